"""The node as NodePorts see it: its own addresses (read from its links), which of them carry
NodePorts and health-check node ports, and the problems of --nodeport-addresses."""

from __future__ import annotations

import logging
from typing import Iterable

from kubeport.endpoints.types import NodeInfo
from kubeport.proxy.nodeports import NodePortSelection, NodePortSpec, nodeport_selection

log = logging.getLogger(__name__)


class NodeView:
    def __init__(self, spec: NodePortSpec | str | Iterable[str]) -> None:
        self.spec = spec
        #: the node's own addresses (not kubeport's VIPs), as last read
        self.addresses: tuple[str, ...] = ()
        self.selection = NodePortSelection(())
        self.problems: list[str] = []
        #: the addresses changed since the selection was made (re-read, or told by the parent)
        self.stale = False

    def select(self, node: NodeInfo | None, local: Iterable[str]) -> NodePortSelection:
        primary = node.primary_ips() if node is not None else ()
        self.addresses, self.stale = tuple(local), False
        self.selection = nodeport_selection(self.spec, primary, self.addresses)
        problems = self.selection.problems(self.spec)
        for problem in set(problems) - set(self.problems):  # said once, as kube-proxy logs it
            log.error("%s", problem)
        self.problems = problems
        return self.selection

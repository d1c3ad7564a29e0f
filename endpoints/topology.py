"""Which endpoints a service port may use on this node: kube-proxy's CategorizeEndpoints.

PLACEHOLDER: every ready endpoint, no policies, no hints. The endpoint-selection
issue replaces the body of ``categorize_endpoints`` with kube-proxy's rules; the
signature and ``EndpointSets`` are the contract the proxy builds on.
"""

from __future__ import annotations

from dataclasses import dataclass

from .types import PortEndpoint


@dataclass(frozen=True, slots=True)
class EndpointSets:
    #: endpoints for cluster-wide traffic; None when the port never uses the cluster set.
    cluster: tuple[PortEndpoint, ...] | None
    #: endpoints on this node for Local policies; None when unused or nothing local is usable.
    local: tuple[PortEndpoint, ...] | None
    #: union of the two (what per-endpoint state such as affinity is kept for).
    all_reachable: tuple[PortEndpoint, ...]
    #: some endpoint anywhere is usable: False means "refuse" (kube-proxy's REJECT).
    has_any: bool


def categorize_endpoints(
    endpoints: tuple[PortEndpoint, ...],
    *,
    node_name: str,
    zone: str | None,
    internal_local: bool,
    external_local: bool,
    externally_accessible: bool,
    prefer_same_node: bool = True,
) -> EndpointSets:
    ready = tuple(e for e in endpoints if e.endpoint.ready)
    return EndpointSets(cluster=ready, local=None, all_reachable=ready, has_any=bool(ready))

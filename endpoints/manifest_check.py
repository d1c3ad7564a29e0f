"""``kubeport check DIR``: every problem of a manifest directory, without a daemon."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence

from .allocstore import AllocationStore
from .manifests import ManifestSource
from .registry import Registry
from .state import ClusterState

DEFAULT_SERVICE_CIDRS = ("10.96.0.0/12",)
DEFAULT_NODE_PORT_RANGE = (30000, 32767)


def check_directory(
    path: str | os.PathLike[str],
    service_cidrs: Sequence[str | ipaddress.IPv4Network | ipaddress.IPv6Network] = DEFAULT_SERVICE_CIDRS,
    node_port_range: tuple[int, int] = DEFAULT_NODE_PORT_RANGE,
) -> list[str]:
    """Every problem of a manifest directory, one line each, starting with the file's path
    (``path`` joined with the file's path inside it). Allocations are made in memory only."""
    if not os.path.isdir(path):
        return [f"{path}: not a directory"]
    networks = [ipaddress.ip_network(str(cidr)) for cidr in service_cidrs]
    registry = Registry(AllocationStore(None), networks, node_port_range)
    source = ManifestSource(path, registry, ClusterState(""), log_problems=False)
    source.load()
    return [os.path.join(os.fspath(path), line) for line in source.problems]

"""``kubeport check DIR``: every problem of a manifest directory, without a daemon."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass

from kubeport.endpoints.manifests.source import ManifestSource
from kubeport.endpoints.registry.registry import Registry
from kubeport.endpoints.registry.store import AllocationStore
from kubeport.endpoints.state import ClusterState

DEFAULT_SERVICE_CIDRS = ("10.96.0.0/12",)
DEFAULT_NODE_PORT_RANGE = (30000, 32767)
#: A check has no history: of two files declaring one object, the first in path order holds it,
#: where a running daemon keeps the one that declared it first (also across restarts).
SKIPPED = "skipped, a kind (or API group) kubeport does not read"
DUPLICATE_NOTE = " (kubeport check keeps the first file in path order; a running daemon, the first to declare it)"


@dataclass(frozen=True, slots=True)
class CheckResult:
    #: one line each, starting with the file's path: what keeps an object from loading as written
    problems: list[str]
    #: ``<file>: <apiVersion> <kind> <name>: skipped, ...`` for each object of a kind (or API
    #: group) kubeport does not read: no problem in a directory that also holds Deployments, yet
    #: a typo in an API group looks just like this, so a check lists them (as warnings: a check
    #: that fails for a Deployment would be useless on a directory of application manifests)
    skipped: list[str]


def check_manifests(
    path: str | os.PathLike[str],
    service_cidrs: Sequence[str | ipaddress.IPv4Network | ipaddress.IPv6Network] = DEFAULT_SERVICE_CIDRS,
    node_port_range: tuple[int, int] = DEFAULT_NODE_PORT_RANGE,
) -> CheckResult:
    """Every problem and skipped object of a manifest directory (paths joined to ``path``).
    Allocations are made in memory only."""
    if not os.path.isdir(path):
        return CheckResult([f"{path}: not a directory"], [])
    networks = [ipaddress.ip_network(str(cidr)) for cidr in service_cidrs]
    registry = Registry(AllocationStore(None), networks, node_port_range)
    source = ManifestSource(path, registry, ClusterState(""), log_problems=False, duplicate_note=DUPLICATE_NOTE)
    source.load()
    return CheckResult([os.path.join(os.fspath(path), line) for line in source.problems],
                       [f"{os.path.join(os.fspath(path), line)}: {SKIPPED}" for line in source.skipped])


def check_directory(
    path: str | os.PathLike[str],
    service_cidrs: Sequence[str | ipaddress.IPv4Network | ipaddress.IPv6Network] = DEFAULT_SERVICE_CIDRS,
    node_port_range: tuple[int, int] = DEFAULT_NODE_PORT_RANGE,
) -> list[str]:
    """Every problem of a manifest directory, one line each, starting with the file's path
    (``path`` joined with the file's path inside it). Allocations are made in memory only."""
    return check_manifests(path, service_cidrs, node_port_range).problems

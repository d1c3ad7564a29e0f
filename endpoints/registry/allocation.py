"""What a Service gets from the allocators: IP families, ClusterIPs, nodePorts, health check port.

The API server's ``pkg/registry/core/service/storage/alloc.go`` (initIPFamilyFields,
allocClusterIPs, initNodePorts, allocHealthCheckNodePort), with one addition for
manifest mode: a Service admitted again keeps what it got before (the API server gets
the same effect because ``kubectl apply`` merges into the stored object).

:func:`allocate_service` changes the allocators only through a :class:`Transaction`:
``commit()`` releases what the Service no longer needs, ``rollback()`` returns what it
took, so a refused Service leaves every allocator exactly as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kubeport.endpoints import model, names
from kubeport.endpoints.fielderrors import FieldError, internal, invalid
from kubeport.endpoints.registry.allocators import (
    AllocationError,
    IPAllocator,
    PortAllocator,
    RangeFull,
    ServiceCIDRAllocator,
)
from kubeport.endpoints.registry.store import NodePortAllocation, ServiceAllocation
from kubeport.endpoints.validation import needs_health_check

_OTHER_FAMILY = {"IPv4": "IPv6", "IPv6": "IPv4"}


class AllocationFailed(Exception):
    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


@dataclass(frozen=True, slots=True)
class FamilyChoice:
    families: tuple[str, ...]
    policy: str


def resolve_ip_families(spec: model.ServiceSpec, configured: list[str], headless: bool) -> FamilyChoice | None:
    """initIPFamilyFields on create: default and check ipFamilyPolicy and ipFamilies.

    ``configured`` lists the families of ``--service-cluster-ip-range``, primary first.
    None for ExternalName. Raises AllocationFailed with the API server's errors.
    """
    if spec.type == "ExternalName":
        return None
    selectorless = not spec.selector
    policy = spec.ip_family_policy
    if policy is None:
        # Headless and selectorless defaults to dual-stack (the API server's special case).
        policy = "RequireDualStack" if headless and selectorless else "SingleStack"
    families = list(spec.ip_families or [])
    ips = [ip for ip in (spec.cluster_ips or []) if ip and ip != "None"]
    errors = _policy_errors(policy, ips, families)
    for i, ip in enumerate(ips):
        family = names.ip_family(ip)
        if i < len(families) or family is None:
            continue
        if family not in configured:
            detail = f"{family} is not configured on this cluster"
            errors.append(invalid(f"spec.clusterIPs[{i}]", spec.cluster_ips, detail))
        else:
            families.append(family)
    if errors:
        raise AllocationFailed(errors)
    if headless and selectorless:
        families = families or [configured[0]]
        if len(families) < 2 and policy != "SingleStack":
            families.append(_OTHER_FAMILY[families[0]])
        return FamilyChoice(tuple(families), policy)
    if policy == "RequireDualStack" and len(configured) < 2:
        errors.append(invalid("spec.ipFamilyPolicy", policy, "this cluster is not configured for dual-stack services"))
    for i, family in enumerate(families):
        if family not in configured:
            errors.append(invalid(f"spec.ipFamilies[{i}]", family, "not configured on this cluster"))
    if errors:
        raise AllocationFailed(errors)
    families = families or [configured[0]]
    if policy != "SingleStack" and len(families) == 1 and len(configured) == 2:
        families.append(_OTHER_FAMILY[families[0]])
    return FamilyChoice(tuple(families), policy)


def _policy_errors(policy: str, ips: list[str], families: list[str]) -> list[FieldError]:
    if policy != "SingleStack":
        return []
    errors = []
    if len(ips) == 2:
        detail = "must be 'RequireDualStack' or 'PreferDualStack' when multiple cluster IPs are specified"
        errors.append(invalid("spec.ipFamilyPolicy", policy, detail))
    if len(families) == 2:
        detail = "must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified"
        errors.append(invalid("spec.ipFamilyPolicy", policy, detail))
    return errors


@dataclass
class Transaction:
    """Allocations taken for one admission, and what to release when it commits."""

    ports: PortAllocator
    ips: dict[str, IPAllocator] | dict[str, ServiceCIDRAllocator]
    taken_ports: list[int] = field(default_factory=list)
    taken_ips: list[tuple[str, str]] = field(default_factory=list)
    release_ports: set[int] = field(default_factory=set)
    release_ips: set[str] = field(default_factory=set)

    def take_port(self, port: int) -> None:
        self.ports.allocate(port)
        self.taken_ports.append(port)

    def next_port(self) -> int:
        port = self.ports.allocate_next()
        self.taken_ports.append(port)
        return port

    def take_ip(self, family: str, ip: str) -> None:
        self.ips[family].allocate(ip)
        self.taken_ips.append((family, ip))

    def next_ip(self, family: str) -> str:
        ip = self.ips[family].allocate_next()
        self.taken_ips.append((family, ip))
        return ip

    def rollback(self) -> None:
        for port in self.taken_ports:
            self.ports.release(port)
        for family, ip in self.taken_ips:
            self.ips[family].release(ip)
        self.taken_ports.clear()
        self.taken_ips.clear()

    def commit(self) -> None:
        for port in self.release_ports:
            self.ports.release(port)
        for ip in self.release_ips:
            allocator = self.ips.get(names.ip_family(ip) or "")
            if allocator is not None:
                allocator.release(ip)


@dataclass(frozen=True, slots=True)
class ServiceAllocations:
    """The allocated fields of one Service; ``node_ports`` is per spec.ports index (0: none)."""

    families: FamilyChoice | None
    cluster_ips: tuple[str, ...]
    node_ports: tuple[int, ...]
    health_check_node_port: int

    def node_port_records(self, spec: model.ServiceSpec) -> tuple[NodePortAllocation, ...]:
        return tuple(
            NodePortAllocation(port.name or "", port.protocol, port.port, node_port)
            for port, node_port in zip(spec.ports, self.node_ports)
            if node_port
        )


def allocate_service(
    spec: model.ServiceSpec,
    headless: bool,
    families: FamilyChoice | None,
    prev: ServiceAllocation | None,
    txn: Transaction,
) -> ServiceAllocations:
    """Allocate into ``txn``; raises AllocationFailed (after rolling ``txn`` back) on any refusal."""
    try:
        cluster_ips = _cluster_ips(spec, headless, families, prev, txn)
        claimed: dict[int, int] = {}  # node port -> spec.ports[].port that holds it
        prev_ports = prev.held_ports() if prev else set()
        node_ports = _node_ports(spec, prev, prev_ports, claimed, txn)
        health = _health_check_port(spec, prev, prev_ports, claimed, txn)
    except AllocationFailed:
        txn.rollback()
        raise
    new_ports = set(claimed)
    txn.release_ports = prev_ports - new_ports
    txn.release_ips = set(prev.cluster_ips if prev else ()) - set(cluster_ips)
    return ServiceAllocations(families, cluster_ips, node_ports, health)


def _cluster_ips(
    spec: model.ServiceSpec,
    headless: bool,
    families: FamilyChoice | None,
    prev: ServiceAllocation | None,
    txn: Transaction,
) -> tuple[str, ...]:
    if families is None or headless:
        return ()
    explicit = [ip for ip in (spec.cluster_ips or []) if ip and ip != "None"]
    previous = {names.ip_family(ip): ip for ip in (prev.cluster_ips if prev else ())}
    result = []
    for i, family in enumerate(families.families):
        wanted = str(names.parse_ip(explicit[i])) if i < len(explicit) else None
        if wanted is not None and wanted != previous.get(family):
            try:
                txn.take_ip(family, wanted)
            except AllocationError as exc:
                detail = f"failed to allocate IP {explicit[i]}: {exc}"
                raise AllocationFailed([invalid("spec.clusterIPs", spec.cluster_ips, detail)]) from None
            result.append(wanted)
        elif wanted is None and family in previous:
            result.append(previous[family])
        elif wanted is None:
            try:
                result.append(txn.next_ip(family))
            except RangeFull as exc:
                error = internal("spec.clusterIPs", f"failed to allocate a serviceIP: {exc}")
                raise AllocationFailed([error]) from None
        else:
            result.append(wanted)
    return tuple(result)


def _claim(port: int, owner: int, path: str, prev_ports: set[int], claimed: dict[int, int], txn: Transaction) -> None:
    """Take an explicitly requested node port for the spec port numbered ``owner``."""
    holder = claimed.get(port)
    if holder == owner:
        return  # TCP and UDP of one port number share it
    if holder is not None:
        raise AllocationFailed([invalid(path, port, "provided port is already allocated")])
    if port not in prev_ports:
        try:
            txn.take_port(port)
        except AllocationError as exc:
            raise AllocationFailed([invalid(path, port, str(exc))]) from None
    claimed[port] = owner


def _next_port(path: str, what: str, txn: Transaction) -> int:
    try:
        return txn.next_port()
    except RangeFull as exc:
        raise AllocationFailed([internal(path, f"failed to allocate a {what}: {exc}")]) from None


def _node_ports(
    spec: model.ServiceSpec,
    prev: ServiceAllocation | None,
    prev_ports: set[int],
    claimed: dict[int, int],
    txn: Transaction,
) -> tuple[int, ...]:
    result = [0] * len(spec.ports)
    if spec.type not in ("NodePort", "LoadBalancer"):
        return tuple(result)
    should_allocate = spec.type == "NodePort" or spec.allocate_load_balancer_node_ports is not False
    by_number: dict[int, int] = {}
    # Explicit requests first, so a dynamic pick can never take a value asked for later.
    for i, port in enumerate(spec.ports):
        if port.node_port:
            _claim(port.node_port, port.port, f"spec.ports[{i}].nodePort", prev_ports, claimed, txn)
            result[i] = port.node_port
            by_number.setdefault(port.port, port.node_port)
    reusable = _previous_node_ports(prev)
    for i, port in enumerate(spec.ports):
        if port.node_port or not should_allocate:
            continue
        if port.port in by_number:
            result[i] = by_number[port.port]
            continue
        reused = _reusable(port, reusable, prev_ports, claimed)
        if reused:
            claimed[reused] = port.port
            result[i] = reused
        else:
            result[i] = _next_port(f"spec.ports[{i}].nodePort", "nodePort", txn)
            claimed[result[i]] = port.port
        by_number[port.port] = result[i]
    return tuple(result)


def _previous_node_ports(prev: ServiceAllocation | None) -> dict[tuple, int]:
    """Previous nodePorts by (name, protocol, port) and, for renamed ports, by (protocol, port)."""
    found: dict[tuple, int] = {}
    for p in prev.node_ports if prev else ():
        found[(p.name, p.protocol, p.port)] = p.node_port
        found.setdefault((p.protocol, p.port), p.node_port)
    return found


def _reusable(
    port: model.ServicePort, reusable: dict[tuple, int], prev_ports: set[int], claimed: dict[int, int]
) -> int:
    for key in ((port.name or "", port.protocol, port.port), (port.protocol, port.port)):
        value = reusable.get(key, 0)
        if value and value in prev_ports and value not in claimed:
            return value
    return 0


def _health_check_port(
    spec: model.ServiceSpec,
    prev: ServiceAllocation | None,
    prev_ports: set[int],
    claimed: dict[int, int],
    txn: Transaction,
) -> int:
    if not needs_health_check(spec):
        return 0
    path = "spec.healthCheckNodePort"
    if spec.health_check_node_port:
        # owner -1: no spec port number, so it can never share a value with a nodePort
        _claim(spec.health_check_node_port, -1, path, prev_ports, claimed, txn)
        return spec.health_check_node_port
    previous = prev.health_check_node_port if prev else 0
    if previous and previous in prev_ports and previous not in claimed:
        claimed[previous] = -1
        return previous
    port = _next_port(path, "HealthCheck NodePort", txn)
    claimed[port] = -1
    return port

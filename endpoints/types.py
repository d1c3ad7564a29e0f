"""Slim, frozen internal types: what the proxy and the DNS server see.

API objects are converted into these once, at ingest (:mod:`kubeport.endpoints.convert`).
Nothing downstream reads raw API dicts or pydantic models. Unchanged services keep
the *same* ``ServiceState`` object from one snapshot to the next, so "did this
service change?" is an identity check.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True, slots=True, order=True)
class ServiceName:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PortSpec:
    """One entry of a Service's spec.ports."""

    name: str  # "" when unnamed
    protocol: str  # TCP | UDP | SCTP
    port: int
    target_port: int | str
    node_port: int = 0  # 0: none
    app_protocol: str | None = None


@dataclass(frozen=True, slots=True, order=True)
class ServicePortName:
    """kube-proxy's key for everything per service port (affinity, endpoint sets)."""

    service: ServiceName
    port: str
    protocol: str

    def __str__(self) -> str:
        port = f":{self.port}" if self.port else ""
        return f"{self.service}{port}/{self.protocol}"


@dataclass(frozen=True, slots=True)
class ServiceInfo:
    name: ServiceName
    uid: str
    type: str  # ClusterIP | NodePort | LoadBalancer | ExternalName
    cluster_ips: tuple[str, ...]  # () for headless, ExternalName, or not yet allocated
    headless: bool
    external_name: str | None
    ports: tuple[PortSpec, ...]
    external_ips: tuple[str, ...] = ()
    #: status.loadBalancer.ingress IPs with ipMode VIP or unset (kube-proxy's IsVIPMode).
    load_balancer_ips: tuple[str, ...] = ()
    load_balancer_source_ranges: tuple[str, ...] = ()
    #: ClientIP session affinity timeout in seconds; 0 means no affinity.
    affinity_timeout: int = 0
    #: spec.externalTrafficPolicy == Local (only meaningful for externally reachable ports).
    external_policy_local: bool = False
    #: spec.internalTrafficPolicy == Local.
    internal_policy_local: bool = False
    health_check_node_port: int = 0
    traffic_distribution: str | None = None
    #: the topology-mode (or deprecated topology-aware-hints) annotation value.
    topology_mode: str | None = None
    publish_not_ready_addresses: bool = False
    #: label service.kubernetes.io/service-proxy-name: such services are not ours to proxy.
    proxy_name: str | None = None
    #: carries the label service.kubernetes.io/headless, which kube-proxy's informers filter
    #: out whatever spec.clusterIP says; DNS still answers for the service (CoreDNS ignores it).
    headless_label: bool = False
    #: metadata.creationTimestamp (RFC 3339), for `kubeport get` only.
    created: str | None = None
    #: spec.selector as "k=v,k2=v2" ("" when none), for `kubeport get -o wide` only.
    selector: str = ""
    #: spec.selector as pairs; None without one (or an empty one): the EndpointSlice
    #: controller leaves such a Service to whoever writes its slices.
    selector_labels: tuple[tuple[str, str], ...] | None = None
    #: spec.ipFamilies, as the registry defaulted them ("IPv4", "IPv6").
    ip_families: tuple[str, ...] = ()
    #: metadata.labels as sorted pairs, for DNS's ``labels`` selector (CoreDNS ``labels``)
    labels: tuple[tuple[str, str], ...] = ()
    #: annotation kubeport.io/proxy-protocol: "v2": TCP connections open with a PROXY protocol v2 header
    proxy_protocol: bool = False
    #: what the conversion found it cannot do as asked, one line each (the service is still served)
    problems: tuple[str, ...] = ()

    @property
    def proxied(self) -> bool:
        """kube-proxy's ShouldSkipService, inverted, plus its informers' label selector
        (pkg/proxy/util/utils.go, cmd/kube-proxy/app/server.go)."""
        return (
            self.type != "ExternalName"
            and not self.headless
            and bool(self.cluster_ips)
            and self.proxy_name is None
            and not self.headless_label
        )

    def port_name(self, port: PortSpec) -> ServicePortName:
        return ServicePortName(self.name, port.name, port.protocol)

    def externally_accessible(self, port: PortSpec) -> bool:
        """kube-proxy's per-port rule (serviceport.go), not the Service type."""
        return bool(port.node_port or self.load_balancer_ips or self.external_ips)


@dataclass(frozen=True, slots=True)
class EndpointInfo:
    """One endpoint of an EndpointSlice (the proxy uses addresses[0] only, like kube-proxy)."""

    address: str
    ready: bool = True  # nil counts as true
    serving: bool = True  # nil counts as true
    terminating: bool = False  # nil counts as false
    hostname: str | None = None
    node_name: str | None = None
    zone: str | None = None
    #: hints.forZones names; None when absent or empty.
    zone_hints: frozenset[str] | None = None
    #: hints.forNodes names; None when absent or empty.
    node_hints: frozenset[str] | None = None
    #: targetRef.name, whatever its kind (CoreDNS endpoint_pod_names).
    pod_name: str | None = None


@dataclass(frozen=True, slots=True)
class EndpointPortInfo:
    name: str
    protocol: str
    port: int


@dataclass(frozen=True, slots=True)
class SliceInfo:
    name: str
    address_type: str  # IPv4 | IPv6 | FQDN
    #: None when the slice's ports are nil ("no ports"), as distinct from empty.
    ports: tuple[EndpointPortInfo, ...] | None
    endpoints: tuple[EndpointInfo, ...]
    #: False when labelled service.kubernetes.io/headless or service-proxy-name: kube-proxy's
    #: informers never see such a slice (cmd/kube-proxy/app/server.go), but DNS still reads its endpoints.
    proxied: bool = True
    #: addresses[1:] of each endpoint, in ``endpoints`` order; None when no endpoint has more
    #: than one (the usual slice). DNS publishes each (CoreDNS); the proxy only the first
    #: (kube-proxy; the API lets consumers do either). Kept here, not on EndpointInfo: a
    #: field there costs 16 bytes per endpoint, which nearly every endpoint would carry empty.
    more_addresses: tuple[tuple[str, ...], ...] | None = None
    #: endpoints.kubernetes.io/last-change-trigger-time (wall-clock seconds), set by the
    #: EndpointSlice controller: where kube-proxy's network programming latency starts.
    #: Not compared: kube-proxy sees a slice whose endpoints are unchanged as unchanged.
    trigger_time: float | None = field(default=None, compare=False)
    #: label endpointslice.kubernetes.io/managed-by: who wrote the slice.
    managed_by: str | None = None


@dataclass(frozen=True, slots=True)
class PortEndpoint:
    """An endpoint as one service port sees it: an address, the resolved port, the conditions."""

    endpoint: EndpointInfo
    port: int
    #: kube-proxy's endpoint identity, "IP:port" ("[v6]:port"). Made once: consumers key
    #: their tables by it, and every use then shares one string instead of formatting anew.
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        address = self.endpoint.address
        object.__setattr__(self, "key", f"[{address}]:{self.port}" if ":" in address else f"{address}:{self.port}")

    @property
    def ip(self) -> str:
        return self.endpoint.address


@dataclass(frozen=True, slots=True)
class ServiceState:
    """A Service and every EndpointSlice labelled with its name, merged."""

    service: ServiceInfo
    slices: tuple[SliceInfo, ...] = ()  # sorted by slice name

    def endpoints_for_port(self, port: PortSpec) -> tuple[PortEndpoint, ...]:
        return endpoints_for_port(self.slices, port.name, port.protocol)


def endpoints_for_port(
    slices: tuple[SliceInfo, ...], port_name: str, protocol: str
) -> tuple[PortEndpoint, ...]:
    """The endpoints of one service port, as kube-proxy's endpointslicecache builds them.

    The slice port whose name and protocol match the service port gives the port
    number (so a named targetPort can resolve to a different number per slice).
    Slices without a matching port contribute nothing; FQDN slices and slices
    labelled away from kube-proxy (``SliceInfo.proxied``) are not proxied.
    Endpoints are keyed by IP:port; if the same key appears twice, the
    non-terminating copy wins. The result is sorted by the key string.
    """
    by_key: dict[str, PortEndpoint] = {}
    for slice_ in slices:
        if slice_.address_type == "FQDN" or not slice_.ports or not slice_.proxied:
            continue
        number = 0
        for slice_port in slice_.ports:
            if slice_port.name == port_name and slice_port.protocol == protocol and slice_port.port:
                number = slice_port.port
                break
        if not number:
            continue
        for endpoint in slice_.endpoints:
            candidate = PortEndpoint(endpoint, number)
            held = by_key.get(candidate.key)
            if held is None or (held.endpoint.terminating and not endpoint.terminating):
                by_key[candidate.key] = candidate
    return tuple(by_key[key] for key in sorted(by_key))


@dataclass(frozen=True, slots=True)
class ContainerPortInfo:
    """A named container port a Service's targetPort may name (``spec.containers[].ports[]``,
    and those of sidecar init containers)."""

    name: str
    protocol: str
    port: int
    #: the container that declares it
    container: str = ""


@dataclass(frozen=True, slots=True)
class ContainerStatusInfo:
    """What kubectl's READY, STATUS and RESTARTS columns read of a container's status."""

    name: str
    ready: bool = False
    restart_count: int = 0
    waiting_reason: str | None = None
    terminated_reason: str | None = None


@dataclass(frozen=True, slots=True)
class PodInfo:
    """A Pod as manifest mode's EndpointSlice controller, ``pods verified`` and `kubeport get pods` read it."""

    namespace: str
    name: str
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: status.podIPs (podIP alone counts as podIPs[0]), canonical
    ips: tuple[str, ...] = ()
    phase: str = "Pending"
    #: the Ready condition is True
    ready: bool = False
    #: metadata.deletionTimestamp (RFC 3339): the Pod is terminating
    deletion_timestamp: str | None = None
    node_name: str | None = None
    hostname: str | None = None
    subdomain: str | None = None
    ports: tuple[ContainerPortInfo, ...] = ()
    #: for `kubeport get pods` only: spec.containers' names, status.reason, status.containerStatuses
    containers: tuple[str, ...] = ()
    reason: str | None = None
    container_statuses: tuple[ContainerStatusInfo, ...] = ()
    created: str | None = None

    @property
    def terminating(self) -> bool:
        return self.deletion_timestamp is not None

    @property
    def terminal(self) -> bool:
        """Succeeded or Failed (``podutil.IsPodTerminal``): in no EndpointSlice."""
        return self.phase in ("Succeeded", "Failed")

    def find_port(self, target: int | str, protocol: str) -> int | None:
        """``podutil.FindPort``: a number as is; a name -> the first container port of that
        name and protocol; None when none has it."""
        if isinstance(target, int):
            return target
        for port in self.ports:
            if port.name == target and port.protocol == protocol:
                return port.port
        return None


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """This node, as read from its Node object."""

    name: str
    zone: str | None = None  # label topology.kubernetes.io/zone; "" is None
    #: (type, address) pairs from status.addresses, in order.
    addresses: tuple[tuple[str, str], ...] = ()
    #: False while the node is being deleted or carries ToBeDeletedByClusterAutoscaler
    #: (kube-proxy's /healthz "nodeEligible", KEP-3836).
    eligible: bool = True
    #: The Ready condition is True (or the object has no conditions, as in hand-written manifests).
    ready: bool = True
    #: status.allocatable.cpu in millicores; 0 when unknown.
    allocatable_cpu_millis: int = 0
    #: labelled node-role.kubernetes.io/control-plane or .../master.
    control_plane: bool = False

    def primary_ips(self) -> tuple[str, ...]:
        """The node's IP per family, kube-proxy's node IPs (GetNodeHostIPs): the first
        InternalIP of the family, else its first ExternalIP. A loopback one is kept here;
        ``--nodeport-addresses primary`` then leaves it out (nodeports.py)."""
        found: dict[int, str] = {}
        ordered = [a for kind, a in self.addresses if kind == "InternalIP"]
        ordered += [a for kind, a in self.addresses if kind == "ExternalIP"]
        for address in ordered:
            try:
                ip = ipaddress.ip_address(address)
            except ValueError:
                continue
            found.setdefault(ip.version, str(ip))
        return tuple(found[v] for v in sorted(found))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One consistent, immutable view of the cluster, published by ClusterState."""

    generation: int
    services: Mapping[ServiceName, ServiceState] = field(default_factory=lambda: MappingProxyType({}))
    namespaces: frozenset[str] = frozenset()
    node: NodeInfo | None = None
    #: False until every source kind has completed its first list.
    synced: bool = False
    #: Before that, the Unix time of the last applied state an earlier process kept, when
    #: this snapshot is built from it (and what the source said since): servable at once.
    restored_at: float | None = None
    #: the labels of the Namespace objects that have any, as sorted pairs (CoreDNS ``namespace_labels``)
    namespace_labels: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=lambda: MappingProxyType({}))
    #: manifest mode's Pods, by (namespace, name); empty with an API server (kube-proxy reads none).
    pods: Mapping[tuple[str, str], "PodInfo"] = field(default_factory=lambda: MappingProxyType({}))
    #: every Node object (topology-mode Auto hints need them all), by name.
    nodes: Mapping[str, NodeInfo] = field(default_factory=lambda: MappingProxyType({}))
    #: services added, changed or removed since generation - 1.
    changed: frozenset[ServiceName] = frozenset()
    #: the Node object changed since generation - 1.
    node_changed: bool = False
    #: some Pod was added, changed or removed since generation - 1.
    pods_changed: bool = False
    #: wall-clock time the oldest change in this snapshot arrived from the source; the
    #: start of kube-proxy's network programming latency. None for the empty snapshot.
    changed_at: float | None = None
    #: the service ranges: --service-cluster-ip-range (the default ServiceCIDR) and every
    #: ServiceCIDR's spec.cidrs, including one being deleted (its Services still hold its
    #: addresses), each once, canonical, the flag's first (KEP-1880)
    service_cidrs: tuple[str, ...] = ()

    @property
    def servable(self) -> bool:
        """The proxy and DNS apply it: the source's whole view, or the last applied state."""
        return self.synced or self.restored_at is not None

    def changed_since(self, older: "Snapshot | None") -> frozenset[ServiceName]:
        """Services that differ between ``older`` and this snapshot.

        A subscriber that skipped snapshots still gets an exact answer: unchanged
        services are the same objects, so the fallback is an identity scan.
        """
        if older is None:
            return frozenset(self.services)
        if older.generation == self.generation:
            return frozenset()
        if older.generation == self.generation - 1:
            return self.changed
        names = set(self.services) | set(older.services)
        return frozenset(n for n in names if self.services.get(n) is not older.services.get(n))

"""The record index: what the cluster zone holds, per service, updated per changed service.

Built from snapshots of :mod:`kubeport.endpoints`; pure (no I/O, no clock: ``now`` is an
argument). Each service becomes a frozen :class:`ServiceRecords` cut down to what DNS
reads; reverse maps (IP -> services) are maintained incrementally from the old and new
records of each changed service, so an update costs what the change costs.

Memory is what grows with the cluster (services and endpoints): the records *share* the
snapshot's own objects (its port tuples, its SliceInfo and EndpointInfo objects) instead
of copying them, endpoint names are worked out when a query needs them, and a reverse map
holds the owning ServiceName itself, not a container, in the usual one-owner case.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, replace
from functools import partial
from itertools import repeat
from operator import attrgetter, is_
from typing import Iterable, Iterator, Mapping, Union

from kubeport.dns.names import endpoint_name
from kubeport.dns.selectors import Selector
from kubeport.endpoints.names import ip_facts
from kubeport.endpoints.programming import programming_starts
from kubeport.endpoints.types import (
    EndpointInfo,
    EndpointPortInfo,
    PortSpec,
    ServiceName,
    ServiceState,
    SliceInfo,
    Snapshot,
)

#: Port of a service or slice that declares no ports (CoreDNS's -1 sentinel): it gives
#: address records but no SRV.
NO_PORT = -1

#: a Service's or a slice's port as the snapshot holds it; DNS reads name, protocol
#: (compared case-insensitively) and port
Port = Union[PortSpec, EndpointPortInfo]
NO_PORTS: tuple[Port, ...] = (EndpointPortInfo("", "", NO_PORT),)

#: the services an address belongs to: the ServiceName itself (the usual case: no
#: container per address) or, when several services share it, a sorted tuple of them
Owners = Union[ServiceName, tuple[ServiceName, ...]]

_address = attrgetter("address")
_ready = attrgetter("ready")
#: the C-speed address check per address type (see _all_addresses)
_PTON = {"IPv4": partial(socket.inet_pton, socket.AF_INET), "IPv6": partial(socket.inet_pton, socket.AF_INET6)}


@dataclass(frozen=True, slots=True)
class ServiceRecords:
    name: ServiceName
    kind: str  # ClusterIP (also NodePort/LoadBalancer) | Headless | ExternalName
    cluster_ips: tuple[str, ...] = ()
    ports: tuple[Port, ...] = NO_PORTS
    #: the CNAME target without trailing dot; None for an IP-valued externalName (NXDOMAIN)
    external_target: str | None = None
    #: the slices with the endpoints DNS publishes (FQDN slices dropped): the snapshot's own
    #: SliceInfo objects where every endpoint is published, else copies holding those only
    slices: tuple[SliceInfo, ...] = ()
    #: addresses of the endpoints not published; with the published ones, the pod
    #: addresses ``pods verified`` knows
    unready_addresses: tuple[str, ...] = ()

    @property
    def fqdn_labels(self) -> tuple[str, ...]:
        return (self.name.name, self.name.namespace, "svc")


def _is_ip(text: str) -> bool:
    return ip_facts(text) is not None


def _all_addresses(address_type: str, endpoints: tuple[EndpointInfo, ...]) -> bool:
    """Every address is an IP of the slice's type, checked at C speed. Addresses are
    validated and canonical at ingest: this only keeps an unvalidated one (a ClusterState
    fed directly) from reaching the encoder."""
    pton = _PTON.get(address_type)
    if pton is None:
        return False
    try:
        for _ in map(pton, map(_address, endpoints)):
            pass
    except (OSError, ValueError):
        return False
    return True


def _published(slice_: SliceInfo) -> tuple[SliceInfo, tuple[str, ...]]:
    """The slice cut to the endpoints DNS publishes, the slice itself when that is all of
    them; and the addresses of the others.

    DNS publishes an endpoint by its ``ready`` condition and nothing else (CoreDNS
    plugin/kubernetes/object/endpoint.go EndpointSliceToEndpoints).
    publishNotReadyAddresses is already in it: the EndpointSlice controller writes
    ``ready = publishNotReadyAddresses || (podReady && !terminating)`` (podToEndpoint), and
    in manifest mode, where nobody runs it, the state does as it would
    (endpoints/hints.py, ``as_the_controller_writes``). A slice the controller did not
    write (mirrored Endpoints, another controller) keeps its own ``ready``, as for CoreDNS.
    """
    endpoints = slice_.endpoints
    if slice_.more_addresses is not None:
        # CoreDNS makes an endpoint of every address (EndpointSliceToEndpoints): same name,
        # conditions and hostname for each.
        endpoints = tuple(one for e, more in zip(endpoints, slice_.more_addresses)
                          for one in (e, *(replace(e, address=extra) for extra in more)))
    if not _all_addresses(slice_.address_type, endpoints):
        endpoints = tuple(e for e in endpoints if _is_ip(e.address))
    if all(map(_ready, endpoints)):
        unready: tuple[str, ...] = ()
    else:
        unready = tuple(e.address for e in endpoints if not e.ready)
        endpoints = tuple(e for e in endpoints if e.ready)
    if endpoints is slice_.endpoints:
        return slice_, unready
    return SliceInfo(slice_.name, slice_.address_type, slice_.ports, endpoints), unready


def service_records(state: ServiceState) -> ServiceRecords:
    info = state.service
    if info.type == "ExternalName":
        target = (info.external_name or "").rstrip(".")
        # An IP-valued externalName makes no record (coredns#2324): the name is NXDOMAIN.
        return ServiceRecords(info.name, "ExternalName",
                              external_target=None if not target or _is_ip(target) else target.lower())
    slices: list[SliceInfo] = []
    unready: tuple[str, ...] = ()
    for slice_ in state.slices:
        if slice_.address_type == "FQDN":
            continue  # deprecated, never written by the controller; CoreDNS would make CNAMEs
        published, not_published = _published(slice_)
        if published.endpoints:
            slices.append(published)
        unready += not_published
    # The usual case keeps the snapshot's tuple itself: nothing copied per service.
    same = len(slices) == len(state.slices) and all(map(is_, slices, state.slices))
    return ServiceRecords(
        name=info.name,
        kind="Headless" if info.headless else "ClusterIP",
        cluster_ips=() if info.headless else info.cluster_ips,
        ports=info.ports or NO_PORTS,
        slices=state.slices if same else tuple(slices),
        unready_addresses=unready,
    )


def _port_view(ports: tuple[Port, ...] | None) -> tuple[tuple[str, str, int], ...]:
    return tuple((p.name, p.protocol.lower(), p.port) for p in ports or NO_PORTS)


def _same_endpoint(a: EndpointInfo, b: EndpointInfo, pod_names: bool) -> bool:
    """Equal as far as DNS reads them (address and what names it), not zone, hints..."""
    return a is b or (a.address == b.address and a.hostname == b.hostname
                      and (not pod_names or a.pod_name == b.pod_name))


def _same_slice(a: SliceInfo, b: SliceInfo, pod_names: bool) -> bool:
    if a is b:
        return True
    if len(a.endpoints) != len(b.endpoints) or _port_view(a.ports) != _port_view(b.ports):
        return False
    return all(_same_endpoint(x, y, pod_names) for x, y in zip(a.endpoints, b.endpoints))


def same_dns(old: ServiceRecords, new: ServiceRecords, pod_names: bool) -> bool:
    """Whether two records of a service answer every question alike (CoreDNS's
    endpointsEquivalent: a change of nodePort, zone or hints is no DNS change)."""
    if (old.kind, old.cluster_ips, old.external_target, old.unready_addresses) != \
            (new.kind, new.cluster_ips, new.external_target, new.unready_addresses):
        return False
    if len(old.slices) != len(new.slices) or _port_view(old.ports) != _port_view(new.ports):
        return False
    return all(_same_slice(a, b, pod_names) for a, b in zip(old.slices, new.slices))


def programming_kinds(old: Snapshot, new: Snapshot, names: Iterable[ServiceName],
                      not_before: float) -> Iterator[tuple[str, float]]:
    """(service_kind, when the change began) per DNS change, for CoreDNS's
    coredns_kubernetes_dns_programming_duration_seconds (plugin/kubernetes/metrics.go).

    A headless service's: one per EndpointSlice added or changed
    (:func:`kubeport.endpoints.programming.programming_starts`; CoreDNS records only those
    with a trigger time, as ``headless_with_selector``). A ClusterIP service's (its Service
    changed): from when the change reached kubeport, as ``cluster_ip``, a kind CoreDNS
    names but never records.
    """
    headless: dict[ServiceName, str] = {}
    for name in names:
        state = new.services.get(name)
        if state is None or state.service.type == "ExternalName":
            continue
        info = state.service
        if not info.headless:
            if new.changed_at is not None:
                yield "cluster_ip", new.changed_at
            continue
        headless[name] = "headless_with_selector" if info.selector else "headless_without_selector"
    for name, started in programming_starts(old, new, not_before, headless):
        yield headless[name], started


def pod_namespaces(snapshot: Snapshot) -> dict[str, str]:
    """IP -> namespace of the Running Pods (CoreDNS kubernetes autopath.go podWithIP: the
    first Running Pod with that IP), every IP of each (CoreDNS reads status.podIP only, so
    a pod asking over its second family would not be found). The node's addresses belong to
    every host-network Pod and to the node itself: none of them names one namespace."""
    node = snapshot.node
    own = {address for _, address in node.addresses} if node is not None else set()
    found: dict[str, str] = {}
    for pod in snapshot.pods.values():
        if pod.phase != "Running":
            continue
        for address in pod.ips:
            if address not in own:
                found.setdefault(address, pod.namespace)
    return found


def owners_of(owners: Owners | None) -> tuple[ServiceName, ...]:
    if owners is None:
        return ()
    return owners if type(owners) is tuple else (owners,)  # type: ignore[return-value]


def _add_owner(table: dict[str, Owners], key: str, name: ServiceName) -> None:
    held = table.setdefault(key, name)
    if held is not name:
        found = owners_of(held)
        if name not in found:
            table[key] = tuple(sorted(found + (name,)))


def _remove_owner(table: dict[str, Owners], key: str, name: ServiceName) -> None:
    """Idempotent: an address may appear in several slices of one service."""
    held = table.get(key)
    if held is None:
        return
    rest = tuple(owner for owner in owners_of(held) if owner != name)
    if not rest:
        del table[key]
    elif len(rest) == 1:
        table[key] = rest[0]
    else:
        table[key] = rest


def _add_owners(table: dict[str, Owners], keys: list[str], name: ServiceName) -> None:
    if table.keys().isdisjoint(keys):
        table.update(zip(keys, repeat(name)))  # the usual case, at C speed
    else:
        for key in keys:
            _add_owner(table, key, name)


@dataclass(frozen=True, slots=True)
class IndexChange:
    """What an update changed, for cache invalidation."""

    services: frozenset[ServiceName] = frozenset()
    namespaces: bool = False
    synced: bool = False
    pods: bool = False

    def __bool__(self) -> bool:
        return bool(self.services) or self.namespaces or self.synced or self.pods


class RecordIndex:
    """Services by (namespace, name), reverse maps, namespaces, sync state, SOA serial."""

    def __init__(self, zone: str = "cluster.local", *, endpoint_pod_names: bool = False,
                 exposed: frozenset[str] | None = None, endpoints: bool = True, now: float = 0.0,
                 selector: Selector | None = None, namespace_selector: Selector | None = None):
        """``exposed``: the namespaces served (CoreDNS ``namespaces``), None for all; the
        services of the others are not indexed at all, so no name, PTR or pod lookup finds them.
        ``endpoints`` False (CoreDNS ``noendpoints``): no endpoint is indexed, as CoreDNS does
        without its EndpointSlice watch: headless services and endpoint names are NXDOMAIN."""
        self.zone = zone.rstrip(".").lower()
        self.zone_labels = tuple(self.zone.split("."))
        self.endpoint_pod_names = endpoint_pod_names
        self.exposed = exposed
        #: CoreDNS ``labels``: only the Services whose labels it matches are indexed
        self.selector = selector
        #: CoreDNS ``namespace_labels``: only the namespaces whose Namespace's labels it matches
        self.namespace_selector = namespace_selector
        #: the namespaces ``namespace_selector`` matched at the last apply
        self._matched: frozenset[str] | None = None
        self.endpoints = endpoints
        self.services: dict[ServiceName, ServiceRecords] = {}
        self.namespaces: frozenset[str] = frozenset()
        self.synced = False
        #: unix time (seconds) of the last DNS-relevant change, like CoreDNS
        self.serial = int(now)
        #: ClusterIP -> the service(s) that have it
        self.cluster_ip_owners: dict[str, Owners] = {}
        #: published endpoint IP -> the service(s) it is an endpoint of
        self.endpoint_owners: dict[str, Owners] = {}
        #: endpoint IP that is not published -> its service(s) (``pods verified``)
        self.unready_owners: dict[str, Owners] = {}
        #: (namespace, status.podIP) of the Pods read, not terminating (``pods verified``,
        #: CoreDNS object.ToPod); the snapshot's pods they were taken from
        self.pod_addresses: frozenset[tuple[str, str]] = frozenset()
        #: every IP of a Running Pod -> its namespace (``autopath``: the namespace of the pod a
        #: query comes from); the node's own addresses are left out, as host-network Pods share them
        self.pod_namespaces: Mapping[str, str] = {}
        self._pods_of: object = None
        #: the snapshot last applied, for what the index leaves out (``outside_owners``)
        self._snapshot: Snapshot | None = None
        self._exposed_now: frozenset[str] | None = exposed
        self._outside_owners: dict[str, tuple[ServiceRecords, ...]] = {}

    @classmethod
    def build(cls, snapshot: Snapshot, *, zone: str = "cluster.local", endpoint_pod_names: bool = False,
              exposed: frozenset[str] | None = None, endpoints: bool = True, now: float = 0.0,
              selector: Selector | None = None, namespace_selector: Selector | None = None) -> "RecordIndex":
        index = cls(zone, endpoint_pod_names=endpoint_pod_names, exposed=exposed, endpoints=endpoints, now=now,
                    selector=selector, namespace_selector=namespace_selector)
        index.apply(snapshot, None, now=now)
        return index

    def apply(self, snapshot: Snapshot, changed: Iterable[ServiceName] | None, *, now: float) -> IndexChange:
        """Bring the index to ``snapshot``; ``changed`` None means every service."""
        exposed = self.exposed
        if self.namespace_selector is not None:
            labels = snapshot.namespace_labels
            matched = frozenset(ns for ns in snapshot.namespaces
                                if self.namespace_selector.matches(dict(labels.get(ns, ()))))
            if matched != self._matched:
                changed = None  # a namespace came into view or left it: every service again
            self._matched = matched
            exposed = matched if exposed is None else exposed & matched
        names = set(snapshot.services) | set(self.services) if changed is None else changed
        touched = set()
        services = snapshot.services
        held = self.services
        selector = self.selector
        for name in names:
            state = services.get(name)
            if exposed is not None and name.namespace not in exposed:
                state = None
            elif selector is not None and state is not None and not selector.matches(dict(state.service.labels)):
                state = None
            new = service_records(state) if state is not None else None
            if new is not None and not self.endpoints:
                new = replace(new, slices=(), unready_addresses=())
            if self._replace(name, held.get(name), new):
                touched.add(name)
        namespaces = snapshot.namespaces if exposed is None else snapshot.namespaces & exposed
        if snapshot is not self._snapshot or exposed != self._exposed_now:
            self._snapshot, self._exposed_now = snapshot, exposed
            self._outside_owners = {}
        pods_changed = False
        if snapshot.pods is not self._pods_of:
            self._pods_of = snapshot.pods
            addresses = frozenset(
                (pod.namespace, pod.ips[0]) for pod in snapshot.pods.values() if pod.ips and not pod.terminating)
            pods_changed, self.pod_addresses = addresses != self.pod_addresses, addresses
            self.pod_namespaces = pod_namespaces(snapshot)
        change = IndexChange(
            services=frozenset(touched),
            namespaces=namespaces != self.namespaces,
            synced=snapshot.synced != self.synced,
            pods=pods_changed,
        )
        self.namespaces = namespaces
        self.synced = snapshot.synced
        if change:
            self.serial = int(now)
        return change

    def _replace(self, name: ServiceName, old: ServiceRecords | None, new: ServiceRecords | None) -> bool:
        if old is None and new is None:
            return False
        if old is not None:
            if new is not None and same_dns(old, new, self.endpoint_pod_names):
                return False
            self._unindex(old)
            del self.services[name]
        if new is not None:
            self.services[name] = new
            self._index(new)
        return True

    def _index(self, records: ServiceRecords) -> None:
        name = records.name
        for ip in records.cluster_ips:
            _add_owner(self.cluster_ip_owners, ip, name)
        for slice_ in records.slices:
            _add_owners(self.endpoint_owners, list(map(_address, slice_.endpoints)), name)
        for ip in records.unready_addresses:
            _add_owner(self.unready_owners, ip, name)

    def _unindex(self, records: ServiceRecords) -> None:
        name = records.name
        for ip in records.cluster_ips:
            _remove_owner(self.cluster_ip_owners, ip, name)
        owners = self.endpoint_owners
        for slice_ in records.slices:
            for endpoint in slice_.endpoints:
                ip = endpoint.address
                if owners.get(ip) is name:
                    del owners[ip]  # the usual case, without the general path's tuples
                else:
                    _remove_owner(owners, ip, name)
        for ip in records.unready_addresses:
            _remove_owner(self.unready_owners, ip, name)

    # --- reading -----------------------------------------------------------------

    def service(self, namespace: str, name: str) -> ServiceRecords | None:
        return self.services.get(ServiceName(namespace, name))

    def cluster_ip_services(self, address: str) -> tuple[ServiceName, ...]:
        """The services with this ClusterIP, sorted."""
        return owners_of(self.cluster_ip_owners.get(address))

    def endpoint_services(self, address: str) -> tuple[ServiceName, ...]:
        """The services publishing an endpoint with this address, sorted."""
        return owners_of(self.endpoint_owners.get(address))

    def outside_owners(self, address: str) -> tuple[ServiceRecords, ...]:
        """The services outside the namespaces served (CoreDNS ``namespaces``,
        ``namespace_labels``) that have ``address`` as a ClusterIP or a published endpoint,
        sorted by name. CoreDNS's ``nsAddrs`` (plugin/kubernetes/ns.go) looks the server's
        own addresses up in its endpoint index, which holds every namespace's: the zone's NS
        names the cluster DNS Service even where ``namespaces`` leaves ``kube-system`` out.
        Found by a scan of the last snapshot, kept until the next one: only an NS query at
        the apex asks, and indexing every hidden service for it would cost memory always."""
        if (found := self._outside_owners.get(address)) is not None:
            return found
        snapshot, exposed = self._snapshot, self._exposed_now
        found = ()
        if snapshot is not None and exposed is not None:
            hits = []
            for name in sorted(snapshot.services):
                if name.namespace in exposed:
                    continue
                state = snapshot.services[name]
                if self.selector is not None and not self.selector.matches(dict(state.service.labels)):
                    continue  # CoreDNS ``labels`` selects what its informer lists: never seen
                records = service_records(state)
                if address in records.cluster_ips or (self.endpoints and any(
                        endpoint.address == address for slice_ in records.slices for endpoint in slice_.endpoints)):
                    hits.append(records)
            found = tuple(hits)
        if len(self._outside_owners) < 64:  # the server's own addresses: a handful
            self._outside_owners[address] = found
        return found

    def endpoint_label(self, endpoint: EndpointInfo) -> str:
        """The endpoint's DNS label (hostname, pod name or dashed address), made when asked:
        kept per endpoint it would cost more memory than any other part of the index."""
        return endpoint_name(endpoint.address, endpoint.hostname, endpoint.pod_name, self.endpoint_pod_names)

    def endpoint_labels(self, records: ServiceRecords, address: str) -> list[str]:
        """The sorted labels of a service's published endpoints with this address."""
        return sorted({self.endpoint_label(endpoint) for slice_ in records.slices
                       for endpoint in slice_.endpoints if endpoint.address == address})

    def ptr_targets(self, address: str) -> list[tuple[str, ...]]:
        """Names (as label tuples, zone excluded) that an IP points back to (CoreDNS
        serviceRecordForIP): the service owning it as ClusterIP, else every ready endpoint
        with that address, one name per (service, endpoint name)."""
        owners = self.cluster_ip_services(address)
        if owners:
            first = owners[0]
            return [(first.name, first.namespace, "svc")]
        targets = []
        for service in self.endpoint_services(address):
            for label in self.endpoint_labels(self.services[service], address):
                targets.append((label, service.name, service.namespace, "svc"))
        return targets

    def knows_pod(self, namespace: str, address: str) -> bool:
        """Whether a Pod of the namespace has that IP, or a service of the namespace an
        endpoint (of any readiness) there (a hand-written slice stands for its Pods)."""
        if (namespace, address) in self.pod_addresses:
            return True
        owners = self.endpoint_services(address) + owners_of(self.unready_owners.get(address))
        return any(owner.namespace == namespace for owner in owners)

    def dump(self) -> Mapping[str, object]:
        """Everything but the serial, normalised for comparisons (incremental == rebuilt):
        what DNS reads of each service, not the snapshot objects it shares."""
        return {
            "services": {name: self._view(records) for name, records in self.services.items()},
            "namespaces": self.namespaces,
            "synced": self.synced,
            "cluster_ip_owners": _owner_sets(self.cluster_ip_owners),
            "endpoint_owners": _owner_sets(self.endpoint_owners),
            "unready_owners": _owner_sets(self.unready_owners),
            "pod_addresses": self.pod_addresses,
            "pod_namespaces": dict(self.pod_namespaces),
        }

    def _view(self, records: ServiceRecords) -> tuple[object, ...]:
        slices = tuple((_port_view(s.ports), tuple((e.address, self.endpoint_label(e)) for e in s.endpoints))
                       for s in records.slices)
        return (records.kind, records.cluster_ips, _port_view(records.ports), records.external_target, slices,
                records.unready_addresses)


def _owner_sets(table: dict[str, Owners]) -> dict[str, frozenset[ServiceName]]:
    return {key: frozenset(owners_of(owners)) for key, owners in table.items()}

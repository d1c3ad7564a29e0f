"""The record index: what the cluster zone holds, per service, updated per changed service.

Built from snapshots of :mod:`kubeport.endpoints`; pure (no I/O, no clock: ``now`` is an
argument). Each service becomes a frozen :class:`ServiceRecords` cut down to what DNS
reads; reverse maps (IP -> names) and the per-namespace address sets used by
``pods verified`` are maintained incrementally from the old and new records of each
changed service, so an update costs what the change costs.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping

from kubeport.endpoints.types import EndpointInfo, ServiceInfo, ServiceName, ServiceState, Snapshot

from .names import endpoint_name

#: Port of a service or slice that declares no ports (CoreDNS's -1 sentinel): it gives
#: address records but no SRV.
NO_PORT = -1


@dataclass(frozen=True, slots=True)
class PortRecord:
    name: str  # "" when unnamed
    protocol: str  # lowercase
    port: int  # NO_PORT for the sentinel


NO_PORTS = (PortRecord("", "", NO_PORT),)


@dataclass(frozen=True, slots=True)
class EndpointRecord:
    address: str  # canonical IP
    name: str  # the endpoint's DNS label (hostname, pod name or dashed address)


@dataclass(frozen=True, slots=True)
class SliceRecords:
    """The ready endpoints of one EndpointSlice with its ports (CoreDNS reads slices as
    separate Endpoints objects; the SRV weight counts candidates per slice)."""

    ports: tuple[PortRecord, ...]
    endpoints: tuple[EndpointRecord, ...]


@dataclass(frozen=True, slots=True)
class ServiceRecords:
    name: ServiceName
    kind: str  # ClusterIP (also NodePort/LoadBalancer) | Headless | ExternalName
    cluster_ips: tuple[str, ...] = ()
    ports: tuple[PortRecord, ...] = NO_PORTS
    #: the CNAME target without trailing dot; None for an IP-valued externalName (NXDOMAIN)
    external_target: str | None = None
    #: only slices with at least one ready endpoint
    slices: tuple[SliceRecords, ...] = ()
    #: every endpoint address of the service, ready or not (``pods verified``)
    pod_addresses: frozenset[str] = frozenset()

    @property
    def fqdn_labels(self) -> tuple[str, ...]:
        return (self.name.name, self.name.namespace, "svc")


def dns_ready(service: ServiceInfo, endpoint: EndpointInfo) -> bool:
    """Whether DNS publishes an endpoint: its ``ready`` condition (CoreDNS reads nothing else).

    The one rule for publishNotReadyAddresses: the EndpointSlice controller writes
    ``ready = publishNotReadyAddresses || (podReady && !terminating)``
    (staging/src/k8s.io/endpointslice/utils.go podToEndpoint). From a kube-apiserver that
    is already in ``ready``; in manifest mode nobody runs the controller, so a service that
    publishes not-ready addresses has every endpoint counted as ready here — the value the
    controller would have written. Both sources thus give the same answer.
    """
    return endpoint.ready or service.publish_not_ready_addresses


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def service_records(state: ServiceState, endpoint_pod_names: bool) -> ServiceRecords:
    info = state.service
    if info.type == "ExternalName":
        target = (info.external_name or "").rstrip(".")
        # An IP-valued externalName makes no record (coredns#2324): the name is NXDOMAIN.
        return ServiceRecords(info.name, "ExternalName",
                              external_target=None if not target or _is_ip(target) else target.lower())
    slices: list[SliceRecords] = []
    pod_addresses: set[str] = set()
    for slice_ in state.slices:
        if slice_.address_type == "FQDN":
            continue  # deprecated, never written by the controller; CoreDNS would make CNAMEs
        endpoints = []
        for endpoint in slice_.endpoints:
            if not _is_ip(endpoint.address):
                continue
            pod_addresses.add(endpoint.address)
            if dns_ready(info, endpoint):
                name = endpoint_name(endpoint.address, endpoint.hostname, endpoint.pod_name, endpoint_pod_names)
                endpoints.append(EndpointRecord(endpoint.address, name))
        if endpoints:
            ports = tuple(PortRecord(p.name, p.protocol.lower(), p.port) for p in slice_.ports or ())
            slices.append(SliceRecords(ports or NO_PORTS, tuple(endpoints)))
    ports = tuple(PortRecord(p.name, p.protocol.lower(), p.port) for p in info.ports)
    return ServiceRecords(
        name=info.name,
        kind="Headless" if info.headless else "ClusterIP",
        cluster_ips=() if info.headless else info.cluster_ips,
        ports=ports or NO_PORTS,
        slices=tuple(slices),
        pod_addresses=frozenset(pod_addresses),
    )


@dataclass(frozen=True, slots=True)
class IndexChange:
    """What an update changed, for cache invalidation."""

    services: frozenset[ServiceName] = frozenset()
    namespaces: bool = False
    synced: bool = False

    def __bool__(self) -> bool:
        return bool(self.services) or self.namespaces or self.synced


class RecordIndex:
    """Services by (namespace, name), reverse maps, namespaces, sync state, SOA serial."""

    def __init__(self, zone: str = "cluster.local", *, endpoint_pod_names: bool = False, now: float = 0.0):
        self.zone = zone.rstrip(".").lower()
        self.zone_labels = tuple(self.zone.split("."))
        self.endpoint_pod_names = endpoint_pod_names
        self.services: dict[ServiceName, ServiceRecords] = {}
        self.namespaces: frozenset[str] = frozenset()
        self.synced = False
        #: unix time (seconds) of the last DNS-relevant change, like CoreDNS
        self.serial = int(now)
        #: ClusterIP -> services that have it (normally one)
        self.cluster_ip_owners: dict[str, set[ServiceName]] = {}
        #: ready endpoint IP -> service -> endpoint names
        self.endpoint_owners: dict[str, dict[ServiceName, frozenset[str]]] = {}
        #: namespace -> endpoint addresses of any readiness (``pods verified``)
        self.pod_addresses: dict[str, Counter[str]] = {}

    @classmethod
    def build(cls, snapshot: Snapshot, *, zone: str = "cluster.local", endpoint_pod_names: bool = False,
              now: float = 0.0) -> "RecordIndex":
        index = cls(zone, endpoint_pod_names=endpoint_pod_names, now=now)
        index.apply(snapshot, None, now=now)
        return index

    def apply(self, snapshot: Snapshot, changed: Iterable[ServiceName] | None, *, now: float) -> IndexChange:
        """Bring the index to ``snapshot``; ``changed`` None means every service."""
        names = set(snapshot.services) | set(self.services) if changed is None else changed
        touched = set()
        for name in names:
            state = snapshot.services.get(name)
            new = service_records(state, self.endpoint_pod_names) if state is not None else None
            if self._replace(name, self.services.get(name), new):
                touched.add(name)
        change = IndexChange(
            services=frozenset(touched),
            namespaces=snapshot.namespaces != self.namespaces,
            synced=snapshot.synced != self.synced,
        )
        self.namespaces = snapshot.namespaces
        self.synced = snapshot.synced
        if change:
            self.serial = int(now)
        return change

    def _replace(self, name: ServiceName, old: ServiceRecords | None, new: ServiceRecords | None) -> bool:
        if old == new:
            return False
        if old is not None:
            self._unindex(old)
            del self.services[name]
        if new is not None:
            self.services[name] = new
            self._index(new)
        return True

    def _index(self, records: ServiceRecords) -> None:
        for ip in records.cluster_ips:
            self.cluster_ip_owners.setdefault(ip, set()).add(records.name)
        for ip, names in _endpoint_names(records).items():
            self.endpoint_owners.setdefault(ip, {})[records.name] = names
        if records.pod_addresses:
            self.pod_addresses.setdefault(records.name.namespace, Counter()).update(records.pod_addresses)

    def _unindex(self, records: ServiceRecords) -> None:
        for ip in records.cluster_ips:
            owners = self.cluster_ip_owners[ip]
            owners.discard(records.name)
            if not owners:
                del self.cluster_ip_owners[ip]
        for ip in _endpoint_names(records):
            by_service = self.endpoint_owners[ip]
            del by_service[records.name]
            if not by_service:
                del self.endpoint_owners[ip]
        if records.pod_addresses:
            counter = self.pod_addresses[records.name.namespace]
            counter.subtract(records.pod_addresses)
            for address in records.pod_addresses:
                if counter[address] <= 0:
                    del counter[address]
            if not counter:
                del self.pod_addresses[records.name.namespace]

    # --- reading -----------------------------------------------------------------

    def service(self, namespace: str, name: str) -> ServiceRecords | None:
        return self.services.get(ServiceName(namespace, name))

    def ptr_targets(self, address: str) -> list[tuple[str, ...]]:
        """Names (as label tuples, zone excluded) that an IP points back to (CoreDNS
        serviceRecordForIP): the service owning it as ClusterIP, else every ready endpoint
        with that address, one name per (service, endpoint name)."""
        owners = self.cluster_ip_owners.get(address)
        if owners:
            first = min(owners)
            return [(first.name, first.namespace, "svc")]
        targets = []
        for service, names in sorted(self.endpoint_owners.get(address, {}).items()):
            for name in sorted(names):
                targets.append((name, service.name, service.namespace, "svc"))
        return targets

    def knows_pod(self, namespace: str, address: str) -> bool:
        return address in self.pod_addresses.get(namespace, ())

    def dump(self) -> Mapping[str, object]:
        """Everything but the serial, normalised for comparisons (incremental == rebuilt)."""
        return {
            "services": dict(self.services),
            "namespaces": self.namespaces,
            "synced": self.synced,
            "cluster_ip_owners": {ip: frozenset(names) for ip, names in self.cluster_ip_owners.items()},
            "endpoint_owners": self.endpoint_owners,
            "pod_addresses": {ns: dict(counter) for ns, counter in self.pod_addresses.items()},
        }


def _endpoint_names(records: ServiceRecords) -> dict[str, frozenset[str]]:
    names: dict[str, set[str]] = {}
    for slice_ in records.slices:
        for endpoint in slice_.endpoints:
            names.setdefault(endpoint.address, set()).add(endpoint.name)
    return {ip: frozenset(found) for ip, found in names.items()}

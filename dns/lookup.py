"""Answers for names in the cluster zone, as CoreDNS's kubernetes plugin gives them. Pure.

Follows ``plugin/kubernetes/{handler,kubernetes,parse}.go`` and ``plugin/backend_lookup.go``:
``services()`` is CoreDNS's Services/Records/findServices/findPods (a list of candidates or
NoSuchName), and one method per qtype builds the records from the candidates. The result
also says what the answer depends on, so the encoded-answer cache can keep answers of
services that did not change.

One deliberate difference: an NS query at the apex is answered whatever its letter case
(CoreDNS compares a lowercased name to the query-cased zone and answers NODATA for
``Cluster.local. NS``; DNS names are case-insensitive, RFC 4343).
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field

from dnslib import QTYPE

from kubeport.dns.encode import Record, address_record, same_name, soa_data, srv_record, txt_data
from kubeport.dns.names import POD, InvalidName, Request, match, parse_request, pod_address
from kubeport.dns.records import NO_PORT, NO_PORTS, RecordIndex, ServiceRecords
from kubeport.dns.wire import NOERROR, NXDOMAIN, SERVFAIL, T_A, T_AAAA, T_CNAME, T_NS, T_PTR, T_SOA, T_SRV, T_TXT
from kubeport.endpoints.types import ServiceName

DNS_SCHEMA_VERSION = "1.1.0"  # kubernetes/dns docs/specification.md
DNS_VERSION_TTL = 28800
MAX_CNAME_CHAIN = 7  # CoreDNS: "len(previousRecords) > 7" stops chasing



class NoSuchName(Exception):
    """CoreDNS's errNoItems/errInvalidRequest/errNsNotExposed: the answer is NXDOMAIN."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """CoreDNS's msg.Service: an address (with port and SRV target) or a CNAME target."""

    host: str
    port: int = NO_PORT
    #: owner labels of SRV targets and glue, without the zone
    target: tuple[str, ...] = ()
    cname: bool = False


@dataclass(slots=True)
class Resolution:
    rcode: int = NOERROR
    answer: list[Record] = field(default_factory=list)
    additional: list[Record] = field(default_factory=list)
    #: SOA in the authority section (every NXDOMAIN, NODATA and SERVFAIL)
    negative: bool = False
    #: the authority section as given (an upstream answer relayed), instead of the zone's SOA
    authority: list[Record] | None = None
    #: AA: the cluster zone's answers; False for an upstream's
    authoritative: bool = True
    #: services the answer depends on; None: it may change with any change (volatile)
    deps: set[ServiceName] | None = field(default_factory=set)
    #: an ExternalName chain leaving the zone: ask upstream for this name, put ``answer``
    #: (the CNAMEs) first
    forward: str | None = None
    #: the zone whose SOA a negative answer carries, when not the cluster zone (a reverse zone)
    soa_zone: tuple[bytes, ...] | None = None
    #: the name does not exist (CoreDNS IsNameError): what ``fallthrough`` hands upstream
    name_error: bool = False


def _labels(text: str) -> tuple[bytes, ...]:
    return tuple(label.encode() for label in text.rstrip(".").split(".") if label)


def soa_record(index: RecordIndex, zone: tuple[bytes, ...], ttl: int) -> Record:
    """``<zone>. min(ttl,300) IN SOA ns.dns.<zone>. hostmaster.<zone>. <serial> 7200 1800 86400 <ttl>``,
    the zone spelled as in the query (CoreDNS plugin.SOA)."""
    data = soa_data((b"ns", b"dns") + zone, (b"hostmaster",) + zone, index.serial, 7200, 1800, 86400, ttl)
    return Record(zone, T_SOA, min(ttl, 300), data)


class Lookup:
    """One question about the cluster zone."""

    def __init__(self, index: RecordIndex, *, ttl: int, pods: str, local_addresses: tuple[str, ...],
                 labels: tuple[bytes, ...], lower: tuple[str, ...] | None = None,
                 ignore_empty_service: bool = False):
        """``lower``: the labels lowercased as text, when the caller has them already.
        ``ignore_empty_service``: CoreDNS ``ignore empty_service``."""
        self.index = index
        self.ignore_empty_service = ignore_empty_service
        self.ttl = ttl
        self.pods = pods
        self.local_addresses = local_addresses
        self.qname = labels
        self.lower = lower if lower is not None else tuple(label.lower().decode("latin-1") for label in labels)
        zone_length = len(index.zone_labels)
        self.zone = labels[len(labels) - zone_length :]
        self.result = Resolution()

    def resolve(self, qtype: int) -> Resolution:
        result = self.result
        base = self.lower[: len(self.lower) - len(self.zone)]
        try:
            if qtype in (T_A, T_AAAA):
                result.answer, result.forward = self._addresses(self.qname, base, qtype, [])
            elif qtype == T_TXT:
                result.answer = self._txt(base)
            elif qtype == T_CNAME:
                result.answer = self._cname(base)
            elif qtype == T_SRV:
                result.answer, result.additional = self._srv(base)
            elif qtype == T_SOA:
                if not base:
                    result.answer = [soa_record(self.index, self.zone, self.ttl)]
                    result.deps = None
            elif qtype == T_NS and not base:
                result.answer, result.additional = self._ns()
            elif qtype == T_PTR:
                self._records(base)  # a forward name has no PTR: NODATA or NXDOMAIN
            else:
                self._services(base, T_A)  # CoreDNS's fake A lookup: NODATA or NXDOMAIN
        except NoSuchName:
            # Before the first sync a missing name may only be missing from what is known so
            # far: SERVFAIL (with SOA), while what is known answers (CoreDNS handler.go:
            # IsNameError && !HasSynced).
            result.rcode = NXDOMAIN if self.index.synced else SERVFAIL
            result.name_error = True
            result.answer, result.additional, result.forward = [], [], None
        if not result.answer and result.forward is None:
            result.negative = True
            result.deps = None  # the SOA serial changes with every change
        return result

    # --- candidates (CoreDNS Services / Records / findServices / findPods) -----------

    def _services(self, base: tuple[str, ...], qtype: int) -> list[Candidate]:
        if base == ("ns", "dns"):
            self.result.deps = None
            family = {T_A: 4, T_AAAA: 6}.get(qtype)
            return [c for c in self._ns_candidates(base) if ipaddress.ip_address(c.host).version == family]
        candidates = self._records(base)
        if qtype == T_SRV:
            return [c for c in candidates if not c.cname]
        return candidates

    def _records(self, base: tuple[str, ...]) -> list[Candidate]:
        try:
            request = parse_request(base)
        except InvalidName:
            raise NoSuchName from None
        if not request.pod_or_svc:
            return []
        if request.namespace not in self.index.namespaces:
            raise NoSuchName
        if request.pod_or_svc == POD:
            return self._pods(request)
        return self._find_services(request)

    def _find_services(self, request: Request) -> list[Candidate]:
        if not request.service:
            return []  # <ns>.svc.<zone>: an existing namespace is NODATA
        name = ServiceName(request.namespace, request.service)
        if self.result.deps is not None:
            self.result.deps.add(name)
        service = self.index.services.get(name)
        if service is None:
            raise NoSuchName
        if service.kind == "ExternalName":
            # Nothing lives below an ExternalName, not even _port._proto (coredns #5734, #6162).
            if request.endpoint or request.port or request.protocol or service.external_target is None:
                raise NoSuchName
            return [Candidate(service.external_target, cname=True)]
        if self.ignore_empty_service and service.kind == "ClusterIP" and not service.slices:
            raise NoSuchName  # kubernetes.go findServices: no ready address in any slice
        if service.kind == "Headless" or request.endpoint:
            found = self._endpoint_candidates(service, request)
        else:
            found = self._cluster_ip_candidates(service, request)
        if found is None:
            raise NoSuchName
        return found

    def _endpoint_candidates(self, service: ServiceRecords, request: Request) -> list[Candidate] | None:
        found = []
        label = self.index.endpoint_label
        for slice_ in service.slices:
            ports = slice_.ports or NO_PORTS
            for endpoint in slice_.endpoints:
                name = label(endpoint)
                if request.endpoint and request.endpoint != name:
                    continue
                target = (name,) + service.fqdn_labels
                for port in ports:
                    if match(request.port, port.name) and match(request.protocol, port.protocol):
                        found.append(Candidate(endpoint.address, port.port, target))
        return found or None

    def _cluster_ip_candidates(self, service: ServiceRecords, request: Request) -> list[Candidate] | None:
        found: list[Candidate] | None = None
        for port in service.ports:
            if match(request.port, port.name) and match(request.protocol, port.protocol):
                found = found or []  # a matching port makes the name exist, IPs or not
                found.extend(Candidate(ip, port.port, service.fqdn_labels) for ip in service.cluster_ips)
        return found

    def _pods(self, request: Request) -> list[Candidate]:
        if self.pods == "disabled":
            raise NoSuchName
        if not request.service:
            return []  # <ns>.pod.<zone>
        address = pod_address(request.service)
        if self.pods == "insecure":
            try:
                return [Candidate(str(ipaddress.ip_address(address)))]
            except ValueError:
                raise NoSuchName from None
        self.result.deps = None
        if not self.index.knows_pod(request.namespace, address):
            raise NoSuchName
        return [Candidate(address)]

    def _ns_candidates(self, base: tuple[str, ...]) -> list[Candidate]:
        """CoreDNS nsAddrs: our own (non-loopback) addresses, named after the service they
        belong to (as an endpoint, or — for a node-local server on the kube-dns IP — as its
        ClusterIP), else ``ns.dns.<zone>``."""
        found: list[Candidate] = []
        local = [a for a in self.local_addresses if not _loopback(a)]
        index = self.index
        for address in local:
            owners = index.cluster_ip_services(address)
            if owners:
                service = index.services[owners[0]]
                found.extend(Candidate(ip, target=service.fqdn_labels) for ip in service.cluster_ips)
                continue
            services = [index.services[owner] for owner in index.endpoint_services(address)]
            if not services:  # a Service of a namespace not served (``namespaces``) still names us
                outside = index.outside_owners(address)
                owner = next((s for s in outside if address in s.cluster_ips), None)
                if owner is not None:
                    found.extend(Candidate(ip, target=owner.fqdn_labels) for ip in owner.cluster_ips)
                    continue
                services = list(outside)
            for service in services:
                if service.kind == "Headless":
                    found.extend(Candidate(address, target=(n,) + service.fqdn_labels)
                                 for n in index.endpoint_labels(service, address))
                else:
                    found.extend(Candidate(ip, target=service.fqdn_labels) for ip in service.cluster_ips)
        if found:
            return found
        return [Candidate(address, target=("ns", "dns")) for address in local]

    # --- records per qtype (CoreDNS plugin/backend_lookup.go) -----------------------

    def _addresses(self, qname: tuple[bytes, ...], base: tuple[str, ...], qtype: int,
                   previous: list[Record]) -> tuple[list[Record], str | None]:
        """CoreDNS A()/AAAA(): addresses of the family, CNAMEs chased in the zone; a CNAME
        leaving the zone returns (the CNAME chain, the target to ask upstream)."""
        records: list[Record] = []
        seen: set[str] = set()
        family = 4 if qtype == T_A else 6
        lower_qname = tuple(label.lower() for label in qname)
        for candidate in self._services(base, qtype):
            if candidate.cname:
                target = _labels(candidate.host)
                if target[len(target) - len(lower_qname):] == lower_qname:
                    continue  # x CNAME x (or below x) is a direct loop
                if len(previous) > MAX_CNAME_CHAIN:
                    continue
                cname = Record(qname, T_CNAME, self.ttl, (target,))
                if any(_same_cname(cname, held) for held in previous):
                    continue
                zone = tuple(label.lower() for label in self.zone)
                if target[len(target) - len(zone):] != zone:
                    return [cname], candidate.host
                inner_base = tuple(label.decode("latin-1") for label in target[: len(target) - len(zone)])
                try:
                    inner, forward = self._addresses(target, inner_base, qtype, previous + [cname])
                except NoSuchName:
                    continue
                if forward is not None:
                    return [cname] + inner, forward
                if inner:
                    records += [cname] + inner
                continue
            host = candidate.host  # canonical (records.py): ":" tells the family
            if (":" in host) == (family == 6) and host not in seen:
                seen.add(host)
                records.append(address_record(qname, host, self.ttl))
        return records, None

    def _txt(self, base: tuple[str, ...]) -> list[Record]:
        if base == ("dns-version",):
            return [Record(self.qname, T_TXT, DNS_VERSION_TTL, txt_data(DNS_SCHEMA_VERSION.encode()))]
        try:
            exists = bool(self._records(base))
        except NoSuchName:
            exists = False
        if not exists:
            raise NoSuchName  # even on the apex and <ns>.svc (CoreDNS's TXT quirk)
        return []

    def _cname(self, base: tuple[str, ...]) -> list[Record]:
        candidates = self._services(base, T_CNAME)
        if candidates and candidates[0].cname:
            return [Record(self.qname, T_CNAME, self.ttl, (_labels(candidates[0].host),))]
        return []

    def _srv(self, base: tuple[str, ...]) -> tuple[list[Record], list[Record]]:
        """CoreDNS SRV(): priority 0, weight floor(100/N) over every candidate before
        de-duplication, SRV de-duplicated on (target, port), glue on (target, address)."""
        candidates = self._services(base, T_SRV)
        if not candidates:
            return [], []
        weight = max(1, math.floor(100.0 / (100 * len(candidates)) * 100))
        records: list[Record] = []
        extra: list[Record] = []
        seen: set[tuple[tuple[str, ...], str | int]] = set()
        for candidate in candidates:
            if candidate.port == NO_PORT:
                continue
            target = tuple(t.encode() for t in candidate.target) + self.zone
            if (candidate.target, candidate.port) not in seen:
                seen.add((candidate.target, candidate.port))
                records.append(srv_record(self.qname, self.ttl, 0, weight, candidate.port, target))
            if (candidate.target, candidate.host) not in seen:
                seen.add((candidate.target, candidate.host))
                extra.append(address_record(target, candidate.host, self.ttl))
        return records, extra

    def _ns(self) -> tuple[list[Record], list[Record]]:
        self.result.deps = None
        records: list[Record] = []
        extra: list[Record] = []
        names: set[tuple[str, ...]] = set()
        for candidate in self._ns_candidates(()):
            target = tuple(t.encode() for t in candidate.target) + self.zone
            extra.append(address_record(target, candidate.host, self.ttl))
            if candidate.target not in names:
                names.add(candidate.target)
                records.append(Record(self.qname, T_NS, self.ttl, (target,)))
        if not records:  # no routable address of ours: still name the zone's server
            records.append(Record(self.qname, T_NS, self.ttl, ((b"ns", b"dns") + self.zone,)))
        return records, extra


def reverse_records(index: RecordIndex, qname: tuple[bytes, ...], address: str, ttl: int) -> list[Record]:
    """PTR records for an IP (CoreDNS PTR/serviceRecordForIP), targets in the primary zone."""
    zone = tuple(label.encode() for label in index.zone_labels)
    return [Record(qname, T_PTR, ttl, (tuple(t.encode() for t in target) + zone,))
            for target in index.ptr_targets(address)]


def _same_cname(a: Record, b: Record) -> bool:
    return (b.rtype == T_CNAME and same_name(a.owner, b.owner)
            and same_name(a.data[0], b.data[0]))  # type: ignore[arg-type]


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or ip.is_unspecified


QTYPE_NAMES: dict[int, str] = {}


def qtype_name(qtype: int) -> str:
    name = QTYPE_NAMES.get(qtype)
    if name is None:
        name = QTYPE_NAMES[qtype] = str(QTYPE.get(qtype, f"TYPE{qtype}"))
    return name

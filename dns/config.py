"""Configuration of the cluster DNS server, validated once at construction."""

from __future__ import annotations

import ipaddress
import logging
import os
import re
from dataclasses import dataclass, replace
from typing import Iterable, Literal, Mapping

from kubeport.dns.names import REVERSE_ZONES, ZoneError, zone_labels
from kubeport.dns.selectors import Selector, SelectorError, parse_selector

log = logging.getLogger(__name__)

PodsMode = Literal["disabled", "insecure", "verified"]
PODS_MODES = ("disabled", "insecure", "verified")

Upstream = tuple[str, int]

#: a namespace name: an RFC 1123 label (k8s.io/apimachinery validation IsDNS1123Label)
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class DnsConfigError(ValueError):
    """A DnsConfig field has an invalid value; the message names the field."""


@dataclass(frozen=True, slots=True)
class DnsConfig:
    #: The cluster domain (``--cluster-domain``), without trailing dot; matched case-insensitively.
    zone: str = "cluster.local"
    #: TTL of every record the server makes (CoreDNS ``ttl``, default 5, 0..3600);
    #: ``dns-version`` is always 28800.
    ttl: int = 5
    #: CoreDNS ``pods``: disabled (NXDOMAIN), insecure (decode the IP from the label) or
    #: verified (only addresses known from EndpointSlices in that namespace).
    pods: PodsMode = "disabled"
    #: CoreDNS ``endpoint_pod_names``: name endpoints without hostname after their pod.
    endpoint_pod_names: bool = False
    #: CoreDNS ``namespaces``: serve only these namespaces (empty: every namespace).
    namespaces: tuple[str, ...] = ()
    #: CoreDNS ``labels``: a label selector; only the Services it matches are served ("": all).
    labels: str = ""
    #: CoreDNS ``namespace_labels``: only the namespaces whose Namespace object it matches ("": all).
    namespace_labels: str = ""
    #: CoreDNS ``noendpoints``: no endpoint records (headless services and endpoint names NXDOMAIN).
    noendpoints: bool = False
    #: CoreDNS ``ignore empty_service``: a ClusterIP service without ready endpoints is NXDOMAIN.
    ignore_empty_service: bool = False
    #: CoreDNS ``autopath @kubernetes``: a query for ``name.<ns>.svc.<zone>`` from a Pod of
    #: namespace ``ns`` walks the pod's search path here and is answered with a CNAME to the
    #: first name found (:mod:`.autopath`).
    autopath: bool = False
    #: the search domains after the cluster's three in a pod's resolv.conf (CoreDNS reads its
    #: host's /etc/resolv.conf); None: the ``search`` line of the host's /etc/resolv.conf.
    autopath_search: tuple[str, ...] | None = None
    #: The reverse zones of CoreDNS ``kubernetes <zone> [ZONES...]``, as names or CIDRs: PTR
    #: records are answered in these and nowhere else (names outside them are forwarded).
    reverse_zones: tuple[str, ...] = ("in-addr.arpa", "ip6.arpa")
    #: CoreDNS ``fallthrough [ZONES...]``: a name the cluster does not know in these zones is
    #: forwarded instead of NXDOMAIN; ``.`` is every zone, empty none.
    fallthrough: tuple[str, ...] = ("in-addr.arpa", "ip6.arpa")
    #: (ip, port) of the upstream resolvers for names outside the cluster zone, asked in a
    #: random order per query (CoreDNS forward ``policy random``), those down skipped.
    #: None: the host's /etc/resolv.conf, see :func:`default_upstreams`.
    upstreams: tuple[Upstream, ...] | None = None
    #: Stub domains: (zone, its upstreams) sorted by zone, a name under a zone forwarded to
    #: that zone's upstreams instead (the longest zone wins), as a CoreDNS server block per
    #: zone with its own ``forward`` and ``cache`` (what NodeLocal DNSCache writes for the
    #: kube-dns ConfigMap's ``stubDomains``, kubernetes/dns cmd/node-cache/app/configmap.go
    #: getStubDomainStr). A mapping zone -> ["IP[:PORT]", ...] is accepted and normalized.
    stub_domains: tuple[tuple[str, tuple[Upstream, ...]], ...] = ()
    #: Addresses to listen on, UDP and TCP (already local addresses of the node).
    addresses: tuple[str, ...] = ("10.96.0.10",)
    #: Port on every address; 0 picks one free port (tests), the same for every listener.
    port: int = 53
    #: Seconds a TCP connection may stay idle (no query, nothing pending) before it is closed.
    tcp_idle_timeout: float = 10.0
    #: Seconds a TCP client has to deliver the rest of a message it began (miekg/dns's read
    #: timeout, dnsTimeout): a client trickling bytes is closed, not kept by its trickle.
    tcp_read_timeout: float = 2.0
    #: Concurrent TCP connections; at the cap the one idle longest is closed for a new one,
    #: and when none is idle the new one is closed at once.
    max_tcp_connections: int = 1000
    #: Concurrent TCP connections from one client address: one pod cannot take the cap.
    max_tcp_connections_per_client: int = 100
    #: Seconds to wait for one try before asking the next upstream (CoreDNS read_timeout); a
    #: query is tried again, over every upstream in turn, until 5 s have passed.
    upstream_timeout: float = 2.0
    #: Forwarded queries in flight; beyond this, REFUSED (CoreDNS forward ``max_concurrent``).
    max_concurrent_forwards: int = 1000
    #: Seconds an idle TCP connection to an upstream may wait to be reused (CoreDNS forward ``expire``).
    upstream_expire: float = 10.0
    #: Entries of the upstream answer cache (CoreDNS cache: 9984).
    cache_size: int = 9984
    #: TTL caps of cached upstream answers: positive, and negative (NXDOMAIN/NODATA).
    cache_max_ttl: int = 3600
    cache_max_negative_ttl: int = 1800
    #: CoreDNS cache ``serve_stale DURATION``: seconds an upstream answer may be served past
    #: its TTL (with TTL 0) while upstreams fail; 0: never.
    serve_stale: float = 0.0
    #: CoreDNS ``serve_stale`` REFRESH_MODE: ``immediate`` answers stale at once and refreshes
    #: in the background; ``verify`` asks upstream first and answers stale only if that fails.
    serve_stale_refresh: Literal["immediate", "verify"] = "immediate"
    #: CoreDNS cache ``prefetch AMOUNT [DURATION] [PERCENTAGE%]``: an upstream answer asked
    #: ``prefetch`` times within ``prefetch_duration`` seconds once its TTL left is down to
    #: ``prefetch_percentage`` % is refreshed before it expires; 0: never.
    prefetch: int = 0
    prefetch_duration: float = 60.0
    prefetch_percentage: int = 10
    #: Entries of the cache of encoded cluster answers (cleared when full).
    answer_cache_size: int = 100_000
    #: UDP payload size this server advertises in its OPT record (DNS flag day 2020).
    edns_udp_size: int = 1232

    def __post_init__(self) -> None:
        zone = self.zone.strip().rstrip(".").lower()
        if not zone or any(not label or len(label) > 63 for label in zone.split(".")):
            raise DnsConfigError(f"DnsConfig.zone: {self.zone!r} is not a domain name")
        object.__setattr__(self, "zone", zone)
        if not 0 <= self.ttl <= 3600:
            raise DnsConfigError(f"DnsConfig.ttl: {self.ttl} is outside 0..3600")
        if self.pods not in PODS_MODES:
            raise DnsConfigError(f"DnsConfig.pods: {self.pods!r} is not one of {', '.join(PODS_MODES)}")
        object.__setattr__(self, "namespaces", tuple(self.namespaces))
        for namespace in self.namespaces:
            if len(namespace) > 63 or not _DNS_LABEL.fullmatch(namespace):
                raise DnsConfigError(f"DnsConfig.namespaces: {namespace!r} is not a namespace name")
        object.__setattr__(self, "reverse_zones", tuple(self.reverse_zones))
        for name in ("labels", "namespace_labels"):
            try:
                parse_selector(getattr(self, name))
            except SelectorError as error:
                raise DnsConfigError(f"DnsConfig.{name}: {error}") from None
        if self.autopath_search is not None:
            search = tuple(domain.strip().rstrip(".").lower() for domain in self.autopath_search)
            for domain in search:
                if not domain or any(not label or len(label) > 63 for label in domain.split(".")):
                    raise DnsConfigError(f"DnsConfig.autopath_search: {domain!r} is not a domain name")
            object.__setattr__(self, "autopath_search", search)
        object.__setattr__(self, "fallthrough", tuple(self.fallthrough))
        if any(zone[-2:] not in REVERSE_ZONES for zone in _zones(self.reverse_zones, "DnsConfig.reverse_zones")):
            raise DnsConfigError(f"DnsConfig.reverse_zones: {', '.join(self.reverse_zones)}: a reverse zone is "
                                 "in-addr.arpa or ip6.arpa, or a CIDR")
        _zones(self.fallthrough, "DnsConfig.fallthrough")
        if self.upstreams is not None:
            object.__setattr__(self, "upstreams", tuple(_upstream(u) for u in self.upstreams))
        object.__setattr__(self, "stub_domains", _stub_domains(self.stub_domains, zone))
        addresses = tuple(self.addresses)
        for address in addresses:
            _ip(address, "DnsConfig.addresses")
        if not addresses:
            raise DnsConfigError("DnsConfig.addresses: at least one address is needed")
        object.__setattr__(self, "addresses", tuple(str(ipaddress.ip_address(a)) for a in addresses))
        if not 0 <= self.port <= 65535:
            raise DnsConfigError(f"DnsConfig.port: {self.port} is outside 0..65535")
        for name in ("tcp_idle_timeout", "tcp_read_timeout", "upstream_timeout", "upstream_expire"):
            if getattr(self, name) <= 0:
                raise DnsConfigError(f"DnsConfig.{name}: must be > 0")
        for name in ("max_tcp_connections", "max_tcp_connections_per_client", "max_concurrent_forwards",
                     "answer_cache_size"):
            if getattr(self, name) < 1:
                raise DnsConfigError(f"DnsConfig.{name}: must be >= 1")
        for name in ("cache_size", "cache_max_ttl", "cache_max_negative_ttl"):
            if getattr(self, name) < 0:
                raise DnsConfigError(f"DnsConfig.{name}: must be >= 0")
        if self.prefetch < 0:
            raise DnsConfigError(f"DnsConfig.prefetch: {self.prefetch} must be >= 0")
        if self.prefetch_duration <= 0:
            raise DnsConfigError(f"DnsConfig.prefetch_duration: {self.prefetch_duration} must be > 0")
        if not 10 <= self.prefetch_percentage <= 90:
            raise DnsConfigError(f"DnsConfig.prefetch_percentage: {self.prefetch_percentage} is outside 10..90")
        if self.serve_stale < 0:
            raise DnsConfigError(f"DnsConfig.serve_stale: {self.serve_stale} must be >= 0")
        if self.serve_stale_refresh not in ("immediate", "verify"):
            raise DnsConfigError(f"DnsConfig.serve_stale_refresh: {self.serve_stale_refresh!r} is not immediate "
                                 "or verify")
        if not 512 <= self.edns_udp_size <= 65535:
            raise DnsConfigError(f"DnsConfig.edns_udp_size: {self.edns_udp_size} is outside 512..65535")

    @property
    def label_selector(self) -> Selector | None:
        return parse_selector(self.labels) if self.labels.strip() else None

    @property
    def namespace_selector(self) -> Selector | None:
        return parse_selector(self.namespace_labels) if self.namespace_labels.strip() else None

    @property
    def reverse_zone_labels(self) -> tuple[tuple[str, ...], ...]:
        return _zones(self.reverse_zones, "DnsConfig.reverse_zones")

    @property
    def fallthrough_labels(self) -> tuple[tuple[str, ...], ...]:
        return _zones(self.fallthrough, "DnsConfig.fallthrough")

    def with_changes(self, **changes: object) -> "DnsConfig":
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_settings(cls, settings: Mapping[str, object], *, addresses: Iterable[str]) -> "DnsConfig":
        """The server's configuration from the configuration file's and flags' ``dns`` section
        (kubeport.config.DnsSettings, as ``dict(settings)``): each setting goes to the field of
        its name (:data:`SETTING_FIELDS` for those named otherwise here), so an option is
        declared there and here and copied by no one. Computed: the upstreams parsed (none
        given: the host's), the listen addresses (the daemon's default), the TTL caps whole
        seconds. A setting this has no field for is a TypeError, not a silent drop."""
        values = {SETTING_FIELDS.get(name, name): value for name, value in settings.items()
                  if name not in NOT_SERVER_SETTINGS}
        upstreams = values.get("upstreams")
        values["upstreams"] = tuple(parse_upstream(u) for u in upstreams) if upstreams else None  # type: ignore[union-attr]
        if "stub_domains" in values:
            values["stub_domains"] = tuple(values["stub_domains"].items())  # type: ignore[union-attr]
        values["addresses"] = tuple(addresses)
        for name in ("cache_max_ttl", "cache_max_negative_ttl"):
            if name in values:
                values[name] = int(values[name])  # type: ignore[call-overload]
        return cls(**values)  # type: ignore[arg-type]


#: DnsSettings names (CoreDNS's, kube-proxy's) -> the DnsConfig field of another name
SETTING_FIELDS = {
    "cluster_domain": "zone",
    "cache_max_denial_ttl": "cache_max_negative_ttl",
    "serve_stale_refresh_mode": "serve_stale_refresh",
    "forward_expire": "upstream_expire",
}
#: DnsSettings the daemon uses around the server (how long it answers after SIGTERM, how long
#: it waits for the first sync before it listens) and whether it reads the kube-dns ConfigMap
#: (the shell watches it; see kubeport.dns.kubedns)
NOT_SERVER_SETTINGS = frozenset({"lame_duck", "kube_dns_config_map", "startup_timeout"})


def _stub_domains(value: object, cluster_zone: str) -> tuple[tuple[str, tuple[Upstream, ...]], ...]:
    """Normalized stub domains: zones lower-cased without the trailing dot, each once, sorted."""
    items = value.items() if isinstance(value, Mapping) else value
    found: dict[str, tuple[Upstream, ...]] = {}
    for item in items:  # type: ignore[union-attr]
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise DnsConfigError(f"DnsConfig.stub_domains: {item!r} is not (zone, servers)")
        text, servers = item
        zone = check_stub_zone(str(text), cluster_zone, "DnsConfig.stub_domains")
        if zone in found:
            raise DnsConfigError(f"DnsConfig.stub_domains: zone {zone!r} is given twice")
        if isinstance(servers, str) or not servers:
            raise DnsConfigError(f"DnsConfig.stub_domains[{zone}]: {servers!r}: a stub domain needs a list of "
                                 "at least one IP[:PORT]")
        try:
            found[zone] = tuple(dict.fromkeys(_upstream(server) for server in servers))
        except DnsConfigError as error:
            raise DnsConfigError(f"DnsConfig.stub_domains[{zone}]: {str(error).removeprefix('DnsConfig.upstreams: ')}") \
                from None
    return tuple(sorted(found.items()))


#: a domain name as kube-dns validates a stub domain (k8s.io/apimachinery validation
#: IsDNS1123Subdomain, in kubernetes/dns pkg/dns/config/config.go validateStubDomains);
#: upper case is accepted here and lowered, as DNS names compare
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_stub_zone(text: str, cluster_zone: str, field_name: str) -> str:
    """A stub domain's zone, normalized; DnsConfigError naming ``field_name`` and the value.
    The root is refused (that is the default upstreams), and so is the cluster zone or a zone
    under it (kube-dns: a stub domain cannot be the cluster domain; its names are answered
    here, never forwarded)."""
    zone = text.strip().rstrip(".").lower()
    if not zone:
        raise DnsConfigError(f"{field_name}: {text!r}: the root zone is the default upstreams' (upstreams), not a "
                             "stub domain")
    if len(zone) > 253 or not _DNS_SUBDOMAIN.fullmatch(zone) or any(len(label) > 63 for label in zone.split(".")):
        raise DnsConfigError(f"{field_name}: {text!r} is not a domain name (RFC 1123 subdomain)")
    if zone == cluster_zone or zone.endswith("." + cluster_zone):
        raise DnsConfigError(f"{field_name}: {text!r} is in the cluster zone {cluster_zone}, which is answered "
                             "here, never forwarded")
    return zone


def parse_stub_domains(text: str) -> dict[str, list[str]]:
    """The ``--dns-stub-domain`` syntax: ``ZONE=SERVER[;SERVER...][,ZONE=...]``, each SERVER an
    ``IP``, ``IP:PORT``, ``[IPv6]:PORT`` or a bare IPv6 address. ``,`` and ``;`` never occur in
    a server or a zone, so neither needs quoting. DnsConfigError names the bad part."""
    found: dict[str, list[str]] = {}
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        zone, equals, servers = entry.partition("=")
        names = [server.strip() for server in servers.split(";") if server.strip()]
        if not equals or not zone.strip() or not names:
            raise DnsConfigError(f"{entry!r}: expected ZONE=IP[:PORT][;IP[:PORT]...]")
        key = zone.strip().rstrip(".").lower()
        if key in found:
            raise DnsConfigError(f"{entry!r}: zone {key!r} is given twice")
        for name in names:
            parse_upstream(name)
        found[key] = names
    return found


def _zones(texts: Iterable[str], field_name: str) -> tuple[tuple[str, ...], ...]:
    zones: list[tuple[str, ...]] = []
    for text in texts:
        try:
            zones.extend(zone for zone in zone_labels(text) if zone not in zones)
        except ZoneError as error:
            raise DnsConfigError(f"{field_name}: {error}") from None
    return tuple(zones)


def _ip(text: str, field_name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        raise DnsConfigError(f"{field_name}: {text!r} is not an IP address") from None


def _upstream(value: object) -> Upstream:
    if isinstance(value, str):
        return parse_upstream(value)
    if isinstance(value, (tuple, list)) and len(value) == 2:
        host, port = value
        ip = _ip(str(host), "DnsConfig.upstreams")
        if not isinstance(port, int) or not 0 < port <= 65535:
            raise DnsConfigError(f"DnsConfig.upstreams: port {port!r} of {host} is outside 1..65535")
        return (str(ip), port)
    raise DnsConfigError(f"DnsConfig.upstreams: {value!r} is not (ip, port)")


def parse_upstream(text: str) -> Upstream:
    """``IP``, ``IP:PORT``, ``[IPv6]:PORT``, ``[IPv6]`` or a bare IPv6 address -> (ip, port)."""
    text = text.strip()
    host, port = text, 53
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise DnsConfigError(f"upstream {text!r}: expected [IPv6]:PORT")
            port = _port(rest[1:], text)
    elif text.count(":") == 1:
        host, port_text = text.split(":")
        port = _port(port_text, text)
    ip = _ip(host, f"upstream {text!r}")
    return (str(ip), port)


def _port(text: str, whole: str) -> int:
    if not text.isdigit() or not 0 < int(text) <= 65535:
        raise DnsConfigError(f"upstream {whole!r}: port {text!r} is outside 1..65535")
    return int(text)


#: systemd-resolved's list of the real upstream nameservers, beside its stub's resolv.conf
#: (what kubeadm gives kubelet as --resolv-conf on such hosts)
SYSTEMD_RESOLV_CONF = "/run/systemd/resolve/resolv.conf"


def default_upstreams(resolv_conf_path: str = "/etc/resolv.conf", *,
                      stub_fallback: str | None = SYSTEMD_RESOLV_CONF) -> tuple[Upstream, ...]:
    """The nameservers of a resolv.conf, port 53, skipping loopback stubs (with a warning).

    A loopback nameserver (systemd-resolved's 127.0.0.53, a local dnsmasq) would send
    pod queries back to the node's stub, which may forward to us: CoreDNS's famous
    ``loop`` crash. When the file names only such stubs, the nameservers of
    ``stub_fallback`` are used if that file exists (systemd-resolved's upstreams). A
    missing or unreadable file gives no upstreams (forwarding then answers SERVFAIL),
    logged here.
    """
    try:
        with open(resolv_conf_path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError as error:
        log.warning("dns: cannot read %s for upstream nameservers: %s", resolv_conf_path, error)
        return ()
    upstreams, stubs = nameservers(lines)
    if stubs:
        log.warning("dns: %s: skipping loopback nameservers %s: pods' queries would loop back to the "
                    "node's own stub resolver", resolv_conf_path, ", ".join(stubs))
    if not upstreams and stubs and stub_fallback and stub_fallback != resolv_conf_path:
        if os.path.exists(stub_fallback):
            log.warning("dns: %s names only a local stub; using the nameservers of %s", resolv_conf_path,
                        stub_fallback)
            return default_upstreams(stub_fallback, stub_fallback=None)
    return upstreams


def search_domains(resolv_conf_path: str = "/etc/resolv.conf") -> tuple[str, ...]:
    """The domains of a resolv.conf's last ``search`` line (the resolver's rule), lower-cased,
    without trailing dots; () when the file cannot be read."""
    try:
        with open(resolv_conf_path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return ()
    found: tuple[str, ...] = ()
    for line in lines:
        fields = line.split("#", 1)[0].split(";", 1)[0].split()
        if fields and fields[0] in ("search", "domain"):
            found = tuple(dict.fromkeys(f.rstrip(".").lower() for f in fields[1:] if f.rstrip(".")))
    return found


def nameservers(lines: Iterable[str]) -> tuple[tuple[Upstream, ...], list[str]]:
    """(usable nameservers, port 53; the loopback/unspecified ones skipped), each once."""
    found: list[Upstream] = []
    stubs: list[str] = []
    seen: set[str] = set()
    for line in lines:
        fields = line.split("#", 1)[0].split(";", 1)[0].split()
        if len(fields) < 2 or fields[0] != "nameserver":
            continue
        text = fields[1].split("%", 1)[0]  # drop an IPv6 zone index
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            continue
        if str(ip) in seen:
            continue
        seen.add(str(ip))
        if ip.is_loopback or ip.is_unspecified:
            stubs.append(str(ip))
        else:
            found.append((str(ip), 53))
    return tuple(found), stubs


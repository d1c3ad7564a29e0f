"""The DNS server's settings as the configuration file and the flags give them.

:class:`DnsSettings` is the ``dns`` section of ``KubeportConfiguration`` (kubeport.config
imports it from here): its field names are the file's keys (camelCase) and the flags'
targets, its descriptions the documentation's. :meth:`DnsConfig.from_settings` turns it
into the server's :class:`~kubeport.dns.config.DnsConfig` field by field. A new option is
a field here and one in DnsConfig (where it is validated and used), nothing else.
"""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic.alias_generators import to_camel

from kubeport.dns.config import DnsConfig, DnsConfigError, parse_stub_domains, parse_upstream
from kubeport.dns.selectors import SelectorError, parse_selector
from kubeport.lib.durations import Duration


class DnsSettings(BaseModel):
    """The ``dns`` section of the configuration file (``--dns-*`` flags override it), with
    CoreDNS kubernetes plugin names; :meth:`DnsConfig.from_settings` makes the server's
    configuration of it field by field."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    cluster_domain: str = Field("cluster.local", description="The cluster zone (CoreDNS `kubernetes <zone>`).")
    addresses: list[str] = Field(
        default_factory=list,
        description="Listen addresses; default the 10th address of the first service range (kube-dns).",
    )
    port: int = Field(53, ge=1, le=65535, description="UDP and TCP port of the DNS server.")
    upstreams: list[str] = Field(
        default_factory=list,
        description="IP[:PORT] upstream resolvers; default the host's resolv.conf minus loopback stubs.",
    )
    stub_domains: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Stub domains: zone -> IP[:PORT] upstreams asked for the names under it instead of `upstreams` "
        "(the longest zone wins), each zone with its own cache (CoreDNS `consul.local { forward . IP }`, kube-dns "
        "`stubDomains`). The flag writes `ZONE=IP[:PORT][;IP...][,ZONE=...]`.")
    kube_dns_config_map: bool = Field(
        True, description="With an API server: read `stubDomains` and `upstreamNameservers` of the ConfigMap "
        "kube-system/kube-dns and follow its changes, as NodeLocal DNSCache does; zones and upstreams given here "
        "win. A change needs a restart.")
    ttl: int = Field(5, ge=0, le=3600, description="TTL of cluster records (CoreDNS `ttl`).")
    pods: Literal["disabled", "insecure", "verified"] = Field("disabled", description="CoreDNS `pods` mode.")
    endpoint_pod_names: bool = Field(
        False, description="CoreDNS `endpoint_pod_names`: an endpoint without hostname is named after its Pod.")
    namespaces: list[str] = Field(
        default_factory=list, description="CoreDNS `namespaces`: serve only these namespaces (empty: all).")
    noendpoints: bool = Field(
        False, description="CoreDNS `noendpoints`: no endpoint records; headless Services and endpoint names are "
        "NXDOMAIN.")
    ignore_empty_service: bool = Field(
        False, description="CoreDNS `ignore empty_service`: NXDOMAIN for a ClusterIP Service without ready endpoints.")
    labels: str = Field(
        "", description="CoreDNS `labels`: a label selector (`app=web,tier!=cache`, `env in (a,b)`); only the "
        "Services it matches are served (empty: all).")
    namespace_labels: str = Field(
        "", description="CoreDNS `namespace_labels`: a label selector; only the namespaces whose Namespace object "
        "it matches are served (empty: all).")
    autopath: bool = Field(
        False, description="CoreDNS `autopath @kubernetes`: a query from a Pod for name.<its ns>.svc.<zone> is "
        "answered for the first name of its search path that exists, behind a CNAME; the Pods are this node's "
        "(API server: a Pod watch of this node).")
    reverse_zones: list[str] = Field(
        default_factory=lambda: ["in-addr.arpa", "ip6.arpa"],
        description="The reverse zones of CoreDNS `kubernetes <zone> [ZONES...]` (names or CIDRs): PTR records "
        "are answered there only.")
    fallthrough: list[str] = Field(
        default_factory=lambda: ["in-addr.arpa", "ip6.arpa"],
        description="CoreDNS `fallthrough [ZONES...]`: unknown names in these zones are forwarded instead of "
        "NXDOMAIN; `.` is every zone, empty none.")
    cache_size: int = Field(9984, ge=0, description="Entries of the upstream answer cache (CoreDNS cache size).")
    cache_max_ttl: Duration = Field(
        3600.0, ge=0, alias="cacheMaxTTL", description="Cap on TTLs of cached upstream answers.")
    cache_max_denial_ttl: Duration = Field(
        1800.0, ge=0, alias="cacheMaxDenialTTL", description="Cap on TTLs of cached negative answers.")
    serve_stale: Duration = Field(
        0.0, ge=0, description="CoreDNS cache `serve_stale DURATION`: answer from an upstream answer expired up to "
        "this long (TTL 0) while upstreams fail; 0: never (CoreDNS's DURATION default is 1h).")
    serve_stale_refresh_mode: Literal["immediate", "verify"] = Field(
        "immediate", description="CoreDNS `serve_stale` REFRESH_MODE: immediate (stale at once, refreshed behind) "
        "or verify (upstream first, stale if it fails).")
    prefetch: int = Field(
        0, ge=0, description="CoreDNS cache `prefetch AMOUNT`: refresh an upstream answer asked this many times "
        "within prefetchDuration once its TTL left is down to prefetchPercentage; 0: never.")
    prefetch_duration: Duration = Field(60.0, gt=0, description="CoreDNS `prefetch` DURATION (1m).")
    prefetch_percentage: int = Field(10, ge=10, le=90, description="CoreDNS `prefetch` PERCENTAGE (10).")
    lame_duck: Duration = Field(
        5.0, ge=0, description="Keep answering this long after SIGTERM (CoreDNS health lameduck).")
    startup_timeout: Duration = Field(
        0.0, ge=0, description="CoreDNS `kubernetes` `startup_timeout`: without a restored last applied state, "
        "DNS listens once the first sync is applied or this long after start, whichever is first; until the sync, "
        "a cluster name not known yet is answered SERVFAIL and other names forwarded. 0: listen at once (CoreDNS's default "
        "is 5s).")
    forward_expire: Duration = Field(
        10.0, gt=0, description="How long an idle TCP connection to an upstream may be reused (CoreDNS forward "
        "`expire`).")
    max_concurrent_forwards: int = Field(
        1000, ge=1, description="Forwarded queries in flight; more are answered REFUSED (CoreDNS forward "
        "`max_concurrent`).")

    @field_validator("cluster_domain")
    @classmethod
    def _strip_dot(cls, value: str) -> str:
        return value.strip(".").lower()

    @field_validator("addresses")
    @classmethod
    def _ips(cls, values: list[str]) -> list[str]:
        return [str(ipaddress.ip_address(v)) for v in values]

    @field_validator("namespaces")
    @classmethod
    def _namespaces(cls, values: list[str]) -> list[str]:
        try:
            DnsConfig(upstreams=(), namespaces=tuple(values))
        except DnsConfigError as exc:
            raise ValueError(str(exc).partition(": ")[2]) from None
        return values

    @field_validator("labels", "namespace_labels")
    @classmethod
    def _labels(cls, value: str) -> str:
        try:
            parse_selector(value)
        except SelectorError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("reverse_zones", "fallthrough")
    @classmethod
    def _zones(cls, values: list[str], info: ValidationInfo) -> list[str]:
        try:
            DnsConfig(upstreams=(), **{info.field_name: tuple(values)})  # type: ignore[arg-type]
        except DnsConfigError as exc:
            raise ValueError(str(exc).partition(": ")[2]) from None
        return values

    @field_validator("stub_domains", mode="before")
    @classmethod
    def _stub_domain_flags(cls, value: object) -> object:
        """The flag's values (a list of ``ZONE=SERVER[;SERVER...][,...]``) into the mapping."""
        if not isinstance(value, list):
            return value
        found: dict[str, list[str]] = {}
        for text in value:
            try:
                parsed = parse_stub_domains(str(text))
            except DnsConfigError as exc:
                raise ValueError(str(exc)) from None
            for zone, servers in parsed.items():
                if zone in found:
                    raise ValueError(f"zone {zone!r} is given twice")
                found[zone] = servers
        return found

    @field_validator("stub_domains")
    @classmethod
    def _stub_domains(cls, value: dict[str, list[str]], info: ValidationInfo) -> dict[str, list[str]]:
        zone = str(info.data.get("cluster_domain", "cluster.local"))
        try:
            DnsConfig(upstreams=(), zone=zone or "cluster.local", stub_domains=value)  # type: ignore[arg-type]
        except DnsConfigError as exc:
            message = str(exc).removeprefix("DnsConfig.stub_domains: ")
            if message.startswith("DnsConfig.stub_domains["):  # "...[zone]: detail" -> "zone zone: detail"
                zone_name, _, detail = message.removeprefix("DnsConfig.stub_domains[").partition("]: ")
                message = f"zone {zone_name}: {detail}"
            raise ValueError(message) from None
        return value

    @field_validator("upstreams")
    @classmethod
    def _upstreams(cls, values: list[str]) -> list[str]:
        for value in values:
            try:
                parse_upstream(value)
            except DnsConfigError as exc:
                raise ValueError(str(exc)) from None
        return values

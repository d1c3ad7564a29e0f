"""The kube-dns ConfigMap's ``stubDomains`` and ``upstreamNameservers``, as NodeLocal DNSCache
reads them, and how they combine with kubeport's own settings. Pure.

The ConfigMap ``kube-dns`` in ``kube-system`` (kubernetes/dns pkg/dns/config/config.go
``Config``) holds JSON in two keys: ``stubDomains``, a map zone -> ["IP[:PORT]", ...], and
``upstreamNameservers``, a list of at most three "IP[:PORT]" that replaces the node's
resolv.conf. An update that does not parse or validate is ignored whole and the last good
one kept (pkg/dns/config/sync.go processUpdate: "ignoring update"); a deleted ConfigMap
means the defaults (sync_configmap.go onDelete: "reverting to default configuration").

Combination (NodeLocal DNSCache, cmd/node-cache/app/configmap.go updateCorefile): the
ConfigMap's upstreamNameservers replace only the placeholder of the default upstreams
(``__PILLAR__UPSTREAM__SERVERS__``, else /etc/resolv.conf); a Corefile that names its own
``forward`` servers keeps them. So here: ``upstreams`` given by flag or file win, and the
ConfigMap's upstreamNameservers replace the host's resolv.conf only. Its stubDomains are
added as server blocks beside the Corefile's own; a zone in both would be two server blocks
for one zone, which CoreDNS refuses, so here the zone given by flag or file wins (the node's
own configuration) and the ConfigMap's entry for it is ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping

from kubeport.dns.config import DnsConfig, DnsConfigError, Upstream, check_stub_zone, parse_upstream

NAMESPACE = "kube-system"
NAME = "kube-dns"
#: kubernetes/dns pkg/dns/config/config.go validateUpstreamNameserver
MAX_UPSTREAM_NAMESERVERS = 3


class KubeDnsConfigError(ValueError):
    """The ConfigMap's data is unusable; the message names the key and the bad value."""


@dataclass(frozen=True, slots=True)
class KubeDnsConfig:
    """What the ConfigMap says; empty: absent, deleted, or neither key present."""

    stub_domains: tuple[tuple[str, tuple[Upstream, ...]], ...] = ()
    upstream_nameservers: tuple[Upstream, ...] = ()

    def describe(self) -> str:
        stubs = ", ".join(zone for zone, _ in self.stub_domains) or "none"
        upstreams = ", ".join(f"{ip}:{port}" for ip, port in self.upstream_nameservers) or "none"
        return f"stub domains: {stubs}; upstream nameservers: {upstreams}"


def parse_kube_dns(data: Mapping[str, str] | None, cluster_zone: str) -> KubeDnsConfig:
    """The ConfigMap's ``data`` (None: no ConfigMap) -> its settings; KubeDnsConfigError when
    a key is not JSON of the right shape or names a bad zone or server. Other keys
    (``federations``) are not kubeport's business and are ignored."""
    if not data:
        return KubeDnsConfig()
    stubs: dict[str, tuple[Upstream, ...]] = {}
    raw = _json(data, "stubDomains", {})
    if not isinstance(raw, dict):
        raise KubeDnsConfigError(f"stubDomains: {_excerpt(data['stubDomains'])}: not a JSON object of "
                                 'zone -> ["IP[:PORT]", ...]')
    for zone_text, servers in raw.items():
        try:
            zone = check_stub_zone(zone_text, cluster_zone, "stubDomains")
        except DnsConfigError as error:
            raise KubeDnsConfigError(str(error)) from None
        if not isinstance(servers, list) or not servers or not all(isinstance(s, str) for s in servers):
            raise KubeDnsConfigError(f"stubDomains[{zone_text}]: {json.dumps(servers)}: not a non-empty list "
                                     'of "IP[:PORT]"')
        if zone in stubs:
            raise KubeDnsConfigError(f"stubDomains: zone {zone_text!r} is given twice")
        stubs[zone] = _servers(servers, f"stubDomains[{zone_text}]")
    upstreams = _json(data, "upstreamNameservers", [])
    if not isinstance(upstreams, list) or not all(isinstance(s, str) for s in upstreams):
        raise KubeDnsConfigError(f"upstreamNameservers: {_excerpt(data['upstreamNameservers'])}: not a JSON list "
                                 'of "IP[:PORT]"')
    if len(upstreams) > MAX_UPSTREAM_NAMESERVERS:
        raise KubeDnsConfigError(f"upstreamNameservers: {len(upstreams)} entries: at most "
                                 f"{MAX_UPSTREAM_NAMESERVERS} (kube-dns)")
    return KubeDnsConfig(tuple(sorted(stubs.items())), _servers(upstreams, "upstreamNameservers"))


def merged(config: DnsConfig, cluster: KubeDnsConfig) -> DnsConfig:
    """``config`` (flags and file) with the ConfigMap's settings where it leaves room (see the
    module's notes): its stub domains for the zones ``config`` has none for, its upstream
    nameservers when ``config`` names no upstreams."""
    if not cluster.stub_domains and not cluster.upstream_nameservers:
        return config
    own = dict(config.stub_domains)
    stubs = {**{zone: servers for zone, servers in cluster.stub_domains if zone not in own}, **own}
    upstreams = config.upstreams
    if upstreams is None and cluster.upstream_nameservers:
        upstreams = cluster.upstream_nameservers
    return config.with_changes(stub_domains=tuple(sorted(stubs.items())), upstreams=upstreams)


def _json(data: Mapping[str, str], key: str, default: object) -> object:
    text = data.get(key)
    if text is None or not text.strip():
        return default
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise KubeDnsConfigError(f"{key}: {_excerpt(text)}: not JSON ({error.msg} at line {error.lineno} "
                                 f"column {error.colno})") from None


def _servers(servers: list[str], where: str) -> tuple[Upstream, ...]:
    parsed = []
    for server in servers:
        try:
            parsed.append(parse_upstream(server))
        except DnsConfigError as error:
            detail = str(error).partition(": ")[2] or str(error)
            raise KubeDnsConfigError(f"{where}: {detail}" if repr(server) in detail else
                                     f"{where}: {server!r}: {detail}") from None
    return tuple(dict.fromkeys(parsed))


def _excerpt(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")

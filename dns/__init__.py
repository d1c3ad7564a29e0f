"""kubeport.dns: the node-local cluster DNS server (CoreDNS kubernetes plugin behaviour).

The daemon uses :class:`DnsServer` with a :class:`DnsConfig`; everything else is the pure
core (names, records, lookup, encode, answer, answer_cache, rotate, forwarded, wire,
upstream_cache, upstream_policy) and its I/O shell (server, udp, mmsg, upstream, upstream_io, upstream_tcp).
"""

from kubeport.dns.config import DnsConfig, DnsConfigError, default_upstreams, parse_upstream
from kubeport.dns.server import DnsServer
from kubeport.dns.stats import DnsStats

__all__ = ["DnsConfig", "DnsConfigError", "DnsServer", "DnsStats", "default_upstreams", "parse_upstream"]

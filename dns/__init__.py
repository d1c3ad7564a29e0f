"""kubeport.dns: the node-local cluster DNS server (CoreDNS kubernetes plugin behaviour).

The daemon uses :class:`DnsServer` with a :class:`DnsConfig`; everything else is the pure
core (names, records, lookup, encode, answer, answer_cache, rotate, wire, and in
``forward/`` the policy, cache and replies) and its I/O shell (server, udp, batch_io, and
in ``forward/`` the forwarder and its udp and tcp transports).
"""

from kubeport.dns.config import DnsConfig, DnsConfigError, default_upstreams, parse_upstream
from kubeport.dns.server import DnsServer
from kubeport.dns.stats import DnsStats

__all__ = ["DnsConfig", "DnsConfigError", "DnsServer", "DnsStats", "default_upstreams", "parse_upstream"]

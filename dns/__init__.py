"""kubeport.dns: the node-local cluster DNS server (CoreDNS kubernetes plugin behaviour).

The daemon uses :class:`DnsServer` with a :class:`DnsConfig` made of :class:`DnsSettings`
(the configuration file's ``dns`` section, :mod:`.settings`); everything else is the pure
core (names, records, lookup, encode, answer, answer_cache, rotate, wire, and in
``forward/`` the policy, cache and replies) and its I/O shell (server, udp, tcp, batch_io,
and in ``forward/`` the forwarder and its udp and tcp transports).

The server and its statistics are imported when first named: kubeport.config imports
:mod:`.settings`, and reading a configuration (``kubeport check``) needs no server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kubeport.dns.config import DnsConfig, DnsConfigError, default_upstreams, parse_upstream

if TYPE_CHECKING:
    from kubeport.dns.server import DnsServer
    from kubeport.dns.stats import DnsStats

__all__ = ["DnsConfig", "DnsConfigError", "DnsServer", "DnsStats", "default_upstreams", "parse_upstream"]


def __getattr__(name: str) -> Any:
    if name == "DnsServer":
        from kubeport.dns.server import DnsServer

        return DnsServer
    if name == "DnsStats":
        from kubeport.dns.stats import DnsStats

        return DnsStats
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

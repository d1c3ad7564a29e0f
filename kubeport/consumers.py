"""What the daemon calls on each of its two consumers beyond
:class:`~kubeport.endpoints.interfaces.Consumer`: the daemon holds them by these protocols
only, and never imports the classes (:mod:`kubeport.components` builds them).

Implementations: :class:`~kubeport.proxy.service.ProxyService`,
:class:`~kubeport.dns.server.DnsServer`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol

from kubeport.endpoints.interfaces import Consumer
from kubeport.endpoints.types import NodeInfo

if TYPE_CHECKING:
    from kubeport.proxy.healthcheck.proxier_health import HealthResponse


class ProxyConsumer(Consumer, Protocol):
    """The service proxy: relays, the node's service addresses, kube-proxy's health."""

    async def start(self, extra_addresses: Iterable[str] = ()) -> None:
        """Listen, and hold the service addresses plus ``extra_addresses`` (DNS's) on the node."""
        ...

    async def run(self, may_resync: Callable[[], bool]) -> None:
        """Keep the host (addresses, table) in sync until cancelled; a full sync only while
        ``may_resync()``."""
        ...

    def request_resync(self) -> None:
        """A full sync of the host soon (SIGHUP)."""
        ...

    async def stop(self, *, grace: float, abort: asyncio.Event, release: bool, hand_over: bool,
                   keep_if: Callable[[], bool]) -> None:
        """Stop accepting and drain for up to ``grace`` seconds (``abort``: at once)."""
        ...

    def healthy(self, now: float | None = None) -> bool:
        """kube-proxy's /livez verdict at ``now`` (default: now)."""
        ...

    def health_request(self, path: str, code: int) -> None:
        """Count a /healthz or /livez request answered with ``code``."""
        ...

    def health_response(self, path: str, node: NodeInfo | None) -> HealthResponse:
        """kube-proxy's /healthz or /livez response for ``node``."""
        ...

    def status(self) -> dict[str, Any]:
        """The proxy part of ``kubeport get status``."""
        ...


class DnsConsumer(Consumer, Protocol):
    """The node-local cluster DNS."""

    @property
    def listening(self) -> bool:
        ...

    def kube_dns_changed(self, data: Mapping[str, str] | None) -> None:
        """The kube-dns ConfigMap's data (None: there is none), as listed or watched."""
        ...

    async def stop(self, lame_duck: float = 0.0, *, hand_over: bool = False) -> None:
        """Stop answering (``hand_over``: a successor listening on the same addresses takes
        the new queries, the ones queued here are answered)."""
        ...

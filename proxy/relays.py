"""What the proxy service drives: the relays of this node, in one process or several.

:class:`~kubeport.proxy.proxier.Proxier` relays in this process;
:class:`~kubeport.proxy.workers.parent.ProxyWorkers` keeps a Proxier for the node's
addresses and nftables and relays in worker processes. Both are :class:`Relays`, and
``create_proxier`` (workers/parent.py) picks one by ``--workers``.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Iterable, Mapping, Protocol

from kubeport.endpoints.types import ServicePortName, Snapshot
from kubeport.proxy.stats import ServicePortStats
from kubeport.proxy.table import Frontend, FrontendRule


class Relays(Protocol):
    """The node's relays: started once, fed snapshots, stopped once."""

    async def start(self, extra_addresses: Iterable[str] = (),
                    reserved_frontends: Iterable[Frontend] | None = None) -> None:
        """Add ``extra_addresses`` (the DNS server's) and prepare; opens no listener yet."""

    async def stop(self, grace: float = 0.0, *, abort: asyncio.Event | None = None, release: bool = True,
                   hand_over: bool | None = None, keep_if: Callable[[], Awaitable[bool]] | None = None) -> None:
        """Stop accepting, drain up to ``grace``, close (see Proxier.stop)."""

    async def apply(self, snapshot: Snapshot) -> None:
        """Serve ``snapshot``: returns once every relay process has applied it."""

    async def wait_failed(self) -> None:
        """Raises the first relay failure (the daemon cannot serve without its relays)."""

    async def wait_ready(self) -> None:
        """Until the first servable snapshot is applied."""

    @property
    def ready(self) -> bool: ...

    async def refresh_node_addresses(self) -> bool:
        """Read the node's addresses again; True when they changed."""

    async def resync_host(self) -> None:
        """Put the VIP addresses and the nftables table back in line, in full."""

    @property
    def stats(self) -> Mapping[ServicePortName, ServicePortStats]: ...

    @property
    def rules(self) -> Mapping[Frontend, FrontendRule]: ...

    @property
    def listening(self) -> frozenset[Frontend]: ...

    @property
    def tcp_relay(self) -> str: ...  # how bulk TCP bytes move: sockmap or splice, and why

    @property
    def client_address(self) -> str: ...  # what endpoints see: "client", or "node: <why>"

    @property
    def pod_traffic(self) -> str: ...  # "connect(): cgroup ...", or "relay: <why>"

    @property
    def connects_balanced(self) -> Mapping[ServicePortName, int]: ...  # counted by the connect() programs

    @property
    def node_addresses(self) -> tuple[str, ...]: ...

    @property
    def nodeport_addresses(self) -> tuple[str, ...]: ...

    @property
    def health_check_addresses(self) -> tuple[str, ...]: ...

    @property
    def host_problems(self) -> bool: ...

    @property
    def problems(self) -> list[str]: ...

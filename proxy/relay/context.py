"""What every listener and relay of one Proxier shares: loop, pipes, timers, the client classifier."""

from __future__ import annotations

import _socket
import asyncio
import ipaddress
import os
import time
from collections import deque
from typing import Callable, Iterable

from kubeport.lib.heldsockets import NOT_HELD, HeldSockets
from kubeport.proxy.clientaddress import ClientAddresses
from kubeport.proxy.config import ProxyConfig
from kubeport.proxy.relay.kernel_relays import KernelRelays
from kubeport.proxy.relay.pipes import PipePool
from kubeport.proxy.relay.poller import EdgePoller
from kubeport.proxy.relay.reserve import DescriptorReserve
from kubeport.proxy.relay.sockmap import open_sockmap

_IP_TRANSPARENT = getattr(_socket, "IP_TRANSPARENT", 19)
_IPV6_TRANSPARENT = 75
_IP_BIND_ADDRESS_NO_PORT = getattr(_socket, "IP_BIND_ADDRESS_NO_PORT", 24)


class LocalClients:
    """Is a client "local" for the eTP=Local short-circuit: in the pod CIDRs, or this node itself?

    kube-proxy (pkg/proxy/iptables/proxier.go syncProxyRules) sends such clients of external
    frontends to the cluster set. Answers are cached per address (bounded), since only
    frontends with eTP=Local ask.
    """

    def __init__(self, networks: Iterable, node_addresses: Iterable[str] = (), cache_size: int = 4096) -> None:
        self._networks = tuple(networks)
        self._links: frozenset[str] = frozenset(node_addresses)
        self._vips: frozenset[str] = frozenset()
        self._node = self._links
        self._cache: dict[str, bool] = {}
        self._cache_size = cache_size

    def set_node_addresses(self, addresses: Iterable[str]) -> None:
        """The node's link addresses (a connection from the node itself has one as source)."""
        self._links = frozenset(addresses)
        self._node = self._links | self._vips
        self._cache.clear()

    def set_vips(self, addresses: frozenset[str]) -> None:
        """The VIPs kubeport added: the node connecting to one of them uses it as the source."""
        self._vips = addresses
        self._node = self._links | self._vips
        self._cache.clear()

    def __call__(self, client_ip: str) -> bool:
        known = self._cache.get(client_ip)
        if known is not None:
            return known
        if client_ip in self._node:
            local = True
        else:
            try:
                ip = ipaddress.ip_address(client_ip.partition("%")[0])
            except ValueError:
                return False
            mapped = getattr(ip, "ipv4_mapped", None)
            ip = mapped or ip
            local = ip.is_loopback or str(ip) in self._node or any(
                ip.version == n.version and ip in n for n in self._networks
            )
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        self._cache[client_ip] = local
        return local


class ConnectTimeouts:
    """One timer for every pending connect: the timeout is constant, so deadlines arrive in order.

    The queue holds tokens, not connections: a connect that completes is cancelled
    with a dict pop, and nothing keeps a finished connection alive until its deadline.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self._loop = loop
        self._timeout = timeout
        self._queue: deque[tuple[float, int]] = deque()
        self._pending: dict[int, object] = {}
        self._next_token = 0
        self._timer: asyncio.TimerHandle | None = None

    def add(self, conn) -> int:
        """Call ``conn.connect_timed_out()`` in ``timeout`` seconds unless cancelled; the token."""
        self._next_token += 1
        token = self._next_token
        self._pending[token] = conn
        self._queue.append((self._loop.time() + self._timeout, token))
        if self._timer is None:
            self._timer = self._loop.call_at(self._queue[0][0], self._fire)
        return token

    def cancel(self, token: int) -> None:
        self._pending.pop(token, None)

    def _fire(self) -> None:
        self._timer = None
        now = self._loop.time()
        queue, pending = self._queue, self._pending
        while queue and queue[0][0] <= now:
            conn = pending.pop(queue.popleft()[1], None)
            if conn is not None:
                conn.connect_timed_out()
        if queue:
            self._timer = self._loop.call_at(queue[0][0], self._fire)

    def __len__(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._queue.clear()
        self._pending.clear()


class RelayContext:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        config: ProxyConfig,
        *,
        on_fatal: Callable[[BaseException], None],
        clock: Callable[[], float] = time.monotonic,
        reserve: DescriptorReserve | None = None,
        hold: HeldSockets = NOT_HELD,
    ) -> None:
        self.loop = loop
        self.config = config
        self.clock = clock
        #: every listener is opened through it (adopted after a crash, else bound and kept)
        self.hold = hold
        #: the proxy's descriptors stop short of the process's last ones (reserve.py)
        self.reserve = reserve if reserve is not None else DescriptorReserve()
        self.pipes = PipePool(config.pipe_size, config.pipe_pool_size, self.reserve.within(os.pipe2))
        #: a backend socket, made under the reserve's ceiling (a retried connect runs outside
        #: the accepting callback that sets it)
        self.backend_socket = self.reserve.within(_socket.socket)
        self.poller = EdgePoller(loop)
        #: one receive buffer for every relay in copy mode (the loop runs one callback at a time).
        self.copy_buffer = bytearray(64 * 1024)
        self.copy_view = memoryview(self.copy_buffer)
        #: the batched datagram buffers of every UDP frontend (udp.py), made with the first one.
        self.udp_batches: tuple | None = None
        self.local_clients = LocalClients(config.cluster_networks)
        #: whose address a connection's upstream side binds (clientaddress.py)
        self.client_addresses = ClientAddresses(config.cluster_cidrs)
        self.timeouts = ConnectTimeouts(loop, config.connect_timeout)
        #: every live TCP relay, for draining at shutdown.
        self.conns: set = set()
        #: UDP frontends still serving their flows after stop() began.
        self.draining: set = set()
        #: per-endpoint connection sets are only needed to cut connections after a grace period.
        self.track_endpoint_conns = config.endpoint_grace_period is not None
        self.on_fatal = on_fatal
        self._idle: asyncio.Event | None = None
        sockmap, self.tcp_relay = open_sockmap(config.tcp_relay)
        #: the directions the sockmap program relays (None: every TCP byte is spliced here).
        self.kernel = None
        if sockmap is not None:
            self.kernel = KernelRelays(self, sockmap, config.sockmap_queue_limit, config.sockmap_sweep_interval)

    def bind_client_address(self, upstream: _socket.socket, family: int, client_ip: str) -> None:
        """Bind ``upstream`` to the client's address, its port left to connect(): the kernel then
        picks one that makes the four-tuple unique (the client's own port may be taken towards
        the same endpoint by another of its connections through another Service)."""
        if family == _socket.AF_INET6:
            upstream.setsockopt(_socket.IPPROTO_IPV6, _IPV6_TRANSPARENT, 1)
            if "." in client_ip and not client_ip.startswith("::ffff:"):
                client_ip = "::ffff:" + client_ip
        else:
            upstream.setsockopt(_socket.IPPROTO_IP, _IP_TRANSPARENT, 1)
            if client_ip.startswith("::ffff:"):
                client_ip = client_ip[7:]
        upstream.setsockopt(_socket.IPPROTO_IP, _IP_BIND_ADDRESS_NO_PORT, 1)
        upstream.bind((client_ip, 0))

    def conn_closed(self, conn) -> None:
        self.conns.discard(conn)
        if self._idle is not None and not self.conns and not self.draining:
            self._idle.set()

    def udp_drained(self, listener) -> None:
        """A draining UDP frontend closed: its flows are gone."""
        self.draining.discard(listener)
        if self._idle is not None and not self.conns and not self.draining:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Until no TCP relay and no draining UDP frontend is left."""
        if not self.conns and not self.draining:
            return
        self._idle = asyncio.Event()
        await self._idle.wait()

    async def wait_idle_for(self, timeout: float, *aborts: asyncio.Event | None) -> None:
        """:meth:`wait_idle` for up to ``timeout`` seconds, or until one of ``aborts`` is set."""
        waiters = {asyncio.ensure_future(self.wait_idle())}
        waiters.update(asyncio.ensure_future(abort.wait()) for abort in aborts if abort is not None)
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    def close(self) -> None:
        if self.kernel is not None:
            self.kernel.close()
        self.timeouts.close()
        self.pipes.close()
        self.poller.close()
        self.copy_view.release()
        if self.udp_batches is not None:
            inbound, replies = self.udp_batches
            inbound.close()
            replies.slots.close()
            self.udp_batches = None

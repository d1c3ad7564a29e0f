"""The proxy on loopback, for its relay, Proxier, lifecycle, UDP and worker tests: a relay or
a started Proxier (fake addresses and firewall) in front of named backends, run on uvloop as
the daemon runs, and the client calls the tests make of what is listening.

Every harness is a context manager, so that a test cannot leave a listener, a backend or a
worker process behind when it fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import resource
import socket
import struct
from typing import AsyncIterator, Awaitable, Callable, Iterator, NamedTuple

import uvloop

from kubeport.endpoints.types import NodeInfo, PortEndpoint, ServiceName, ServicePortName, ServiceState, Snapshot
from kubeport.proxy.balancer import Balancer, Route, ServicePortPool
from kubeport.proxy.config import ProxyConfig
from kubeport.proxy.proxier import Proxier
from kubeport.proxy.relay.context import RelayContext
from kubeport.proxy.relay.tcp_listener import TcpListener
from kubeport.proxy.table import Frontend
from kubeport.proxy.workers.parent import ProxyWorkers, create_proxier

from .fake_host import FakeAddresses, FakeFirewall
from .slim import endpoint, endpoint_slice, port, service, snapshot
from .wait import DEADLINE

NODE = NodeInfo(name="node-a", addresses=(("InternalIP", "127.0.0.1"),))

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


# --- on uvloop, on loopback -------------------------------------------------------------------

def reset_connection(writer: asyncio.StreamWriter) -> None:
    """Close a stream with an RST (SO_LINGER 0), as a client or backend that aborts does."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def on_uvloop(test):
    """Run an async test on uvloop, as the daemon runs (to pytest-asyncio it is a sync test)."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        return uvloop.run(test(*args, **kwargs))

    return run


class LoopbackRelay:
    """A TcpListener on 127.0.0.1:<ephemeral> in front of the given (ip, port) endpoints."""

    def __init__(self, endpoints: list[tuple[str, int]], *, reserve=None, **config) -> None:
        """``reserve``: the DescriptorReserve of the relay's context (else one on the real limit)."""
        config.setdefault("seed", 1)
        self.config = ProxyConfig(**config)
        self.fatal: list[BaseException] = []
        self.ctx = RelayContext(asyncio.get_running_loop(), self.config, on_fatal=self.fatal.append, reserve=reserve)
        name = ServicePortName(ServiceName("default", "web"), "", "TCP")
        balancer = Balancer(random.Random(self.config.seed), eject_after=self.config.eject_after_failures)
        self.pool = ServicePortPool(name, balancer)
        wanted = [PortEndpoint(endpoint(ip), number) for ip, number in endpoints]
        self.pool.sync(wanted)
        route = Route(self.pool, self.pool.states(wanted))
        self.listener = TcpListener(self.ctx, Frontend("127.0.0.1", 0, "TCP"), route)
        self.listener.open()
        self.address = self.listener.sock.getsockname()

    @property
    def stats(self):
        return self.pool.stats

    def close(self) -> None:
        self.listener.close()
        for conn in list(self.ctx.conns):
            conn.abort()
        self.ctx.close()


class Backends:
    """Named servers on 127.0.0.1: TCP answers "<name>\\n" then echoes; UDP answers "<name> <data>"."""

    def __init__(self) -> None:
        self.servers: list = []
        self.transports: list = []

    async def tcp(self, name: str) -> int:
        async def handle(reader, writer):
            writer.write(name.encode() + b"\n")
            try:
                while data := await reader.read(65536):
                    writer.write(data)
            except ConnectionError:
                pass
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.servers.append(server)
        return server.sockets[0].getsockname()[1]

    async def udp(self, name: str) -> int:
        class Echo(asyncio.DatagramProtocol):
            def connection_made(self, transport):
                self.transport = transport

            def datagram_received(self, data, addr):
                self.transport.sendto(name.encode() + b" " + data, addr)

        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(Echo, local_addr=("127.0.0.1", 0))
        self.transports.append(transport)
        return transport.get_extra_info("sockname")[1]

    def close(self) -> None:
        for server in self.servers:
            server.close()
        for transport in self.transports:
            transport.close()


async def start_proxier(*, leftover_addresses=(), capture=True, **config):
    """A started Proxier (ProxyWorkers with ``workers`` > 1) with fake addresses (node: 127.0.0.1,
    ::1; ``leftover_addresses`` as a predecessor left them) and a fake firewall (``capture``:
    with policy routing for externalIPs and LB IPs, see proxy/host/capture.py)."""
    config.setdefault("seed", 1)
    config.setdefault("nodeport_addresses", ("primary", "localhost"))
    addresses = FakeAddresses(["127.0.0.1", "::1"], owned=leftover_addresses)
    firewall = FakeFirewall()
    firewall.can_capture = capture
    proxier = create_proxier(ProxyConfig(**config), "node-a", addresses=addresses, firewall=firewall)
    await proxier.start(extra_addresses=["127.0.0.53"])
    return proxier, addresses, firewall


# --- snapshots --------------------------------------------------------------------------------------

def web(*backends: int, name: str = "web", vip: str = "127.0.0.10", port_number: int = 80, protocol: str = "TCP",
        target: int = 8080, node_port: int = 0, node: str = "node-a", **fields) -> ServiceState:
    """A service on ``vip``:``port_number`` with one slice per backend port, its endpoint 127.0.0.1 on ``node``.

    The proxy relays to the slice's port, so ``target`` only has to be well-formed.
    """
    fields.setdefault("type", "NodePort" if node_port else "ClusterIP")
    info = service(name, [vip], [port(port_number, protocol=protocol, target=target, node_port=node_port)], **fields)
    slices = tuple(endpoint_slice(f"{name}-{i}", [endpoint("127.0.0.1", node=node)], [("", protocol, backend)])
                   for i, backend in enumerate(backends))
    return ServiceState(info, slices)


# --- a started Proxier ------------------------------------------------------------------------------

class RunningProxier(NamedTuple):
    proxier: Proxier | ProxyWorkers
    addresses: FakeAddresses
    firewall: FakeFirewall
    backends: Backends


@contextlib.asynccontextmanager
async def running_proxier(**config) -> AsyncIterator[RunningProxier]:
    """start_proxier(**config) with a fresh Backends; both are stopped on the way out, pass or fail."""
    backends = Backends()
    proxier, addresses, firewall = await start_proxier(**config)
    try:
        yield RunningProxier(proxier, addresses, firewall, backends)
    finally:
        await proxier.stop()
        backends.close()


async def apply_states(proxier: Proxier | ProxyWorkers, states: list[ServiceState], *,
                       previous: Snapshot | None = None, synced: bool = True) -> Snapshot:
    """Apply a snapshot of ``states`` on NODE; it is returned to be the next one's ``previous``."""
    applied = snapshot(states, node=NODE, previous=previous, synced=synced)
    await proxier.apply(applied)
    return applied


async def greeting(host: str, port_: int = 80, source: str | None = None) -> str:
    """The first line a Backends TCP server says (its name) through the frontend at host:port_."""
    reader, writer = await asyncio.open_connection(host, port_, local_addr=(source, 0) if source else None)
    try:
        return (await asyncio.wait_for(reader.readline(), DEADLINE)).decode().strip()
    finally:
        writer.close()


async def greeted_connection(host: str, port_: int = 80) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """A connection kept open through the frontend, with the greeting line that proves it reached a backend."""
    reader, writer = await asyncio.open_connection(host, port_)
    return reader, writer, await asyncio.wait_for(reader.readline(), DEADLINE)


async def echoed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, line: bytes) -> bytes:
    """What comes back for ``line`` on a greeted connection (Backends echo after the greeting)."""
    writer.write(line)
    return await asyncio.wait_for(reader.readline(), DEADLINE)


def udp_client(vip: str, port_: int = 53) -> socket.socket:
    # Connected, so it only accepts datagrams from the VIP: proof that replies come from the frontend.
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    sock.connect((vip, port_))
    return sock


async def udp_ask(sock: socket.socket, data: bytes, timeout: float = DEADLINE) -> bytes:
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, data)
    return await asyncio.wait_for(loop.sock_recv(sock, 65535), timeout)


async def udp_ask_once(host: str, port_: int, data: bytes, timeout: float = DEADLINE) -> bytes:
    """udp_ask from a new socket, hence a new source port: a new flow each call."""
    with contextlib.closing(udp_client(host, port_)) as sock:
        return await udp_ask(sock, data, timeout)


# --- a LoopbackRelay in front of throwaway servers ----------------------------------------------------

@contextlib.asynccontextmanager
async def backend_server(handler: Handler) -> AsyncIterator[int]:
    """A TCP server on 127.0.0.1 running ``handler`` per connection; yields its port."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


@contextlib.asynccontextmanager
async def relay_in_front_of(endpoints: list[tuple[str, int]], **config) -> AsyncIterator[LoopbackRelay]:
    relay = LoopbackRelay(endpoints, **config)
    try:
        yield relay
    finally:
        relay.close()


@contextlib.asynccontextmanager
async def relay_to(handler: Handler, **config) -> AsyncIterator[LoopbackRelay]:
    """A relay whose only endpoint is a backend_server running ``handler``."""
    async with backend_server(handler) as port_, relay_in_front_of([("127.0.0.1", port_)], **config) as relay:
        yield relay


async def read_all(address: tuple[str, int], request: bytes | None = None) -> bytes:
    """Connect, send ``request`` and a FIN if given, and return everything until the other side's FIN."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        if request is not None:
            writer.write(request)
            writer.write_eof()
        return await asyncio.wait_for(reader.read(), DEADLINE)
    finally:
        writer.close()



@contextlib.contextmanager
def open_file_limit(limit: int) -> Iterator[None]:
    """The process's soft RLIMIT_NOFILE at ``limit`` for the block (the hard one unchanged)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

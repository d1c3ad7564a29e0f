"""Harnesses shared by the proxy's loopback tests (proxier, lifecycle, UDP, workers, relay, connect).

kubeport.proxy.testing builds the snapshots, the Proxier and the LoopbackRelay; this wraps them so
that a test cannot leave a listener, a backend or a worker process behind when it fails, and holds
the client calls the tests make of what is listening.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import AsyncIterator, Awaitable, Callable, NamedTuple

from kubeport.endpoints.types import NodeInfo, ServiceState, Snapshot
from kubeport.proxy.host.addresses import FakeAddresses
from kubeport.proxy.host.nftables import FakeFirewall
from kubeport.proxy.proxier import Proxier
from kubeport.proxy.testing import (
    DEADLINE,
    Backends,
    LoopbackRelay,
    endpoint,
    endpoint_slice,
    port,
    service,
    snapshot,
    start_proxier,
)
from kubeport.proxy.workers import ProxyWorkers

NODE = NodeInfo(name="node-a", addresses=(("InternalIP", "127.0.0.1"),))

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


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


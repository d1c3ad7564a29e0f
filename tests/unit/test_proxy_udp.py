"""UDP through the Proxier on loopback: replies from the frontend, flows dropped with their endpoint,
idle expiry, flow limits."""

from __future__ import annotations

import asyncio
import socket

from kubeport.endpoints.types import NodeInfo, ServiceState
from kubeport.proxy.testing import (
    DEADLINE,
    Backends,
    endpoint,
    endpoint_slice,
    on_uvloop,
    port,
    service,
    snapshot,
    start_proxier as start,
    until,
)

NODE = NodeInfo(name="node-a", addresses=(("InternalIP", "127.0.0.1"),))


def udp_web(ports: list[int], vip: str = "127.0.0.30") -> ServiceState:
    info = service("dns", [vip], [port(53, protocol="UDP")])
    slices = tuple(endpoint_slice(f"dns-{i}", [endpoint("127.0.0.1")], [("", "UDP", p)]) for i, p in enumerate(ports))
    return ServiceState(info, slices)


async def udp_ask(sock: socket.socket, data: bytes) -> bytes:
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, data)
    return await asyncio.wait_for(loop.sock_recv(sock, 65535), DEADLINE)


def udp_client(vip: str = "127.0.0.30") -> socket.socket:
    # A connected socket only accepts datagrams from the VIP: proof that replies come from the frontend.
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    sock.connect((vip, 53))
    return sock


@on_uvloop
async def test_udp__replies_from_the_frontend__flows_to_a_removed_endpoint_dropped_at_once():
    backends = Backends()
    proxier, _, _ = await start()
    try:
        a, b = await backends.udp("a"), await backends.udp("b")
        first = snapshot([udp_web([a])], node=NODE)
        await proxier.apply(first)
        client = udp_client()
        assert await udp_ask(client, b"q1") == b"a q1"
        (stats,) = proxier.stats.values()
        assert (stats.udp_flows, stats.udp_flows_total) == (1, 1)
        await proxier.apply(snapshot([udp_web([b])], node=NODE, previous=first))
        assert stats.udp_flows == 0
        assert await udp_ask(client, b"q2") == b"b q2"
        client.close()
    finally:
        await proxier.stop()
        backends.close()


@on_uvloop
async def test_udp__idle_flows_expire():
    backends = Backends()
    proxier, _, _ = await start(udp_idle_timeout=0.05)
    try:
        await proxier.apply(snapshot([udp_web([await backends.udp("a")])], node=NODE))
        client = udp_client()
        assert await udp_ask(client, b"q") == b"a q"
        (stats,) = proxier.stats.values()
        await until(lambda: stats.udp_flows == 0, "the flow to expire")
        assert await udp_ask(client, b"again") == b"a again"
        assert stats.udp_flows_total == 2
        client.close()
    finally:
        await proxier.stop()
        backends.close()


@on_uvloop
async def test_udp__per_client_flow_limit():
    backends = Backends()
    proxier, _, _ = await start(udp_max_flows_per_client=1)
    try:
        await proxier.apply(snapshot([udp_web([await backends.udp("a")])], node=NODE))
        first, second = udp_client(), udp_client()
        assert await udp_ask(first, b"q") == b"a q"
        await asyncio.get_running_loop().sock_sendall(second, b"q")
        (stats,) = proxier.stats.values()
        await until(lambda: stats.udp_flows_rejected == 1, "the second flow to be refused")
        first.close()
        second.close()
    finally:
        await proxier.stop()
        backends.close()

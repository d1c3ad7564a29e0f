"""Proxier start and stop for graceful shutdown and seamless restart (issue 8), on loopback.

The daemon's handover: a successor binds the same frontends (SO_REUSEPORT) and adopts the
VIPs and the nftables table; the predecessor stops with ``release=False``, stops accepting
TCP at once, lets its UDP frontends serve until their flows are idle, and drains.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from kubeport.endpoints.types import NodeInfo, ServiceState
from kubeport.proxy.table import Frontend
from kubeport.proxy.testing import (
    DEADLINE,
    Backends,
    LoopbackRelay,
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


def web(backend: int, *, vip: str = "127.0.0.10", protocol: str = "TCP", **fields) -> ServiceState:
    info = service("web", [vip], [port(80, target=backend, protocol=protocol)], **fields)
    return ServiceState(info, (endpoint_slice("web-0", [endpoint("127.0.0.1")], [("", protocol, backend)]),))


async def udp_ask(host: str, port_: int, data: bytes, timeout: float = DEADLINE) -> bytes:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    try:
        sock.connect((host, port_))
        sock.send(data)
        return await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 2048), timeout)
    finally:
        sock.close()


@on_uvloop
async def test_stop_release_false__vips_and_firewall_left_for_the_successor__issue8():
    backends = Backends()
    proxier, addresses, firewall = await start()
    try:
        lb = service("edge", ["127.0.0.20"], [port(80, target=8080)], type="LoadBalancer",
                     load_balancer_ips=("127.0.0.21",), load_balancer_source_ranges=("10.0.0.0/8",))
        states = [web(await backends.tcp("a")),
                  ServiceState(lb, (endpoint_slice("edge-0", [endpoint("127.0.0.1")], [("", "TCP", 8080)]),))]
        await proxier.apply(snapshot(states, node=NODE))
        assert firewall.allowed == {Frontend("127.0.0.21", 80, "TCP"): ("10.0.0.0/8",)}
        await proxier.stop(release=False)
        assert addresses.released is False and firewall.released is False
        assert {"127.0.0.10", "127.0.0.20", "127.0.0.21"} <= addresses.owned
        assert firewall.allowed  # still there: the successor replaces the table in one transaction
    finally:
        await proxier.stop()
        backends.close()


@on_uvloop
async def test_start__a_predecessors_vips_stay_until_the_first_snapshot__issue8():
    backends = Backends()
    proxier, addresses, _ = await start(leftover_addresses=["127.0.0.10", "127.0.0.99"])
    try:
        assert {"127.0.0.10", "127.0.0.99", "127.0.0.53"} <= addresses.owned  # start only adds
        await proxier.apply(snapshot([web(await backends.tcp("a"))], node=NODE))
        assert addresses.owned == {"127.0.0.10", "127.0.0.53"}  # the first snapshot prunes the rest
    finally:
        await proxier.stop()
        backends.close()


@pytest.mark.parametrize(("accept_queued", "served"), [
    pytest.param(True, True, id="shutdown__queued_clients_served"),
    pytest.param(False, False, id="plain_close__queued_clients_reset"),
])
@on_uvloop
async def test_listener_close__connections_already_queued(accept_queued, served):
    backends = Backends()
    relay = LoopbackRelay([("127.0.0.1", await backends.tcp("a"))])
    clients = []
    try:
        for _ in range(3):  # handshakes done by the kernel; the loop has not run to accept them
            client = socket.create_connection(relay.address, timeout=DEADLINE)
            client.setblocking(False)
            clients.append(client)
        relay.listener.close(accept_queued=accept_queued)
        loop = asyncio.get_running_loop()
        for client in clients:
            if served:
                assert await asyncio.wait_for(loop.sock_recv(client, 16), DEADLINE) == b"a\n"
            else:
                with pytest.raises(ConnectionResetError):
                    await asyncio.wait_for(loop.sock_recv(client, 16), DEADLINE)
    finally:
        for client in clients:
            client.close()
        relay.close()
        backends.close()


@on_uvloop
async def test_stop__abort_resets_what_is_still_open_before_the_grace_ends__issue8():
    backends = Backends()
    proxier, _, _ = await start()
    try:
        await proxier.apply(snapshot([web(await backends.tcp("a"))], node=NODE))
        reader, writer = await asyncio.open_connection("127.0.0.10", 80)
        assert await reader.readline() == b"a\n"
        abort = asyncio.Event()
        stopping = asyncio.create_task(proxier.stop(grace=60.0, abort=abort))
        await asyncio.sleep(0)
        assert not stopping.done()  # draining: the connection is still open
        abort.set()  # a second SIGTERM
        await asyncio.wait_for(stopping, DEADLINE)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(), DEADLINE)
    finally:
        await proxier.stop()
        backends.close()


@on_uvloop
async def test_stop__udp_frontend_serves_until_its_flows_are_idle__issue8():
    backends = Backends()
    proxier, _, _ = await start(udp_idle_timeout=0.3)
    try:
        await proxier.apply(snapshot([web(await backends.udp("u"), protocol="UDP")], node=NODE))
        assert await udp_ask("127.0.0.10", 80, b"one") == b"u one"
        stopping = asyncio.create_task(proxier.stop(grace=DEADLINE))
        await until(lambda: not proxier.listening, "stop to begin")
        assert await udp_ask("127.0.0.10", 80, b"two") == b"u two"  # still served while draining
        await asyncio.wait_for(stopping, DEADLINE)  # the flows went idle: closed well before the grace
        with pytest.raises((ConnectionRefusedError, asyncio.TimeoutError)):
            await udp_ask("127.0.0.10", 80, b"three", timeout=0.5)
    finally:
        await proxier.stop()
        backends.close()


@on_uvloop
async def test_apply_while_stopping_changes_nothing():
    backends = Backends()
    proxier, _, _ = await start()
    try:
        first = snapshot([web(await backends.tcp("a"))], node=NODE)
        await proxier.apply(first)
        reader, writer = await asyncio.open_connection("127.0.0.10", 80)
        stopping = asyncio.create_task(proxier.stop(grace=DEADLINE))
        await until(lambda: not proxier.listening, "stop to begin")
        await proxier.apply(snapshot([web(await backends.tcp("b"))], node=NODE, previous=first))
        assert proxier.listening == frozenset()
        writer.close()
        await asyncio.wait_for(stopping, DEADLINE)
    finally:
        await proxier.stop()
        backends.close()


@on_uvloop
async def test_handover__successor_on_the_same_frontends_takes_new_clients__issue8():
    backends = Backends()
    old, _, _ = await start(udp_idle_timeout=0.3)
    new, _, _ = await start(udp_idle_timeout=0.3)
    try:
        tcp_old, tcp_new = await backends.tcp("old"), await backends.tcp("new")
        udp_old, udp_new = await backends.udp("old"), await backends.udp("new")
        udp = service("dns", ["127.0.0.11"], [port(53, protocol="UDP")])
        await old.apply(snapshot([web(tcp_old), ServiceState(udp, (endpoint_slice(
            "dns-0", [endpoint("127.0.0.1")], [("", "UDP", udp_old)]),))], node=NODE))
        await new.apply(snapshot([web(tcp_new), ServiceState(udp, (endpoint_slice(
            "dns-0", [endpoint("127.0.0.1")], [("", "UDP", udp_new)]),))], node=NODE))
        # Both bound (SO_REUSEPORT): the kernel spreads clients over the two.
        assert await udp_ask("127.0.0.11", 53, b"q") in (b"old q", b"new q")
        stopping = asyncio.create_task(old.stop(grace=DEADLINE, release=False))
        await until(lambda: not old.listening, "the old instance to stop accepting")
        for i in range(20):  # a fresh source port each time: every hash, yet all on the successor
            assert await udp_ask("127.0.0.11", 53, b"%d" % i) == b"new %d" % i
            reader, writer = await asyncio.open_connection("127.0.0.10", 80)
            assert await reader.readline() == b"new\n"
            writer.close()
        await asyncio.wait_for(stopping, DEADLINE)  # its UDP flows went idle
    finally:
        await old.stop()
        await new.stop()
        backends.close()


@on_uvloop
async def test_second_stop__cuts_the_drain_short_and_returns_when_done():
    backends = Backends()
    proxier, addresses, _ = await start()
    try:
        await proxier.apply(snapshot([web(await backends.tcp("a"))], node=NODE))
        reader, writer = await asyncio.open_connection("127.0.0.10", 80)
        assert await reader.readline() == b"a\n"
        first = asyncio.create_task(proxier.stop(grace=60.0))
        await until(lambda: not proxier.listening, "the first stop to begin")
        await asyncio.wait_for(proxier.stop(), DEADLINE)
        assert first.done() or await asyncio.wait_for(first, DEADLINE) is None
        assert addresses.owned == frozenset()
    finally:
        await proxier.stop()
        backends.close()

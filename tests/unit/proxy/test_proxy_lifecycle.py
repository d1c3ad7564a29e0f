"""Proxier start and stop for graceful shutdown and seamless restart, on loopback.

The daemon's handover: a successor binds the same frontends (SO_REUSEPORT) and adopts the
VIPs and the nftables table; the predecessor stops with ``release=False``, stops accepting
TCP at once, lets its UDP frontends serve until their flows are idle, and drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest

from kubeport.proxy.table import Frontend

from support.proxy_loopback import (
    Backends,
    apply_states,
    greeted_connection,
    greeting,
    on_uvloop,
    relay_in_front_of,
    running_proxier,
    udp_ask_once,
    web,
)
from support.wait import DEADLINE, until


@on_uvloop
async def test_stop_release_false__vips_and_firewall_left_for_the_successor():
    """Handover (kubeport's own, no kube-proxy counterpart): the successor adopts VIPs and table."""
    async with running_proxier() as (proxier, addresses, firewall, backends):
        lb = web(8080, name="edge", vip="127.0.0.20", type="LoadBalancer",
                 load_balancer_ips=("127.0.0.21",), load_balancer_source_ranges=("10.0.0.0/8",))
        await apply_states(proxier, [web(await backends.tcp("a")), lb])
        assert firewall.allowed == {Frontend("127.0.0.21", 80, "TCP"): ("10.0.0.0/8",)}
        await proxier.stop(release=False)
        assert addresses.released is False and firewall.released is False
        assert {"127.0.0.10", "127.0.0.20"} <= addresses.owned
        assert firewall.allowed and firewall.captured  # the successor replaces the table in one transaction


@on_uvloop
@pytest.mark.parametrize("capture", [
    pytest.param(True, id="policy_routing__only_the_service_ports_taken"),
    pytest.param(False, id="no_policy_routing__the_address_taken_like_ipvs_mode"),
])
async def test_external_ips_and_lb_ips_taken_by_port__not_as_addresses(capture):
    async with running_proxier(capture=capture) as (proxier, addresses, firewall, backends):
        port = await backends.tcp("a")
        edge = web(port, name="edge", vip="127.0.0.20", type="LoadBalancer", external_ips=("127.0.0.22",),
                   load_balancer_ips=("127.0.0.21",))
        empty = web(name="empty", vip="127.0.0.30", external_ips=("127.0.0.31",))  # no endpoint: refused
        await apply_states(proxier, [edge, empty])
        taken = {"127.0.0.21", "127.0.0.22", "127.0.0.31"}
        assert {"127.0.0.20", "127.0.0.30"} <= addresses.owned
        assert not taken & addresses.owned if capture else taken - {"127.0.0.31"} <= addresses.owned
        assert firewall.captured == ({Frontend("127.0.0.21", 80, "TCP"): True, Frontend("127.0.0.22", 80, "TCP"): True,
                                      Frontend("127.0.0.31", 80, "TCP"): False} if capture else {})
        assert await greeting("127.0.0.22") == "a"  # the listener is there either way


@on_uvloop
async def test_start__a_predecessors_vips_stay_until_the_first_snapshot():
    """Handover (kubeport's own): a start adds addresses, the first snapshot prunes leftovers."""
    async with running_proxier(leftover_addresses=["127.0.0.10", "127.0.0.99"]) as (proxier, addresses, _, backends):
        assert {"127.0.0.10", "127.0.0.99", "127.0.0.53"} <= addresses.owned  # start only adds
        await apply_states(proxier, [web(await backends.tcp("a"))])
        assert addresses.owned == {"127.0.0.10", "127.0.0.53"}  # the first snapshot prunes the rest


@pytest.mark.parametrize(("accept_queued", "served"), [
    pytest.param(True, True, id="shutdown__queued_clients_served"),
    pytest.param(False, False, id="plain_close__queued_clients_reset"),
])
@on_uvloop
async def test_listener_close__connections_already_queued(accept_queued, served):
    with contextlib.closing(Backends()) as backends:
        async with relay_in_front_of([("127.0.0.1", await backends.tcp("a"))]) as relay:
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


@on_uvloop
async def test_stop__abort_resets_what_is_still_open_before_the_grace_ends():
    """Graceful stop (kubeport's own): a second SIGTERM resets the connections still draining."""
    async with running_proxier() as (proxier, _, _, backends):
        await apply_states(proxier, [web(await backends.tcp("a"))])
        reader, _, hello = await greeted_connection("127.0.0.10")
        assert hello == b"a\n"
        abort = asyncio.Event()
        stopping = asyncio.create_task(proxier.stop(grace=60.0, abort=abort))
        await until(lambda: not proxier.listening, "the stop to begin")
        assert not stopping.done()  # draining: the connection is still open
        abort.set()  # a second SIGTERM
        await asyncio.wait_for(stopping, DEADLINE)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(), DEADLINE)


@on_uvloop
async def test_stop__udp_frontend_serves_until_its_flows_are_idle():
    """Graceful stop (kubeport's own): a UDP frontend stays until its flows are idle."""
    async with running_proxier(udp_idle_timeout=0.3) as (proxier, _, _, backends):
        await apply_states(proxier, [web(await backends.udp("u"), protocol="UDP")])
        assert await udp_ask_once("127.0.0.10", 80, b"one") == b"u one"
        stopping = asyncio.create_task(proxier.stop(grace=DEADLINE))
        await until(lambda: not proxier.listening, "stop to begin")
        assert await udp_ask_once("127.0.0.10", 80, b"two") == b"u two"  # still served while draining
        await asyncio.wait_for(stopping, DEADLINE)  # the flows went idle: closed well before the grace
        with pytest.raises((ConnectionRefusedError, asyncio.TimeoutError)):
            await udp_ask_once("127.0.0.10", 80, b"three", timeout=0.5)


@on_uvloop
async def test_apply_while_stopping_changes_nothing():
    async with running_proxier() as (proxier, _, _, backends):
        first = await apply_states(proxier, [web(await backends.tcp("a"))])
        reader, writer = await asyncio.open_connection("127.0.0.10", 80)
        stopping = asyncio.create_task(proxier.stop(grace=DEADLINE))
        await until(lambda: not proxier.listening, "stop to begin")
        await apply_states(proxier, [web(await backends.tcp("b"))], previous=first)
        assert proxier.listening == frozenset()
        writer.close()
        await asyncio.wait_for(stopping, DEADLINE)


@on_uvloop
async def test_handover__successor_on_the_same_frontends_takes_new_clients():
    """Handover over SO_REUSEPORT (socket(7)): once the predecessor stops, new clients reach the successor."""
    async with (running_proxier(udp_idle_timeout=0.3) as (old, _, _, backends),
                running_proxier(udp_idle_timeout=0.3) as (new, _, _, _)):
        tcp_old, tcp_new = await backends.tcp("old"), await backends.tcp("new")
        udp_old, udp_new = await backends.udp("old"), await backends.udp("new")
        dns = {"name": "dns", "vip": "127.0.0.11", "port_number": 53, "protocol": "UDP"}
        await apply_states(old, [web(tcp_old), web(udp_old, **dns)])
        await apply_states(new, [web(tcp_new), web(udp_new, **dns)])
        # Both bound (SO_REUSEPORT): the kernel spreads clients over the two.
        assert await udp_ask_once("127.0.0.11", 53, b"q") in (b"old q", b"new q")
        stopping = asyncio.create_task(old.stop(grace=DEADLINE, release=False))
        await until(lambda: not old.listening, "the old instance to stop accepting")
        for i in range(20):  # a fresh source port each time: every hash, yet all on the successor
            assert await udp_ask_once("127.0.0.11", 53, b"%d" % i) == b"new %d" % i
            assert await greeting("127.0.0.10") == "new"
        await asyncio.wait_for(stopping, DEADLINE)  # its UDP flows went idle


@on_uvloop
async def test_second_stop__cuts_the_drain_short_and_returns_when_done():
    async with running_proxier() as (proxier, addresses, _, backends):
        await apply_states(proxier, [web(await backends.tcp("a"))])
        _, _, hello = await greeted_connection("127.0.0.10")
        assert hello == b"a\n"
        first = asyncio.create_task(proxier.stop(grace=60.0))
        await until(lambda: not proxier.listening, "the first stop to begin")
        await asyncio.wait_for(proxier.stop(), DEADLINE)
        assert first.done() or await asyncio.wait_for(first, DEADLINE) is None
        assert addresses.owned == frozenset()

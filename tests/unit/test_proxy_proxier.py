"""The Proxier on loopback: listeners reconciled from snapshots, endpoints swapped in place.

VIPs are 127.0.0.x (local without adding addresses); the address manager and the
firewall are fakes; backends are real sockets on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import pytest

from kubeport.endpoints.types import NodeInfo, ServiceState
from kubeport.proxy.context import LocalClients
from kubeport.proxy.proxier import sctp_supported
from kubeport.proxy.table import Frontend
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


def web(ports: list[int], *, vip: str = "127.0.0.10", name: str = "web", node_port: int = 0, **fields):
    info = service(name, [vip], [port(80, target=8080, node_port=node_port)],
                   type="NodePort" if node_port else "ClusterIP", **fields)
    slices = tuple(
        endpoint_slice(f"{name}-{i}", [endpoint("127.0.0.1", node="node-a")], [("", "TCP", p)])
        for i, p in enumerate(ports)
    )
    return ServiceState(info, slices)


async def fetch(host: str, port_: int) -> str:
    reader, writer = await asyncio.open_connection(host, port_)
    line = await asyncio.wait_for(reader.readline(), DEADLINE)
    writer.close()
    return line.decode().strip()


async def refused(host: str, port_: int) -> bool:
    try:
        reader, writer = await asyncio.open_connection(host, port_)
    except ConnectionRefusedError:
        return True
    writer.close()
    return False


@on_uvloop
async def test_unsynced_snapshot_opens_nothing():
    backends = Backends()
    proxier, _, _ = await start()
    try:
        await proxier.apply(snapshot([web([await backends.tcp("a")])], synced=False, node=NODE))
        assert proxier.listening == frozenset() and not proxier.ready
    finally:
        await proxier.stop()
        backends.close()


@on_uvloop
async def test_forward_refuse_drop__listeners_and_firewall__a6():
    backends = Backends()
    proxier, addresses, firewall = await start()
    try:
        a = await backends.tcp("a")
        states = [
            web([a], node_port=30080),
            web([], vip="127.0.0.11", name="empty"),
            web([a], vip="127.0.0.12", name="local-only", internal_policy_local=True),
        ]
        # "local-only"'s endpoint lives on another node: iTP=Local has nothing local -> DROP.
        states[2] = ServiceState(states[2].service, (endpoint_slice(
            "local-only-0", [endpoint("127.0.0.1", node="node-b")], [("", "TCP", a)]),))
        await proxier.apply(snapshot(states, node=NODE))
        assert proxier.ready
        assert await fetch("127.0.0.10", 80) == "a"
        assert await fetch("127.0.0.1", 30080) == "a"
        assert await refused("127.0.0.11", 80)
        assert firewall.drops == {Frontend("127.0.0.12", 80, "TCP"): False}
        assert Frontend("127.0.0.12", 80, "TCP") not in proxier.listening
        assert addresses.owned == {"127.0.0.10", "127.0.0.11", "127.0.0.12", "127.0.0.53"}
    finally:
        await proxier.stop()
        backends.close()


@on_uvloop
async def test_endpoint_change__swapped_in_place__established_connection_survives():
    backends = Backends()
    proxier, _, _ = await start()
    try:
        a, b = await backends.tcp("a"), await backends.tcp("b")
        first = snapshot([web([a])], node=NODE)
        await proxier.apply(first)
        listener = proxier.listener(Frontend("127.0.0.10", 80, "TCP"))
        reader, writer = await asyncio.open_connection("127.0.0.10", 80)
        assert await reader.readline() == b"a\n"

        second = snapshot([web([b])], node=NODE, previous=first)
        await proxier.apply(second)
        assert proxier.listener(Frontend("127.0.0.10", 80, "TCP")) is listener
        assert await fetch("127.0.0.10", 80) == "b"
        writer.write(b"still there?\n")
        assert await asyncio.wait_for(reader.readline(), DEADLINE) == b"still there?\n"
        writer.close()
    finally:
        await proxier.stop()
        backends.close()


@on_uvloop
async def test_change_to_one_service_touches_only_it():
    backends = Backends()
    proxier, _, _ = await start()
    try:
        a, b = await backends.tcp("a"), await backends.tcp("b")
        first = snapshot([web([a]), web([a], vip="127.0.0.20", name="other")], node=NODE)
        await proxier.apply(first)
        other = proxier.listener(Frontend("127.0.0.20", 80, "TCP"))
        other_route = other.route
        second = snapshot([web([b]), first.services[other_route.pool.name.service]], node=NODE, previous=first)
        await proxier.apply(second)
        assert proxier.listener(Frontend("127.0.0.20", 80, "TCP")) is other
        assert other.route is other_route
    finally:
        await proxier.stop()
        backends.close()


@on_uvloop
async def test_service_removed__stops_answering_and_vip_goes():
    backends = Backends()
    proxier, addresses, _ = await start()
    try:
        first = snapshot([web([await backends.tcp("a")])], node=NODE)
        await proxier.apply(first)
        await proxier.apply(snapshot([], node=NODE, previous=first))
        assert await refused("127.0.0.10", 80)
        assert addresses.owned == {"127.0.0.53"}
        assert proxier.stats == {}
    finally:
        await proxier.stop()
        backends.close()


@on_uvloop
async def test_reserved_dns_frontend_is_left_to_the_dns_server():
    proxier, _, _ = await start()
    try:
        info = service("kube-dns", ["127.0.0.53"], [port(53, name="dns", protocol="UDP"), port(53, name="tcp")],
                       namespace="kube-system")
        slices = (endpoint_slice("kube-dns-0", [endpoint("127.0.0.1")], [("dns", "UDP", 5353), ("tcp", "TCP", 5353)]),)
        await proxier.apply(snapshot([ServiceState(info, slices)], node=NODE))
        assert proxier.listening == frozenset()
    finally:
        await proxier.stop()


@on_uvloop
async def test_grace_period__connection_to_a_deleted_endpoint_is_cut():
    backends = Backends()
    proxier, _, _ = await start(endpoint_grace_period=0.05)
    try:
        a, b = await backends.tcp("a"), await backends.tcp("b")
        first = snapshot([web([a])], node=NODE)
        await proxier.apply(first)
        reader, writer = await asyncio.open_connection("127.0.0.10", 80)
        assert await reader.readline() == b"a\n"
        await proxier.apply(snapshot([web([b])], node=NODE, previous=first))
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(), DEADLINE)
    finally:
        await proxier.stop()
        backends.close()


@on_uvloop
async def test_grace_period__endpoint_back_in_time__connection_kept():
    backends = Backends()
    proxier, _, _ = await start(endpoint_grace_period=0.05)
    try:
        a, b = await backends.tcp("a"), await backends.tcp("b")
        first = snapshot([web([a])], node=NODE)
        await proxier.apply(first)
        reader, writer = await asyncio.open_connection("127.0.0.10", 80)
        assert await reader.readline() == b"a\n"
        second = snapshot([web([b])], node=NODE, previous=first)
        await proxier.apply(second)
        await proxier.apply(snapshot([web([a, b])], node=NODE, previous=second))
        await until(lambda: not proxier.pending_endpoint_cuts, "the grace period to end")
        writer.write(b"still here\n")
        assert await asyncio.wait_for(reader.readline(), DEADLINE) == b"still here\n"
        writer.close()
    finally:
        await proxier.stop()
        backends.close()


@on_uvloop
async def test_stop__drains_then_resets_what_is_left():
    backends = Backends()
    proxier, addresses, _ = await start()
    try:
        await proxier.apply(snapshot([web([await backends.tcp("a")])], node=NODE))
        reader, writer = await asyncio.open_connection("127.0.0.10", 80)
        assert await reader.readline() == b"a\n"
        stopping = asyncio.create_task(proxier.stop(grace=5.0))
        await until(lambda: proxier.listening == frozenset() or stopping.done(), "listeners to close")
        assert await refused("127.0.0.10", 80)
        writer.write(b"late words\n")
        assert await asyncio.wait_for(reader.readline(), DEADLINE) == b"late words\n"
        writer.close()
        await asyncio.wait_for(stopping, DEADLINE)
        assert addresses.owned == frozenset()
    finally:
        await proxier.stop()
        backends.close()


@on_uvloop
async def test_sctp_port_without_kernel_support__reported_not_served():
    proxier, _, _ = await start()
    try:
        info = service("sig", ["127.0.0.40"], [port(9000, protocol="SCTP")])
        slices = (endpoint_slice("sig-0", [endpoint("127.0.0.1")], [("", "SCTP", 9000)]),)
        await proxier.apply(snapshot([ServiceState(info, slices)], node=NODE))
        if sctp_supported():
            assert Frontend("127.0.0.40", 9000, "SCTP") in proxier.listening
        else:
            assert proxier.problems == ["127.0.0.40:9000/SCTP: SCTP is not supported by this kernel; not served"]
    finally:
        await proxier.stop()


@on_uvloop
async def test_port_in_use__reported_and_retried_on_the_next_apply():
    backends = Backends()
    blocker = socket.socket()
    blocker.bind(("127.0.0.10", 80))
    blocker.listen()
    proxier, _, _ = await start()
    try:
        first = snapshot([web([await backends.tcp("a")])], node=NODE)
        await proxier.apply(first)
        assert "127.0.0.10:80/TCP (default/web/TCP): cannot listen" in proxier.problems[0]
        blocker.close()
        await proxier.apply(first)  # same snapshot: only the failed listener is retried
        assert proxier.problems == []
        assert await fetch("127.0.0.10", 80) == "a"
    finally:
        blocker.close()
        await proxier.stop()
        backends.close()


@pytest.mark.parametrize(
    ("client", "local"),
    [
        pytest.param("10.244.3.4", True, id="pod_cidr__local__a6_short_circuit"),
        pytest.param("fd00:10:244::7", True, id="pod_cidr_v6__local"),
        pytest.param("192.168.1.10", True, id="node_address__local__a6_short_circuit"),
        pytest.param("127.0.0.1", True, id="loopback__the_node_itself"),
        pytest.param("::ffff:10.244.3.4", True, id="v4_mapped_pod__local"),
        pytest.param("10.96.0.20", True, id="node_to_its_own_vip__source_is_the_vip__local"),
        pytest.param("203.0.113.5", False, id="outside__external_client"),
    ],
)
def test_local_clients(client, local):
    networks = [ipaddress.ip_network("10.244.0.0/16"), ipaddress.ip_network("fd00:10:244::/56")]
    classify = LocalClients(networks, ["192.168.1.10"])
    classify.set_vips(frozenset({"10.96.0.20"}))
    assert classify(client) is local
    assert classify(client) is local  # cached answer agrees

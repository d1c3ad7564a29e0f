"""The Proxier on loopback: listeners reconciled from snapshots, endpoints swapped in place.

VIPs are 127.0.0.x (local without adding addresses); the address manager and the
firewall are fakes; backends are real sockets on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import pytest
from support.fake_host import FakeAddresses, FakeFirewall
from support.proxy_loopback import apply_states, echoed, greeted_connection, greeting, on_uvloop, running_proxier, web
from support.slim import endpoint, endpoint_slice, port, service
from support.wait import DEADLINE, until

from kubeport.endpoints.types import ServiceName, ServiceState
from kubeport.proxy.config import ProxyConfig
from kubeport.proxy.healthcheck.service_health import HealthCheckServers
from kubeport.proxy.host.kernel import sctp_supported
from kubeport.proxy.relay.context import LocalClients
from kubeport.proxy.table import Frontend
from kubeport.proxy.workers.parent import create_proxier


async def refused(host: str, port_: int) -> bool:
    try:
        reader, writer = await asyncio.open_connection(host, port_)
    except ConnectionRefusedError:
        return True
    writer.close()
    return False


@on_uvloop
async def test_unsynced_snapshot_opens_nothing():
    async with running_proxier() as (proxier, _, _, backends):
        await apply_states(proxier, [web(await backends.tcp("a"))], synced=False)
        assert proxier.listening == frozenset() and not proxier.ready


@on_uvloop
async def test_forward_refuse_drop__listeners_and_firewall():
    """Forward, REJECT and DROP as pkg/proxy/iptables/proxier.go syncProxyRules chooses them."""
    async with running_proxier() as (proxier, addresses, firewall, backends):
        a = await backends.tcp("a")
        states = [
            web(a, node_port=30080),
            web(vip="127.0.0.11", name="empty"),
            # Its endpoint lives on another node: iTP=Local has nothing local -> DROP.
            web(a, vip="127.0.0.12", name="local-only", internal_policy_local=True, node="node-b"),
        ]
        await apply_states(proxier, states)
        assert proxier.ready
        assert await greeting("127.0.0.10", 80) == "a"
        assert await greeting("127.0.0.1", 30080) == "a"
        assert await refused("127.0.0.11", 80)
        assert firewall.drops == {Frontend("127.0.0.12", 80, "TCP"): False}
        assert Frontend("127.0.0.12", 80, "TCP") not in proxier.listening
        assert addresses.owned == {"127.0.0.10", "127.0.0.11", "127.0.0.12", "127.0.0.53"}


@on_uvloop
async def test_endpoint_change__swapped_in_place__established_connection_survives():
    async with running_proxier() as (proxier, _, _, backends):
        a, b = await backends.tcp("a"), await backends.tcp("b")
        first = await apply_states(proxier, [web(a)])
        listener = proxier.listener(Frontend("127.0.0.10", 80, "TCP"))
        reader, writer, hello = await greeted_connection("127.0.0.10")
        assert hello == b"a\n"

        await apply_states(proxier, [web(b)], previous=first)
        assert proxier.listener(Frontend("127.0.0.10", 80, "TCP")) is listener
        assert await greeting("127.0.0.10", 80) == "b"
        assert await echoed(reader, writer, b"still there?\n") == b"still there?\n"
        writer.close()


@on_uvloop
async def test_change_to_one_service_touches_only_it():
    async with running_proxier() as (proxier, _, _, backends):
        a, b = await backends.tcp("a"), await backends.tcp("b")
        first = await apply_states(proxier, [web(a), web(a, vip="127.0.0.20", name="other")])
        other = proxier.listener(Frontend("127.0.0.20", 80, "TCP"))
        other_route = other.route
        await apply_states(proxier, [web(b), first.services[other_route.pool.name.service]], previous=first)
        assert proxier.listener(Frontend("127.0.0.20", 80, "TCP")) is other
        assert other.route is other_route


@on_uvloop
async def test_service_removed__stops_answering_and_vip_goes():
    async with running_proxier() as (proxier, addresses, _, backends):
        first = await apply_states(proxier, [web(await backends.tcp("a"))])
        await apply_states(proxier, [], previous=first)
        assert await refused("127.0.0.10", 80)
        assert addresses.owned == {"127.0.0.53"}
        assert proxier.stats == {}


@on_uvloop
async def test_reserved_dns_frontend_is_left_to_the_dns_server():
    async with running_proxier() as (proxier, _, _, _):
        info = service("kube-dns", ["127.0.0.53"], [port(53, name="dns", protocol="UDP"), port(53, name="tcp")],
                       namespace="kube-system")
        slices = (endpoint_slice("kube-dns-0", [endpoint("127.0.0.1")], [("dns", "UDP", 5353), ("tcp", "TCP", 5353)]),)
        await apply_states(proxier, [ServiceState(info, slices)])
        assert proxier.listening == frozenset()


@on_uvloop
async def test_grace_period__connection_to_a_deleted_endpoint_is_cut():
    async with running_proxier(endpoint_grace_period=0.05) as (proxier, _, _, backends):
        a, b = await backends.tcp("a"), await backends.tcp("b")
        first = await apply_states(proxier, [web(a)])
        reader, _, hello = await greeted_connection("127.0.0.10")
        assert hello == b"a\n"
        await apply_states(proxier, [web(b)], previous=first)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(), DEADLINE)


@on_uvloop
async def test_grace_period__endpoint_back_in_time__connection_kept():
    async with running_proxier(endpoint_grace_period=0.05) as (proxier, _, _, backends):
        a, b = await backends.tcp("a"), await backends.tcp("b")
        first = await apply_states(proxier, [web(a)])
        reader, writer, hello = await greeted_connection("127.0.0.10")
        assert hello == b"a\n"
        second = await apply_states(proxier, [web(b)], previous=first)
        await apply_states(proxier, [web(a, b)], previous=second)
        await until(lambda: not proxier.pending_endpoint_cuts, "the grace period to end")
        assert await echoed(reader, writer, b"still here\n") == b"still here\n"
        writer.close()


@on_uvloop
async def test_stop__drains_then_resets_what_is_left():
    async with running_proxier() as (proxier, addresses, _, backends):
        await apply_states(proxier, [web(await backends.tcp("a"))])
        reader, writer, hello = await greeted_connection("127.0.0.10")
        assert hello == b"a\n"
        stopping = asyncio.create_task(proxier.stop(grace=5.0))
        await until(lambda: proxier.listening == frozenset() or stopping.done(), "listeners to close")
        assert await refused("127.0.0.10", 80)
        assert await echoed(reader, writer, b"late words\n") == b"late words\n"
        writer.close()
        await asyncio.wait_for(stopping, DEADLINE)
        assert addresses.owned == frozenset()


@on_uvloop
async def test_sctp_port_without_kernel_support__reported_not_served():
    async with running_proxier() as (proxier, _, _, _):
        state = web(9000, name="sig", vip="127.0.0.40", port_number=9000, protocol="SCTP")
        await apply_states(proxier, [state])
        if sctp_supported():
            assert Frontend("127.0.0.40", 9000, "SCTP") in proxier.listening
        else:
            assert proxier.problems == ["127.0.0.40:9000/SCTP: SCTP is not supported by this kernel; not served"]


@on_uvloop
async def test_port_in_use__reported_and_retried_on_the_next_apply():
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.10", 80))
        blocker.listen()
        async with running_proxier() as (proxier, _, _, backends):
            first = await apply_states(proxier, [web(await backends.tcp("a"))])
            assert "127.0.0.10:80/TCP (default/web/TCP): cannot listen" in proxier.problems[0]
            blocker.close()
            await proxier.apply(first)  # same snapshot: only the failed listener is retried
            assert proxier.problems == []
            assert await greeting("127.0.0.10", 80) == "a"


NO_MATCH_V4 = ("nodePortAddresses '10.9.0.0/16': no local IPv4 address in 10.9.0.0/16: "
               "no NodePorts and no health-check node ports on IPv4")


@pytest.mark.parametrize(
    ("nodeport_addresses", "health_check", "node_port_open", "problems"),
    [
        pytest.param(("primary", "localhost"), ("127.0.0.1", "::1"), True, [], id="matched__each_address"),
        pytest.param(("127.0.0.0/8",), ("127.0.0.1",), True, [], id="cidr_matched__its_addresses_only"),
        pytest.param(("10.9.0.0/16",), (), False, [NO_MATCH_V4],
                     id="cidr_matching_nothing__no_nodeport_no_health_check_port__logged_once"),
    ],
)
async def test_nodeport_addresses_matching_nothing_open_no_health_check_port(
    nodeport_addresses, health_check, node_port_open, problems, caplog
):
    """pkg/proxy/util/nodeport_addresses.go; health-check ports on the same addresses (service_health.go)."""
    async with running_proxier(nodeport_addresses=nodeport_addresses) as (proxier, _, _, backends):
        first = await apply_states(proxier, [web(await backends.tcp("a"), node_port=30080)])
        await apply_states(proxier, [web(await backends.tcp("b"), node_port=30080)], previous=first)
        assert proxier.health_check_addresses == health_check
        assert (Frontend("127.0.0.1", 30080, "TCP") in proxier.listening) is node_port_open
        assert proxier.problems == problems
        assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == problems
        # The daemon's glue: health-check ports go where the proxier says, nowhere when nothing matched.
        servers = HealthCheckServers(lambda: True)
        try:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                hc_port = probe.getsockname()[1]
            assert await servers.sync({hc_port: (ServiceName("default", "web"), 1)}, proxier.health_check_addresses) == {}
            assert servers.ports == (frozenset({hc_port}) if health_check else frozenset())
        finally:
            await servers.close()


@pytest.mark.parametrize(
    ("client", "local"),
    [
        pytest.param("10.244.3.4", True, id="pod_cidr__local__short_circuit"),
        pytest.param("fd00:10:244::7", True, id="pod_cidr_v6__local"),
        pytest.param("192.168.1.10", True, id="node_address__local__short_circuit"),
        pytest.param("127.0.0.1", True, id="loopback__the_node_itself"),
        pytest.param("::ffff:10.244.3.4", True, id="v4_mapped_pod__local"),
        pytest.param("10.96.0.20", True, id="node_to_its_own_vip__source_is_the_vip__local"),
        pytest.param("203.0.113.5", False, id="outside__external_client"),
    ],
)
def test_local_clients(client, local):
    """Who is short-circuited to the cluster set: kube-proxy's --detect-local-mode ClusterCIDR
    (pkg/proxy/util/localdetector.go) and the node itself (pkg/proxy/iptables/proxier.go)."""
    networks = [ipaddress.ip_network("10.244.0.0/16"), ipaddress.ip_network("fd00:10:244::/56")]
    classify = LocalClients(networks, ["192.168.1.10"])
    classify.set_vips(frozenset({"10.96.0.20"}))
    assert classify(client) is local
    assert classify(client) is local  # cached answer agrees


@on_uvloop
@pytest.mark.parametrize("capture", [pytest.param(True, id="external_ips_captured__not_filtered_by_address"),
                                     pytest.param(False, id="external_ips_local__filtered_too")])
async def test_vips_answer_only_their_service_ports(capture):
    """The firewall is told every VIP kubeport makes local and what each serves (the rest is
    rejected); the node's own address stays out though a Service names it."""
    async with running_proxier(capture=capture) as (proxier, _, firewall, backends):
        a = await backends.tcp("a")
        states = [web(a, port_number=80, node_port=30080, external_ips=("127.0.0.70", "127.0.0.1")),
                  web(a, vip="127.0.0.11", name="dns-like", port_number=53, protocol="UDP")]
        first = await apply_states(proxier, states)
        external = {"127.0.0.70"} if not capture else set()
        assert firewall.vips.addresses == {"127.0.0.10", "127.0.0.11", "127.0.0.53", *external}
        served = {Frontend("127.0.0.10", 80, "TCP"), Frontend("127.0.0.11", 53, "UDP"),
                  Frontend("127.0.0.53", 53, "TCP"), Frontend("127.0.0.53", 53, "UDP")}
        if not capture:
            served |= {Frontend("127.0.0.70", 80, "TCP"), Frontend("127.0.0.1", 80, "TCP")}
        assert firewall.vips.ports == served

        await apply_states(proxier, states[:1], previous=first)
        assert "127.0.0.11" not in firewall.vips.addresses
        assert Frontend("127.0.0.11", 53, "UDP") not in firewall.vips.ports


@on_uvloop
async def test_without_nft__a_problem_line_says_the_node_sockets_are_exposed():
    firewall = FakeFirewall()
    firewall.has_nft = False
    proxier = create_proxier(ProxyConfig(seed=1), "node-a", addresses=FakeAddresses(["127.0.0.1"]), firewall=firewall)
    await proxier.start(extra_addresses=["127.0.0.53"])
    try:
        assert any("reaches the node's sockets bound to 0.0.0.0" in p for p in proxier.problems)
    finally:
        await proxier.stop()


@on_uvloop
async def test_service_ranges_follow_the_snapshot__the_flag_s_always_kept():
    """kube-proxy's nftables mode drops traffic to unallocated addresses of every ServiceCIDR
    (KEP-1880): a range a snapshot adds reaches the firewall, one it drops leaves it, and the
    configured --service-cluster-ip-range stays whatever a snapshot says."""
    from dataclasses import replace

    async with running_proxier(service_cidrs=("10.96.0.0/28",)) as (proxier, _, firewall, backends):
        first = await apply_states(proxier, [web(await backends.tcp("a"))])
        assert firewall.service_cidrs == ("10.96.0.0/28",)
        added = replace(first, generation=first.generation + 1, changed=frozenset(),
                        service_cidrs=("10.96.0.0/28", "10.97.0.0/24"))
        await proxier.apply(added)
        assert firewall.service_cidrs == ("10.96.0.0/28", "10.97.0.0/24")
        await proxier.apply(replace(added, generation=added.generation + 1, service_cidrs=()))
        assert firewall.service_cidrs == ("10.96.0.0/28",)

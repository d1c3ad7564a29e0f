"""Health-check node ports (kube-proxy's pkg/proxy/healthcheck/service_health.go; KEP-1669 for the
drain): pure parts and real HTTP on loopback."""

from __future__ import annotations

import asyncio
import socket
from types import MappingProxyType

import aiohttp
import pytest

from kubeport.endpoints.types import (
    EndpointInfo,
    EndpointPortInfo,
    PortSpec,
    ServiceInfo,
    ServiceName,
    ServiceState,
    SliceInfo,
)
from kubeport.proxy.healthcheck.service_health import (
    HealthCheckServers,
    desired_health_checks,
    local_ready_endpoints,
    needs_health_check,
    service_health_response,
    update_health_checks,
)

WEB = ServiceName("default", "web")
NODE = "node-a"


def info(name: ServiceName = WEB, *, type_: str = "LoadBalancer", etp_local: bool = True, hc_port: int = 32000,
         cluster_ips: tuple[str, ...] = ("10.96.0.20",), headless: bool = False) -> ServiceInfo:
    return ServiceInfo(
        name=name, uid="u", type=type_, cluster_ips=cluster_ips, headless=headless, external_name=None,
        ports=(PortSpec("http", "TCP", 80, 8080, node_port=30080),
               PortSpec("https", "TCP", 443, 8443, node_port=30443)),
        external_policy_local=etp_local, health_check_node_port=hc_port,
    )


def ep(address: str, *, node: str | None = NODE, ready: bool = True, terminating: bool = False) -> EndpointInfo:
    return EndpointInfo(address=address, ready=ready, serving=ready or terminating, terminating=terminating,
                        node_name=node)


def state(service: ServiceInfo, *endpoints: EndpointInfo, ports=None, family: str = "IPv4") -> ServiceState:
    ports = ports or (EndpointPortInfo("http", "TCP", 8080), EndpointPortInfo("https", "TCP", 8443))
    return ServiceState(service, (SliceInfo("s1", family, ports, tuple(endpoints)),))


# --- pure -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("service", "needed"),
    [
        pytest.param(info(), True, id="load_balancer_etp_local"),
        pytest.param(info(type_="NodePort"), False, id="node_port_etp_local_has_no_health_check"),
        pytest.param(info(etp_local=False), False, id="load_balancer_etp_cluster"),
        pytest.param(info(hc_port=0), False, id="no_health_check_node_port_allocated"),
        pytest.param(info(cluster_ips=("None",), headless=True), False, id="headless_not_proxied"),
    ],
)
def test_needs_health_check(service, needed) -> None:
    assert needs_health_check(service) is needed


@pytest.mark.parametrize(
    ("endpoints", "count"),
    [
        pytest.param((ep("10.244.1.5"), ep("10.244.1.6")), 2, id="local_ready_endpoints"),
        pytest.param((ep("10.244.1.5"), ep("10.244.2.5", node="node-b")), 1, id="remote_endpoints_do_not_count"),
        pytest.param((ep("10.244.1.5", ready=False),), 0, id="unready_endpoints_do_not_count"),
        pytest.param((ep("10.244.1.5", ready=False, terminating=True),), 0,
                     id="serving_terminating_endpoints_do_not_count__kep1669_lb_drain"),
        pytest.param((ep("10.244.1.5", node=None),), 0, id="endpoint_without_node_name_is_not_local"),
    ],
)
def test_local_ready_endpoints(endpoints, count) -> None:
    assert local_ready_endpoints(state(info(), *endpoints), NODE) == count


def test_local_endpoints_are_distinct_ips_across_all_ports() -> None:
    # Each IP serves both ports: counted once.
    assert local_ready_endpoints(state(info(), ep("10.244.1.5"), ep("10.244.1.6")), NODE) == 2
    only_https = state(info(), ep("10.244.1.7"), ports=(EndpointPortInfo("https", "TCP", 8443),))
    assert local_ready_endpoints(only_https, NODE) == 1


def test_dual_stack_pod_is_one_endpoint__each_family_proxier_counts_its_own() -> None:
    ports = (EndpointPortInfo("http", "TCP", 8080),)
    dual = info(cluster_ips=("10.96.0.20", "fd00:96::20"))
    slices = (SliceInfo("v4", "IPv4", ports, (ep("10.244.1.5"), ep("10.244.1.6"))),
              SliceInfo("v6", "IPv6", ports, (ep("fd00:244::5"),)))
    assert local_ready_endpoints(ServiceState(dual, slices), NODE) == 2
    both = (SliceInfo("v4", "IPv4", ports, (ep("10.244.1.5"),)), SliceInfo("v6", "IPv6", ports, (ep("fd00:244::5"),)))
    assert local_ready_endpoints(ServiceState(dual, both), NODE) == 1


def test_local_endpoints_need_a_node_name() -> None:
    assert local_ready_endpoints(state(info(), ep("10.244.1.5")), "") == 0


def test_desired_health_checks_and_incremental_update() -> None:
    api = ServiceName("default", "api")
    services = MappingProxyType({
        WEB: state(info(), ep("10.244.1.5")),
        api: state(info(api, hc_port=32001)),
        ServiceName("default", "plain"): state(info(ServiceName("default", "plain"), etp_local=False)),
    })
    desired = desired_health_checks(services, NODE)
    assert desired == {32000: (WEB, 1), 32001: (api, 0)}

    changed = dict(services)
    changed[api] = state(info(api, hc_port=32001), ep("10.244.1.9"), ep("10.244.1.10"))
    del changed[WEB]
    assert update_health_checks(desired, changed, [WEB, api], NODE) == {32001: (api, 2)}


@pytest.mark.parametrize(
    ("count", "proxy_healthy", "status"),
    [
        pytest.param(2, True, 200, id="local_endpoints_and_healthy_proxy"),
        pytest.param(0, True, 503, id="no_local_endpoints"),
        pytest.param(2, False, 503, id="proxy_unhealthy"),
    ],
)
def test_service_health_response(count, proxy_healthy, status) -> None:
    response = service_health_response(WEB, count, proxy_healthy)
    assert response.status == status
    assert dict(response.headers) == {
        "Content-Type": "application/json",
        "X-Content-Type-Options": "nosniff",
        "X-Load-Balancing-Endpoint-Weight": str(count),
    }


def test_service_health_body_is_kube_proxys_exactly() -> None:
    assert service_health_response(WEB, 2, True).body == (
        b'{\n\t"service": {\n\t\t"namespace": "default",\n\t\t"name": "web"\n\t},\n'
        b'\t"localEndpoints": 2,\n\t"serviceProxyHealthy": true\n}'
    )


# --- real HTTP on loopback ------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


async def probe(host: str, port: int, path: str = "/healthz") -> tuple[int, dict[str, str], str]:
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session, session.get(f"http://{host}:{port}{path}") as got:
        return got.status, dict(got.headers), await got.text()


async def refused(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except ConnectionRefusedError:
        return True
    writer.close()
    await writer.wait_closed()
    return False


class ProxyHealthKnob:
    """The proxy's health as the servers see it at request time."""

    healthy = True


@pytest.fixture
def proxy() -> ProxyHealthKnob:
    return ProxyHealthKnob()


@pytest.fixture
async def servers(proxy):
    hcs = HealthCheckServers(lambda: proxy.healthy)
    yield hcs
    await hcs.close()


async def keep_alive_get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    """One HTTP/1.1 request on an open connection; the body of the answer."""
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    return await reader.readexactly(length)


async def test_serves_any_path_with_kube_proxy_answer(servers) -> None:
    port = free_port()
    assert await servers.sync({port: (WEB, 2)}, ["127.0.0.1"]) == {}
    for path in ("/healthz", "/", "/anything/else"):
        status, headers, text = await probe("127.0.0.1", port, path)
        assert status == 200
        assert headers["Content-Type"] == "application/json"
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["X-Load-Balancing-Endpoint-Weight"] == "2"
        assert text == service_health_response(WEB, 2, True).body.decode()


async def test_count_changes_in_place_and_503_without_local_endpoints(servers) -> None:
    port = free_port()
    await servers.sync({port: (WEB, 1)}, ["127.0.0.1"])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        assert b'"localEndpoints": 1' in await keep_alive_get(reader, writer)
        await servers.sync({port: (WEB, 0)}, ["127.0.0.1"])
        # Same connection still served: the port was left alone, not reopened.
        assert b'"localEndpoints": 0' in await keep_alive_get(reader, writer)
    finally:
        writer.close()
        await writer.wait_closed()
    status, _, text = await probe("127.0.0.1", port)
    assert status == 503
    assert '"localEndpoints": 0' in text


async def test_503_when_proxy_unhealthy(servers, proxy) -> None:
    port = free_port()
    await servers.sync({port: (WEB, 3)}, ["127.0.0.1"])
    proxy.healthy = False
    status, _, text = await probe("127.0.0.1", port)
    assert status == 503
    assert '"serviceProxyHealthy": false' in text


async def test_removed_port_is_closed(servers) -> None:
    keep, drop = free_port(), free_port()
    await servers.sync({keep: (WEB, 1), drop: (ServiceName("default", "api"), 1)}, ["127.0.0.1"])
    await servers.sync({keep: (WEB, 1)}, ["127.0.0.1"])
    assert servers.ports == {keep}
    assert await refused("127.0.0.1", drop)
    assert (await probe("127.0.0.1", keep))[0] == 200


async def test_listens_only_on_given_addresses_and_reopens_when_they_change(servers) -> None:
    port = free_port()
    await servers.sync({port: (WEB, 1)}, ["127.0.0.2"])
    assert await refused("127.0.0.1", port)
    assert (await probe("127.0.0.2", port))[0] == 200
    await servers.sync({port: (WEB, 1)}, ["127.0.0.1"])
    assert await refused("127.0.0.2", port)
    assert (await probe("127.0.0.1", port))[0] == 200


@pytest.mark.parametrize(
    ("addresses", "answering", "refusing"),
    [
        pytest.param(["127.0.0.2"], ["127.0.0.2"], ["127.0.0.1"], id="each_matched_node_ip"),
        pytest.param(["0.0.0.0"], ["127.0.0.1", "127.0.0.2"], [], id="match_all_family__wildcard"),
        pytest.param(None, ["127.0.0.1", "127.0.0.2"], [], id="none__every_address"),
        pytest.param([], [], ["127.0.0.1", "127.0.0.2"], id="nodeport_addresses_match_nothing__no_port"),
    ],
)
async def test_listens_where_nodeport_addresses_say(servers, addresses, answering, refusing) -> None:
    """pkg/proxy/healthcheck/service_health.go SyncServices listens on the matched node IPs."""
    port = free_port()
    assert await servers.sync({port: (WEB, 1)}, addresses) == {}
    assert servers.ports == (frozenset({port}) if answering else frozenset())
    assert servers.failures == {}
    for host in answering:
        assert (await probe(host, port))[0] == 200
    for host in refusing:
        assert await refused(host, port)


async def test_no_matched_address_closes_open_ports_and_a_match_reopens_them(servers) -> None:
    port = free_port()
    await servers.sync({port: (WEB, 1)}, ["127.0.0.1"])
    assert await servers.sync({port: (WEB, 1)}, []) == {}
    assert servers.ports == frozenset() and await refused("127.0.0.1", port)
    assert await servers.retry_failed() == {}  # nothing to retry: not a failure
    await servers.sync({port: (WEB, 1)}, ["127.0.0.1"])
    assert (await probe("127.0.0.1", port))[0] == 200


async def test_port_in_use_is_reported_and_retried_next_sync(servers) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    try:
        failures = await servers.sync({port: (WEB, 1)}, ["127.0.0.1"])
        assert list(failures) == [port]
        assert "default/web" in failures[port] and str(port) in failures[port]
        assert servers.ports == frozenset()
    finally:
        blocker.close()
    assert await servers.sync({port: (WEB, 1)}, ["127.0.0.1"]) == {}
    assert (await probe("127.0.0.1", port))[0] == 200


async def test_close_stops_everything(servers) -> None:
    port = free_port()
    await servers.sync({port: (WEB, 1)}, ["127.0.0.1"])
    await servers.close()
    assert servers.ports == frozenset()
    assert await refused("127.0.0.1", port)

"""DNS metrics under CoreDNS's names: the exposition is scraped and parsed with
prometheus_client's parser after real answers from a DnsServer on loopback, forwarding to
a fake upstream on another loopback port."""

from __future__ import annotations

import asyncio
import platform
import struct
from collections import Counter

import pytest
from dnslib import QTYPE, RCODE, RR, SOA, A, DNSRecord
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kubeport.lib.version import __version__
from kubeport.dns.config import DnsConfig
from kubeport.dns.metrics import BUCKET_BOUNDS, DnsCollector, family_label, type_label
from kubeport.dns.server import DnsServer
from kubeport.dns.stats import DURATION_BUCKETS, SIZE_BUCKETS, DurationHistogram

from support.api import cluster_state, endpoint_slice, service
from support.coredns_dashboard import NOT_EXPORTED, dashboard_series
from support.zonetext import question

HTTP = [{"name": "http", "port": 80}]
CLUSTER = [
    service("web", clusterIP="10.96.0.20", ports=HTTP),
    endpoint_slice("web", ports=HTTP, endpoints=["10.244.0.5"]),
]
WEB = "web.default.svc.cluster.local"


class Upstream(asyncio.DatagramProtocol):
    """example.test: www has an A record, every other name is NXDOMAIN with a SOA."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        request = DNSRecord.parse(data)
        reply = request.reply()
        if str(request.q.qname).lower() == "www.example.test.":
            reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A("203.0.113.7"), ttl=300))
        else:
            reply.header.rcode = RCODE.NXDOMAIN
            reply.add_auth(RR("example.test.", QTYPE.SOA, ttl=60, rdata=SOA(
                "ns.example.test.", "admin.example.test.", (1, 7200, 1800, 86400, 60))))
        self.transport.sendto(reply.pack(), addr)


class Client(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.replies: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.replies.put_nowait(data)


@pytest.fixture
async def dns():
    loop = asyncio.get_running_loop()
    upstream, _ = await loop.create_datagram_endpoint(Upstream, local_addr=("127.0.0.1", 0))
    upstream_port = upstream.get_extra_info("sockname")[1]
    server = DnsServer(DnsConfig(addresses=("127.0.0.1",), port=0, upstreams=(("127.0.0.1", upstream_port),)))
    await server.start()
    server.apply(cluster_state(CLUSTER).commit())
    server.upstream_name = f"127.0.0.1:{upstream_port}"
    yield server
    await server.stop()
    upstream.close()


async def ask_udp(server: DnsServer, packets: list[bytes], answered: int | None = None) -> list[bytes]:
    """Send each packet in turn, waiting for its reply (packets without a header get none)."""
    loop = asyncio.get_running_loop()
    transport, client = await loop.create_datagram_endpoint(Client, remote_addr=("127.0.0.1", server.port))
    replies = []
    try:
        for packet in packets:
            transport.sendto(packet)
            if len(packet) >= 12:
                replies.append(await asyncio.wait_for(client.replies.get(), 5))
    finally:
        transport.close()
    return replies


async def ask_tcp(server: DnsServer, packet: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(len(packet).to_bytes(2, "big") + packet)
    size = int.from_bytes(await asyncio.wait_for(reader.readexactly(2), 5), "big")
    reply = await asyncio.wait_for(reader.readexactly(size), 5)
    writer.close()
    return reply


def scrape(server: DnsServer) -> dict[str, dict[frozenset, float]]:
    """sample name -> {labels: value}, through the text exposition and its parser."""
    registry = CollectorRegistry()
    registry.register(DnsCollector(server))
    samples: dict[str, dict[frozenset, float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return samples


def labels(**values: str) -> frozenset:
    return frozenset(values.items())


QDCOUNT_0 = struct.pack("!HHHHHH", 0x1235, 0x0100, 0, 0, 0, 0)
TRAFFIC = [  # (packet, udp?) in order; what each one is for is in the expectations below
    (question(WEB), True), (question(WEB), True), (question(WEB), True),  # one build, two cached
    (question(WEB, "AAAA"), True),  # NODATA
    (question(f"_http._tcp.{WEB}", "SRV"), True),
    (question("nope.default.svc.cluster.local"), True),  # NXDOMAIN
    (question("dns-version.cluster.local", "TXT"), True),
    (question(WEB, "HINFO"), True),  # type "other"
    (QDCOUNT_0, True),  # FORMERR, type "other"
    (b"\x12\x34", True),  # no header: dropped, not counted
    (question("www.example.test"), True), (question("www.example.test"), True),  # forwarded, then cached
    (question("gone.example.test"), True), (question("gone.example.test"), True),  # NXDOMAIN cached (denial)
    (question(WEB, query_id=7), False),  # over TCP
]


async def send_traffic(server: DnsServer) -> None:
    for packet, udp in TRAFFIC:
        if udp:
            await ask_udp(server, [packet])
        else:
            await ask_tcp(server, packet)


async def test_counters_match_the_traffic_sent(dns: DnsServer) -> None:
    await send_traffic(dns)
    metrics = scrape(dns)
    block = {"server": f"dns://:{dns.port}", "zone": "."}
    requests = {dict(key)["proto"] + " " + dict(key)["type"]: value
                for key, value in metrics["coredns_dns_requests_total"].items()}
    assert requests == {"udp A": 8, "udp AAAA": 1, "udp SRV": 1, "udp TXT": 1, "udp other": 2, "tcp A": 1}
    assert all(dict(key)["family"] == "1" and dict(key).items() >= block.items()
               for key in metrics["coredns_dns_requests_total"])
    responses = {dict(key)["rcode"]: value for key, value in metrics["coredns_dns_responses_total"].items()}
    assert responses == {"NOERROR": 10, "NXDOMAIN": 3, "FORMERR": 1}
    assert all(dict(key)["plugin"] == "" for key in metrics["coredns_dns_responses_total"])
    to = dns.upstream_name
    assert metrics["coredns_forward_requests_total"] == {labels(to=to): 2}
    assert metrics["coredns_forward_responses_total"] == {labels(to=to, rcode="NOERROR"): 1,
                                                           labels(to=to, rcode="NXDOMAIN"): 1}
    # the first UDP forward opens the upstream's socket, the second reuses it
    assert metrics["coredns_forward_conn_cache_misses_total"] == {labels(to=to, proto="udp"): 1}
    assert metrics["coredns_forward_conn_cache_hits_total"] == {labels(to=to, proto="udp"): 1}
    server = block["server"]
    cache = {"server": server, "zones": ".", "view": ""}
    assert metrics["coredns_cache_hits_total"] == {labels(**cache, type="success"): 1,
                                                   labels(**cache, type="denial"): 1}
    assert metrics["coredns_cache_misses_total"] == {labels(**cache): 2}
    assert metrics["coredns_cache_requests_total"] == {labels(**cache): 4}
    assert metrics["coredns_cache_entries"] == {labels(**cache, type="success"): 1,
                                                labels(**cache, type="denial"): 1}
    assert metrics["coredns_forward_max_concurrent_rejects_total"] == {labels(): 0}
    # 6 cluster questions built once each; web A twice more over UDP and once over TCP from the cache.
    assert metrics["kubeport_dns_answer_cache_misses_total"] == {labels(server=server): 6}
    assert metrics["kubeport_dns_answer_cache_hits_total"] == {labels(server=server): 3}
    assert metrics["kubeport_dns_dropped_total"] == {labels(server=server): 1}


async def test_duration_histogram_counts_every_request(dns: DnsServer) -> None:
    await send_traffic(dns)
    metrics = scrape(dns)
    requests: Counter[str] = Counter()
    for key, value in metrics["coredns_dns_requests_total"].items():
        requests[dict(key)["type"]] += value
    counts = {dict(key)["type"]: value for key, value in metrics["coredns_dns_request_duration_seconds_count"].items()}
    assert counts == dict(requests)
    buckets: dict[str, list[tuple[float, float]]] = {}
    for key, value in metrics["coredns_dns_request_duration_seconds_bucket"].items():
        found = dict(key)
        buckets.setdefault(found["type"], []).append((float(found["le"]), value))
    for qtype, series in buckets.items():
        series.sort()
        assert [bound for bound, _ in series] == [*DURATION_BUCKETS, float("inf")], qtype
        assert all(a[1] <= b[1] for a, b in zip(series, series[1:])), f"{qtype}: buckets are cumulative"
        assert series[-1][1] == counts[qtype]
    # The upstream round trips were timed: A's sum is more than nothing.
    sums = {dict(key)["type"]: value for key, value in metrics["coredns_dns_request_duration_seconds_sum"].items()}
    assert sums["A"] > 0


async def test_cached_answers_are_not_timed(dns: DnsServer) -> None:
    await ask_udp(dns, [question(WEB)])
    timed = dns.stats.durations["A"].count
    await ask_udp(dns, [question(WEB)] * 20)
    assert dns.stats.durations["A"].count == timed
    assert dns.stats.answer_cache_hits == 20


async def test_before_any_query_every_family_is_exported(dns: DnsServer) -> None:
    metrics = scrape(dns)
    assert metrics["coredns_cache_misses_total"] == {labels(server=f"dns://:{dns.port}", zones=".", view=""): 0}
    assert "coredns_dns_requests_total" not in metrics  # no series until a request is counted


def test_registering_reads_no_stats_and_catches_duplicates() -> None:
    server = DnsServer(DnsConfig(addresses=("127.0.0.1",), port=0, upstreams=()))
    registry = CollectorRegistry()
    registry.register(DnsCollector(server))
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(DnsCollector(server))


@pytest.mark.parametrize("qtype, label", [
    pytest.param("A", "A", id="a"),
    pytest.param("AAAA", "AAAA", id="aaaa"),
    pytest.param("ANY", "ANY", id="any"),
    pytest.param("MX", "MX", id="mx"),
    pytest.param("HINFO", "other", id="unlisted_type__bounded_cardinality"),
    pytest.param("TYPE65280", "other", id="numeric_type__bounded_cardinality"),
    pytest.param("invalid", "other", id="formerr_before_the_question"),
])
def test_type_label(qtype: str, label: str) -> None:
    assert type_label(qtype) == label


@pytest.mark.parametrize("addresses, family", [
    pytest.param(("10.96.0.10",), "1", id="ipv4__coredns_family_1"),
    pytest.param(("fd00:10:96::a",), "2", id="ipv6__coredns_family_2"),
    pytest.param(("10.96.0.10", "127.0.0.1"), "1", id="ipv4_only"),
    pytest.param(("10.96.0.10", "fd00:10:96::a"), "", id="mixed_not_split"),
])
def test_family_label(addresses: tuple[str, ...], family: str) -> None:
    assert family_label(addresses) == family


@pytest.mark.parametrize("seconds, bucket", [
    pytest.param(0.0, 0, id="zero"),
    pytest.param(0.00025, 0, id="on_the_bound__le_is_inclusive"),
    pytest.param(0.0002501, 1, id="just_above"),
    pytest.param(8.192, 15, id="last_bound"),
    pytest.param(30.0, 16, id="inf"),
])
def test_duration_buckets(seconds: float, bucket: int) -> None:
    histogram = DurationHistogram()
    histogram.observe(seconds)
    assert histogram.counts.index(1) == bucket and histogram.total == seconds


def test_bucket_bounds_are_coredns_time_buckets() -> None:
    """plugin.TimeBuckets = prometheus.ExponentialBuckets(0.00025, 2, 16)."""
    assert BUCKET_BOUNDS[:3] == ("0.00025", "0.0005", "0.001")
    assert BUCKET_BOUNDS[-2:] == ("8.192", "+Inf") and len(BUCKET_BOUNDS) == 17


async def test_size_histograms_count_every_reply_with_its_bytes(dns: DnsServer) -> None:
    """coredns_dns_request_size_bytes / _response_size_bytes (plugin/metrics/vars: req.Len(),
    the reply's size), cached answers included: the sums are the bytes that went each way."""
    udp = [question(WEB), question(WEB), question(f"_http._tcp.{WEB}", "SRV"), question("www.example.test"),
           question("www.example.test"), question("nope.default.svc.cluster.local", edns=1232)]
    replies = await ask_udp(dns, udp)
    tcp_query = question(WEB, query_id=9)
    tcp_reply = await ask_tcp(dns, tcp_query)
    metrics = scrape(dns)
    block = {"server": f"dns://:{dns.port}", "zone": ".", "view": ""}
    assert metrics["coredns_dns_request_size_bytes_count"] == {labels(**block, proto="udp"): 6,
                                                               labels(**block, proto="tcp"): 1}
    assert metrics["coredns_dns_request_size_bytes_sum"] == {labels(**block, proto="udp"): sum(map(len, udp)),
                                                             labels(**block, proto="tcp"): len(tcp_query)}
    assert metrics["coredns_dns_response_size_bytes_sum"] == {labels(**block, proto="udp"): sum(map(len, replies)),
                                                              labels(**block, proto="tcp"): len(tcp_reply)}
    buckets = {float(dict(key)["le"]): value for key, value in metrics["coredns_dns_response_size_bytes_bucket"].items()
               if dict(key)["proto"] == "udp"}
    assert sorted(buckets) == [*SIZE_BUCKETS, float("inf")]
    assert all(buckets[bound] == sum(len(r) <= bound for r in replies) for bound in buckets)


async def test_build_info_plugins_and_panics_are_exported(dns: DnsServer) -> None:
    metrics = scrape(dns)
    (info,) = metrics["coredns_build_info"]
    assert dict(info)["version"] == __version__ and dict(info)["goversion"] == platform.python_version()
    enabled = {dict(key)["name"] for key in metrics["coredns_plugin_enabled"]}
    assert {"kubernetes", "forward", "cache", "loadbalance", "prometheus"} <= enabled
    assert metrics["coredns_panics_total"] == {labels(): 0}


async def test_every_series_a_coredns_dashboard_reads_is_exported(dns: DnsServer) -> None:
    """Scraped after traffic and a change, the way the dashboard's Prometheus sees the DNS
    metrics address."""
    await send_traffic(dns)
    from support.api import to_model

    state = cluster_state([*CLUSTER, service("db", clusterIP="None", ports=HTTP)])
    state.commit()
    state.upsert(to_model(endpoint_slice("db", ports=HTTP, endpoints=["10.244.0.9"])))
    dns.apply(state.commit())  # the next generation: db's new slice is a change to program
    registry = CollectorRegistry()
    registry.register(DnsCollector(dns))
    for collector in (ProcessCollector,):
        collector(registry=registry)
    scraped: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            scraped.setdefault(sample.name, set()).update(sample.labels)
    wanted = dashboard_series()
    assert len(wanted) >= 15, "the fixture holds the dashboard's queries"
    missing = {name for name in wanted if name not in scraped} - NOT_EXPORTED
    assert not missing
    for name, grouped in wanted.items():
        if name in scraped:
            assert grouped <= scraped[name] | {"instance", "job"}, name


def test_dns_programming_duration_from_the_trigger_time_to_answered() -> None:
    """coredns_kubernetes_dns_programming_duration_seconds (plugin/kubernetes/metrics.go): a headless
    service's changed EndpointSlice, from its last-change-trigger-time to the apply that drops
    the old answers; a ClusterIP service's change from its arrival."""
    from support.api import to_model

    triggered = 1_700_000_100.0  # 2023-11-14T22:15:00Z
    wall = [triggered - 60]  # the server started before the change
    server = DnsServer(DnsConfig(addresses=("127.0.0.1",), port=0, upstreams=()), clock=lambda: wall[0])
    ports = [{"name": "http", "port": 80}]
    state = cluster_state([service("db", clusterIP="None", ports=ports, selector={"app": "db"}),
                           endpoint_slice("db", ports=ports, endpoints=["10.244.0.7"])])
    server.apply(state.commit())
    slice_ = endpoint_slice("db", ports=ports, endpoints=["10.244.0.7", "10.244.0.8"])
    slice_["metadata"]["annotations"] = {"endpoints.kubernetes.io/last-change-trigger-time": "2023-11-14T22:15:00Z"}
    state.upsert(to_model(slice_))
    wall[0] = triggered + 2.5
    server.apply(state.commit())
    (histogram,) = server.stats.programming.values()
    assert list(server.stats.programming) == ["headless_with_selector"]
    assert histogram.total == pytest.approx(2.5)
    metrics = scrape(server)
    assert metrics["coredns_kubernetes_dns_programming_duration_seconds_count"] == {
        labels(service_kind="headless_with_selector"): 1}
    assert metrics["coredns_kubernetes_dns_programming_duration_seconds_bucket"][
        labels(service_kind="headless_with_selector", le="4.096")] == 1


def test_tcp_limits_and_oversized_queries_are_counted() -> None:
    server = DnsServer(DnsConfig(upstreams=()))
    server.stats.tcp_evicted, server.stats.tcp_read_timeouts, server.stats.oversized = 2, 3, 4
    samples = {s.name: s.value for family in DnsCollector(server).collect() for s in family.samples}
    assert (samples["kubeport_dns_tcp_evicted_total"], samples["kubeport_dns_tcp_read_timeouts_total"],
            samples["kubeport_dns_oversized_total"]) == (2, 3, 4)

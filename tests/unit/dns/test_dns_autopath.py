"""autopath, as CoreDNS's ``autopath @kubernetes``: a query from a Pod of namespace ns for
``name.<ns>.svc.<zone>`` is answered with the first name of the pod's search path that is not
NXDOMAIN, behind a CNAME from the name asked (plugin/autopath/autopath.go ServeDNS, cname.go
cnamer; plugin/kubernetes/autopath.go AutoPath, podWithIP: a Running Pod with that IP)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from dnslib import AAAA, QTYPE, RR, SOA, A, DNSRecord

from kubeport.dns.answer import Answerer, Forward
from kubeport.dns.autopath import Walk, below_search_domain, search_path, start
from kubeport.dns.config import DnsConfig
from kubeport.dns.records import RecordIndex

from support import api
from support.dns_answers import CLUSTER, SERIAL, SOA as CLUSTER_SOA
from support.zonetext import question, read_reply

CLIENT = "10.244.9.1"  # a Running Pod of testns
PODS = [
    api.node("node-1", addresses=[("InternalIP", "192.168.50.11")]),
    api.pod("client", "testns", ips=[CLIENT, "fd00:244::9:1"]),
    api.pod("starting", "testns", ips=["10.244.9.2"], phase="Pending"),
    api.pod("other", "default", ips=["10.244.9.3"]),
    api.pod("host-network", "testns", ips=["192.168.50.11"]),
]


def make(synced: bool = True, **config) -> Answerer:
    config.setdefault("autopath", True)
    config.setdefault("autopath_search", ())
    cfg = DnsConfig(upstreams=(), addresses=("10.96.0.10",), **config)
    return Answerer(cfg, RecordIndex.build(api.snapshot_of(CLUSTER + PODS, synced=synced), now=SERIAL))


def ask(answerer: Answerer, name: str, qtype: str = "A", client: str | None = CLIENT) -> bytes | Forward:
    reply = answerer.answer(question(name, qtype), False, client)
    assert reply is not None
    return reply


def upstream(name: str, qtype: str, rcode: int = 0, answer=(), authority=()) -> bytes:
    """An upstream's answer as the forwarder hands it on (ID 0, no OPT)."""
    message = DNSRecord.question(name, qtype).reply()
    message.header.id = 0
    message.header.aa = 0
    message.header.rcode = rcode
    for rr in answer:
        message.add_answer(rr)
    for rr in authority:
        message.add_auth(rr)
    return bytes(message.pack())


EXAMPLE_A = RR("example.com.", QTYPE.A, rdata=A("93.184.216.34"), ttl=300)
EXAMPLE_SOA = RR("example.com.", QTYPE.SOA, ttl=3600,
                 rdata=SOA("ns.icann.org.", "noc.dns.icann.org.", (1, 7200, 3600, 1209600, 3600)))


@dataclass(frozen=True)
class Case:
    name: str
    qtype: str
    rcode: str
    answer: tuple[str, ...]
    client: str | None = CLIENT
    config: tuple[tuple[str, object], ...] = ()


def case(id: str, name: str, qtype: str, rcode: str, answer=(), client: str | None = CLIENT, **config):
    return pytest.param(Case(name, qtype, rcode, tuple(answer), client, tuple(config.items())), id=id)


@pytest.mark.parametrize("c", [
    case("a_service_of_another_namespace_behind_a_cname", "web.default.testns.svc.cluster.local.", "A", "NOERROR", [
        "web.default.testns.svc.cluster.local. 5 IN CNAME web.default.svc.cluster.local.",
        "web.default.svc.cluster.local. 5 IN A 10.96.0.20"]),
    case("the_letter_case_of_the_query_is_kept", "Web.Default.testns.svc.cluster.local.", "A", "NOERROR", [
        "Web.Default.testns.svc.cluster.local. 5 IN CNAME Web.Default.svc.cluster.local.",
        "Web.Default.svc.cluster.local. 5 IN A 10.96.0.20"]),
    case("a_service_of_its_own_namespace_needs_no_cname", "svc1.testns.svc.cluster.local.", "A", "NOERROR", [
        "svc1.testns.svc.cluster.local. 5 IN A 10.96.0.11"]),
    case("srv_of_another_namespace", "_http._tcp.web.default.testns.svc.cluster.local.", "SRV", "NOERROR", [
        "_http._tcp.web.default.testns.svc.cluster.local. 5 IN CNAME _http._tcp.web.default.svc.cluster.local.",
        "_http._tcp.web.default.svc.cluster.local. 5 IN SRV 0 100 80 web.default.svc.cluster.local."]),
    case("a_namespace_found_on_svc_zone_is_nodata_without_cname", "default.testns.svc.cluster.local.", "A",
         "NOERROR", []),
    case("a_client_that_is_no_pod_walks_itself", "web.default.testns.svc.cluster.local.", "A", "NXDOMAIN",
         client="10.0.0.1"),
    case("a_pod_not_running_is_not_known", "web.default.testns.svc.cluster.local.", "A", "NXDOMAIN",
         client="10.244.9.2"),
    case("the_node_address_names_no_namespace", "web.default.testns.svc.cluster.local.", "A", "NXDOMAIN",
         client="192.168.50.11"),
    case("a_pod_of_another_namespace_has_another_search_path", "web.default.testns.svc.cluster.local.", "A",
         "NXDOMAIN", client="10.244.9.3"),
    case("the_pod_asking_over_its_second_family", "web.default.testns.svc.cluster.local.", "A", "NOERROR", [
        "web.default.testns.svc.cluster.local. 5 IN CNAME web.default.svc.cluster.local.",
        "web.default.svc.cluster.local. 5 IN A 10.96.0.20"], client="fd00:244::9:1"),
    case("off_by_default", "web.default.testns.svc.cluster.local.", "A", "NXDOMAIN", autopath=False),
])
def test_autopath_in_the_cluster_zone(c: Case) -> None:
    reply = ask(make(**dict(c.config)), c.name, c.qtype, c.client)
    assert isinstance(reply, bytes), reply
    read = read_reply(reply)
    assert (read.rcode, list(read.answer)) == (c.rcode, list(c.answer))
    assert DNSRecord.parse(reply).q.qname == c.name  # the question as asked (cnamer)


def test_a_name_error_a_pod_could_complete_is_not_kept_for_everyone() -> None:
    answerer = make()
    name = "web.default.testns.svc.cluster.local."
    assert read_reply(ask(answerer, name, client="10.0.0.1")).rcode == "NXDOMAIN"
    assert answerer.cached(question(name, "A")) is None
    assert read_reply(ask(answerer, name)).rcode == "NOERROR"
    # a name error nobody completes is kept as before
    ask(answerer, "x.y.cluster.local.", client="10.0.0.1")
    assert answerer.cached(question("x.y.cluster.local.", "A")) is not None


def test_before_the_first_sync_no_search_path_is_walked() -> None:
    reply = ask(make(synced=False), "web.default.testns.svc.cluster.local.")
    assert read_reply(reply).rcode == "SERVFAIL"


def test_an_external_name_is_asked_upstream_as_the_bare_name() -> None:
    answerer = make()
    forward = ask(answerer, "example.com.testns.svc.cluster.local.")
    assert isinstance(forward, Forward) and forward.walk is not None
    assert forward.labels == (b"example", b"com")
    reply = answerer.autopath_step(forward, upstream("example.com.", "A", answer=[EXAMPLE_A]))
    assert isinstance(reply, bytes)
    read = read_reply(reply)
    assert read.rcode == "NOERROR" and "aa" not in read.flags
    assert read.answer == ("example.com.testns.svc.cluster.local. 300 IN CNAME example.com.",
                           "example.com. 300 IN A 93.184.216.34")
    assert DNSRecord.parse(reply).q.qname == "example.com.testns.svc.cluster.local."
    assert answerer.stats.autopath_successes == 1


def test_nodata_upstream_is_the_answer_with_its_soa() -> None:
    answerer = make()
    forward = ask(answerer, "example.com.testns.svc.cluster.local.", "AAAA")
    assert isinstance(forward, Forward)
    reply = answerer.autopath_step(forward, upstream("example.com.", "AAAA", authority=[EXAMPLE_SOA]))
    read = read_reply(reply)  # type: ignore[arg-type]
    assert (read.rcode, read.answer) == ("NOERROR", ())
    assert read.authority[0].startswith("example.com. 3600 IN SOA ns.icann.org.")


def test_every_name_nxdomain_is_the_first_answer() -> None:
    answerer = make()
    forward = ask(answerer, "nx.example.testns.svc.cluster.local.")
    assert isinstance(forward, Forward)
    reply = answerer.autopath_step(forward, upstream("nx.example.", "A", rcode=3, authority=[EXAMPLE_SOA]))
    read = read_reply(reply)  # type: ignore[arg-type]
    assert (read.rcode, read.answer, read.authority) == ("NXDOMAIN", (), (CLUSTER_SOA,))
    assert DNSRecord.parse(reply).q.qname == "nx.example.testns.svc.cluster.local."


def test_the_host_search_domains_come_before_the_bare_name() -> None:
    answerer = make(autopath_search=("corp.example",))
    forward = ask(answerer, "db.x.testns.svc.cluster.local.", "AAAA")
    assert isinstance(forward, Forward)
    assert forward.labels == (b"db", b"x", b"corp", b"example")
    then = answerer.autopath_step(forward, upstream("db.x.corp.example.", "A", rcode=3))
    assert isinstance(then, Forward) and then.labels == (b"db", b"x")
    found = RR("db.x.", QTYPE.AAAA, rdata=AAAA("2001:db8::1"), ttl=60)
    read = read_reply(answerer.autopath_step(then, upstream("db.x.", "AAAA", answer=[found])))  # type: ignore[arg-type]
    assert read.answer == ("db.x.testns.svc.cluster.local. 60 IN CNAME db.x.", "db.x. 60 IN AAAA 2001:db8::1")


def test_no_upstream_answer_is_servfail() -> None:
    answerer = make()
    forward = ask(answerer, "example.com.testns.svc.cluster.local.")
    assert isinstance(forward, Forward)
    assert read_reply(answerer.autopath_step(forward, None)).rcode == "SERVFAIL"  # type: ignore[arg-type]


def test_an_external_name_service_found_on_the_way_keeps_both_cnames() -> None:
    forward = ask(make(), "ext.testns.default.svc.cluster.local.", client="10.244.9.3")
    assert isinstance(forward, Forward) and forward.walk is None
    assert forward.labels == (b"ext", b"interwebs", b"test")
    assert [(r.owner, r.data) for r in forward.chain or ()] == [
        ((b"ext", b"testns", b"default", b"svc", b"cluster", b"local"),
         ((b"ext", b"testns", b"svc", b"cluster", b"local"),)),
        ((b"ext", b"testns", b"svc", b"cluster", b"local"), ((b"ext", b"interwebs", b"test"),)),
    ]


@pytest.mark.parametrize("namespace, host, expected", [
    ("testns", (), [b"testns.svc.cluster.local", b"svc.cluster.local", b"cluster.local", b""]),
    ("a", ("corp.example", "cluster.local"), [b"a.svc.cluster.local", b"svc.cluster.local", b"cluster.local",
                                              b"corp.example", b""]),
])
def test_search_path(namespace, host, expected) -> None:
    assert [b".".join(labels) for labels in search_path(namespace, ("cluster", "local"), host)] == expected


@pytest.mark.parametrize("name, walked", [
    ("web.ns.svc.cluster.local", True),
    ("ns.svc.cluster.local", False),  # the search domain itself: no base name
    ("web.other.svc.cluster.local", False),
    ("web.ns.svc.cluster.local.evil", False),
])
def test_start(name, walked) -> None:
    lower = tuple(name.split("."))
    walk = start(tuple(label.encode() for label in lower), lower, "ns", ("cluster", "local"), ())
    assert (walk is not None) == walked
    if walk is not None:
        assert walk == Walk((b"web",), search_path("ns", ("cluster", "local"), ()), 0)


@pytest.mark.parametrize("name, below", [
    ("x.ns.svc.cluster.local", True),
    ("ns.svc.cluster.local", False),
    ("x.ns.pod.cluster.local", False),
    ("a.b.x.ns.svc.cluster.local", True),
    ("x.ns.svc.example.org", False),
])
def test_below_search_domain(name, below) -> None:
    assert below_search_domain(tuple(name.split(".")), ("cluster", "local")) == below

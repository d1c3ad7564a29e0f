"""Relayed upstream answers kept encoded per query shape: served by Answerer.answer without
a parse, the query ID patched in, TTLs aged by whole seconds (RFC 1035 7.3, as the upstream
cache ages them), gone when the upstream answer expires. Time is a fake clock."""

from __future__ import annotations

import pytest
from dnslib import EDNS0, QTYPE, RCODE, RR, SOA, TXT, A, DNSRecord

from kubeport.dns.answer import Answerer, Forward
from kubeport.dns.config import DnsConfig
from kubeport.dns.forward.replies import ForwardedAnswers, ForwardedReply
from kubeport.dns.records import RecordIndex
from kubeport.dns.stats import DnsStats
from kubeport.dns.forward.forwarder import Forwarder, UpstreamCache, without_opt

from support.api import service, snapshot_of
from support.zonetext import question, read_reply

NAME = "www.example.com."


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def upstream_reply(name: str = NAME, *, answers: int = 1, ttl: int = 300, rcode: int = 0,
                   soa: tuple[int, int] | None = None, txt: int = 0) -> bytes:
    """``answers`` A records (16 bytes each, compressed, after 33 of header and question),
    after one TXT record of ``txt`` bytes of text if asked."""
    record = DNSRecord.question(name, "A")
    reply = record.reply()
    reply.header.rcode = rcode
    if txt:
        reply.add_answer(RR(name, QTYPE.TXT, rdata=TXT([b"x" * 200] * (txt // 200)), ttl=ttl))
    for i in range(answers):
        reply.add_answer(RR(name, QTYPE.A, rdata=A(f"203.0.113.{i % 250 + 1}"), ttl=ttl - i % 2))
    if soa is not None:
        reply.add_auth(RR("example.com.", QTYPE.SOA, ttl=soa[0], rdata=SOA(
            "ns.example.com.", "admin.example.com.", (1, 2, 3, 4, soa[1]))))
    reply.add_ar(EDNS0(udp_len=1232))
    return bytes(reply.pack())


class Rig:
    """An answerer and an upstream cache, wired as DnsServer wires them, without sockets."""

    def __init__(self, **config: object):
        self.clock = Clock()
        self.stats = DnsStats()
        objects = [service("web", clusterIP="10.96.0.20", ports=[{"port": 80}])]
        self.answerer = Answerer(DnsConfig(upstreams=(), **config), RecordIndex.build(snapshot_of(objects), now=1),
                                 self.stats, clock=self.clock)
        self.cache = UpstreamCache(100, max_ttl=3600, max_negative_ttl=1800)

    def forward(self, packet: bytes, tcp: bool = False) -> Forward:
        result = self.answerer.answer(packet, tcp)
        assert isinstance(result, Forward), result
        return result

    def resolve(self, packet: bytes, upstream: bytes, tcp: bool = False) -> bytes:
        """The first query: forwarded, upstream answers, the answer is cached and relayed."""
        forward = self.forward(packet, tcp)
        query = forward.query
        key = Forwarder.cache_key(forward.question, do=bool(query.edns and query.edns.do), cd=False)
        self.cache.put(key, *without_opt(upstream), now=self.clock.now)
        stored = self.cache.lookup(key, self.clock.now)
        assert stored is not None
        return self.answerer.relay_stored(forward, stored, self.clock.now)

    def ask(self, packet: bytes, tcp: bool = False) -> bytes:
        reply = self.answerer.answer(packet, tcp)
        assert isinstance(reply, bytes), reply
        return reply


@pytest.fixture
def rig() -> Rig:
    return Rig()


@pytest.mark.parametrize("elapsed, ttls", [
    pytest.param(0.0, ["300", "299"], id="same_second_as_stored"),
    pytest.param(0.99, ["300", "299"], id="under_a_second_is_not_aged"),
    pytest.param(100.4, ["200", "199"], id="whole_seconds_subtracted__rfc1035_7_3"),
    pytest.param(298.5, ["2", "1"], id="last_seconds_before_the_lowest_ttl"),
])
def test_repeat_is_answered_encoded_with_the_id_patched_and_ttls_aged(rig: Rig, elapsed: float,
                                                                      ttls: list[str]) -> None:
    first = read_reply(rig.resolve(question(NAME, query_id=1), upstream_reply(answers=2)))
    assert first.id == 1 and [line.split()[1] for line in first.answer] == ["300", "299"]
    rig.clock.now += elapsed
    again = read_reply(rig.ask(question(NAME, query_id=0xBEEF)))
    # each TTL stays with its record whatever the order (loadbalance turns them)
    assert again.id == 0xBEEF and ttls_by_address(again) == {"203.0.113.1": ttls[0], "203.0.113.2": ttls[1]}
    assert again.rcode == "NOERROR"


def turned(answer: tuple[str, ...], turns: int) -> tuple[str, ...]:
    """The answer with its run of A records turned (CoreDNS loadbalance)."""
    first = next((i for i, line in enumerate(answer) if " IN A " in line), len(answer))
    run = answer[first:]
    turns %= max(1, len(run))
    return answer[:first] + run[turns:] + run[:turns]


def ttls_by_address(reply) -> dict[str, str]:
    return {line.split()[-1]: line.split()[1] for line in reply.answer}


def test_entry_ends_with_the_lowest_ttl(rig: Rig) -> None:
    rig.resolve(question(NAME), upstream_reply(answers=2, ttl=300))  # TTLs 300 and 299
    rig.clock.now += 298.9
    assert isinstance(rig.answerer.answer(question(NAME)), bytes)
    rig.clock.now += 0.1
    assert isinstance(rig.answerer.answer(question(NAME)), Forward)
    assert len(rig.answerer.forwarded) == 0


def test_negative_answer_lives_for_the_soa_minimum__rfc2308(rig: Rig) -> None:
    nxdomain = upstream_reply(answers=0, rcode=RCODE.NXDOMAIN, soa=(300, 60))
    rig.resolve(question(NAME), nxdomain)
    rig.clock.now += 10
    reply = read_reply(rig.ask(question(NAME)))
    assert reply.rcode == "NXDOMAIN" and reply.authority[0].split()[1] == "290"
    assert rig.stats.cache_hits == {"denial": 1}  # coredns_cache_hits_total{type="denial"}
    rig.clock.now += 50
    assert isinstance(rig.answerer.answer(question(NAME)), Forward)


@pytest.mark.parametrize("upstream, rcode", [
    pytest.param(upstream_reply(answers=0, rcode=RCODE.SERVFAIL), "SERVFAIL", id="servfail__coredns_servfail_5s"),
    pytest.param(upstream_reply(ttl=0), "NOERROR", id="ttl_zero__coredns_minttl_5s"),
])
def test_upstream_servfail_and_ttl_zero_are_kept_5s_like_coredns(rig: Rig, upstream: bytes, rcode: str) -> None:
    rig.resolve(question(NAME), upstream)
    rig.clock.now += 4.9
    assert read_reply(rig.ask(question(NAME))).rcode == rcode  # from the entry: upstream not asked
    rig.clock.now += 0.1
    assert isinstance(rig.answerer.answer(question(NAME)), Forward)


def test_hits_are_counted_like_relayed_answers(rig: Rig) -> None:
    rig.resolve(question(NAME), upstream_reply())
    rig.ask(question(NAME))
    rig.ask(question(NAME), tcp=True)
    assert rig.stats.requests == {("udp", "A"): 2, ("tcp", "A"): 1}
    assert rig.stats.responses == {"NOERROR": 3}
    assert rig.stats.cache_hits == {"success": 2}


@pytest.mark.parametrize("variant", [
    pytest.param(question(NAME.upper()), id="letter_case_is_part_of_the_key"),
    pytest.param(question(NAME, rd=False), id="rd_is_part_of_the_key"),
    pytest.param(question(NAME, edns=1232), id="edns_is_part_of_the_key"),
    pytest.param(question(NAME, "AAAA"), id="qtype_is_part_of_the_key"),
])
def test_other_query_shapes_are_not_served_from_the_entry(rig: Rig, variant: bytes) -> None:
    rig.resolve(question(NAME), upstream_reply())
    assert isinstance(rig.answerer.answer(variant), Forward)


def test_each_shape_gets_its_own_reply_edns_and_rd_echoed(rig: Rig) -> None:
    rig.resolve(question(NAME, edns=4096, do=True, rd=False), upstream_reply())
    reply = read_reply(rig.ask(question(NAME, query_id=9, edns=4096, do=True, rd=False)))
    assert reply.edns == (1232, True) and "rd" not in reply.flags and reply.id == 9


@pytest.mark.parametrize("packet, upstream, udp_answers, udp_limit", [
    pytest.param(question(NAME), upstream_reply(answers=40), 29, 512, id="no_edns_keeps_what_fits_512"),
    pytest.param(question(NAME, edns=1232), upstream_reply(answers=40), 40, 1232, id="edns_1232_is_whole"),
    pytest.param(question(NAME), upstream_reply(answers=40, txt=600), 0, 512,
                 id="first_record_alone_too_big_is_question_only"),
])
def test_too_big_for_udp_is_trimmed_over_udp_whole_over_tcp_ttls_aged(rig: Rig, packet: bytes, upstream: bytes,
                                                                      udp_answers: int, udp_limit: int) -> None:
    """Cut to the client's buffer over UDP (CoreDNS request/request.go Scrub), whole over TCP."""
    rig.resolve(packet, upstream)
    rig.clock.now += 5
    tcp = read_reply(rig.ask(packet, tcp=True))
    udp = read_reply(rig.ask(packet))
    assert "tc" not in tcp.flags and ttls_by_address(tcp)["203.0.113.1"] == "295"
    # the UDP variant is patched too: its records carry the TCP one's aged TTLs
    assert udp.answer == turned(tcp.answer, 1)[:udp_answers]  # one turn further (loadbalance), then cut
    assert ("tc" in udp.flags) == (udp_answers < len(tcp.answer)) and udp.size <= udp_limit


def test_unknown_reverse_names_are_not_kept_the_cluster_may_claim_them(rig: Rig) -> None:
    ptr = question("9.9.96.10.in-addr.arpa.", "PTR")
    forward = rig.forward(ptr)
    assert not forward.shareable
    rig.resolve(ptr, upstream_reply("9.9.96.10.in-addr.arpa."))
    assert len(rig.answerer.forwarded) == 0 and isinstance(rig.answerer.answer(ptr), Forward)


def test_externalname_chain_from_the_cache_is_completed_not_kept() -> None:
    rig = Rig()
    rig.answerer.index = RecordIndex.build(snapshot_of([
        service("ext", type="ExternalName", externalName="www.example.com")]), now=1)
    reply = read_reply(rig.resolve(question("ext.default.svc.cluster.local."), upstream_reply()))
    assert reply.answer[1] == "www.example.com. 300 IN A 203.0.113.1"
    assert len(rig.answerer.forwarded) == 0


def test_reconfigure_drops_the_encoded_replies(rig: Rig) -> None:
    rig.resolve(question(NAME), upstream_reply())
    rig.answerer.reconfigure(rig.answerer.config.with_changes(ttl=30), rig.answerer.index)
    assert len(rig.answerer.forwarded) == 0


def entry(stored: float = 0.0, expires: float = 100.0) -> ForwardedReply:
    cells = ([0], [0])
    return ForwardedReply(b"u", b"t", [], [], stored=stored, expires=expires, udp_records=0, cells=cells)


def test_capacity_drops_the_oldest() -> None:
    answers = ForwardedAnswers(2)
    for key in (b"a", b"b", b"c"):
        answers.put(key, entry())
    assert set(answers.entries) == {b"b", b"c"}
    assert answers.get(b"c", True, 1.0) == b"t" and answers.get(b"a", False, 1.0) is None


def test_zero_capacity_keeps_nothing() -> None:
    answers = ForwardedAnswers(0)
    answers.put(b"a", entry())
    assert len(answers) == 0


def test_a_clock_before_the_store_time_is_a_miss() -> None:
    answers = ForwardedAnswers(2)
    answers.put(b"a", entry(stored=50.0))
    assert answers.get(b"a", False, 49.0) is None

"""CoreDNS ``loadbalance`` (plugin/loadbalance/loadbalance.go roundRobin): the A/AAAA records of a reply
turn, CNAMEs first, so clients of a headless Service do not all pick the same pod. Here a
rotation spliced into encoded replies: a one-address reply is never touched, and the
records of a reply, whatever their order, stay the same."""

from __future__ import annotations

import struct
from collections import Counter

import pytest
from dnslib import CNAME, QTYPE, RCODE, RR, A, DNSRecord

from kubeport.dns.answer import Answerer, Forward
from kubeport.dns.config import DnsConfig
from kubeport.dns.encode import Packer, Record, address_record
from kubeport.dns.records import RecordIndex
from kubeport.dns.rotate import Rotation, Run, address_run, rotation
from kubeport.dns.forward.forwarder import UpstreamCache, without_opt
from kubeport.endpoints.types import ServiceName

from support.api import endpoint_slice, service, snapshot_of
from support.zonetext import header_only, question, read_reply

HTTP = [{"name": "http", "port": 80}]
ZONE = "default.svc.cluster.local."
H4 = f"h4.{ZONE}"
IPS = ["10.244.0.1", "10.244.0.2", "10.244.0.3", "10.244.0.4"]
CLUSTER = [
    service("web", clusterIP="10.96.0.20", ports=HTTP),
    service("h4", clusterIP="None", ports=HTTP),
    endpoint_slice("h4", ports=HTTP, endpoints=IPS),
    endpoint_slice("h4", address_type="IPv6", ports=HTTP, endpoints=["fd00::1", "fd00::2", "fd00::3"]),
    service("alias", type="ExternalName", externalName=f"h4.{ZONE}"),
    service("ext", type="ExternalName", externalName="www.example.com"),
    service("big", clusterIP="None", ports=HTTP),
    endpoint_slice("big", ports=HTTP, endpoints=[f"10.245.{i // 250}.{i % 250 + 1}" for i in range(60)]),
]


@pytest.fixture
def answerer() -> Answerer:
    return Answerer(DnsConfig(upstreams=()), RecordIndex.build(snapshot_of(CLUSTER), now=1), clock=lambda: 1.0)


def firsts(answerer: Answerer, packet: bytes, times: int, tcp: bool = False) -> list[str]:
    return [read_reply(answerer.answer(packet, tcp)).answer[0] for _ in range(times)]


# --- the pure parts --------------------------------------------------------------------


def packed(records: list[Record], rcode: int = 0) -> tuple[bytes, list[int]]:
    """A message (question www.example.com A) holding ``records`` in its answer section."""
    qname = (b"www", b"example", b"com")
    header = struct.pack("!HHHHHH", 0, 0x8400 | rcode, 1, len(records), 0, 0)
    packer = Packer(header, b"\x03www\x07example\x03com\x00\x00\x01\x00\x01", qname)
    packer.records(records)
    return bytes(packer.buffer), packer.ends


WWW = (b"www", b"example", b"com")
CDN = (b"cdn", b"example", b"net")


def a(owner=WWW, last: int = 1) -> Record:
    return address_record(owner, f"192.0.2.{last}", 60)


def aaaa(owner=WWW, last: int = 1) -> Record:
    return address_record(owner, f"2001:db8::{last}", 60)


def cname(owner=WWW, target=CDN) -> Record:
    return Record(owner, 5, 60, (target,))


@pytest.mark.parametrize("records, rcode, run", [
    pytest.param([a(last=1)], 0, None, id="one_address_has_no_run"),
    pytest.param([a(last=1), a(last=2), a(last=3)], 0, (0, 3, 16), id="a_records_16_bytes"),
    pytest.param([aaaa(last=1), aaaa(last=2)], 0, (0, 2, 28), id="aaaa_records_28_bytes"),
    pytest.param([cname(), a(CDN, 1), a(CDN, 2)], 0, (1, 2, 16), id="cname_kept_first__loadbalance"),
    pytest.param([a(last=1), aaaa(last=1), aaaa(last=2)], 0, (1, 2, 28), id="first_single_type_run"),
    pytest.param([a(last=1), a(last=2)], RCODE.NXDOMAIN, None, id="only_noerror_turns__loadbalance"),
    # the first A of a name not written before carries the name itself: it cannot move
    pytest.param([a(CDN, 1), a(CDN, 2)], 0, None, id="owner_written_in_full_not_a_run"),
    pytest.param([a(CDN, 1), a(CDN, 2), a(CDN, 3)], 0, (1, 2, 16), id="pointers_after_a_full_owner"),
])
def test_address_run(records: list[Record], rcode: int, run: tuple[int, int, int] | None) -> None:
    message, ends = packed(records, rcode)
    found = address_run(message, ends)
    assert (None if found is None else (found.first, found.count, found.size)) == run
    if found is not None:
        assert found.start == ends[found.first]


def test_pointer_into_the_run_is_not_a_run() -> None:
    """A pointer that names a place inside the run would move with it (no encoder writes
    one; an upstream could)."""
    message, ends = packed([a(last=1), a(last=2)])
    forged = bytearray(message)
    forged[ends[1]:ends[1] + 2] = (0xC000 | ends[0]).to_bytes(2, "big")  # the 2nd owner points at the 1st
    assert address_run(bytes(forged), ends) is None


@pytest.mark.parametrize("udp_run, tcp_turns, udp_turns", [
    pytest.param("123", ["123", "231", "312", "123"], ["123", "231", "312", "123"], id="whole_in_both"),
    pytest.param("12", ["123", "231", "312"], ["12", "23", "31"], id="trimmed_udp_gets_a_window_of_the_turned_run"),
    pytest.param("", ["123", "231"], ["", ""], id="question_only_udp_is_untouched"),
])
def test_rotation_splices_turns(udp_run: str, tcp_turns: list[str], udp_turns: list[str]) -> None:
    """Records of 4 bytes ("1111"...) after a 4-byte head; the UDP variant holds the first
    ones (the TC cut), then its own tail."""
    tcp, udp = b"HEAD" + _spell("123") + b"TAIL", b"head" + _spell(udp_run) + b"opt"
    turns = Rotation(udp, tcp, start=4, size=4, held=(len(udp_run), 3))
    assert [turns.reply(True) for _ in tcp_turns] == [b"HEAD" + _spell(t) + b"TAIL" for t in tcp_turns]
    turns.turn = 0
    assert [turns.reply(False) for _ in udp_turns] == [b"head" + _spell(t) + b"opt" for t in udp_turns]


def _spell(digits: str) -> bytes:
    return b"".join(d.encode() * 4 for d in digits)


def test_rotation_needs_two_records_to_turn() -> None:
    assert rotation(Run(0, 4, 4, 3), b"", b"x" * 20, (0, 1)) is None
    assert rotation(None, b"", b"", (0, 0)) is None


# --- cluster answers ---------------------------------------------------------------------


@pytest.mark.parametrize("name, qtype, addresses", [
    pytest.param(H4, "A", IPS, id="headless_a"),
    pytest.param(H4, "AAAA", ["fd00::1", "fd00::2", "fd00::3"], id="headless_aaaa"),
])
def test_headless_answers_turn_every_address_first_in_turn(answerer: Answerer, name: str, qtype: str,
                                                           addresses: list[str]) -> None:
    packet = question(name, qtype, edns=1232)
    replies = [read_reply(answerer.answer(packet)) for _ in range(2 * len(addresses))]
    assert Counter(reply.answer[0].split()[-1] for reply in replies) == {a: 2 for a in addresses}
    assert all(sorted(reply.answer) == sorted(replies[0].answer) for reply in replies)
    assert len({reply.answer for reply in replies}) == len(addresses)


def test_tcp_and_udp_answers_turn_too(answerer: Answerer) -> None:
    packet = question(H4)
    assert len(set(firsts(answerer, packet, 4, tcp=True))) == 4


def test_one_address_answer_is_the_same_bytes_every_time(answerer: Answerer) -> None:
    """Every ClusterIP answer: served from the plain entries, never spliced."""
    packet = question(f"web.{ZONE}", edns=1232)
    replies = {answerer.answer(packet) for _ in range(5)}
    assert len(replies) == 1 and len(answerer.cache.entries) == 1 and answerer.cache.turning == {}


def test_cname_stays_first_addresses_turn__loadbalance(answerer: Answerer) -> None:
    packet = question(f"alias.{ZONE}")
    replies = [read_reply(answerer.answer(packet)) for _ in range(4)]
    assert all(reply.answer[0] == f"alias.{ZONE} 5 IN CNAME {H4}" for reply in replies)
    assert len({reply.answer[1] for reply in replies}) == 4


def test_srv_keeps_its_order_and_glue__loadbalance_rest(answerer: Answerer) -> None:
    """CoreDNS shuffles only A/AAAA/MX: SRV records keep their order. The glue in the
    additional section is not turned here (CoreDNS shuffles it; clients match it by name)."""
    packet = question(f"_http._tcp.h4.{ZONE}", "SRV", edns=1232)
    replies = {answerer.answer(packet) for _ in range(4)}
    assert len(replies) == 1


def test_truncated_udp_answer_shows_a_turning_window(answerer: Answerer) -> None:
    """Turned (loadbalance.go roundRobin), then cut to what fits, with TC (CoreDNS request.go Scrub)."""
    packet = question(f"big.{ZONE}")  # 60 records: 29 fit in 512 bytes
    whole = read_reply(answerer.answer(packet, tcp=True)).answer
    for turn in range(1, 4):
        raw = answerer.answer(packet)
        reply = read_reply(raw)
        assert "tc" in reply.flags and len(raw) <= 512 and header_only(raw)[3] == (1, len(reply.answer), 0, 0)
        assert reply.answer == (whole[turn:] + whole[:turn])[: len(reply.answer)]


def test_a_change_drops_turning_entries_of_its_service(answerer: Answerer) -> None:
    answerer.answer(question(H4))
    answerer.answer(question(f"web.{ZONE}"))
    assert len(answerer.cache) == 2 and len(answerer.cache.turning) == 1
    answerer.cache.invalidate([ServiceName("default", "h4")])
    assert len(answerer.cache) == 1 and not answerer.cache.turning


# --- relayed upstream answers (loadbalance sits before forward) -------------------------


def upstream(name: str = "www.example.com.", count: int = 4, *, rcode: int = 0, chain: bool = False) -> bytes:
    reply = DNSRecord.question(name, "A").reply()
    reply.header.rcode = rcode
    owner = name
    if chain:
        reply.add_answer(RR(name, QTYPE.CNAME, rdata=CNAME("cdn.example.net."), ttl=60))
        owner = "cdn.example.net."
    for i in range(count):
        reply.add_answer(RR(owner, QTYPE.A, rdata=A(f"203.0.113.{i + 1}"), ttl=300))
    return bytes(reply.pack())


def relayed_firsts(answerer: Answerer, message: bytes, packet: bytes, times: int) -> list[str]:
    """Relay the message ``times`` times through the upstream cache path, as the server does."""
    forward = answerer.answer(packet)
    assert isinstance(forward, Forward)
    cache = UpstreamCache(10, 3600, 1800)
    cache.put(b"k", *without_opt(message), now=1.0)
    first = read_reply(answerer.relay_stored(forward, cache.lookup(b"k", 1.0), 1.0))
    found = [first.answer]
    for _ in range(times - 1):
        found.append(read_reply(answerer.answer(packet)).answer)
    return found


@pytest.mark.parametrize("message, turns", [
    pytest.param(upstream(count=4), 4, id="cached_relayed_answer_turns"),
    pytest.param(upstream(count=1), 1, id="one_address_untouched"),
    pytest.param(upstream(count=3, chain=True), 3, id="upstream_cname_chain_stays_first"),
])
def test_relayed_answers_turn(answerer: Answerer, message: bytes, turns: int) -> None:
    answers = relayed_firsts(answerer, message, question("www.example.com."), 8)
    assert len({answer for answer in answers}) == turns
    assert all(sorted(answer) == sorted(answers[0]) for answer in answers)
    assert all(" CNAME " in answer[0] for answer in answers) or " CNAME " not in answers[0][0]


def test_uncached_relay_turns_per_reply(answerer: Answerer) -> None:
    forward = answerer.answer(question("www.example.com."))
    message, _ = without_opt(upstream(count=3))
    answers = {read_reply(answerer.relay(forward, message)).answer for _ in range(3)}
    assert len(answers) == 3


def test_externalname_completed_from_upstream_turns_cname_first(answerer: Answerer) -> None:
    forward = answerer.answer(question(f"ext.{ZONE}"))
    message, _ = without_opt(upstream(count=3))
    answers = [read_reply(answerer.relay(forward, message)).answer for _ in range(3)]
    assert all(answer[0] == f"ext.{ZONE} 5 IN CNAME www.example.com." for answer in answers)
    assert len({answer[1] for answer in answers}) == 3


def test_turning_hits_count_as_requests_responses_and_cache_hits(answerer: Answerer) -> None:
    """A turning reply's hits count once, in its (proto, qtype, rcode) cell, and read back as
    coredns_dns_requests_total, _responses_total and the answer cache's hits."""
    for tcp in (False, False, True):
        answerer.answer(question(H4), tcp)
    answerer.answer(question(H4, "AAAA"))
    stats = answerer.stats
    assert stats.requests == {("udp", "A"): 2, ("tcp", "A"): 1, ("udp", "AAAA"): 1}
    assert stats.responses == {"NOERROR": 4}
    assert (stats.answer_cache_hits, stats.answer_cache_misses) == (2, 2)

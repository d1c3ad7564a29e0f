"""The wire layer and the answerer's handling of packets: malformed input, EDNS0, truncation.

Acceptance rules follow miekg/dns's DefaultMsgAcceptFunc, which CoreDNS uses: responses
are ignored, other opcodes get NOTIMP, bad section counts and unparseable packets FORMERR.
"""

from __future__ import annotations

import random
import struct

import pytest
from dnslib import EDNSOption

from kubeport.dns.answer import Answerer
from kubeport.dns.config import DnsConfig
from kubeport.dns.records import RecordIndex
from kubeport.dns.wire import (
    BADVERS,
    FORMERR,
    NOTIMP,
    Ignored,
    QueryError,
    cache_key,
    parse_query,
    read_name,
    walk_message,
)

from support.api import endpoint_slice, service, snapshot_of
from support.zonetext import header_only, question, read_reply

WEB = "web.default.svc.cluster.local."
BIG = "big.default.svc.cluster.local."


def big_cluster(endpoints: int = 300):
    addresses = [f"10.244.{i // 250}.{i % 250 + 1}" for i in range(endpoints)]
    return [
        service("web", clusterIP="10.96.0.20", ports=[{"name": "http", "port": 80}]),
        service("big", clusterIP="None", ports=[{"name": "http", "port": 80}]),
        endpoint_slice("big", ports=[{"name": "http", "port": 80}], endpoints=addresses),
    ]


@pytest.fixture(scope="module")
def answerer() -> Answerer:
    config = DnsConfig(upstreams=())
    return Answerer(config, RecordIndex.build(snapshot_of(big_cluster()), now=1))


def header(query_id=0x1234, flags=0x0100, qd=1, an=0, ns=0, ar=0) -> bytes:
    return struct.pack("!HHHHHH", query_id, flags, qd, an, ns, ar)


NAME = b"\x03web\x07default\x03svc\x07cluster\x05local\x00"
A_IN = b"\x00\x01\x00\x01"


@pytest.mark.parametrize("packet, rcode", [
    pytest.param(header(qd=0), FORMERR, id="qdcount_0__miekg"),
    pytest.param(header(qd=2) + NAME + A_IN + NAME + A_IN, FORMERR, id="qdcount_2__miekg"),
    pytest.param(header(an=2) + NAME + A_IN, FORMERR, id="ancount_over_1__miekg"),
    pytest.param(header(ar=3) + NAME + A_IN, FORMERR, id="arcount_over_2__miekg"),
    pytest.param(header() + b"\xc0\x0c" + A_IN, FORMERR, id="compression_pointer_to_itself"),
    pytest.param(header() + b"\x01a\xc0\x0e" + A_IN, FORMERR, id="compression_loop_forward_pointer"),
    pytest.param(header() + b"\x03web\x07def", FORMERR, id="name_runs_past_the_end"),
    pytest.param(header() + NAME + b"\x00\x01", FORMERR, id="question_without_class"),
    pytest.param(header() + b"\x40abc\x00" + A_IN, FORMERR, id="extended_label_type"),
    pytest.param(header() + (b"\x3f" + b"a" * 63) * 4 + b"\x00" + A_IN, FORMERR, id="name_over_255_octets"),
    pytest.param(header(ar=1) + NAME + A_IN + b"\x00\x00\x29\x04\xd0\x00\x00\x00\x00\x00\x10", FORMERR,
                 id="opt_rdata_past_the_end"),
    pytest.param(header(ar=2) + NAME + A_IN + (b"\x00\x00\x29\x04\xd0\x00\x00\x00\x00\x00\x00") * 2, FORMERR,
                 id="two_opt_records__rfc6891"),
    pytest.param(header(ar=1) + NAME + A_IN + b"\x00\x00\x29\x04\xd0\x00\x00\x00\x00\x00\x06"
                 + b"\x00\x0a\x00\x08\x01\x02", FORMERR, id="edns_option_longer_than_the_opt_data__miekg"),
    pytest.param(header(ar=1) + NAME + A_IN + b"\x00\x00\x29\x04\xd0\x00\x00\x00\x00\x00\x02\x00\x0a",
                 FORMERR, id="edns_option_header_cut__miekg"),
    pytest.param(header(flags=0x2800) + NAME + A_IN, NOTIMP, id="opcode_update_notimp__miekg"),
    pytest.param(header(flags=0x2000) + NAME + A_IN, NOTIMP, id="opcode_notify_notimp"),
    pytest.param(header(flags=0x1000) + NAME + A_IN, NOTIMP, id="opcode_status_notimp"),
    pytest.param(header(ar=1) + NAME + A_IN + b"\x00\x00\x29\x04\xd0\x00\x01\x00\x00\x00\x00", BADVERS,
                 id="edns_version_1_badvers__rfc6891"),
])
def test_error_replies(answerer: Answerer, packet: bytes, rcode: int) -> None:
    with pytest.raises(QueryError) as raised:
        parse_query(packet)
    assert raised.value.rcode == rcode
    reply = answerer.answer(packet)
    query_id, flags, name, counts = header_only(reply)
    assert query_id == 0x1234 and flags & 0x8000
    if rcode == BADVERS:
        assert read_reply(reply).rcode == "BADVERS"
    else:
        assert flags & 0xF == rcode and counts[:3] == (0, 0, 0)
        assert flags & 0x7800 == struct.unpack("!H", packet[2:4])[0] & 0x7800  # opcode echoed


@pytest.mark.parametrize("packet", [
    pytest.param(b"", id="empty"),
    pytest.param(b"\x12\x34\x01\x00\x00\x01", id="truncated_header"),
    pytest.param(header(flags=0x8100) + NAME + A_IN, id="response_not_query__miekg"),
])
def test_dropped_only_without_a_query_header(answerer: Answerer, packet: bytes) -> None:
    with pytest.raises(Ignored):
        parse_query(packet)
    assert answerer.answer(packet) is None


def test_random_bytes_get_formerr_and_the_server_keeps_answering(answerer: Answerer) -> None:
    rng = random.Random(5)
    for _ in range(2000):
        size = rng.randrange(12, 200)
        packet = bytearray(rng.randbytes(size))
        packet[2] &= 0x07  # a query (QR=0) with opcode QUERY; everything else random
        reply = answerer.answer(bytes(packet))
        assert reply is not None
        if isinstance(reply, bytes):
            assert reply[:2] == packet[:2]
    assert read_reply(answerer.answer(question(WEB))).answer == (f"{WEB} 5 IN A 10.96.0.20",)


def test_compression_in_question_is_followed_when_it_points_back() -> None:
    labels, end, compressed = read_name(b"\x03web\x00" + b"\x03www\xc0\x00", 5)
    assert (labels, end, compressed) == ((b"www", b"web"), 11, True)


def test_cache_key_ignores_id_and_edns_options_but_not_case_or_size() -> None:
    plain = question(WEB, query_id=1)
    assert cache_key(plain) == cache_key(question(WEB, query_id=2))
    assert cache_key(plain) != cache_key(question(WEB.upper()))
    cookie_a = question(WEB, edns=1232, options=[EDNSOption(10, b"\x01" * 8)])
    cookie_b = question(WEB, edns=1232, options=[EDNSOption(10, b"\x02" * 8)])
    assert cache_key(cookie_a) == cache_key(cookie_b) != cache_key(question(WEB, edns=4096))
    assert cache_key(question(WEB, edns=1232, do=True)) != cache_key(question(WEB, edns=1232))
    assert parse_query(cookie_a).cache_key == cache_key(cookie_a)
    assert cache_key(plain + b"junk") is None


def test_non_canonical_query_is_answered_but_not_cached(answerer: Answerer) -> None:
    packet = question(WEB) + b"trailing"
    assert parse_query(packet).cache_key is None
    assert read_reply(answerer.answer(packet)).answer == (f"{WEB} 5 IN A 10.96.0.20",)


def test_opt_is_echoed_with_our_size_and_do_bit__rfc6891(answerer: Answerer) -> None:
    reply = read_reply(answerer.answer(question(WEB, edns=4096, do=True)))
    assert reply.edns == (1232, True)
    assert read_reply(answerer.answer(question(WEB, edns=4096))).edns == (1232, False)
    assert read_reply(answerer.answer(question(WEB))).edns is None


def test_rd_flag_echoed(answerer: Answerer) -> None:
    assert "rd" not in read_reply(answerer.answer(question(WEB, rd=False))).flags
    assert "rd" in read_reply(answerer.answer(question(WEB, rd=True))).flags


@pytest.mark.parametrize("edns, limit", [
    pytest.param(None, 512, id="no_edns_512__rfc1035"),
    pytest.param(1232, 1232, id="edns_1232"),
    pytest.param(4096, 4096, id="edns_4096"),
    pytest.param(100, 512, id="edns_below_512_means_512__rfc6891"),
])
def test_udp_truncation_to_client_size_sets_tc(answerer: Answerer, edns: int | None, limit: int) -> None:
    """CoreDNS request/request.go Scrub: cut to the client's buffer (RFC 1035 4.2.1, RFC 6891 6.2.5), TC."""
    raw = answerer.answer(question(BIG, edns=edns))
    reply = read_reply(raw)
    assert "tc" in reply.flags and len(raw) <= limit
    assert 0 < reply.records < 300 and reply.rcode == "NOERROR"
    assert all(line.startswith(f"{BIG} 5 IN A 10.244.") for line in reply.answer)


def test_tcp_gets_the_whole_answer(answerer: Answerer) -> None:
    reply = read_reply(answerer.answer(question(BIG), tcp=True))
    assert "tc" not in reply.flags and reply.records == 300


def test_udp_and_tcp_answers_are_cached_separately(answerer: Answerer) -> None:
    packet = question(BIG, query_id=77)
    udp, tcp = answerer.answer(packet), answerer.answer(packet, tcp=True)
    again_udp, again_tcp = answerer.answer(packet), answerer.answer(packet, tcp=True)
    # the same sizes and records each time; only their order turns (loadbalance)
    assert (len(again_udp), len(again_tcp)) == (len(udp), len(tcp)) and len(udp) < len(tcp)
    assert sorted(read_reply(again_tcp).answer) == sorted(read_reply(tcp).answer)


def test_walk_message_finds_every_ttl(answerer: Answerer) -> None:
    raw = answerer.answer(question("_http._tcp.web.default.svc.cluster.local.", "SRV", edns=1232))
    _, spans = walk_message(raw)
    assert [(span.section, span.rtype, span.ttl) for span in spans] == [(0, 33, 5), (2, 1, 5), (2, 41, 0)]
    for span in spans[:2]:
        assert struct.unpack_from("!I", raw, span.ttl_offset)[0] == 5


def test_cached_answer_rate(answerer: Answerer) -> None:
    """The cached-answer path (its figures against knot are in bench/RESULTS.md): a slice, a dict lookup
    and the ID patch. Prints the in-process rate; no timed assertion."""
    import time

    packet = question(WEB, edns=1232)
    answer = answerer.answer
    first = answer(packet)
    rounds = 200_000
    started = time.perf_counter()
    for _ in range(rounds):
        answer(packet)
    elapsed = time.perf_counter() - started
    assert answer(packet) == first
    table = {packet[2:]: first[2:]}  # the floor: one dict lookup plus the ID patch
    started = time.perf_counter()
    for _ in range(rounds):
        packet[:2] + table[packet[2:]]
    floor = time.perf_counter() - started
    print(f"\ncached A answer: {rounds / elapsed:,.0f} answers/s ({elapsed / rounds * 1e6:.2f} us each; "
          f"a bare dict lookup + ID patch: {floor / rounds * 1e6:.2f} us, ratio {elapsed / floor:.1f}x)")


def test_malformed_edns_option_is_formerr_though_the_question_is_cached(answerer: Answerer) -> None:
    good = question(WEB, edns=1232, options=[EDNSOption(10, b"\x01" * 8)])
    assert read_reply(answerer.answer(good)).rcode == "NOERROR"
    assert read_reply(answerer.answer(good)).rcode == "NOERROR"  # from the answer cache now
    bad = bytearray(good)
    bad[-10:-8] = b"\x00\x20"  # the cookie's length: 32, past the end of the OPT data
    assert cache_key(bytes(bad)) is None
    assert header_only(answerer.answer(bytes(bad)))[1] & 0xF == FORMERR

"""Upstream answers: the TTL-honouring cache (sans-IO, time passed in) and relaying them to
clients (ID, RD, OPT, truncation), and ExternalName chains completed from upstream."""

from __future__ import annotations

import pytest
from dnslib import EDNS0, NS, QTYPE, RCODE, RR, SOA, TXT, A, DNSRecord

from kubeport.dns.answer import Answerer, Forward
from kubeport.dns.config import DnsConfig
from kubeport.dns.records import RecordIndex
from kubeport.dns.forward.forwarder import UpstreamCache, without_opt
from kubeport.dns.wire import parse_query

from support.api import service, snapshot_of
from support.zonetext import header_only, question, read_reply


def upstream_reply(name: str = "www.example.com.", *, answers: int = 1, ttl: int = 300, rcode: int = 0,
                   soa: tuple[int, int] | None = None, tc: bool = False, opt: bool = True,
                   nameservers: int = 0, txt: int = 0) -> bytes:
    """Sizes, compressed: header and question 33 bytes, each A 16, each NS 18; a TXT
    record of ``txt`` bytes of text comes first, in 200-byte strings."""
    record = DNSRecord.question(name, "A")
    record.header.id = 999
    reply = record.reply()
    reply.header.rcode = rcode
    reply.header.tc = int(tc)
    if txt:
        reply.add_answer(RR(name, QTYPE.TXT, rdata=TXT([b"x" * 200] * (txt // 200)), ttl=ttl))
    for i in range(answers):
        reply.add_answer(RR(name, QTYPE.A, rdata=A(f"203.0.113.{i + 1}"), ttl=ttl))
    for i in range(nameservers):
        reply.add_auth(RR("example.com.", QTYPE.NS, rdata=NS(f"ns{i}.example.com."), ttl=ttl))
    if soa is not None:
        soa_ttl, minimum = soa
        reply.add_auth(RR("example.com.", QTYPE.SOA, ttl=soa_ttl, rdata=SOA(
            "ns.example.com.", "admin.example.com.", (1, 2, 3, 4, minimum))))
    if opt:
        reply.add_ar(EDNS0(udp_len=1232))
    return bytes(reply.pack())


def stored(message: bytes):
    return without_opt(message)


def test_without_opt_zeroes_the_id_and_cuts_the_opt() -> None:
    message, spans = without_opt(upstream_reply())
    record = DNSRecord.parse(message)
    assert record.header.id == 0 and record.ar == [] and len(spans) == 1


def test_cache_ages_ttls_and_expires() -> None:
    cache = UpstreamCache(10, max_ttl=3600, max_negative_ttl=1800)
    cache.put(b"k", *stored(upstream_reply(ttl=300)), now=1000.0)
    message, negative = cache.get(b"k", 1100.4)
    assert not negative and DNSRecord.parse(message).rr[0].ttl == 200
    assert cache.get(b"k", 1300.0) is None and len(cache) == 0


@pytest.mark.parametrize("kwargs, lifetime, caps", [
    pytest.param({"ttl": 300}, 300, None, id="positive_lowest_ttl"),
    pytest.param({"ttl": 7200}, 3600, None, id="positive_capped"),
    pytest.param({"answers": 0, "rcode": RCODE.NXDOMAIN, "soa": (900, 60)}, 60, None, id="negative_soa_minimum__rfc2308"),
    pytest.param({"answers": 0, "soa": (30, 600)}, 30, None, id="nodata_soa_ttl__rfc2308"),
    pytest.param({"answers": 0, "rcode": RCODE.NXDOMAIN, "soa": (7200, 7200)}, 1800, None, id="negative_capped"),
    # CoreDNS cache defaults: minsuccess/mindenial 5 s, MinimalDefaultTTL 5 s, servfail 5 s.
    pytest.param({"answers": 0, "rcode": RCODE.NXDOMAIN}, 5, None, id="negative_without_soa_5s__coredns"),
    pytest.param({"answers": 0, "rcode": RCODE.NXDOMAIN, "soa": (1, 1)}, 5, None, id="negative_at_least_5s__coredns"),
    pytest.param({"answers": 0, "rcode": RCODE.SERVFAIL}, 5, None, id="servfail_5s__coredns"),
    pytest.param({"answers": 0, "rcode": RCODE.REFUSED}, 0, None, id="refused_not_cached"),
    pytest.param({"tc": True}, 0, None, id="truncated_not_cached"),
    pytest.param({"ttl": 0}, 5, None, id="ttl_zero_kept_5s__coredns_minttl"),
    pytest.param({"ttl": 3}, 5, None, id="short_ttl_kept_5s__coredns_minttl"),
    pytest.param({"ttl": 300}, 0, {"max_ttl": 0}, id="max_ttl_0_turns_caching_off"),
    pytest.param({"answers": 0, "rcode": RCODE.SERVFAIL}, 0, {"max_negative_ttl": 0},
                 id="max_denial_ttl_0_keeps_no_servfail"),
])
def test_cache_lifetime(kwargs: dict, lifetime: int, caps: dict | None) -> None:
    cache = UpstreamCache(10, **({"max_ttl": 3600, "max_negative_ttl": 1800} | (caps or {})))
    cache.put(b"k", *stored(upstream_reply(**kwargs)), now=0.0)
    if lifetime == 0:
        assert cache.get(b"k", 0.0) is None
    else:
        assert cache.get(b"k", lifetime - 0.01) is not None and cache.get(b"k", lifetime) is None


def test_cache_size_cap_drops_the_oldest() -> None:
    cache = UpstreamCache(2, max_ttl=3600, max_negative_ttl=1800)
    for key in (b"a", b"b", b"c"):
        cache.put(key, *stored(upstream_reply()), now=0.0)
    assert len(cache) == 2 and cache.get(b"a", 1.0) is None and cache.get(b"c", 1.0) is not None


@pytest.fixture
def answerer() -> Answerer:
    objects = [service("ext", type="ExternalName", externalName="www.example.com")]
    return Answerer(DnsConfig(upstreams=()), RecordIndex.build(snapshot_of(objects), now=1))


def forward_of(answerer: Answerer, packet: bytes, tcp: bool = False) -> Forward:
    result = answerer.answer(packet, tcp)
    assert isinstance(result, Forward)
    return result


def test_relay_patches_id_and_rd_and_adds_our_opt(answerer: Answerer) -> None:
    forward = forward_of(answerer, question("www.example.com.", query_id=4242, rd=False, edns=4096, do=True))
    message, _ = without_opt(upstream_reply())
    reply = read_reply(answerer.relay(forward, message))
    assert reply.id == 4242 and "rd" not in reply.flags
    assert reply.answer == ("www.example.com. 300 IN A 203.0.113.1",) and reply.edns == (1232, True)


@pytest.mark.parametrize("upstream, edns, tcp, sections, truncated", [
    pytest.param(upstream_reply(answers=40), None, False, (29, 0, 0), True,
                 id="no_edns_keeps_the_records_that_fit_512"),
    pytest.param(upstream_reply(answers=40), 1232, False, (40, 0, 0), False, id="edns_1232_fits_whole"),
    pytest.param(upstream_reply(answers=80), 1232, False, (74, 0, 0), True,
                 id="edns_budget_leaves_room_for_our_opt"),
    pytest.param(upstream_reply(answers=25, nameservers=6), None, False, (25, 4, 0), True,
                 id="answer_kept_before_authority__miekg_truncate"),
    pytest.param(upstream_reply(answers=0, txt=600), None, False, (0, 0, 0), True,
                 id="first_record_alone_too_big_is_question_only"),
    pytest.param(upstream_reply(answers=40), None, True, (40, 0, 0), False, id="tcp_gets_the_whole_message"),
])
def test_relay_trims_to_the_client_buffer_keeping_whole_records(answerer: Answerer, upstream: bytes,
                                                                edns: int | None, tcp: bool,
                                                                sections: tuple[int, int, int],
                                                                truncated: bool) -> None:
    """Cut to the client's buffer, whole records, TC set: CoreDNS request/request.go Scrub."""
    message, _ = without_opt(upstream)
    packet = question("www.example.com.", edns=edns)
    whole = read_reply(answerer.relay(forward_of(answerer, packet, tcp=True), message))
    raw = answerer.relay(forward_of(answerer, packet, tcp=tcp), message)
    reply = read_reply(raw)
    assert (len(reply.answer), len(reply.authority), len(reply.additional)) == sections
    assert ("tc" in reply.flags, reply.rcode, reply.edns is not None) == (truncated, "NOERROR", edns is not None)
    # the counts in the header must match the records kept, else clients misparse
    assert header_only(raw)[3] == (1, *sections[:2], sections[2] + (edns is not None))
    # the next relay is turned one record further (loadbalance), then cut
    assert reply.answer == turned(whole.answer, 1)[: sections[0]] and reply.authority == whole.authority[: sections[1]]
    assert reply.size <= (65535 if tcp else edns or 512)


def turned(answer: tuple[str, ...], turns: int) -> tuple[str, ...]:
    """The answer with its run of A records turned (CoreDNS loadbalance)."""
    first = next((i for i, line in enumerate(answer) if " IN A " in line), len(answer))
    run = answer[first:]
    turns %= max(1, len(run))
    return answer[:first] + run[turns:] + run[:turns]


def test_relay_without_upstream_is_servfail(answerer: Answerer) -> None:
    reply = read_reply(answerer.relay(forward_of(answerer, question("www.example.com.")), None))
    assert reply.rcode == "SERVFAIL" and reply.id == 4660


EXT = "ext.default.svc.cluster.local."
CNAME = f"{EXT} 5 IN CNAME www.example.com."


@pytest.mark.parametrize("upstream, rcode, answer, tc", [
    pytest.param(upstream_reply(), "NOERROR", (CNAME, "www.example.com. 300 IN A 203.0.113.1"), False,
                 id="cname_then_upstream_answer"),
    pytest.param(upstream_reply(answers=0, rcode=RCODE.NXDOMAIN, soa=(60, 60)), "NOERROR", (CNAME,), False,
                 id="upstream_nxdomain_becomes_noerror"),
    pytest.param(upstream_reply(tc=True), "NOERROR", (CNAME, "www.example.com. 300 IN A 203.0.113.1"), True,
                 id="upstream_tc_copied"),
    # upstream.go Lookup: the SERVFAIL core/dnsserver/server.go writes when forward fails has no answer
    pytest.param(None, "NOERROR", (CNAME,), False, id="no_upstream_answer_keeps_the_cname"),
])
def test_externalname_chain_completed_from_upstream(answerer: Answerer, upstream, rcode, answer, tc) -> None:
    """kubernetes/dns specification 2.5, completed as CoreDNS plugin/backend_lookup.go A does: the
    CNAME and upstream's records, NOERROR whatever upstream said, upstream's TC; no answer, the CNAME."""
    forward = forward_of(answerer, question(EXT, edns=1232))
    message = without_opt(upstream)[0] if upstream is not None else None
    reply = read_reply(answerer.relay(forward, message))
    assert (reply.rcode, reply.answer, "tc" in reply.flags) == (rcode, answer, tc)
    assert "aa" in reply.flags and bool(reply.authority) == (not answer)


def test_forward_question_keeps_the_query_spelling(answerer: Answerer) -> None:
    forward = forward_of(answerer, question("WwW.Example.COM.", "AAAA"))
    assert forward.question == parse_query(question("WwW.Example.COM.", "AAAA")).question

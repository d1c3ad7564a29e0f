"""The Forwarder against fake upstreams on 127.0.0.1: CoreDNS forward's retries until its 5 s
deadline, random policy, immediate failover on ICMP refusal, health checks, the transport
the query arrived on, and answers cached stamped when they arrived (plugin/forward/forward.go
ServeDNS, plugin/pkg/proxy/connect.go Connect, plugin/cache).
Timeouts are scaled down (tenths of a second) so the suite stays fast."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import socket
import time
from typing import Callable

import pytest
from dnslib import QTYPE, RR, A, DNSRecord

from kubeport.dns.config import DnsConfig
from kubeport.dns.server import DnsServer
from kubeport.dns.stats import DnsStats
from kubeport.dns.forward.forwarder import Forwarder, UpstreamCache
from kubeport.dns.forward.policy import MAX_FAILS

from support.dns_loopback import LoopbackDnsPort
from support.wait import until
from support.zonetext import question, read_reply

Behaviour = Callable[[str, DNSRecord], "bytes | None"]
WWW = b"\x03www\x07example\x03com\x00\x00\x01\x00\x01"  # www.example.com. A IN


def ask_for(label: str) -> bytes:
    """The question ``<label>.example.com. A IN`` as sent upstream."""
    return bytes([len(label)]) + label.encode() + WWW[4:]


def answer_a(proto: str, request: DNSRecord) -> bytes | None:
    reply = request.reply()
    reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A("192.0.2.1"), ttl=300))
    return bytes(reply.pack())


def silent(proto: str, request: DNSRecord) -> bytes | None:
    return None


class FakeUpstream:
    """UDP and TCP on one loopback port; ``behaviour`` makes each reply (None: dropped)."""

    def __init__(self, behaviour: Behaviour = answer_a):
        self.behaviour = behaviour
        self.queries: list[tuple[str, str]] = []  # (proto, name), health checks included
        self.port = 0

    def asked(self, name: str = "www.example.com.", proto: str | None = None) -> int:
        return sum(1 for p, n in self.queries if n == name and proto in (None, p))

    def _reply(self, proto: str, packet: bytes) -> bytes | None:
        request = DNSRecord.parse(packet)
        self.queries.append((proto, str(request.q.qname)))
        return self.behaviour(proto, request)

    async def start(self) -> "FakeUpstream":
        self._serving = LoopbackDnsPort(self._reply)
        await self._serving.start()
        self.port = self._serving.port
        return self

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    async def stop(self) -> None:
        await self._serving.stop()


def closed_port() -> tuple[str, int]:
    """A loopback UDP port nobody listens on: the kernel answers ICMP port unreachable."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return ("127.0.0.1", probe.getsockname()[1])


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def forwarder(*upstreams: tuple[str, int], timeout: float = 0.2, deadline: float = 5.0, seed: int = 1,
              clock: Callable[[], float] = time.monotonic, **kwargs) -> Forwarder:
    return Forwarder(upstreams, timeout=timeout, cache=UpstreamCache(100, 3600, 1800), stats=DnsStats(),
                     max_concurrent=100, deadline=deadline, clock=clock, rng=random.Random(seed), **kwargs)


@pytest.fixture
async def fakes():
    started: list[FakeUpstream] = []

    async def make(behaviour: Behaviour = answer_a) -> FakeUpstream:
        started.append(await FakeUpstream(behaviour).start())
        return started[-1]

    yield make
    for fake in started:
        await fake.stop()


async def resolve_timed(forwarder: Forwarder, question_bytes: bytes = WWW, **kwargs) -> tuple[bytes | None, float]:
    started = time.monotonic()
    message = await forwarder.resolve(question_bytes, do=False, cd=False, **kwargs)
    return message, time.monotonic() - started


async def test_lost_packet_is_asked_again_not_servfail__forward_deadline(fakes) -> None:
    """One upstream, its first answer lost: CoreDNS asks again after read_timeout and
    answers; it does not give up (SERVFAIL) after the one try."""
    lost = []

    def lose_first(proto: str, request: DNSRecord) -> bytes | None:
        if str(request.q.qname) == "www.example.com." and not lost:
            lost.append(request)
            return None
        return answer_a(proto, request)

    upstream = await fakes(lose_first)
    forward = forwarder(upstream.address)
    message, elapsed = await resolve_timed(forward)
    assert message is not None and DNSRecord.parse(message).a.rdata == A("192.0.2.1")
    assert upstream.asked() == 2 and 0.2 <= elapsed < 1.0
    forward.close()
    await forward.wait_closed()


async def test_silent_upstreams_give_up_at_the_deadline_not_after__forward_deadline(fakes) -> None:
    """Three silent upstreams, read_timeout 0.4 s, deadline 0.5 s (CoreDNS: 2 s and 5 s):
    the second try is cut at the deadline (uncut, it would end at 0.8 s)."""
    upstreams = [await fakes(silent) for _ in range(3)]
    forward = forwarder(*(u.address for u in upstreams), timeout=0.4, deadline=0.5)
    message, elapsed = await resolve_timed(forward)
    assert message is None and 0.5 <= elapsed < 0.7
    assert sum(u.asked() for u in upstreams) == 2
    forward.close()
    await forward.wait_closed()


async def test_refused_upstream_is_left_at_once__icmp(fakes) -> None:
    good = await fakes()
    dead = closed_port()
    forward = forwarder(dead, good.address, timeout=1.0)
    for index in range(6):
        message, elapsed = await resolve_timed(forward, ask_for(f"r{index}"))
        assert message is not None and elapsed < 0.5  # not the 1 s timeout
    forward.close()
    await forward.wait_closed()


async def test_only_upstream_refused_is_servfail_at_once_without_spinning(fakes) -> None:
    forward = forwarder(closed_port(), deadline=5.0)
    message, elapsed = await resolve_timed(forward)
    assert message is None and elapsed < 0.5
    assert sum(forward.stats.forward_requests.values()) == 1
    forward.close()
    await forward.wait_closed()


async def test_policy_random_spreads_queries_and_is_not_sticky__forward_policy_random(fakes) -> None:
    upstreams = [await fakes(), await fakes()]
    forward = forwarder(*(u.address for u in upstreams))
    for index in range(30):
        assert (await resolve_timed(forward, ask_for(f"p{index}")))[0] is not None
    asked = [len(u.queries) for u in upstreams]
    assert sum(asked) == 30 and min(asked) >= 5, asked
    forward.close()
    await forward.wait_closed()


@pytest.mark.parametrize("tcp, proto", [pytest.param(True, "tcp", id="tcp_over_tcp__forward_transport"),
                                        pytest.param(False, "udp", id="udp_over_udp")])
async def test_query_is_forwarded_over_the_transport_it_arrived_on(fakes, tcp: bool, proto: str) -> None:
    upstream = await fakes()
    forward = forwarder(upstream.address)
    message, _ = await resolve_timed(forward, tcp=tcp)
    assert message is not None and upstream.queries == [(proto, "www.example.com.")]
    forward.close()
    await forward.wait_closed()


async def test_answer_is_cached_stamped_when_it_arrived(fakes) -> None:
    clock = Clock()

    def slow(proto: str, request: DNSRecord) -> bytes | None:
        clock.now += 3  # the upstream takes 3 s to answer
        return answer_a(proto, request)

    upstream = await fakes(slow)
    forward = forwarder(upstream.address, clock=clock)
    assert (await resolve_timed(forward))[0] is not None
    stored = forward.cache.lookup(Forwarder.cache_key(WWW, do=False, cd=False), clock.now)
    assert stored is not None and stored.stored == 1003.0 and stored.aged(clock.now) == stored.message
    forward.close()
    await forward.wait_closed()


async def test_first_relayed_answer_keeps_its_whole_ttl(fakes) -> None:
    """Through the server: the wait for the upstream is not taken off the TTL."""
    clock = Clock()

    def slow(proto: str, request: DNSRecord) -> bytes | None:
        clock.now += 3
        return answer_a(proto, request)

    upstream = await fakes(slow)
    server = DnsServer(DnsConfig(addresses=("127.0.0.1",), port=0, upstreams=(upstream.address,)), monotonic=clock)
    await server.start()
    try:
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
            client.setblocking(False)
            client.connect(("127.0.0.1", server.port))
            await loop.sock_sendall(client, question("www.example.com."))
            reply = read_reply(await asyncio.wait_for(loop.sock_recv(client, 65535), 5))
        assert reply.answer == ("www.example.com. 300 IN A 192.0.2.1",)
    finally:
        await server.stop()


async def test_upstream_down_after_failed_checks_is_skipped_until_it_answers__forward_health(fakes, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="kubeport.dns.forward.forwarder")
    flaky, good = await fakes(silent), await fakes()
    forward = forwarder(flaky.address, good.address, timeout=0.1, check_interval=0.01, seed=3)
    for index in range(20):  # until a query has tried the silent one (the order is random)
        assert (await resolve_timed(forward, ask_for(f"d{index}")))[0] is not None
        if any(name != "." for _, name in flaky.queries):
            break
    await until(lambda: flaky.address in forward.health.down, "the silent upstream marked down", 3)
    assert flaky.asked(".") > MAX_FAILS and "is down" in caplog.text
    assert forward.stats.forward_healthcheck_failures[f"127.0.0.1:{flaky.port}"] > MAX_FAILS
    tried = len(flaky.queries) - flaky.asked(".")
    for index in range(6):
        assert (await resolve_timed(forward, ask_for(f"u{index}")))[0] is not None
    assert len(flaky.queries) - flaky.asked(".") == tried  # the silent one is not tried while down
    flaky.behaviour = answer_a
    await until(lambda: not forward.health.down, "the upstream back up", 3)
    assert "answers again" in caplog.text
    forward.close()
    await forward.wait_closed()


async def test_every_upstream_down_still_asks_one__forward_healthcheck_broken(fakes) -> None:
    lone = await fakes(silent)
    forward = forwarder(lone.address, timeout=0.1, deadline=0.15, check_interval=0.01)
    assert (await resolve_timed(forward))[0] is None
    await until(lambda: lone.address in forward.health.down, "the lone upstream marked down", 3)
    asked = lone.asked()
    assert (await resolve_timed(forward))[0] is None
    assert lone.asked() > asked and forward.stats.forward_healthcheck_broken == 1
    forward.close()
    await forward.wait_closed()


def test_server_warns_when_no_upstream_remains(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="kubeport.dns.server")
    DnsServer(DnsConfig(addresses=("127.0.0.1",), port=0, upstreams=()))
    assert "no upstream resolver" in caplog.text


async def test_a_handed_over_server_answers_its_forwards_in_flight(fakes) -> None:
    """Handover: the old server's queries waiting for an upstream get their answer through it
    (the socket steps aside for new queries, and stays open for those replies)."""
    attempts: list[str] = []

    def first_lost(proto: str, request: DNSRecord) -> bytes | None:
        attempts.append(proto)
        return None if len(attempts) == 1 else answer_a(proto, request)  # the retry is answered

    upstream = await fakes(first_lost)
    config = DnsConfig(addresses=("127.0.0.1",), port=0, upstreams=(upstream.address,), upstream_timeout=0.3)
    old = DnsServer(config)
    await old.start()
    loop = asyncio.get_running_loop()
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.setblocking(False)
    client.connect(("127.0.0.1", old.port))
    try:
        client.send(question("www.example.com.", "A", query_id=7))
        await until(lambda: len(attempts) == 1, "the query at the old server", 3)  # in flight at the old server
        new = DnsServer(dataclasses.replace(config, port=old.port))
        await new.start()  # beside it, SO_REUSEPORT
        await old.stop(hand_over=True)
        reply = read_reply(await asyncio.wait_for(loop.sock_recv(client, 4096), 2))
        assert reply.rcode == "NOERROR" and reply.answer, reply
        client.send(question("www.example.com.", "A", query_id=8))  # now the new server's
        assert read_reply(await asyncio.wait_for(loop.sock_recv(client, 4096), 2)).rcode == "NOERROR"
        await new.stop()
    finally:
        client.close()

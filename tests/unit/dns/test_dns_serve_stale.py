"""CoreDNS cache `serve_stale`, through a DnsServer on loopback forwarding to a stub upstream
that dies (its port closed: ICMP port unreachable) and comes back on the same port. Time
for the cache is a fake monotonic clock; the sockets are real.

CoreDNS: plugin/cache/handler.go ServeDNS (an item expired less than serve_stale ago is
served at TTL 0; ``immediate`` answers it and prefetches, ``verify`` asks upstream first,
plugin/cache/dnssec.go verifyStaleResponseWriter keeps NOERROR/NXDOMAIN only).
"""

from __future__ import annotations

import asyncio

import pytest
from dnslib import QTYPE, RR, A, DNSRecord

from kubeport.dns.config import DnsConfig
from kubeport.dns.forward.cache import UpstreamCache
from kubeport.dns.server import DnsServer

from support.wait import until
from support.zonetext import question, read_reply

NAME = "www.example.test."
TTL = 30


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class StubUpstream(asyncio.DatagramProtocol):
    """www.example.test A 203.0.113.7 (TTL 30) on a fixed loopback port, stoppable."""

    def __init__(self) -> None:
        self.asked = 0
        self.port = 0
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        request = DNSRecord.parse(data)
        if str(request.q.qname) != NAME:
            return  # a health check: not counted
        self.asked += 1
        reply = request.reply()
        reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A("203.0.113.7"), ttl=TTL))
        self.transport.sendto(reply.pack(), addr)  # type: ignore[union-attr]

    async def start(self) -> "StubUpstream":
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: self, local_addr=("127.0.0.1", self.port))
        self.port = self.transport.get_extra_info("sockname")[1]  # type: ignore[union-attr]
        return self

    def die(self) -> None:
        self.transport.close()  # type: ignore[union-attr]


class Client(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.replies: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.replies.put_nowait(data)


async def ask(server: DnsServer):
    loop = asyncio.get_running_loop()
    transport, client = await loop.create_datagram_endpoint(Client, remote_addr=("127.0.0.1", server.port))
    try:
        transport.sendto(question(NAME))
        return read_reply(await asyncio.wait_for(client.replies.get(), 8))
    finally:
        transport.close()


@pytest.fixture
async def rig(request):
    stub = await StubUpstream().start()
    clock = Clock()
    config = DnsConfig(addresses=("127.0.0.1",), port=0, upstreams=(("127.0.0.1", stub.port),),
                       upstream_timeout=0.5, **request.param)
    server = DnsServer(config, monotonic=clock)
    await server.start()
    yield server, stub, clock
    await server.stop()
    if stub.transport is not None:
        stub.transport.close()


def answer(reply) -> list[tuple[int, str]]:
    return [(int(line.split()[1]), line.split()[-1]) for line in reply.answer]


IMMEDIATE = {"serve_stale": 3600.0}
VERIFY = {"serve_stale": 3600.0, "serve_stale_refresh": "verify"}


@pytest.mark.parametrize("rig", [pytest.param(IMMEDIATE, id="immediate")], indirect=True)
async def test_immediate_answers_stale_while_upstream_is_down_then_refreshes(rig) -> None:
    server, stub, clock = rig
    assert answer(await ask(server)) == [(TTL, "203.0.113.7")]
    stub.die()
    clock.now += TTL + 60  # expired a minute ago
    stale = await ask(server)
    assert (stale.rcode, answer(stale)) == ("NOERROR", [(0, "203.0.113.7")])  # TTL 0, as CoreDNS
    assert server.stats.served_stale == 1
    await stub.start()  # back on the same port
    again = await ask(server)
    assert answer(again) == [(0, "203.0.113.7")]  # answered at once; the refresh runs behind it
    await until(lambda: stub.asked == 2 and server.forwarder.cache.lookup(
        server.forwarder.cache_key(b"\x03www\x07example\x04test\x00\x00\x01\x00\x01", do=False, cd=False),
        clock.now) is not None, "the background refresh")
    fresh = await ask(server)
    assert answer(fresh) == [(TTL, "203.0.113.7")] and stub.asked == 2  # from the refreshed cache


@pytest.mark.parametrize("rig", [pytest.param(VERIFY, id="verify")], indirect=True)
async def test_verify_asks_upstream_first_and_answers_stale_only_if_it_fails(rig) -> None:
    server, stub, clock = rig
    await ask(server)
    stub.die()
    clock.now += TTL + 60
    stale = await ask(server)
    assert (stale.rcode, answer(stale)) == ("NOERROR", [(0, "203.0.113.7")])
    await stub.start()
    fresh = await ask(server)
    assert answer(fresh) == [(TTL, "203.0.113.7")] and stub.asked == 2
    assert server.stats.served_stale == 1


@pytest.mark.parametrize("rig", [pytest.param(IMMEDIATE, id="immediate")], indirect=True)
async def test_past_serve_stale_the_entry_is_gone(rig) -> None:
    server, stub, clock = rig
    await ask(server)
    stub.die()
    clock.now += TTL + 3600  # expired an hour ago: serve_stale 1h is over
    assert (await ask(server)).rcode == "SERVFAIL"


@pytest.mark.parametrize("rig", [pytest.param({}, id="off")], indirect=True)
async def test_without_serve_stale_an_expired_answer_is_not_served(rig) -> None:
    server, stub, clock = rig
    await ask(server)
    stub.die()
    clock.now += TTL
    assert (await ask(server)).rcode == "SERVFAIL"
    assert server.stats.served_stale == 0


@pytest.mark.parametrize("age, fresh, stale", [
    pytest.param(29.9, True, True, id="before_expiry_fresh"),
    pytest.param(30.0, False, True, id="at_expiry_stale"),
    pytest.param(30.0 + 3599.9, False, True, id="inside_serve_stale"),
    pytest.param(30.0 + 3600.0, False, False, id="serve_stale_over_dropped"),
])
def test_cache_lookup_windows(age: float, fresh: bool, stale: bool) -> None:
    """plugin/cache/cache.go getIgnoreTTL: ttl > -staleUpTo."""
    from kubeport.dns.forward.cache import without_opt

    cache = UpstreamCache(10, 3600, 1800, serve_stale=3600)
    request = DNSRecord.question(NAME)
    reply = request.reply()
    reply.add_answer(RR(NAME, QTYPE.A, rdata=A("203.0.113.7"), ttl=TTL))
    cache.put(b"k", *without_opt(bytes(reply.pack())), now=0.0)
    assert (cache.lookup(b"k", age) is not None) == fresh
    found = cache.lookup(b"k", age, stale=True)
    assert (found is not None) == stale
    if found is not None and not fresh:
        assert [rr.ttl for rr in DNSRecord.parse(found.stale()).rr] == [0]


PREFETCH = {"prefetch": 1}


def fresh_in_cache(server: DnsServer, clock: Clock, stored_after: float) -> bool:
    key = server.forwarder.cache_key(b"\x03www\x07example\x04test\x00\x00\x01\x00\x01", do=False, cd=False)
    stored = server.forwarder.cache.lookup(key, clock.now)
    return stored is not None and stored.stored >= stored_after


@pytest.mark.parametrize("rig", [pytest.param(PREFETCH, id="prefetch_1")], indirect=True)
async def test_prefetch_refreshes_a_popular_answer_before_it_expires(rig) -> None:
    """plugin/cache/handler.go shouldPrefetch: ttl <= ceil(10% of 30) = 3 s left, one hit: refresh
    in the background, counted at the stub before the answer expires."""
    server, stub, clock = rig
    await ask(server)
    clock.now += 26  # 4 s left: not yet
    assert answer(await ask(server)) == [(4, "203.0.113.7")] and server.stats.prefetches == 0
    clock.now += 1.5  # 2.5 s left
    assert answer(await ask(server)) == [(3, "203.0.113.7")]  # answered from the cache, refreshed behind it
    refreshed_at = clock.now
    await until(lambda: stub.asked == 2 and fresh_in_cache(server, clock, refreshed_at), "the prefetch")
    clock.now += 5  # past the first answer's expiry
    assert answer(await ask(server)) == [(25, "203.0.113.7")] and stub.asked == 2
    assert server.stats.prefetches == 1


@pytest.mark.parametrize("rig", [pytest.param({"prefetch": 2}, id="prefetch_2")], indirect=True)
async def test_prefetch_amount_counts_the_queries_in_the_window(rig) -> None:
    server, stub, clock = rig
    await ask(server)
    clock.now += 28
    await ask(server)
    assert server.stats.prefetches == 0 and not server._refreshing  # one query: not popular enough
    await ask(server)
    assert server.stats.prefetches == 1
    await until(lambda: stub.asked == 2, "the prefetch")


@pytest.mark.parametrize("rig", [pytest.param({}, id="off")], indirect=True)
async def test_without_prefetch_nothing_is_refreshed(rig) -> None:
    server, stub, clock = rig
    await ask(server)
    clock.now += 28
    assert answer(await ask(server)) == [(2, "203.0.113.7")]
    assert server.stats.prefetches == 0 and not server._refreshing and stub.asked == 1

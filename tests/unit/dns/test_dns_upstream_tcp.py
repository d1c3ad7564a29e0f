"""TCP connections to upstreams reused as CoreDNS forward reuses them (plugin/pkg/proxy
persistent.go, connect.go; forward.go ErrCachedClosed), against a fake TCP upstream on
127.0.0.1 that counts the connections it accepts. The pool's clock is injected: no test
waits out the 10 s expiry."""

from __future__ import annotations

import asyncio
import random
from typing import Callable

import pytest

from kubeport.dns.stats import DnsStats
from kubeport.dns.forward.forwarder import Forwarder, UpstreamCache
from kubeport.dns.forward.tcp import EXPIRE, TcpPool

from support.wait import until

WWW = b"\x03www\x07example\x03com\x00\x00\x01\x00\x01"  # www.example.com. A IN


def frame(message: bytes) -> bytes:
    return len(message).to_bytes(2, "big") + message


class FakeTcpUpstream:
    """Answers each query with itself, QR set. ``hold``: answers wait for :meth:`release`;
    ``silent``: none sent; ``hang_up_on_query``: the next query closes its connection."""

    def __init__(self) -> None:
        self.accepted = 0
        self.ended = 0  # connections gone, either side closing
        self.queries: list[int] = []  # the connection number each query came on
        self.hold = self.silent = self.hang_up_on_query = False
        self.held: dict[int, tuple[asyncio.StreamWriter, bytes]] = {}
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._changed = asyncio.Condition()

    async def start(self) -> "FakeTcpUpstream":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.address = self._server.sockets[0].getsockname()[:2]
        return self

    async def stop(self) -> None:
        self._server.close()
        for writer in self._writers.values():
            writer.close()
        await self._server.wait_closed()

    async def until(self, condition: Callable[[], bool], deadline: float = 2.0) -> None:
        await until(condition, "the upstream's connections and queries as awaited", deadline,
                    changed=self._next_change)

    async def _next_change(self) -> None:
        # Called right after a check, with no await in between: no notification is missed.
        async with self._changed:
            await self._changed.wait()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def release(self, number: int) -> None:
        writer, answer = self.held.pop(number)
        writer.write(frame(answer))

    def hang_up_idle(self) -> None:
        for writer in self._writers.values():
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        number = self.accepted
        self._writers[number] = writer
        await self._notify()
        try:
            while True:
                query = await reader.readexactly(int.from_bytes(await reader.readexactly(2), "big"))
                self.queries.append(number)
                answer = query[:2] + bytes([query[2] | 0x80]) + query[3:]
                if self.hang_up_on_query:
                    self.hang_up_on_query = False
                    break
                if self.hold:
                    self.held[number] = (writer, answer)
                elif not self.silent:
                    writer.write(frame(answer))
                await self._notify()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            del self._writers[number]
            self.ended += 1
            await self._notify()


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def upstream():
    fake = await FakeTcpUpstream().start()
    yield fake
    await fake.stop()


async def ask(pool: TcpPool, upstream: FakeTcpUpstream) -> bytes:
    answer = await asyncio.wait_for(pool.ask(upstream.address, WWW, do=False, cd=False, udp_size=1232), 2.0)
    assert answer[2] & 0x80 and answer[12 : 12 + len(WWW)] == WWW
    return answer


async def test_sequential_queries_share_one_connection__coredns_persistent(upstream: FakeTcpUpstream) -> None:
    pool = TcpPool()
    await ask(pool, upstream)
    await ask(pool, upstream)
    assert (upstream.accepted, upstream.queries, pool.idle(upstream.address)) == (1, [1, 1], 1)
    pool.close()


async def test_concurrent_queries_each_get_a_connection_and_the_last_returned_is_taken_first__coredns_lifo(
        upstream: FakeTcpUpstream) -> None:
    pool = TcpPool()
    upstream.hold = True
    queries = {asyncio.ensure_future(ask(pool, upstream)) for _ in range(2)}
    await upstream.until(lambda: len(upstream.held) == 2)
    upstream.release(2)
    done, _ = await asyncio.wait(queries, timeout=2.0, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1 and pool.idle(upstream.address) == 1
    upstream.release(1)  # connection 1 goes back last
    await asyncio.gather(*queries)
    upstream.hold = False
    await ask(pool, upstream)
    assert (upstream.accepted, upstream.queries[-1], pool.idle(upstream.address)) == (2, 1, 2)
    pool.close()


@pytest.mark.parametrize("idle_for, connections", [
    pytest.param(EXPIRE - 0.1, 1, id="idle_under_expire_is_reused"),
    pytest.param(EXPIRE + 0.1, 2, id="idle_over_expire_is_closed_not_reused__coredns_expire_10s"),
])
async def test_idle_connection_expiry(upstream: FakeTcpUpstream, idle_for: float, connections: int) -> None:
    clock = Clock()
    pool = TcpPool(clock=clock)
    await ask(pool, upstream)
    clock.now += idle_for
    await ask(pool, upstream)
    await upstream.until(lambda: upstream.ended == connections - 1)  # the expired one closed
    assert upstream.accepted == connections and pool.idle(upstream.address) == 1
    pool.close()


async def test_expired_connections_are_swept_when_one_is_given_back(upstream: FakeTcpUpstream) -> None:
    clock = Clock()
    pool = TcpPool(clock=clock)
    upstream.hold = True
    first = asyncio.gather(ask(pool, upstream), ask(pool, upstream))
    await upstream.until(lambda: len(upstream.held) == 2)
    upstream.release(1)
    upstream.release(2)
    await first
    held = asyncio.ensure_future(ask(pool, upstream))  # takes one, leaves one idle
    await upstream.until(lambda: len(upstream.held) == 1)
    clock.now += EXPIRE + 1
    upstream.release(next(iter(upstream.held)))
    await held
    await upstream.until(lambda: upstream.ended == 1)
    assert pool.idle(upstream.address) == 1
    pool.close()


async def test_idle_connections_are_swept_without_another_query__coredns_expire_ticker(
        upstream: FakeTcpUpstream) -> None:
    """After a burst, connections nobody asks again must not stay open until the upstream
    closes them: CoreDNS sweeps every ``expire``."""
    clock = Clock()
    pool = TcpPool(clock=clock)
    upstream.hold = True
    burst = asyncio.gather(*(ask(pool, upstream) for _ in range(3)))
    await upstream.until(lambda: len(upstream.held) == 3)
    for query in list(upstream.held):
        upstream.release(query)
    await burst
    assert pool.idle(upstream.address) == 3 and pool._sweeper is not None  # the timer is armed
    clock.now += EXPIRE + 1
    pool.sweep()  # what the timer does, EXPIRE seconds later
    await upstream.until(lambda: upstream.ended == 3)
    assert pool.idle(upstream.address) == 0 and pool._sweeper is None  # nothing idle: no timer
    pool.close()


async def test_connection_closed_by_upstream_while_idle_is_not_used(upstream: FakeTcpUpstream) -> None:
    pool = TcpPool()
    await ask(pool, upstream)
    upstream.hang_up_idle()
    await upstream.until(lambda: upstream.ended == 1)
    await ask(pool, upstream)
    assert upstream.accepted == 2
    pool.close()


async def test_reused_connection_closed_before_answering_is_asked_again_once_on_a_new_one__coredns_err_cached_closed(
        upstream: FakeTcpUpstream) -> None:
    pool = TcpPool()
    await ask(pool, upstream)
    upstream.hang_up_on_query = True  # the race: the upstream's close not yet seen when reused
    await ask(pool, upstream)
    assert (upstream.accepted, upstream.queries) == (2, [1, 1, 2])
    pool.close()


async def test_new_connection_closed_before_answering_is_not_asked_again(upstream: FakeTcpUpstream) -> None:
    pool = TcpPool()
    upstream.hang_up_on_query = True
    with pytest.raises(EOFError):
        await ask(pool, upstream)
    assert (upstream.accepted, upstream.queries, pool.idle(upstream.address)) == (1, [1], 0)


async def test_cancelled_query_closes_its_connection(upstream: FakeTcpUpstream) -> None:
    pool = TcpPool()
    upstream.silent = True
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await pool.ask(upstream.address, WWW, do=False, cd=False, udp_size=1232)
    await upstream.until(lambda: upstream.ended == 1)
    upstream.silent = False
    await ask(pool, upstream)
    assert (upstream.accepted, pool.idle(upstream.address)) == (2, 1)
    pool.close()


async def test_close_closes_idle_connections_and_those_in_use_when_they_finish(upstream: FakeTcpUpstream) -> None:
    pool = TcpPool()
    await ask(pool, upstream)
    upstream.hold = True
    in_use = asyncio.ensure_future(ask(pool, upstream))
    await upstream.until(lambda: len(upstream.held) == 1)
    idle = asyncio.ensure_future(ask(pool, upstream))
    await upstream.until(lambda: len(upstream.held) == 2)
    upstream.release(2)
    await idle
    pool.close()
    await upstream.until(lambda: upstream.ended == 1)
    upstream.release(1)
    await in_use
    await upstream.until(lambda: upstream.ended == 2)
    assert pool.idle(upstream.address) == 0


async def test_forwarder_reuses_tcp_connections_and_closes_them(upstream: FakeTcpUpstream) -> None:
    forward = Forwarder((upstream.address,), timeout=1.0, cache=UpstreamCache(100, 3600, 1800), stats=DnsStats(),
                        max_concurrent=100, rng=random.Random(1))
    for label in (b"a", b"b"):  # two names: the second is not answered from the cache
        question = bytes([len(label)]) + label + WWW[4:]
        assert await forward.resolve(question, do=False, cd=False, tcp=True) is not None
    assert upstream.accepted == 1
    to = (f"{upstream.address[0]}:{upstream.address[1]}", "tcp")
    assert (forward.stats.forward_conn_cache_misses, forward.stats.forward_conn_cache_hits) == ({to: 1}, {to: 1})
    forward.close()
    await forward.wait_closed()
    await upstream.until(lambda: upstream.ended == 1)


async def _closed_while_idle(upstream: FakeTcpUpstream) -> None:
    upstream.hang_up_idle()
    await upstream.until(lambda: upstream.ended == 1)


async def _closed_unseen(upstream: FakeTcpUpstream) -> None:
    upstream.hang_up_on_query = True


@pytest.mark.parametrize("between, counted", [
    (None, [False, True]),
    (_closed_while_idle, [False, False]),
    # CoreDNS counts the cached connection it took (a hit), then the one it dials (a miss)
    (_closed_unseen, [False, True, False]),
], ids=["reused", "closed-while-idle", "cached-closed"])
async def test_connections_taken_are_counted_as_coredns_conn_cache_hits_and_misses(
        upstream: FakeTcpUpstream, between, counted: list[bool]) -> None:
    taken: list[bool] = []
    pool = TcpPool(counted=lambda to, reused: taken.append(reused))
    await ask(pool, upstream)
    if between is not None:
        await between(upstream)
    await ask(pool, upstream)
    assert taken == counted
    pool.close()

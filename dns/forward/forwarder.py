"""Forwarding to upstream resolvers, as CoreDNS ``forward`` does, answers cached.

:class:`Forwarder` is the I/O around :mod:`.upstream_policy`: per query a random order of the
healthy upstreams, cycled until 5 s have passed, each try waiting ``timeout`` (CoreDNS
read_timeout, 2 s) at most, an upstream that refuses (ICMP) left at once; a failed try
starts health checks of its upstream. A query that arrived over TCP is forwarded over TCP
(CoreDNS: the transport it arrived on); over UDP, a truncated answer is asked again over
TCP, on reused connections (:mod:`.upstream_tcp`). An answer is cached (:mod:`.upstream_cache`)
stamped with the time it arrived, so the wait for it is not taken off its TTLs.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Callable

from kubeport.dns.forward.cache import MIN_TTL, SERVFAIL_TTL, StoredMessage, UpstreamCache, without_opt
from kubeport.dns.forward.policy import (
    CHECK_INTERVAL,
    CHECK_TIMEOUT,
    FORWARD_DEADLINE,
    Tries,
    UpstreamHealth,
    policy_order,
)
from kubeport.dns.forward.tcp import EXPIRE, TcpPool
from kubeport.dns.forward.udp import UdpChannel, Upstream, open_udp_channel, upstream_query
from kubeport.dns.stats import DnsStats
from kubeport.dns.wire import RCODE_NAMES, TC

__all__ = ["Forwarder", "upstream_label", "MIN_TTL", "SERVFAIL_TTL", "StoredMessage", "UpstreamCache", "upstream_query", "without_opt"]

log = logging.getLogger(__name__)

def upstream_label(upstream: Upstream) -> str:
    """The ``to`` label of an upstream's metrics: ``IP:PORT``, ``[IPv6]:PORT`` (CoreDNS's
    proxy address, net.JoinHostPort in plugin/pkg/parse HostPortOrFile), one per upstream,
    whichever zone's forwarder asks it."""
    host, port = upstream
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


#: ``. IN NS``: CoreDNS forward's health check question
ROOT_NS = b"\x00\x00\x02\x00\x01"


class Forwarder:
    def __init__(self, upstreams: tuple[Upstream, ...], *, timeout: float, cache: UpstreamCache,
                 stats: DnsStats, max_concurrent: int, udp_size: int = 1232, deadline: float = FORWARD_DEADLINE,
                 check_interval: float = CHECK_INTERVAL, expire: float = EXPIRE,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None):
        """``timeout``: the longest wait for one try (read_timeout); ``deadline``: for all the
        tries of a query; ``clock``: monotonic seconds, the cache's time; ``rng``: the
        policy's randomness; ``expire``: how long an idle TCP connection may be reused."""
        self.upstreams = upstreams
        self.timeout = timeout
        self.cache = cache
        self.stats = stats
        self.max_concurrent = max_concurrent
        self.udp_size = udp_size
        self.deadline = deadline
        self.check_interval = check_interval
        self.inflight = 0
        self.health: UpstreamHealth[Upstream] = UpstreamHealth()
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._channels: dict[Upstream, UdpChannel] = {}
        self._tcp = TcpPool(expire=expire, clock=clock, counted=self._counted_tcp)
        self._checks: dict[Upstream, asyncio.Task[None]] = {}
        self._stopping: list[asyncio.Task[None]] = []
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def busy(self) -> bool:
        return self.inflight >= self.max_concurrent

    @staticmethod
    def cache_key(question: bytes, *, do: bool, cd: bool) -> bytes:
        return question + bytes((do | (cd << 1),))

    def cached(self, key: bytes, now: float, *, stale: bool = False) -> StoredMessage | None:
        """The cached answer to relay, counted as a cache hit or miss; ``stale``: an expired
        one within serve_stale too (a hit, as CoreDNS counts it; ``now >= expires`` tells)."""
        stored = self.cache.lookup(key, now, stale=stale)
        if stored is None:
            self.stats.cache_misses += 1
            return None
        self.stats.cache_hit_cell("denial" if stored.negative else "success")[0] += 1
        return stored

    async def resolve(self, question: bytes, *, do: bool, cd: bool, tcp: bool = False) -> bytes | None:
        """An upstream's answer (ID 0, no OPT), cached; None when none answered in time.
        ``tcp``: the query arrived over TCP, so it is forwarded over TCP."""
        self.inflight += 1
        try:
            clock = self._clock
            down = self.health.down
            if down and len(down) == len(self.upstreams):
                self.stats.forward_healthcheck_broken += 1  # asked anyway: the checks may be what is broken
            tries = Tries(policy_order(self.upstreams, down, self._rng), now=clock(),
                          read_timeout=self.timeout, deadline=self.deadline)
            while (attempt := tries.next(clock())) is not None:
                upstream, timeout = attempt
                try:
                    message = await self._ask(upstream, question, do=do, cd=cd, tcp=tcp, timeout=timeout)
                except (OSError, EOFError):  # refused or broken: not asked again for this query
                    tries.drop(upstream)
                    continue
                if message is None:
                    continue
                try:
                    stripped, spans = without_opt(message)
                except ValueError:
                    tries.drop(upstream)
                    continue
                self._answered(upstream)
                self.cache.put(self.cache_key(question, do=do, cd=cd), stripped, spans, clock())
                return stripped
            return None
        finally:
            self.inflight -= 1

    async def _ask(self, upstream: Upstream, question: bytes, *, do: bool, cd: bool, tcp: bool,
                   timeout: float) -> bytes | None:
        """The upstream's message, or None when it timed out; raises OSError or EOFError
        when it failed (refused by ICMP, connection reset or closed early)."""
        name = upstream_label(upstream)
        self.stats.forward_requests[name] += 1
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                if tcp:
                    message = await self._tcp.ask(upstream, question, do=do, cd=cd, udp_size=self.udp_size)
                else:
                    channel = self._channels.get(upstream)
                    self._count_connection(upstream, "udp", channel is not None and channel.transport is not None)
                    message = await self._ask_udp(upstream, question, do=do, cd=cd)
                    if message[2] & (TC >> 8):
                        message = await self._tcp.ask(upstream, question, do=do, cd=cd, udp_size=self.udp_size)
        except TimeoutError:
            self.stats.forward_timeouts[name] += 1
            log.debug("dns: upstream %s timed out", name)
            self._check(upstream)
            return None
        except (OSError, EOFError) as error:
            log.debug("dns: upstream %s failed: %s", name, error)
            self._check(upstream)
            raise
        rcode = RCODE_NAMES.get(message[3] & 0xF, str(message[3] & 0xF))
        self.stats.forward_responses[(name, rcode)] += 1
        self.stats.observe_forward(name, rcode, time.monotonic() - started)
        return message

    def _count_connection(self, upstream: Upstream, proto: str, reused: bool) -> None:
        """coredns_forward_conn_cache_hits/misses_total: a UDP query on the upstream's open
        socket is a hit, one that opens it a miss (health checks are not counted, as in
        CoreDNS, whose checks dial on their own)."""
        counter = self.stats.forward_conn_cache_hits if reused else self.stats.forward_conn_cache_misses
        counter[(upstream_label(upstream), proto)] += 1

    def _counted_tcp(self, upstream: Upstream, reused: bool) -> None:
        self._count_connection(upstream, "tcp", reused)

    async def _ask_udp(self, upstream: Upstream, question: bytes, *, do: bool, cd: bool) -> bytes:
        channel = self._channels.get(upstream)
        if channel is None or channel.transport is None:
            channel = self._channels[upstream] = await open_udp_channel(upstream)
        return await channel.ask(question, do=do, cd=cd, udp_size=self.udp_size)

    # --- health checks (CoreDNS forward health_check) --------------------------------

    def _check(self, upstream: Upstream) -> None:
        """Start checking an upstream that failed a try, unless its checks run already."""
        if self._closed or upstream in self._checks:
            return
        task = asyncio.get_running_loop().create_task(self._run_checks(upstream))
        self._checks[upstream] = task
        task.add_done_callback(lambda done: self._checks.pop(upstream, None) if self._checks.get(upstream) is done
                               else None)

    async def _run_checks(self, upstream: Upstream) -> None:
        """``. IN NS`` every check interval until one is answered (any rcode will do)."""
        while True:
            try:
                async with asyncio.timeout(min(CHECK_TIMEOUT, self.timeout)):
                    await self._ask_udp(upstream, ROOT_NS, do=False, cd=False)
            except (TimeoutError, OSError, EOFError):
                self.stats.forward_healthcheck_failures[upstream_label(upstream)] += 1
                if self.health.check_failed(upstream):
                    log.warning("dns: upstream %s:%d is down (%d health checks failed in a row); the other "
                                "upstreams are asked while it is", *upstream, self.health.fails[upstream])
                await asyncio.sleep(self.check_interval)
                continue
            self._answered(upstream)
            return

    def _answered(self, upstream: Upstream) -> None:
        if self.health.answered(upstream):
            log.warning("dns: upstream %s:%d answers again", *upstream)

    def close(self) -> None:
        """Close the sockets and cancel the health checks (:meth:`wait_closed` waits for them)."""
        self._closed = True
        for channel in self._channels.values():
            if channel.transport is not None:
                channel.transport.close()
        self._channels.clear()
        self._tcp.close()
        for task in self._checks.values():
            task.cancel()
            self._stopping.append(task)
        self._checks.clear()

    async def wait_closed(self) -> None:
        stopping, self._stopping = self._stopping, []
        if stopping:
            await asyncio.gather(*stopping, return_exceptions=True)

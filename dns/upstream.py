"""Forwarding to upstream resolvers, with a positive/negative cache honouring TTLs.

:class:`UpstreamCache` is sans-IO (``now`` passed in): it stores upstream answers as
bytes with the offsets of their TTLs, so a hit costs a copy and a few TTL patches.
:class:`Forwarder` is the I/O: one connected UDP socket per upstream with queries
multiplexed by random ID, a retry over TCP when the answer is truncated, a timeout per
upstream (CoreDNS forward's read_timeout, 2 s) and failover to the next upstream; the
last upstream that answered is asked first next time.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import struct
from dataclasses import dataclass

from dnslib import DNSRecord

from .stats import DnsStats
from .wire import CD, HEADER, NOERROR, NXDOMAIN, RCODE_NAMES, RD, SERVFAIL, TC, TYPE_OPT, RecordSpan, opt_record, walk_message

log = logging.getLogger(__name__)

T_SOA = 6

#: CoreDNS cache's defaults: an answer stays at least MIN_TTL seconds whatever its TTL
#: (minsuccess/mindenial 5), a negative answer without records 5 s (MinimalDefaultTTL), and
#: an upstream's SERVFAIL 5 s (servfail 5s), so a failing or TTL-0 name does not send every
#: query upstream.
MIN_TTL = 5
SERVFAIL_TTL = 5


@dataclass(slots=True)
class StoredMessage:
    """An upstream answer as cached: ID 0, no OPT, TTLs as received."""

    message: bytes
    ttls: tuple[tuple[int, int], ...]  # (offset, ttl as received)
    stored: float
    expires: float
    negative: bool

    def aged(self, now: float) -> bytes:
        """The message with every TTL lowered by the whole seconds since it was stored."""
        age = int(now - self.stored)
        if age <= 0 or not self.ttls:
            return self.message
        message = bytearray(self.message)
        for offset, ttl in self.ttls:
            struct.pack_into("!I", message, offset, max(0, ttl - age))
        return bytes(message)


def without_opt(message: bytes) -> tuple[bytes, list[RecordSpan]]:
    """The message with ID 0 and its OPT record removed, and its record spans.

    The OPT is normally the last record and has a root owner, so cutting it off breaks no
    compression pointer; an OPT elsewhere is removed by a dnslib round trip.
    Raises ValueError for a malformed message.
    """
    _, spans = walk_message(message)
    opts = [span for span in spans if span.rtype == TYPE_OPT]
    message = b"\x00\x00" + message[2:]
    if not opts:
        return message, spans
    if len(opts) == 1 and opts[0] is spans[-1] and spans[-1].end == len(message):
        arcount = (message[10] << 8) | message[11]
        trimmed = message[:10] + (arcount - 1).to_bytes(2, "big") + message[12 : opts[0].start]
        return trimmed, spans[:-1]
    try:
        record = DNSRecord.parse(message)
    except Exception as error:  # dnslib raises assorted types on garbage
        raise ValueError(f"unparseable upstream message: {error}") from None
    record.ar = [rr for rr in record.ar if rr.rtype != TYPE_OPT]
    packed = record.pack()
    return packed, walk_message(packed)[1]


class UpstreamCache:
    """Upstream answers by question (as sent, with the DO/CD bits), until their TTL ends."""

    def __init__(self, capacity: int, max_ttl: int, max_negative_ttl: int):
        self.capacity = capacity
        self.max_ttl = max_ttl
        self.max_negative_ttl = max_negative_ttl
        self._entries: dict[bytes, StoredMessage] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def negative_entries(self) -> int:
        """Entries holding NXDOMAIN/NODATA answers: a scan, for metrics at scrape time."""
        return sum(1 for stored in self._entries.values() if stored.negative)

    def get(self, key: bytes, now: float) -> tuple[bytes, bool] | None:
        """(the message with TTLs aged, negative?) or None."""
        stored = self.lookup(key, now)
        return None if stored is None else (stored.aged(now), stored.negative)

    def lookup(self, key: bytes, now: float) -> StoredMessage | None:
        """The stored answer, unless absent or expired (then it is dropped)."""
        stored = self._entries.get(key)
        if stored is None:
            return None
        if now >= stored.expires:
            del self._entries[key]
            return None
        return stored

    def put(self, key: bytes, message: bytes, spans: list[RecordSpan], now: float) -> None:
        """Cache a message (ID 0, no OPT) if it can be: a positive answer for its lowest
        TTL, a negative one (NXDOMAIN, NODATA) for min(SOA TTL, SOA MINIMUM) (RFC 2308), at
        least :data:`MIN_TTL` and at most the caps; a SERVFAIL for :data:`SERVFAIL_TTL`
        (CoreDNS cache); never REFUSED or truncated answers. A cap of 0 turns caching off."""
        if self.capacity <= 0:
            return
        flags = (message[2] << 8) | message[3]
        rcode = flags & 0xF
        if flags & TC or rcode not in (NOERROR, NXDOMAIN, SERVFAIL):
            return
        answers = [span for span in spans if span.section == 0]
        negative = rcode != NOERROR or not answers
        if rcode == SERVFAIL:
            ttl = min(SERVFAIL_TTL, self.max_negative_ttl)
        elif negative:
            soas = [span for span in spans if span.section == 1 and span.rtype == T_SOA]
            if soas:
                minimum = struct.unpack_from("!I", message, soas[0].end - 4)[0]
                ttl = min(soas[0].ttl, minimum)
            else:
                ttl = MIN_TTL
            ttl = min(max(ttl, MIN_TTL), self.max_negative_ttl)
        else:
            ttl = min(max(min(span.ttl for span in spans if span.section < 2), MIN_TTL), self.max_ttl)
        if ttl <= 0:
            return
        if key not in self._entries and len(self._entries) >= self.capacity:
            del self._entries[next(iter(self._entries))]  # oldest first
        ttls = tuple((span.ttl_offset, span.ttl) for span in spans)
        self._entries[key] = StoredMessage(message, ttls, now, now + ttl, negative)


def upstream_query(query_id: int, question: bytes, *, do: bool, cd: bool, udp_size: int) -> bytes:
    header = HEADER.pack(query_id, RD | (CD if cd else 0), 1, 0, 0, 1)
    return header + question + opt_record(udp_size, do)


class _UdpChannel(asyncio.DatagramProtocol):
    """A connected UDP socket to one upstream; answers matched by ID and question."""

    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None
        self.pending: dict[int, tuple[bytes, asyncio.Future[bytes]]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: object) -> None:
        if len(data) < 12:
            return
        held = self.pending.get((data[0] << 8) | data[1])
        if held is None:
            return
        question, future = held
        if data[12 : 12 + len(question)].lower() == question.lower() and not future.done():
            future.set_result(data)

    def error_received(self, exc: Exception) -> None:
        # ICMP port unreachable and the like: fail every waiting query now, not at the timeout.
        for _, future in self.pending.values():
            if not future.done():
                future.set_exception(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.error_received(exc or ConnectionError("upstream socket closed"))


class Forwarder:
    def __init__(self, upstreams: tuple[tuple[str, int], ...], *, timeout: float, cache: UpstreamCache,
                 stats: DnsStats, max_concurrent: int, udp_size: int = 1232):
        self.upstreams = upstreams
        self.timeout = timeout
        self.cache = cache
        self.stats = stats
        self.max_concurrent = max_concurrent
        self.udp_size = udp_size
        self.inflight = 0
        self._preferred = 0
        self._channels: dict[tuple[str, int], _UdpChannel] = {}

    @property
    def busy(self) -> bool:
        return self.inflight >= self.max_concurrent

    @staticmethod
    def cache_key(question: bytes, *, do: bool, cd: bool) -> bytes:
        return question + bytes((do | (cd << 1),))

    def cached(self, key: bytes, now: float) -> StoredMessage | None:
        """The cached answer to relay, counted as a cache hit or miss."""
        stored = self.cache.lookup(key, now)
        if stored is None:
            self.stats.cache_misses += 1
            return None
        self.stats.cache_hit_cell("denial" if stored.negative else "success")[0] += 1
        return stored

    async def resolve(self, question: bytes, *, do: bool, cd: bool, now: float) -> bytes | None:
        """An upstream's answer (ID 0, no OPT), cached; None when every upstream failed."""
        self.inflight += 1
        try:
            for position in self._order():
                upstream = self.upstreams[position]
                message = await self._ask(upstream, question, do=do, cd=cd)
                if message is None:
                    continue
                try:
                    stripped, spans = without_opt(message)
                except ValueError:
                    continue
                self._preferred = position
                self.cache.put(self.cache_key(question, do=do, cd=cd), stripped, spans, now)
                return stripped
            return None
        finally:
            self.inflight -= 1

    def _order(self) -> list[int]:
        count = len(self.upstreams)
        return [(self._preferred + i) % count for i in range(count)]

    async def _ask(self, upstream: tuple[str, int], question: bytes, *, do: bool, cd: bool) -> bytes | None:
        name = f"{upstream[0]}:{upstream[1]}"
        self.stats.forward_requests[name] += 1
        try:
            async with asyncio.timeout(self.timeout):
                message = await self._ask_udp(upstream, question, do=do, cd=cd)
                if message[2] & (TC >> 8):
                    message = await self._ask_tcp(upstream, question, do=do, cd=cd)
        except TimeoutError:
            self.stats.forward_timeouts[name] += 1
            log.debug("dns: upstream %s timed out", name)
            return None
        except (OSError, EOFError, asyncio.IncompleteReadError) as error:
            log.debug("dns: upstream %s failed: %s", name, error)
            return None
        self.stats.forward_responses[(name, RCODE_NAMES.get(message[3] & 0xF, str(message[3] & 0xF)))] += 1
        return message

    async def _channel(self, upstream: tuple[str, int]) -> _UdpChannel:
        channel = self._channels.get(upstream)
        if channel is None or channel.transport is None:
            loop = asyncio.get_running_loop()
            _, channel = await loop.create_datagram_endpoint(_UdpChannel, remote_addr=upstream)
            self._channels[upstream] = channel
        return channel

    async def _ask_udp(self, upstream: tuple[str, int], question: bytes, *, do: bool, cd: bool) -> bytes:
        channel = await self._channel(upstream)
        query_id = secrets.randbits(16)
        while query_id in channel.pending:
            query_id = secrets.randbits(16)
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        channel.pending[query_id] = (question, future)
        try:
            assert channel.transport is not None
            channel.transport.sendto(upstream_query(query_id, question, do=do, cd=cd, udp_size=self.udp_size))
            return await future
        finally:
            del channel.pending[query_id]

    async def _ask_tcp(self, upstream: tuple[str, int], question: bytes, *, do: bool, cd: bool) -> bytes:
        reader, writer = await asyncio.open_connection(*upstream)
        try:
            query_id = secrets.randbits(16)
            packet = upstream_query(query_id, question, do=do, cd=cd, udp_size=self.udp_size)
            writer.write(len(packet).to_bytes(2, "big") + packet)
            while True:
                size = int.from_bytes(await reader.readexactly(2), "big")
                message = await reader.readexactly(size)
                if len(message) >= 12 and (message[0] << 8 | message[1]) == query_id:
                    return message
        finally:
            writer.close()

    def close(self) -> None:
        for channel in self._channels.values():
            if channel.transport is not None:
                channel.transport.close()
        self._channels.clear()

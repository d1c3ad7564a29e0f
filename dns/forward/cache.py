"""The cache of upstream answers, honouring their TTLs. Sans-IO (``now`` passed in).

Answers are stored as bytes with the offsets of their TTLs, so a hit costs a copy and a few
TTL patches.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

from dnslib import DNSRecord

from kubeport.dns.wire import NOERROR, NXDOMAIN, SERVFAIL, T_SOA, TC, TYPE_OPT, RecordSpan, walk_message

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
    #: when the queries that count towards a prefetch came (CoreDNS cache item.Update)
    hits: list[float] = field(default_factory=list)

    def prefetch_at(self, percentage: int) -> float:
        """When the TTL left is down to ``percentage`` of the TTL stored (CoreDNS cache
        shouldPrefetch: ttl <= ceil(percentage/100 * origTTL))."""
        ttl = int(self.expires - self.stored)
        return self.expires - math.ceil(percentage / 100 * ttl)

    def counts_towards_prefetch(self, now: float, window: float, amount: int) -> bool:
        """Count a query after the prefetch point; True once ``amount`` came within ``window``."""
        self.hits = [hit for hit in self.hits if hit > now - window]
        self.hits.append(now)
        return len(self.hits) >= amount

    def stale(self) -> bytes:
        """The message with every TTL 0, as CoreDNS's cache serves an expired item (serve_stale)."""
        message = bytearray(self.message)
        for offset, _ in self.ttls:
            struct.pack_into("!I", message, offset, 0)
        return bytes(message)

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

    def __init__(self, capacity: int, max_ttl: int, max_negative_ttl: int, serve_stale: float = 0.0):
        """``serve_stale``: seconds an entry is kept past its TTL, to be served while no
        upstream answers (CoreDNS cache ``serve_stale``); 0 drops it when it expires."""
        self.capacity = capacity
        self.max_ttl = max_ttl
        self.max_negative_ttl = max_negative_ttl
        self.serve_stale = serve_stale
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

    def lookup(self, key: bytes, now: float, *, stale: bool = False) -> StoredMessage | None:
        """The stored answer, unless absent or expired; ``stale``: an expired one too while
        within ``serve_stale`` of its expiry (CoreDNS cache getIgnoreTTL). An entry past that
        is dropped."""
        stored = self._entries.get(key)
        if stored is None:
            return None
        if now >= stored.expires:
            if now >= stored.expires + self.serve_stale:
                del self._entries[key]
                return None
            return stored if stale else None
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

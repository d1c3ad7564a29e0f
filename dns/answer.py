"""The sans-IO answerer: query bytes -> reply bytes, or a Forward for the shell to resolve.

Cluster answers are encoded once (:mod:`.encode`) and kept per question in an
:class:`~.answer_cache.AnswerCache`; a repeated question costs a slice, a dict lookup and the
ID patch. Answers with several A/AAAA records turn them per reply (CoreDNS ``loadbalance``,
:mod:`.rotate`): a splice of the kept bytes.
Entries remember which services they depend on: an update drops the answers of the
services that changed plus every "volatile" one (negative answers carry the SOA serial,
PTR/NS/pod answers span services), so no answer outlives the generation it was built
from, while the answers of untouched services stay encoded.
"""

from __future__ import annotations

import bisect
import struct
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable

from dnslib import RR, DNSRecord
from dnslib.label import DNSBuffer

from kubeport.dns import autopath
from kubeport.dns.answer_cache import AnswerCache, CachedAnswer, TurningAnswer
from kubeport.dns.config import DnsConfig
from kubeport.dns.encode import Packer, Record, same_name
from kubeport.dns.forward.forwarder import StoredMessage
from kubeport.dns.forward.replies import ForwardedAnswers, ForwardedReply, TurningReply
from kubeport.dns.lookup import Lookup, Resolution, qtype_name, reverse_records, soa_record
from kubeport.dns.names import Zone, classify, reverse_address, served_zone
from kubeport.dns.records import IndexChange, RecordIndex
from kubeport.dns.rotate import Rotation, address_run, record_ends, relayed_run, rotation
from kubeport.dns.stats import DnsStats
from kubeport.dns.wire import (
    HEADER,
    NOERROR,
    NXDOMAIN,
    RCODE_NAMES,
    REFUSED,
    SERVFAIL,
    T_A,
    T_AAAA,
    T_CNAME,
    T_NS,
    T_PTR,
    T_SOA,
    TC,
    Ignored,
    Query,
    QueryError,
    encode_name,
    opt_record,
    options_fit,
    parse_query,
    question_reply,
    reply_flags,
    walk_message,
    with_opt,
)

T_AXFR, T_IXFR = 252, 251
MAX_TCP_MESSAGE = 65535

@dataclass(frozen=True, slots=True)
class Forward:
    """A question to ask upstream before the client can be answered."""

    query: Query
    tcp: bool
    #: the name to ask (labels, sent as is) and its type
    labels: tuple[bytes, ...]
    qtype: int
    #: ExternalName: the CNAME chain to put before the upstream answer; None: plain forward
    chain: tuple[Record, ...] | None = None
    #: the relayed reply may be kept encoded for this query shape: never for names the
    #: cluster could claim later (reverse names fall through only while unknown)
    shareable: bool = False
    #: bytes of the query (coredns_dns_request_size_bytes)
    request_size: int = 0
    #: autopath: the search path being walked; ``labels`` is its current name, and an
    #: NXDOMAIN moves on to the next (:meth:`Answerer.autopath_step`)
    walk: autopath.Walk | None = None

    @property
    def question(self) -> bytes:
        return encode_name(self.labels) + struct.pack("!HH", self.qtype, self.query.qclass)


class Answerer:
    def __init__(self, config: DnsConfig, index: RecordIndex, stats: DnsStats | None = None, *,
                 timer: Callable[[], float] | None = None, clock: Callable[[], float] = time.monotonic):
        """``timer`` (a monotonic clock, in seconds): time the answers that are built, for
        the duration histogram; None (the default, and the pure tests) times nothing.
        ``clock`` (monotonic seconds): ages the relayed upstream answers kept encoded."""
        self.config = config
        self.index = index
        self.stats = stats if stats is not None else DnsStats()
        self.cache = AnswerCache(config.answer_cache_size)
        self.forwarded = ForwardedAnswers(config.cache_size)
        self._entries = self.cache.entries
        self._turning = self.cache.turning
        self._forwarded = self.forwarded.entries
        self._timer = timer
        self._clock = clock
        #: the clock the relayed answers age by (the batched UDP listener reads it once per batch)
        self.clock = clock
        self._started = 0.0
        #: the turn of address records in replies built for one query only (CoreDNS
        #: loadbalance): ExternalName chains completed from upstream, uncached relays
        self._turns = 0
        #: size of the query being answered (set per query on the slow path)
        self._request_size = 0
        self._zones(config)

    def _zones(self, config: DnsConfig) -> None:
        self._reverse_zones = config.reverse_zone_labels
        self._fallthrough = config.fallthrough_labels
        #: the listeners pass the client's address to :meth:`build` only when this is set
        self.autopath = config.autopath
        self._host_search = config.autopath_search or ()

    def answer(self, packet: bytes, tcp: bool = False, client: str | None = None) -> bytes | Forward | None:
        """The reply to one query (bytes in, bytes out), a Forward, or None (no header:
        drop; TCP: close the connection). ``client``: the address the query came from."""
        body = self.cached(packet, tcp)
        if body is not None:
            return packet[:2] + body
        return self.build(packet, tcp, client)

    def build(self, packet: bytes, tcp: bool = False, client: str | None = None) -> bytes | Forward | None:
        """:meth:`answer` for a query :meth:`cached` found nothing for. Only these can
        depend on ``client`` (autopath): an answer that does is never kept encoded."""
        if self._timer is not None:
            self._started = self._timer()  # read back by _reply: only built answers are timed
        return self._answer(packet, tcp, client)

    def cached(self, packet: bytes, tcp: bool = False) -> bytes | None:
        """The reply to a question answered before, without its 2-byte ID (the query's goes
        in front), counted as a hit; None when none is kept. The batched UDP listener sends
        it as it is, the query's ID in a separate iovec: no copy on the hot path."""
        # wire.cache_key inlined: this is the whole cost of a cached answer.
        end = packet.find(b"\x00", 12) + 5
        size = len(packet)
        if size == end:
            key = packet[2:end]
        elif end >= 17 and size >= end + 11 and packet[end : end + 3] == b"\x00\x00\x29" \
                and size == end + 11 + ((packet[end + 9] << 8) | packet[end + 10]) \
                and (size == end + 11 or options_fit(packet, end + 11, size)):
            key = packet[2:end] + packet[end + 3 : end + 9]
        else:
            return None
        entry = self._entries.get(key)
        if entry is not None:
            entry.hits[tcp][0] += 1
            return entry.replies[tcp]
        if key in self._forwarded:
            reply = self.forwarded.get(key, tcp, self._clock())
            if reply is not None:
                return reply
        turning = self._turning.get(key)  # after the forwarded: their hits pay nothing for it
        if turning is not None:
            turning.hits[tcp][0] += 1
            return turning.rotation.reply(tcp)
        return None

    def invalidate(self, change: IndexChange) -> None:
        if change.namespaces or change.synced:
            self.cache.clear()
        elif change:
            self.cache.invalidate(change.services)

    def reconfigure(self, config: DnsConfig, index: RecordIndex) -> None:
        self.config = config
        self.index = index
        self._zones(config)
        self.cache.capacity = config.answer_cache_size
        self.cache.clear()
        self.forwarded.capacity = config.cache_size
        self.forwarded.clear()

    # --- the slow path ---------------------------------------------------------------

    def _answer(self, packet: bytes, tcp: bool, client: str | None = None) -> bytes | Forward | None:
        proto = "tcp" if tcp else "udp"
        self._request_size = len(packet)
        try:
            query = parse_query(packet)
        except Ignored:
            self.stats.dropped += 1
            return None
        except QueryError as error:
            reply = error.reply(self.config.edns_udp_size)
            self.stats.count(proto, "invalid", RCODE_NAMES.get(error.rcode, str(error.rcode)), len(packet), len(reply))
            return reply
        qtype = query.qtype
        if qtype in (T_AXFR, T_IXFR):  # no zone transfers (CoreDNS without `transfer`)
            return self.reply_raw(query, tcp, question_reply(query, REFUSED, self.config.edns_udp_size,
                                                             authoritative=False), REFUSED, len(packet))
        lower = query.lower_labels
        where = classify(lower, self.index.zone_labels, self._reverse_zones)
        if where is Zone.OTHER:
            return Forward(query, tcp, query.labels, qtype, shareable=True, request_size=len(packet))
        if where is Zone.REVERSE:
            return self._reverse(query, tcp, lower)
        if self.autopath and client is not None and self.index.synced:
            namespace = self.index.pod_namespaces.get(client)
            walk = autopath.start(query.labels, lower, namespace, self.index.zone_labels, self._host_search) \
                if namespace is not None else None
            if walk is not None:
                return self._walk(query, tcp, walk)
        result = self._lookup(query.labels, lower, qtype)
        if result.name_error and served_zone(lower, self._fallthrough) is not None:
            return Forward(query, tcp, query.labels, qtype, request_size=len(packet))
        if result.forward is not None:
            target = tuple(label.encode() for label in result.forward.split(".") if label)
            return Forward(query, tcp, target, qtype, chain=tuple(result.answer), request_size=len(packet))
        # A name error below <ns>.svc.<zone> is what autopath completes for that namespace's
        # pods: kept encoded, it would be served to them too.
        keep = not (self.autopath and result.name_error and autopath.below_search_domain(lower, self.index.zone_labels))
        return self._reply(query, tcp, result, keep=keep)

    def _lookup(self, labels: tuple[bytes, ...], lower: tuple[str, ...], qtype: int) -> Resolution:
        config = self.config
        return Lookup(self.index, ttl=config.ttl, pods=config.pods, local_addresses=config.addresses,
                      labels=labels, lower=lower, ignore_empty_service=config.ignore_empty_service).resolve(qtype)

    # --- autopath (CoreDNS plugin/autopath/autopath.go ServeDNS) ------------------------

    def _walk(self, query: Query, tcp: bool, walk: autopath.Walk | None) -> bytes | Forward:
        """Try the search names from ``walk`` on: the first one of the cluster zone that is not
        a name error is the answer (a CNAME from the name asked before it); the first one
        outside is asked upstream; when none is left, the answer to the name asked."""
        while walk is not None:
            name = query.labels if walk.position == 0 else walk.name  # the first is the name asked
            lower = tuple(label.lower().decode("latin-1") for label in name)
            where = classify(lower, self.index.zone_labels, self._reverse_zones)
            if where is Zone.OTHER:
                return Forward(query, tcp, name, query.qtype, request_size=self._request_size, walk=walk)
            if where is Zone.CLUSTER:
                result = self._lookup(name, lower, query.qtype)
                if not result.name_error:
                    self.stats.autopath_successes += 1
                    if walk.position == 0:  # the name asked: the answer anyone gets
                        return self._reply(query, tcp, result) if result.forward is None else \
                            self._chain(query, tcp, result, ())
                    cname = _cname_to_answer(query.labels, result.answer)
                    if result.forward is not None:
                        return self._chain(query, tcp, result, cname)
                    result.answer = list(cname) + result.answer
                    return self._reply(query, tcp, result, keep=False)
            walk = walk.next()
        result = self._lookup(query.labels, query.lower_labels, query.qtype)
        return self._reply(query, tcp, result, keep=False)

    def _chain(self, query: Query, tcp: bool, result: Resolution, cname: tuple[Record, ...]) -> Forward:
        assert result.forward is not None
        target = tuple(label.encode() for label in result.forward.split(".") if label)
        return Forward(query, tcp, target, query.qtype, chain=cname + tuple(result.answer),
                       request_size=self._request_size)

    def autopath_step(self, forward: Forward, message: bytes | None) -> bytes | Forward:
        """An upstream's answer to a search name of ``forward.walk``: an NXDOMAIN moves on to
        the next name; another answer is the reply, behind a CNAME from the name asked (CoreDNS
        cnamer); no answer at all is SERVFAIL (CoreDNS returns forward's error at once)."""
        walk = forward.walk
        assert walk is not None
        self._request_size = forward.request_size
        # The server times the whole walk, upstream round trips included: _reply must not time it again.
        timer, self._timer = self._timer, None
        try:
            return self._step(forward, walk, message)
        finally:
            self._timer = timer

    def _step(self, forward: Forward, walk: autopath.Walk, message: bytes | None) -> bytes | Forward:
        query = forward.query
        if message is None:
            return self.reply_raw(query, forward.tcp, question_reply(
                query, SERVFAIL, self.config.edns_udp_size, authoritative=False), SERVFAIL)
        try:
            upstream = DNSRecord.parse(message)
        except Exception:  # dnslib raises many types on garbage: as no answer
            upstream = None
        if upstream is None:
            return self.reply_raw(query, forward.tcp, question_reply(
                query, SERVFAIL, self.config.edns_udp_size, authoritative=False), SERVFAIL)
        rcode = upstream.header.rcode
        if rcode == NXDOMAIN:
            return self._walk(query, forward.tcp, walk.next())
        self.stats.autopath_successes += 1
        answer = [_from_dnslib(rr) for rr in upstream.rr]
        result = Resolution(rcode=rcode, answer=list(_cname_to_answer(query.labels, answer)) + answer,
                            authority=[_from_dnslib(rr) for rr in upstream.auth],
                            additional=[_from_dnslib(rr) for rr in upstream.ar if rr.rtype != 41],
                            deps=None, authoritative=bool(upstream.header.aa))
        udp, full, turning = self._encode(query, result)
        reply = (full if forward.tcp else udp) if turning is None else self._once(turning, forward.tcp)
        if upstream.header.tc:
            reply = (((reply[0] << 8) | reply[1]) | TC).to_bytes(2, "big") + reply[2:]
        return self.reply_raw(query, forward.tcp, query.id.to_bytes(2, "big") + reply, rcode)

    def _reverse(self, query: Query, tcp: bool, lower: tuple[str, ...]) -> bytes | Forward:
        """A name in a served reverse zone (CoreDNS handler.go ServeDNS, reverse.go Reverse):
        the PTR of a known address; NODATA is answered here (only a name error falls
        through): an SOA anywhere in the zone, and any type but NS at its apex; an NS query
        at the apex is forwarded (CoreDNS would name a service inside the reverse zone). A
        name error falls through when ``fallthrough`` covers it, else NXDOMAIN with the
        reverse zone's SOA."""
        qtype = query.qtype
        served = served_zone(lower, self._reverse_zones)
        assert served is not None  # classify found it
        zone = query.labels[len(query.labels) - len(served):]
        apex = len(lower) == len(served)
        if qtype == T_SOA or (apex and qtype != T_NS):
            if apex and qtype == T_SOA:
                return self._reply(query, tcp, Resolution(answer=[soa_record(self.index, zone, self.config.ttl)],
                                                          deps=None))
            return self._reply(query, tcp, Resolution(negative=True, deps=None, soa_zone=zone))
        address = reverse_address(lower) if qtype == T_PTR else None
        records = reverse_records(self.index, query.labels, address, self.config.ttl) if address else []
        if records:
            return self._reply(query, tcp, Resolution(answer=records, deps=None))
        if apex or served_zone(lower, self._fallthrough) is not None:
            return Forward(query, tcp, query.labels, qtype, request_size=self._request_size)
        # Before the first sync an unknown address may only be unknown so far (handler.go ServeDNS).
        return self._reply(query, tcp, Resolution(rcode=NXDOMAIN if self.index.synced else SERVFAIL, negative=True,
                                                  deps=None, soa_zone=zone, name_error=True))

    def _reply(self, query: Query, tcp: bool, result: Resolution, *, keep: bool = True) -> bytes:
        """The encoded reply, kept for the next identical query unless ``keep`` is False."""
        self.stats.answer_cache_misses += 1
        key = query.cache_key if keep else None
        udp, full, turning = self._encode(query, result)
        rcode = RCODE_NAMES.get(result.rcode, str(result.rcode))
        qtype = qtype_name(query.qtype)
        stats = self.stats
        cells = stats.served_cells(qtype, rcode, None, self._request_size, (len(udp) + 2, len(full) + 2))
        if turning is None:
            entry: CachedAnswer | TurningAnswer = CachedAnswer((udp, full), cells)
            reply = full if tcp else udp
        else:
            entry = TurningAnswer(turning, cells)
            reply = turning.reply(tcp) if key is not None else self._once(turning, tcp)
        if key is not None:
            self.cache.put(key, entry, result.deps)
        stats.count("tcp" if tcp else "udp", qtype, rcode, self._request_size, len(reply) + 2)
        if self._timer is not None:
            stats.observe(qtype, self._timer() - self._started)
        return query.id.to_bytes(2, "big") + reply

    def _once(self, turning: Rotation, tcp: bool) -> bytes:
        """A reply built for one query, turned by the answerer's own count."""
        turning.turn = self._turns % turning.count
        self._turns += 1
        return turning.reply(tcp)

    def reply_raw(self, query: Query, tcp: bool, reply: bytes, rcode: int, request_size: int | None = None) -> bytes:
        """Count and return a reply built elsewhere (relayed upstream answers, REFUSED...);
        ``request_size`` by default that of the query being answered now (the slow path's)."""
        self.stats.count("tcp" if tcp else "udp", qtype_name(query.qtype), RCODE_NAMES.get(rcode, str(rcode)),
                         self._request_size if request_size is None else request_size, len(reply))
        return reply

    def _encode(self, query: Query, result: Resolution) -> tuple[bytes, bytes, Rotation | None]:
        """(UDP reply, TCP reply), both without the 2-byte ID, and their rotation when the
        answer holds several address records of a type (CoreDNS loadbalance)."""
        flags = reply_flags(query.flags, result.rcode, authoritative=result.authoritative)
        authority: list[Record] = list(result.authority) if result.authority is not None else []
        if result.negative and result.authority is None:
            zone = result.soa_zone or query.labels[len(query.labels) - len(self.index.zone_labels):]
            authority.append(soa_record(self.index, zone, self.config.ttl))
        sections = (result.answer, authority, result.additional)
        packed, ends = _pack(flags, query, sections)
        full, full_kept = self._fit(query, flags, sections, packed, ends, MAX_TCP_MESSAGE)
        limit = query.udp_limit()
        udp, udp_kept = (full, full_kept) if len(full) <= limit else \
            self._fit(query, flags, sections, packed, ends, limit)
        run = address_run(packed, ends) if len(result.answer) > 1 else None
        turning = rotation(run, udp[2:], full[2:], (udp_kept, full_kept), skip=2, message=packed)
        return udp[2:], full[2:], turning

    def _fit(self, query: Query, flags: int, sections: tuple[list[Record], ...], packed: bytes,
             ends: list[int], limit: int) -> tuple[bytes, int]:
        """The packed message, or if too big the longest prefix of records (answer,
        authority, additional) that fits, with TC (CoreDNS/miekg Msg.Truncate); and how many
        records it holds. Compression pointers only point backwards, so a prefix of a packed
        message is a valid message."""
        opt = opt_record(self.config.edns_udp_size, query.edns.do) if query.edns else b""
        budget = limit - len(opt)
        kept = len(ends) - 1  # ends[0] is the end of the question
        if len(packed) > budget:
            kept = bisect.bisect_right(ends, budget) - 1
            counts = [0, 0, 0]
            remaining = kept
            for position, records in enumerate(sections):
                counts[position] = min(remaining, len(records))
                remaining -= counts[position]
            packed = HEADER.pack(0, flags | TC, 1, *counts) + packed[12 : ends[kept]]
        return (with_opt(packed, query, self.config.edns_udp_size) if opt else packed), kept

    # --- completing forwards -------------------------------------------------------------

    def relay(self, forward: Forward, message: bytes | None) -> bytes:
        """The client's reply from an upstream message (ID 0, no OPT), or SERVFAIL."""
        query = forward.query
        if forward.chain is not None:
            return self.complete_chain(forward, message)
        if message is None:
            return self.reply_raw(query, forward.tcp, question_reply(
                query, SERVFAIL, self.config.edns_udp_size, authoritative=False), SERVFAIL, forward.request_size)
        reply, kept = self._relayed(query, message, MAX_TCP_MESSAGE if forward.tcp else query.udp_limit())
        # CoreDNS loadbalance sits before forward too: the whole run turns, then the cut
        turning = rotation(relayed_run(message), reply, reply, (kept, kept), message=message)
        if turning is not None:
            reply = self._once(turning, True)
        return self.reply_raw(query, forward.tcp, reply, reply[3] & 0xF, forward.request_size)

    def relay_stored(self, forward: Forward, stored: StoredMessage, now: float) -> bytes:
        """:meth:`relay` of a cached upstream answer, TTLs aged to ``now``; the reply is kept
        encoded for this query shape when the forward is shareable, so the next identical
        query is answered by :meth:`answer` without parsing it."""
        query = forward.query
        if forward.chain is not None:
            return self.complete_chain(forward, stored.aged(now))
        ttl_offsets = [offset for offset, _ in stored.ttls]
        tcp, tcp_records = self._relayed(query, stored.message, MAX_TCP_MESSAGE, ttl_offsets)
        udp, udp_records = self._relayed(query, stored.message, query.udp_limit(), ttl_offsets)
        qtype, rcode = qtype_name(query.qtype), RCODE_NAMES.get(tcp[3] & 0xF, str(tcp[3] & 0xF))
        stats = self.stats
        body = tcp[2:]
        udp_body = body if udp == tcp else udp[2:]
        turning = rotation(relayed_run(stored.message, ttl_offsets), udp_body, body, (udp_records, tcp_records),
                           skip=2)
        # A trimmed reply holds the first records only: the TTLs past its cut are not in it.
        entry = (ForwardedReply if turning is None else partial(TurningReply, turning=turning))(
            udp_body, body, [offset - 2 for offset in ttl_offsets[:tcp_records]],
            [ttl for _, ttl in stored.ttls[:tcp_records]], udp_records=udp_records, stored=stored.stored,
            # with prefetch, the queries past the prefetch point reach the upstream cache, which counts them
            expires=stored.prefetch_at(self.config.prefetch_percentage) if self.config.prefetch else stored.expires,
            cells=stats.served_cells(qtype, rcode, "denial" if stored.negative else "success", forward.request_size,
                                     (len(udp_body) + 2, len(body) + 2)))
        if forward.shareable and query.cache_key is not None:
            self.forwarded.put(query.cache_key, entry)
        reply = query.id.to_bytes(2, "big") + entry.reply(forward.tcp, now)
        stats.count("tcp" if forward.tcp else "udp", qtype, rcode, forward.request_size, len(reply))
        return reply

    def _relayed(self, query: Query, message: bytes, limit: int,
                 ttl_offsets: list[int] | None = None) -> tuple[bytes, int]:
        """An upstream message (ID 0, no OPT) as the reply to ``query``: its ID, RD echoed,
        our OPT if it had EDNS; and how many of its records the reply holds. Over ``limit``
        it keeps the longest prefix of records that fits, with TC (CoreDNS/miekg
        Msg.Truncate, as :meth:`_fit`), or the question only with TC when no record fits.
        ``ttl_offsets`` (every record's, in order) spares walking the message to cut it."""
        flags = ((message[2] << 8) | message[3]) & ~0x0100 | (query.flags & 0x0100)
        _, _, qdcount, ancount, nscount, arcount = HEADER.unpack_from(message)
        head = query.id.to_bytes(2, "big") + flags.to_bytes(2, "big")
        opt_size = len(opt_record(self.config.edns_udp_size, False)) if query.edns else 0
        if len(message) + opt_size <= limit:
            return with_opt(head + message[4:], query, self.config.edns_udp_size), ancount + nscount + arcount
        if ttl_offsets is None:  # only a reply that needs cutting pays for the walk
            ttl_offsets = [span.ttl_offset for span in walk_message(message)[1]]
        ends = record_ends(message, ttl_offsets)
        kept = bisect.bisect_right(ends, limit - opt_size)
        if kept == 0:
            return question_reply(query, flags & 0xF, self.config.edns_udp_size, authoritative=False,
                                  truncated=True), 0
        counts = []
        remaining = kept
        for count in (ancount, nscount, arcount):
            counts.append(min(remaining, count))
            remaining -= counts[-1]
        # Compression pointers only point backwards, so a prefix of records is a valid message.
        trimmed = HEADER.pack(query.id, flags | TC, qdcount, *counts) + message[12 : ends[kept - 1]]
        return with_opt(trimmed, query, self.config.edns_udp_size), kept

    def complete_chain(self, forward: Forward, message: bytes | None) -> bytes:
        """CNAME chain + upstream answer, NOERROR whatever upstream said, TC copied (CoreDNS
        plugin/backend_lookup.go A() for an out-of-zone CNAME target). When upstream could
        not be asked the chain is the whole answer: CoreDNS's upstream.go Lookup asks through
        its own server, which answers SERVFAIL when forward fails (core/dnsserver/server.go
        ServeDNS, errorFunc), and A() appends that reply's empty answer to the CNAME."""
        query = forward.query
        answer: list[Record] = list(forward.chain or ())
        truncated = False
        if message is not None:
            try:
                upstream = DNSRecord.parse(message)
            except Exception:  # dnslib raises many types on garbage; treat as no answer
                upstream = None
            if upstream is not None:
                answer += [_from_dnslib(rr) for rr in upstream.rr]
                truncated = bool(upstream.header.tc)
        result = Resolution(rcode=NOERROR, answer=answer, negative=not answer, deps=None)
        udp, full, turning = self._encode(query, result)
        reply = (full if forward.tcp else udp) if turning is None else self._once(turning, forward.tcp)
        if truncated:
            reply = (((reply[0] << 8) | reply[1]) | TC).to_bytes(2, "big") + reply[2:]
        return self.reply_raw(query, forward.tcp, query.id.to_bytes(2, "big") + reply, NOERROR, forward.request_size)


def _cname_to_answer(original: tuple[bytes, ...], answer: list[Record]) -> tuple[Record, ...]:
    """CoreDNS autopath cnamer: a CNAME from the name asked to the owner of the first answer
    record that is not that name, with its TTL; none when every record is the name asked."""
    for record in answer:
        if not same_name(record.owner, original):
            return (Record(original, T_CNAME, record.ttl, (record.owner,)),)
    return ()


def _pack(flags: int, query: Query, sections: tuple[list[Record], ...]) -> tuple[bytes, list[int]]:
    """The packed message (ID 0) and the offset after the question and after each record."""
    header = HEADER.pack(0, flags, 1, len(sections[0]), len(sections[1]), len(sections[2]))
    packer = Packer(header, query.question, query.labels)
    for records in sections:
        packer.records(records)
    return bytes(packer.buffer), packer.ends


class _NoNames(dict):
    """A dnslib name table that never matches: RDATA packed on its own has no pointers."""

    def __contains__(self, key: object) -> bool:
        return False


def _from_dnslib(rr: RR) -> Record:
    """An upstream record (dnslib) as a Record; names in CNAME/NS/PTR data stay compressible."""
    owner = tuple(rr.rname.label)
    if rr.rtype in (T_CNAME, T_NS, T_PTR):
        return Record(owner, rr.rtype, rr.ttl, (tuple(rr.rdata.label.label),))
    if rr.rtype in (T_A, T_AAAA):
        return Record(owner, rr.rtype, rr.ttl, (bytes(rr.rdata.data),))
    buffer = DNSBuffer()
    buffer.names = _NoNames()
    rr.rdata.pack(buffer)
    return Record(owner, rr.rtype, rr.ttl, (bytes(buffer.data),))

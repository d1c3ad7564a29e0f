"""DNS wire format without dnslib: the query parser, the cache key, OPT, error replies.

Everything a query needs before its answer is known lives here, so the hot path (a
cached answer) never builds a dnslib object: :func:`cache_key` slices the packet, the
cached reply gets the query ID prepended. Everything here is pure.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

HEADER = struct.Struct("!HHHHHH")
RR_FIXED = struct.Struct("!HHIH")  # type, class, ttl, rdlength

QR = 0x8000
OPCODE_MASK = 0x7800
AA = 0x0400
TC = 0x0200
RD = 0x0100
RA = 0x0080
AD = 0x0020
CD = 0x0010

NOERROR, FORMERR, SERVFAIL, NXDOMAIN, NOTIMP, REFUSED = 0, 1, 2, 3, 4, 5
BADVERS = 16
RCODE_NAMES = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED", 16: "BADVERS"}

#: record types (RFC 1035 3.2.2, RFC 3596, RFC 2782, RFC 6891) and the one class served
T_A, T_NS, T_CNAME, T_SOA, T_PTR, T_MX, T_TXT, T_AAAA, T_SRV = 1, 2, 5, 6, 12, 15, 16, 28, 33
TYPE_OPT = 41
CLASS_IN = 1
MAX_NAME_WIRE = 255
MAX_POINTER_HOPS = 64
MAX_UDP_PAYLOAD = 65507


class Ignored(Exception):
    """Not answerable: no complete header, or a response (QR=1) sent to us (never answer
    those, like every server: it would make two servers ping-pong)."""


class QueryError(Exception):
    """A query that gets an error reply without looking at the data (FORMERR, NOTIMP, BADVERS)."""

    def __init__(self, rcode: int, message: str, query_id: int, flags: int, edns: "Edns | None" = None):
        super().__init__(message)
        self.rcode = rcode
        self.query_id = query_id
        self.flags = flags
        self.edns = edns

    def reply(self, udp_size: int) -> bytes:
        return error_reply(self.query_id, self.flags, self.rcode, self.edns, udp_size)


@dataclass(frozen=True, slots=True)
class Edns:
    udp_size: int  # as sent; the reply limit is max(512, udp_size)
    version: int
    do: bool


@dataclass(frozen=True, slots=True)
class Query:
    id: int
    flags: int
    #: the question name's labels exactly as sent (letter case is echoed)
    labels: tuple[bytes, ...]
    qtype: int
    qclass: int
    edns: Edns | None
    #: the question section as sent, without compression (name, type, class)
    question: bytes
    #: key of the encoded-answer cache, None when the packet is not in canonical shape
    cache_key: bytes | None

    @property
    def lower_labels(self) -> tuple[str, ...]:
        return tuple(label.lower().decode("latin-1") for label in self.labels)

    def udp_limit(self) -> int:
        """Largest UDP reply the client accepts (RFC 6891 6.2.5: below 512 means 512), at
        most what one IPv4 datagram carries."""
        if self.edns is None:
            return 512
        return min(max(512, self.edns.udp_size), MAX_UDP_PAYLOAD)


def cache_key(packet: bytes) -> bytes | None:
    """The encoded-answer cache key of a packet: header minus ID, question, OPT fixed part.

    The key is a pure function of the bytes that decide the answer (flags, counts,
    question incl. letter case, EDNS size/version/DO); EDNS options (cookies) are left
    out so they do not split the cache. Only the canonical shape (question name without
    compression, then nothing or exactly one OPT) has a key. :func:`parse_query` uses
    the same function, so a key that hits always belongs to a query parsed the same way.
    """
    end = packet.find(b"\x00", 12) + 5
    if end < 17:
        return None
    size = len(packet)
    if size == end:
        return packet[2:end]
    if size >= end + 11 and packet[end : end + 3] == b"\x00\x00\x29":
        if size == end + 11 + ((packet[end + 9] << 8) | packet[end + 10]) and (
                size == end + 11 or options_fit(packet, end + 11, size)):
            return packet[2:end] + packet[end + 3 : end + 9]
    return None


def read_name(packet: bytes, offset: int) -> tuple[tuple[bytes, ...], int, bool]:
    """Labels of the name at ``offset``, the offset after it, whether it used compression.

    Pointers must point backwards (so a loop is impossible) and at most
    MAX_POINTER_HOPS are followed; the total name is at most 255 octets on the wire.
    """
    labels: list[bytes] = []
    wire_length = 0
    end = -1
    hops = 0
    size = len(packet)
    while True:
        if offset >= size:
            raise ValueError("name runs past the end of the packet")
        length = packet[offset]
        if length == 0:
            if end < 0:
                end = offset + 1
            return tuple(labels), end, hops > 0
        kind = length & 0xC0
        if kind == 0xC0:
            if offset + 1 >= size:
                raise ValueError("compression pointer runs past the end of the packet")
            target = ((length & 0x3F) << 8) | packet[offset + 1]
            if target >= offset:
                raise ValueError("compression pointer does not point backwards (loop)")
            hops += 1
            if hops > MAX_POINTER_HOPS:
                raise ValueError("too many compression pointers")
            if end < 0:
                end = offset + 2
            offset = target
            continue
        if kind:
            raise ValueError(f"unsupported label type 0x{kind:02x}")
        wire_length += length + 1
        if wire_length + 1 > MAX_NAME_WIRE:
            raise ValueError("name longer than 255 octets")
        if offset + 1 + length > size:
            raise ValueError("label runs past the end of the packet")
        labels.append(packet[offset + 1 : offset + 1 + length])
        offset += 1 + length


def parse_query(packet: bytes) -> Query:
    """Parse a query; raises Ignored (drop) or QueryError (answer with its rcode).

    Mirrors miekg/dns's acceptance rules that CoreDNS inherits: responses are ignored,
    opcodes other than QUERY get NOTIMP, a QDCOUNT other than 1 or more than one record in
    answer/authority, or more than two in additional, gets FORMERR.
    """
    if len(packet) < 12:
        raise Ignored("shorter than a DNS header")
    query_id, flags, qdcount, ancount, nscount, arcount = HEADER.unpack_from(packet)
    if flags & QR:
        raise Ignored("a response, not a query")
    if flags & OPCODE_MASK:
        raise QueryError(NOTIMP, f"opcode {(flags & OPCODE_MASK) >> 11} not implemented", query_id, flags)
    if qdcount != 1 or ancount > 1 or nscount > 1 or arcount > 2:
        raise QueryError(FORMERR, f"section counts {qdcount}/{ancount}/{nscount}/{arcount}", query_id, flags)
    try:
        labels, offset, compressed = read_name(packet, 12)
        if offset + 4 > len(packet):
            raise ValueError("question runs past the end of the packet")
        qtype, qclass = struct.unpack_from("!HH", packet, offset)
        question_end = offset + 4
        edns, opt_offset, end = _skip_records(packet, question_end, ancount + nscount, arcount)
    except (ValueError, struct.error) as error:
        raise QueryError(FORMERR, str(error), query_id, flags) from None
    if edns is not None and edns.version != 0:
        raise QueryError(BADVERS, f"EDNS version {edns.version}", query_id, flags, edns)
    canonical = (
        not compressed
        and ancount == 0
        and nscount == 0
        and (opt_offset == question_end if arcount == 1 else arcount == 0)
        and end == len(packet)
    )
    return Query(
        id=query_id,
        flags=flags,
        labels=labels,
        qtype=qtype,
        qclass=qclass,
        edns=edns,
        question=encode_name(labels) + packet[offset:question_end],
        cache_key=cache_key(packet) if canonical else None,
    )


def _skip_records(packet: bytes, offset: int, plain: int, additional: int) -> tuple[Edns | None, int, int]:
    """Walk the records after the question; return the OPT (if any), its offset, the end."""
    edns: Edns | None = None
    opt_offset = -1
    for index in range(plain + additional):
        start = offset
        _, offset, _ = read_name(packet, offset)
        if offset + 10 > len(packet):
            raise ValueError("record runs past the end of the packet")
        rtype, rclass, ttl, rdlength = RR_FIXED.unpack_from(packet, offset)
        offset += 10 + rdlength
        if offset > len(packet):
            raise ValueError("record data runs past the end of the packet")
        if rtype == TYPE_OPT:
            if index < plain or edns is not None or packet[start] != 0:
                raise ValueError("misplaced or duplicate OPT record")
            if not options_fit(packet, offset - rdlength, offset):
                raise ValueError("an EDNS option runs past the OPT record")
            edns = Edns(udp_size=rclass, version=(ttl >> 16) & 0xFF, do=bool(ttl & 0x8000))
            opt_offset = start
    return edns, opt_offset, offset


def options_fit(packet: bytes, offset: int, end: int) -> bool:
    """Each EDNS option's length fits its OPT record's data, as miekg/dns unpacks them (one
    that does not is FORMERR in CoreDNS)."""
    while offset < end:
        if offset + 4 > end:
            return False
        offset += 4 + ((packet[offset + 2] << 8) | packet[offset + 3])
    return offset == end


def encode_name(labels: tuple[bytes, ...]) -> bytes:
    return b"".join(bytes((len(label),)) + label for label in labels) + b"\x00"


def opt_record(udp_size: int, do: bool, extended_rcode: int = 0) -> bytes:
    """Our OPT record: our payload size, version 0, DO echoed, no options."""
    ttl = (extended_rcode << 24) | (0x8000 if do else 0)
    return b"\x00" + RR_FIXED.pack(TYPE_OPT, udp_size, ttl, 0)


def reply_flags(query_flags: int, rcode: int, *, authoritative: bool) -> int:
    """QR, the query's opcode/RD/CD echoed, RA (we recurse for names outside the zone)."""
    flags = QR | RA | (query_flags & (OPCODE_MASK | RD | CD)) | (rcode & 0xF)
    return flags | AA if authoritative else flags


def error_reply(query_id: int, query_flags: int, rcode: int, edns: Edns | None, udp_size: int) -> bytes:
    """Header-only reply (no question: it could not be trusted) with the rcode."""
    reply = HEADER.pack(query_id, reply_flags(query_flags, rcode, authoritative=False), 0, 0, 0, 1 if edns else 0)
    if edns is not None:
        reply += opt_record(udp_size, edns.do, rcode >> 4)
    return reply


def question_reply(query: Query, rcode: int, udp_size: int, *, authoritative: bool, truncated: bool = False) -> bytes:
    """A reply carrying only the question (REFUSED, SERVFAIL, a relayed answer too big for UDP)."""
    flags = reply_flags(query.flags, rcode, authoritative=authoritative) | (TC if truncated else 0)
    header = HEADER.pack(query.id, flags, 1, 0, 0, 1 if query.edns else 0)
    reply = header + query.question
    if query.edns is not None:
        reply += opt_record(udp_size, query.edns.do)
    return reply


def with_opt(message: bytes, query: Query, udp_size: int) -> bytes:
    """Append our OPT to a message that has none, if the query had EDNS."""
    if query.edns is None:
        return message
    arcount = (message[10] << 8) | message[11]
    return message[:10] + (arcount + 1).to_bytes(2, "big") + message[12:] + opt_record(udp_size, query.edns.do)


@dataclass(frozen=True, slots=True)
class RecordSpan:
    """Where one resource record sits in a message (for TTL patching and OPT removal)."""

    section: int  # 0 answer, 1 authority, 2 additional
    start: int
    ttl_offset: int
    rtype: int
    ttl: int
    end: int


def walk_message(message: bytes) -> tuple[int, list[RecordSpan]]:
    """The end of the question section and every record of a (response) message.

    Raises ValueError when the message is malformed.
    """
    if len(message) < 12:
        raise ValueError("shorter than a DNS header")
    _, _, qdcount, ancount, nscount, arcount = HEADER.unpack_from(message)
    offset = 12
    for _ in range(qdcount):
        _, offset, _ = read_name(message, offset)
        offset += 4
    if offset > len(message):
        raise ValueError("question runs past the end of the message")
    question_end = offset
    spans: list[RecordSpan] = []
    for section, count in enumerate((ancount, nscount, arcount)):
        for _ in range(count):
            start = offset
            _, offset, _ = read_name(message, offset)
            if offset + 10 > len(message):
                raise ValueError("record runs past the end of the message")
            rtype, _, ttl, rdlength = RR_FIXED.unpack_from(message, offset)
            ttl_offset = offset + 4
            offset += 10 + rdlength
            if offset > len(message):
                raise ValueError("record data runs past the end of the message")
            spans.append(RecordSpan(section, start, ttl_offset, rtype, ttl, offset))
    return question_end, spans

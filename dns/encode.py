"""Resource records as plain values and their wire encoding, without dnslib. Pure.

An answer is built once per question shape and then served from a cache, but that first
build is on the query path too (a cold cache, a name asked once), so it must not pay for
dnslib's object model (an object per record, field and label). A :class:`Record` is a
tuple of labels, a type, a TTL and its RDATA as parts: bytes as they are, or a domain
name (a tuple of labels). :class:`Packer` writes a message with name compression
(RFC 1035 4.1.4) where it is allowed: owner names and the names inside NS, CNAME, PTR
and SOA data (RFC 3597 4); never inside SRV data (RFC 2782), though later names may point
into an SRV target, as miekg/dns packs them.
"""

from __future__ import annotations

import socket
import struct
from typing import NamedTuple, Union

from kubeport.dns.wire import CLASS_IN, T_A, T_AAAA, T_CNAME, T_NS, T_PTR, T_SOA, T_SRV

#: types whose RDATA names may be compressed (RFC 3597 section 4)
COMPRESSED_DATA = frozenset({T_NS, T_CNAME, T_SOA, T_PTR})
#: a compression pointer holds 14 bits of offset
MAX_POINTER = 0x3FFF

Name = tuple[bytes, ...]
Part = Union[bytes, Name]

_TYPE_CLASS_TTL = struct.Struct("!HHI")
_SRV_FIXED = struct.Struct("!HHH")
_SOA_TIMES = struct.Struct("!IIIII")


class Record(NamedTuple):
    owner: Name
    rtype: int
    ttl: int
    #: RDATA: bytes as they are, or names (tuples of labels)
    data: tuple[Part, ...]


def address_record(owner: Name, address: str, ttl: int) -> Record:
    """A or AAAA, by the address's family."""
    if ":" in address:
        return Record(owner, T_AAAA, ttl, (socket.inet_pton(socket.AF_INET6, address),))
    return Record(owner, T_A, ttl, (socket.inet_pton(socket.AF_INET, address),))


def srv_record(owner: Name, ttl: int, priority: int, weight: int, port: int, target: Name) -> Record:
    return Record(owner, T_SRV, ttl, (_SRV_FIXED.pack(priority, weight, port), target))


def soa_data(mname: Name, rname: Name, serial: int, refresh: int, retry: int, expire: int,
             minimum: int) -> tuple[Part, ...]:
    return (mname, rname, _SOA_TIMES.pack(serial & 0xFFFFFFFF, refresh, retry, expire, minimum))


def txt_data(*strings: bytes) -> tuple[Part, ...]:
    return (b"".join(bytes((len(s),)) + s for s in strings),)


def same_name(a: Name, b: Name) -> bool:
    """DNS names compare case-insensitively (RFC 4343)."""
    return len(a) == len(b) and all(x.lower() == y.lower() for x, y in zip(a, b))


class Packer:
    """Writes one message: header space, question, records; remembers where each record
    ends (a prefix of the records is a valid message: pointers only point backwards)."""

    __slots__ = ("buffer", "names", "ends")

    def __init__(self, header: bytes, question: bytes, qname: Name):
        self.buffer = bytearray(header)
        self.names: dict[Name, int] = {}
        self._remember(qname, len(header))
        self.buffer += question
        self.ends = [len(self.buffer)]

    def _remember(self, labels: Name, offset: int, count: int | None = None) -> None:
        """Note where each suffix of ``labels`` (the first ``count`` ones) starts."""
        names = self.names
        for index in range(len(labels) if count is None else count):
            if offset > MAX_POINTER:
                return
            names.setdefault(labels[index:], offset)
            offset += 1 + len(labels[index])

    def name(self, labels: Name, compress: bool = True) -> None:
        """Write a name, pointing at an earlier copy of its longest known suffix if
        ``compress``. Either way its suffixes become known for the names written after it:
        owners in the additional section point into the SRV targets before them, as
        miekg/dns packDomainName ("still pick up names that can be used for future
        compressions") does for CoreDNS."""
        buffer = self.buffer
        if not compress:
            start = len(buffer)
            for label in labels:
                buffer.append(len(label))
                buffer += label
            buffer.append(0)
            self._remember(labels, start)
            return
        names = self.names
        start = len(buffer)
        for index in range(len(labels)):
            pointer = names.get(labels[index:])
            if pointer is not None:
                self._remember(labels, start, index)
                buffer += (0xC000 | pointer).to_bytes(2, "big")
                return
            buffer.append(len(labels[index]))
            buffer += labels[index]
        buffer.append(0)
        self._remember(labels, start)

    def record(self, record: Record) -> None:
        buffer = self.buffer
        self.name(record.owner)
        buffer += _TYPE_CLASS_TTL.pack(record.rtype, CLASS_IN, record.ttl)
        length_at = len(buffer)
        buffer += b"\x00\x00"
        compress = record.rtype in COMPRESSED_DATA
        for part in record.data:
            if part.__class__ is bytes:
                buffer += part  # type: ignore[operator]
            else:
                self.name(part, compress)  # type: ignore[arg-type]
        struct.pack_into("!H", buffer, length_at, len(buffer) - length_at - 2)
        self.ends.append(len(buffer))

    def records(self, records: list[Record]) -> None:
        for record in records:
            self.record(record)

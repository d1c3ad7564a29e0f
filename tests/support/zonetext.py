"""DNS messages as zone text, for tests that check answers: questions as a stub resolver
sends them, replies and records read back through dnslib as zone-file lines."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Iterable

from dnslib import EDNS0, QTYPE, DNSRecord

from kubeport.dns.encode import Packer, Record
from kubeport.dns.wire import RCODE_NAMES


def question(name: str, qtype: str | int = "A", *, query_id: int = 4660, rd: bool = True,
             edns: int | None = None, do: bool = False, options: Iterable[Any] = ()) -> bytes:
    """A query packet as a stub resolver sends it (RD set, no EDNS unless asked)."""
    record = DNSRecord.question(name, qtype if isinstance(qtype, str) else QTYPE.get(qtype))
    record.header.id = query_id
    record.header.rd = int(rd)
    if edns is not None:
        record.add_ar(EDNS0(udp_len=edns, flags="do" if do else "", opts=list(options)))
    return bytes(record.pack())


@dataclass(frozen=True)
class Reply:
    """A reply as zone text: ``"web.default.svc.cluster.local. 5 IN A 10.96.0.20"``."""

    rcode: str
    answer: tuple[str, ...]
    authority: tuple[str, ...]
    additional: tuple[str, ...]
    flags: frozenset[str]
    id: int
    size: int
    edns: tuple[int, bool] | None  # (udp size, DO) of the OPT record

    @property
    def records(self) -> int:
        return len(self.answer)


def zone_line(rr: Any) -> str:
    return " ".join(rr.toZone().split())


def record_lines(records: Iterable[Record]) -> list[str]:
    """Records (kubeport.dns.encode) as zone text lines, through the wire and dnslib."""
    records = list(records)
    packer = Packer(struct.pack("!HHHHHH", 0, 0x8000, 0, len(records), 0, 0), b"", ())
    packer.records(records)
    return [zone_line(rr) for rr in DNSRecord.parse(bytes(packer.buffer)).rr]


def read_reply(packet: bytes) -> Reply:
    record = DNSRecord.parse(packet)
    header = record.header
    flags = frozenset(name for name in ("qr", "aa", "tc", "rd", "ra", "ad", "cd") if getattr(header, name))
    opt = [rr for rr in record.ar if rr.rtype == 41]
    edns = None
    rcode = header.rcode
    if opt:
        ttl = opt[0].ttl
        edns = (opt[0].rclass, bool(ttl & 0x8000))
        rcode |= (ttl >> 24) << 4
    return Reply(
        rcode=RCODE_NAMES.get(rcode, str(rcode)),
        answer=tuple(zone_line(rr) for rr in record.rr),
        authority=tuple(zone_line(rr) for rr in record.auth),
        additional=tuple(zone_line(rr) for rr in record.ar if rr.rtype != 41),
        flags=flags,
        id=header.id,
        size=len(packet),
        edns=edns,
    )


def header_only(packet: bytes) -> tuple[int, int, str, tuple[int, int, int, int]]:
    """(id, flags, rcode name, section counts) of any reply, even one dnslib cannot parse."""
    query_id, flags, qd, an, ns, ar = struct.unpack_from("!HHHHHH", packet)
    return query_id, flags, RCODE_NAMES.get(flags & 0xF, str(flags & 0xF)), (qd, an, ns, ar)

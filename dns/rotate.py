"""CoreDNS ``loadbalance``: the address records of an answer turn by one record per reply. Pure.

The Corefiles of kubeadm (cmd/kubeadm/app/phases/addons/dns/manifests.go) and of
coredns/deployment (kubernetes/coredns.yaml.sed) end with ``loadbalance``: CoreDNS shuffles the
A and AAAA records of every NOERROR reply (``plugin/loadbalance``, CNAMEs kept first), so the
clients of a headless Service do not all pick the same first pod. Here answers are kept
encoded, so the shuffle is a rotation spliced into the bytes: an address record whose owner
is a compression pointer has a fixed size (A 16 bytes, AAAA 28) and holds no name another
record could point into, so a run of them can be cut and joined again without re-encoding.
A reply with one address record (every ClusterIP answer) has no run and is never touched.

Differences from CoreDNS, deliberate: a rotation, not a random permutation (each record is
first equally often); only the answer section turns (CoreDNS also shuffles the authority and
additional sections, whose order clients do not read: SRV glue is matched by name); MX
records, whose size varies, keep their order; a run mixing A and AAAA (only an ANY answer
from upstream) turns its first single-type part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kubeport.dns.wire import T_A, T_AAAA, read_name, walk_message

#: type and RDLENGTH of an address record by its size with a 2-byte owner (a pointer):
#: owner 2 + type, class, TTL, RDLENGTH 10 + RDATA
FIXED_ADDRESS = {16: (T_A, 4), 28: (T_AAAA, 16)}


@dataclass(frozen=True, slots=True)
class Run:
    """Consecutive fixed-size address records of one type in a message's answer section."""

    first: int  # index of its first record among the message's records
    start: int  # offset of its first record
    size: int  # bytes per record
    count: int


def address_run(message: bytes, bounds: Sequence[int]) -> Run | None:
    """The first run of two or more address records of one type in the answer section of a
    NOERROR ``message``, each owned by a compression pointer to a name before the run.
    ``bounds``: where the question ends, then where each record ends (``Packer.ends``)."""
    if len(message) < 12 or message[3] & 0xF:
        return None
    records = min((message[6] << 8) | message[7], len(bounds) - 1)
    index = 0
    while index < records - 1:
        start = bounds[index]
        size = _address_size(message, start, bounds[index + 1], start)
        end = index + 1
        if size:
            while end < records and _address_size(message, bounds[end], bounds[end + 1], start) == size:
                end += 1
            if end - index >= 2:
                return Run(index, start, size, end - index)
        index = end
    return None


def relayed_run(message: bytes, ttl_offsets: Sequence[int] | None = None) -> Run | None:
    """:func:`address_run` of an upstream message (ID 0, no OPT), which is valid (it was
    walked when received); ``ttl_offsets`` (every record's) spare walking it again."""
    if message[3] & 0xF or ((message[6] << 8) | message[7]) < 2:
        return None
    if ttl_offsets is None:
        question_end, spans = walk_message(message)
        return address_run(message, [question_end] + [span.end for span in spans])
    offset = 12
    for _ in range((message[4] << 8) | message[5]):
        offset = read_name(message, offset)[1] + 4
    return address_run(message, [offset] + record_ends(message, ttl_offsets))


def record_ends(message: bytes, ttl_offsets: Sequence[int]) -> list[int]:
    """Where each record ends, from where its TTL is: TTL (4), RDLENGTH (2), RDATA."""
    return [offset + 6 + ((message[offset + 4] << 8) | message[offset + 5]) for offset in ttl_offsets]


def _address_size(message: bytes, start: int, end: int, run_start: int) -> int:
    """The record's size if it is an address record owned by a pointer before ``run_start``, else 0."""
    fixed = FIXED_ADDRESS.get(end - start)
    if fixed is None or message[start] & 0xC0 != 0xC0:
        return 0
    if ((message[start] & 0x3F) << 8 | message[start + 1]) >= run_start:
        return 0
    rtype, rdlength = fixed
    if (message[start + 2] << 8 | message[start + 3]) != rtype:
        return 0
    if (message[start + 10] << 8 | message[start + 11]) != rdlength:
        return 0
    return end - start


class Rotation:
    """A reply's UDP and TCP variants whose address run turns by one record per reply.

    Both variants hold the same bytes before the run (but the header), and a trimmed (TC)
    UDP variant holds only the first records: it gets the first records of the turned run,
    as a reply truncated after CoreDNS's shuffle would."""

    __slots__ = ("heads", "tails", "lengths", "twice", "size", "count", "start", "held", "turn")

    def __init__(self, udp: bytes, tcp: bytes, *, start: int, size: int, held: tuple[int, int],
                 run: bytes | None = None, turn: int = 0):
        """``start``: offset of the run in both variants; ``held``: how many of its records
        the UDP and the TCP variant hold; ``run``: all of its records, when the TCP variant
        does not hold them all."""
        self.start = start
        self.size = size
        self.held = held
        udp_length, tcp_length = held[0] * size, held[1] * size
        self.heads = (udp[:start], tcp[:start])
        self.tails = (udp[start + udp_length :], tcp[start + tcp_length :])
        self.lengths = (udp_length, tcp_length)
        if run is None:
            run = tcp[start : start + tcp_length]
        self.count = len(run) // size
        self.twice = run + run  # any turn is one slice of it
        self.turn = turn % self.count

    def reply(self, tcp: bool) -> bytes:
        """The variant with the run turned by the current turn; the next reply turns one further."""
        turn = self.turn
        self.turn = turn + 1 if turn + 1 < self.count else 0
        at = turn * self.size
        return self.heads[tcp] + self.twice[at : at + self.lengths[tcp]] + self.tails[tcp]

    def over(self, udp: bytes, tcp: bytes) -> "Rotation":
        """The same layout and turn over new bytes (the TTLs aged)."""
        return Rotation(udp, tcp, start=self.start, size=self.size, held=self.held, turn=self.turn)


def rotation(run: Run | None, udp: bytes, tcp: bytes, kept: tuple[int, int], *, skip: int = 0,
             message: bytes | None = None) -> Rotation | None:
    """The rotation of ``run`` (found in ``message``) in its two variants, which hold its
    first ``kept`` records each and start ``skip`` bytes into the message (2: without the
    ID). The run's records are read from ``message`` if given (all of them turn, even in a
    trimmed TCP variant), else from the TCP variant. None when fewer than two turn."""
    if run is None:
        return None
    held = (min(run.count, max(0, kept[0] - run.first)), min(run.count, max(0, kept[1] - run.first)))
    records = run.count if message is not None else held[1]
    if records < 2:
        return None
    whole = message[run.start : run.start + run.count * run.size] if message is not None else None
    return Rotation(udp, tcp, start=run.start - skip, size=run.size, held=held, run=whole)

"""Relayed upstream answers kept encoded per client query shape, with their TTLs aged. Pure.

The upstream cache (:class:`~.upstream.UpstreamCache`) keeps one message per question;
turning it into a client's reply (ID, RD, OPT, the UDP size limit) costs a parse of the
query and a few copies. This cache keeps that finished reply under the same key as the
encoded cluster answers (header minus ID, question as sent, OPT fixed part), so a
repeated forwarded question costs what a cluster answer costs: a dict lookup and the ID
patch. TTLs are aged like the upstream cache ages them (whole seconds elapsed since the
answer was stored, RFC 1035 7.3), patched at offsets found once; the aged reply is kept
until the age changes, so most hits patch nothing. An entry ends when its upstream answer
does (its lowest TTL). A reply with several A/AAAA records turns them per hit (CoreDNS
``loadbalance`` sits before ``forward``; :mod:`.rotate`), over the aged bytes.
"""

from __future__ import annotations

import struct
from typing import Any, Sequence

from kubeport.dns.rotate import Rotation

_TTL = struct.Struct("!I")

Cell = list[int]


class ForwardedReply:
    """One encoded reply, UDP and TCP variants without the 2-byte ID."""

    __slots__ = ("stored", "expires", "udp", "tcp", "offsets", "ttls", "udp_offsets", "udp_ttls", "age", "aged",
                 "served", "udp_served", "aged_from", "aged_until", "udp_iovec")

    def __init__(self, udp: bytes, tcp: bytes, offsets: Sequence[int], ttls: Sequence[int], *, udp_records: int,
                 stored: float, expires: float, cells: tuple[Cell, Cell]):
        self.stored = stored
        self.expires = expires
        self.udp = udp
        self.tcp = tcp
        #: TTL offsets within ``tcp``, one per record in message order
        self.offsets = tuple(offsets)
        self.ttls = tuple(ttls)
        #: ``udp`` holds the first ``udp_records`` records of ``tcp`` at the same offsets: all
        #: of them, those that fit the client's buffer (trimmed, TC), or none (question only)
        self.udp_offsets = self.offsets[:udp_records]
        self.udp_ttls = self.ttls[:udp_records]
        self.age = 0
        self.aged = (udp, tcp)
        #: where a hit over UDP, over TCP counts (DnsStats.served_cells), and the UDP one again
        self.served = cells
        self.udp_served = cells[0]
        self._aged_window()

    def _aged_window(self) -> None:
        #: while ``aged_from <= now < aged_until`` the reply is ``aged`` as it is (the same
        #: whole seconds of age, before the entry ends): the batched UDP listener serves it
        #: from there, with ``udp_iovec`` (where ``aged[False]`` is; it fills that in)
        self.aged_from = self.stored + self.age
        self.aged_until = min(self.aged_from + 1, self.expires)
        self.udp_iovec: bytes | None = None

    def reply(self, tcp: bool, now: float) -> bytes:
        """The reply without ID, TTLs aged to ``now`` (whole seconds since it was stored)."""
        age = int(now - self.stored)
        if age != self.age:
            self._age_to(age)
        return self.aged[tcp]

    def _age_to(self, age: int) -> None:
        self.age = age
        tcp_aged = _aged(self.tcp, self.offsets, self.ttls, age)
        self.aged = (tcp_aged if self.udp is self.tcp else _aged(self.udp, self.udp_offsets, self.udp_ttls, age),
                     tcp_aged)
        self._aged_window()


class TurningReply(ForwardedReply):
    """A reply whose A/AAAA records turn per hit, over the aged bytes (a subclass: the
    replies that do not turn pay nothing for it)."""

    __slots__ = ("turning",)

    def __init__(self, *args: Any, turning: Rotation, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.turning = turning

    def _aged_window(self) -> None:
        super()._aged_window()
        self.aged_until = self.aged_from  # a different reply per hit: never served as it is

    def reply(self, tcp: bool, now: float) -> bytes:
        age = int(now - self.stored)
        if age != self.age:
            self._age_to(age)
            self.turning = self.turning.over(*self.aged)
        return self.turning.reply(tcp)


def _aged(message: bytes, offsets: tuple[int, ...], ttls: tuple[int, ...], age: int) -> bytes:
    if not offsets:
        return message
    patched = bytearray(message)
    for offset, ttl in zip(offsets, ttls):
        _TTL.pack_into(patched, offset, ttl - age if ttl > age else 0)
    return bytes(patched)


class ForwardedAnswers:
    """Encoded relayed replies by client query key, at most ``capacity`` (oldest dropped)."""

    __slots__ = ("entries", "capacity")

    def __init__(self, capacity: int):
        self.entries: dict[bytes, ForwardedReply] = {}
        self.capacity = capacity

    def get(self, key: bytes, tcp: bool, now: float) -> bytes | None:
        """The reply without ID, TTLs aged to ``now``, counted as a cache hit; None when
        absent or expired."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        if now >= entry.expires or now < entry.stored:
            del self.entries[key]
            return None
        entry.served[tcp][0] += 1
        return entry.reply(tcp, now)

    def put(self, key: bytes, entry: ForwardedReply) -> None:
        if self.capacity <= 0:
            return
        entries = self.entries
        if key not in entries and len(entries) >= self.capacity:
            del entries[next(iter(entries))]
        entries[key] = entry

    def clear(self) -> None:
        self.entries.clear()

    def __len__(self) -> int:
        return len(self.entries)

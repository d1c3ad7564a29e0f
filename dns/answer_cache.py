"""Encoded cluster answers by query key, with the services each depends on. Pure.

Two dicts under one capacity: ``entries`` holds replies served as they are (the ID patched
in), ``turning`` those whose address records turn per reply (:mod:`.rotate`). The hot path
looks in ``entries`` first, so a one-address answer costs exactly what it did before
rotation existed; only a multi-address answer pays a second lookup and a splice.
"""

from __future__ import annotations

from typing import Iterable

from kubeport.dns.rotate import Rotation
from kubeport.endpoints.types import ServiceName


class CachedAnswer:
    """One question's replies without their ID, and the stats cells a hit counts in
    (:meth:`DnsStats.served_cells`: one-element lists shared with the metrics). Both are
    pairs indexed by the transport: ``[False]`` UDP, ``[True]`` TCP, so the hot path picks
    one without a branch."""

    __slots__ = ("replies", "hits", "udp_hits", "udp_iovec")

    def __init__(self, replies: tuple[bytes, bytes], hits: tuple[list[int], list[int]]) -> None:
        self.replies = replies
        self.hits = hits
        #: ``hits[False]`` again, and where the UDP reply's bytes are (for the batched
        #: listener's sendmmsg, which fills it in): a UDP hit there reads this object only
        self.udp_hits = hits[0]
        self.udp_iovec: bytes | None = None


class TurningAnswer:
    """A question whose address records turn per reply (:mod:`.rotate`), and its stats cells
    (UDP, TCP)."""

    __slots__ = ("rotation", "hits")

    def __init__(self, rotation: Rotation, hits: tuple[list[int], list[int]]) -> None:
        self.rotation = rotation
        self.hits = hits


class AnswerCache:
    """Encoded answers by cache key, with the services each depends on."""

    __slots__ = ("entries", "turning", "capacity", "_volatile", "_by_service")

    def __init__(self, capacity: int):
        self.entries: dict[bytes, CachedAnswer] = {}
        self.turning: dict[bytes, TurningAnswer] = {}
        self.capacity = capacity
        self._volatile: set[bytes] = set()
        self._by_service: dict[ServiceName, set[bytes]] = {}

    def put(self, key: bytes, entry: CachedAnswer | TurningAnswer, deps: Iterable[ServiceName] | None) -> None:
        if len(self) >= self.capacity:
            self.clear()
        if isinstance(entry, TurningAnswer):
            self.entries.pop(key, None)
            self.turning[key] = entry
        else:
            self.turning.pop(key, None)
            self.entries[key] = entry
        if deps is None:
            self._volatile.add(key)
        else:
            for name in deps:
                self._by_service.setdefault(name, set()).add(key)

    def invalidate(self, services: Iterable[ServiceName]) -> None:
        """Drop the answers of these services and every volatile answer. Keys may sit in
        stale sets after a re-put; dropping too much only costs a re-encode."""
        entries, turning = self.entries, self.turning
        for name in services:
            for key in self._by_service.pop(name, ()):
                entries.pop(key, None)
                turning.pop(key, None)
        for key in self._volatile:
            entries.pop(key, None)
            turning.pop(key, None)
        self._volatile.clear()

    def clear(self) -> None:
        self.entries.clear()  # the same dict objects: the hot path holds references
        self.turning.clear()
        self._volatile.clear()
        self._by_service.clear()

    def __len__(self) -> int:
        return len(self.entries) + len(self.turning)

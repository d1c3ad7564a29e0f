"""Timers the Proxier keeps: one sweep for every ClientIP affinity table, and endpoint grace cuts.

Affinity tables forget a client lazily when it comes back too late; clients that never
come back would stay until the size cap evicts them. One periodic timer sweeps all the
tables instead of one timer per table, and each sweep removes at most ``budget`` entries
(resuming where the last one stopped), so a sweep never stalls the loop.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Hashable, Protocol, Sequence


class Expirable(Protocol):
    def expire(self, now: float, budget: int) -> int: ...


def sweep_tables(tables: Sequence[Expirable], now: float, budget: int, start: int = 0) -> tuple[int, int]:
    """Expire entries across ``tables`` from index ``start`` on, at most ``budget`` in all.

    Returns (entries removed, the index the next sweep starts at): a table whose
    expired entries did not fit in the budget is visited first next time.
    """
    count = len(tables)
    removed = 0
    for step in range(count):
        index = (start + step) % count
        removed += tables[index].expire(now, budget - removed)
        if removed >= budget:
            return removed, index
    return removed, 0


class AffinitySweeper:
    """The one timer for every affinity table of a Proxier."""

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: Callable[[], float], interval: float,
                 budget: int) -> None:
        self._loop = loop
        self._clock = clock
        self._interval = interval
        self._budget = budget
        self._tables: dict[Hashable, Expirable] = {}
        self._next = 0
        self._timer: asyncio.TimerHandle | None = None
        #: entries removed by sweeps so far.
        self.expired = 0

    def track(self, key: Hashable, table: Expirable | None) -> None:
        """Sweep ``table`` from now on (None: stop sweeping what ``key`` had)."""
        if table is None:
            self._tables.pop(key, None)
            return
        self._tables[key] = table
        if self._timer is None:
            self._timer = self._loop.call_later(self._interval, self._tick)

    def __len__(self) -> int:
        return len(self._tables)

    def _tick(self) -> None:
        self._timer = None
        if not self._tables:
            return
        removed, self._next = sweep_tables(list(self._tables.values()), self._clock(), self._budget, self._next)
        self.expired += removed
        self._timer = self._loop.call_later(self._interval, self._tick)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._tables.clear()

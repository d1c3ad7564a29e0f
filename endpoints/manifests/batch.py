"""Running a manifest batch: a generator that yields its disk work and gets the results back.

The batch logic (:mod:`~kubeport.endpoints.manifests.source`) stays free of threads: it yields
each piece of disk work (listing, reading, parsing a chunk). :func:`drive` runs larger work
in a worker thread, so the event loop keeps serving while a large file loads, and work
marked :class:`Inline` (a few stats, a small file) on the loop, where a thread hop would
cost more than the work. :func:`run_sync` runs everything in the caller (``kubeport check``).
:func:`collector_paused` keeps the cyclic garbage collector out of a first load.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any


class Inline:
    """Disk work cheap enough to run on the event loop."""

    __slots__ = ("work",)

    def __init__(self, work: Callable[[], Any]) -> None:
        self.work = work


Batch = Generator["Callable[[], Any] | Inline", Any, None]


def run_sync(batch: Batch) -> None:
    try:
        work = next(batch)
        while True:
            work = batch.send(work.work() if isinstance(work, Inline) else work())
    except StopIteration:
        pass


#: Inline work runs back to back for at most this long before the loop gets a turn (a
#: directory of thousands of small files must not keep health checks and DNS waiting).
YIELD_AFTER_S = 0.01


async def drive(batch: Batch) -> None:
    clock = time.monotonic  # not loop.time(): uvloop's stands still while a callback runs
    resumed = clock()
    try:
        work = next(batch)
        while True:
            if isinstance(work, Inline):
                result = work.work()
                if clock() - resumed > YIELD_AFTER_S:
                    await asyncio.sleep(0)
                    resumed = clock()
            else:
                result = await asyncio.to_thread(work)
                resumed = clock()
            work = batch.send(result)
    except StopIteration:
        pass


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection inside; afterwards every object alive is frozen out of it.

    A first load creates a million long-lived objects (models, slim types) and no reference
    cycles: the collector would traverse them again and again as they pile up (a fifth of
    the load's CPU at 10,000 services) and find nothing. Frozen (``gc.freeze``), they stay
    out of later collections; they are still freed by reference counting when dropped.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.freeze()

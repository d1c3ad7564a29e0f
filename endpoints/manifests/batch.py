"""Running a manifest batch: a generator that yields its disk work and gets the results back.

The batch logic (:mod:`~kubeport.endpoints.manifests.source`) stays free of threads: it yields
each piece of disk work (listing, reading, parsing a chunk). :func:`drive` runs larger work
in a worker thread, so the event loop keeps serving while a large file loads, and work
marked :class:`Inline` (a few stats, parsing a small file) on the loop, where a thread hop
would cost more than the work. Reading a file's bytes is :class:`Disk` work: it runs in a
thread of :class:`DiskThreads` and is awaited no longer than its deadline. A read stuck in
the kernel (a hung FUSE or NFS mount: ``read(2)`` waits, and no signal but a fatal one ends
the wait) is left behind in its thread, the batch goes on with the file as not read, and
the loop never waits on it. :func:`run_sync` runs everything in the caller (``kubeport
check``). :func:`collector_paused` keeps the cyclic garbage collector out of a first load.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

log = logging.getLogger(__name__)


class Inline:
    """Disk work cheap enough to run on the event loop."""

    __slots__ = ("work",)

    def __init__(self, work: Callable[[], Any]) -> None:
        self.work = work


class Disk:
    """Disk work that may hang: done in a :class:`DiskThreads` thread, and when it is not done
    within ``timeout`` seconds, ``late()`` is the result instead."""

    __slots__ = ("work", "timeout", "late")

    def __init__(self, work: Callable[[], Any], timeout: float, late: Callable[[str], Any]) -> None:
        self.work = work
        self.timeout = timeout
        #: called with why the work was left behind
        self.late = late


Batch = Generator["Callable[[], Any] | Inline | Disk", Any, None]


def run_sync(batch: Batch) -> None:
    try:
        work = next(batch)
        while True:
            work = batch.send(work.work() if isinstance(work, (Inline, Disk)) else work())
    except StopIteration:
        pass


#: reads left behind, still stuck, beyond which a new read is not tried: each holds a thread
MAX_STUCK = 4


class DiskThreads:
    """One thread doing disk work at a time, replaced when its work outlives its deadline.

    A thread left behind is a daemon thread (a hung read does not keep the process from
    exiting); once its work returns, it ends. While :data:`MAX_STUCK` of them are still
    stuck, :meth:`run` does not start more: the file system is not answering.

    The hand-over costs what ``asyncio.to_thread`` does (a queue and a wake-up of the loop
    through ``call_soon_threadsafe``), not a thread per read.
    """

    def __init__(self, max_stuck: int = MAX_STUCK) -> None:
        self.max_stuck = max_stuck
        #: reads left behind and not returned yet
        self.stuck = 0
        self._queue: queue.SimpleQueue | None = None

    async def run(self, disk: Disk) -> Any:
        if self.stuck >= self.max_stuck:
            return disk.late(f"{self.stuck} earlier reads are still stuck in the file system")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if self._queue is None:
            self._queue = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(self._queue,), name="manifest-disk", daemon=True).start()
        work_queue = self._queue
        work_queue.put((disk.work, future, loop))
        try:
            return await asyncio.wait_for(asyncio.shield(future), disk.timeout)
        except TimeoutError:
            if self._queue is work_queue:  # its thread is stuck: later work goes to a new one
                self._queue = None
                work_queue.put(None)  # the thread ends once its stuck work returns
            self.stuck += 1
            future.add_done_callback(self._returned)
            log.warning("a manifest read took longer than %g s: left behind in its thread", disk.timeout)
            return disk.late(f"not read within the read timeout ({disk.timeout:g} s): the file system does "
                             "not answer")

    def _returned(self, _future: asyncio.Future[Any]) -> None:
        self.stuck -= 1

    @staticmethod
    def _serve(work_queue: queue.SimpleQueue) -> None:
        while (item := work_queue.get()) is not None:
            work, future, loop = item
            try:
                result, error = work(), None
            except BaseException as exc:  # handed to the awaiting coroutine
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:
                return  # the loop is closed: nobody waits


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


#: Inline work runs back to back for at most this long before the loop gets a turn (a
#: directory of thousands of small files must not keep health checks and DNS waiting).
YIELD_AFTER_S = 0.01


async def drive(batch: Batch, disk: DiskThreads | None = None) -> None:
    clock = time.monotonic  # not loop.time(): uvloop's stands still while a callback runs
    disk = disk or DiskThreads()
    resumed = clock()
    try:
        work = next(batch)
        while True:
            if isinstance(work, Inline):
                result = work.work()
                if clock() - resumed > YIELD_AFTER_S:
                    await asyncio.sleep(0)
                    resumed = clock()
            elif isinstance(work, Disk):
                result = await disk.run(work)
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
    cycles: the collector would traverse them again and again as they pile up (a large
    share of a big load's CPU) and find nothing. Frozen (``gc.freeze``), they stay
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

"""Running manifest batches: inline work, thread work, and the event loop's turns."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

from kubeport.endpoints.manifests.batch import YIELD_AFTER_S, Inline, collector_paused, drive, run_sync


def batch(works, results):
    for work in works:
        results.append((yield work))


def busy(seconds: float):
    def work():
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
        return threading.current_thread().name
    return work


async def test_inline_work_runs_on_the_loop_and_thread_work_does_not():
    results: list = []
    await drive(batch([Inline(busy(0)), busy(0)], results))
    assert results[0] == threading.current_thread().name != results[1]


async def test_a_long_run_of_inline_work_gives_the_loop_turns():
    turns = 0

    async def other_task():
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other_task())
    await asyncio.sleep(0)
    before = turns
    results: list = []
    await drive(batch([Inline(busy(YIELD_AFTER_S / 2)) for _ in range(12)], results))
    task.cancel()
    assert len(results) == 12 and turns - before >= 2  # 6 x YIELD_AFTER_S of work: several turns


def test_run_sync_runs_everything_in_the_caller():
    results: list = []
    run_sync(batch([Inline(busy(0)), busy(0)], results))
    assert results == [threading.current_thread().name] * 2


def test_collector_paused_then_restored_and_frozen():
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    held = [[i] for i in range(1000)]
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() >= frozen + len(held)
    gc.unfreeze()  # leave the test process as it was

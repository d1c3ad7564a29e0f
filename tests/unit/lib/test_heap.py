"""The freed heap goes back to the kernel in a quiet moment after changes, never between two
changes of a burst (a trim walks the whole heap: ~5 ms on the loop at 10,000 services)."""

from __future__ import annotations

import asyncio

import pytest

from kubeport.lib.heap import keep_heap_trimmed, release_freed_memory
from kubeport.lib.quiet import quiet_moment

from support.wait import until


class Releases:
    """Counts the trims asked for; ``available`` False is a C library without malloc_trim."""

    def __init__(self, available: bool = True) -> None:
        self.calls = 0
        self.available = available

    def __call__(self) -> bool:
        self.calls += 1
        return self.available


def test_this_machine_can_trim():
    assert release_freed_memory()  # glibc: CI and the daemon's hosts


async def test_a_burst_is_trimmed_once_after_it_stops():
    changed, releases, trimmed = asyncio.Event(), Releases(), []
    task = asyncio.create_task(keep_heap_trimmed(changed, lambda: trimmed.append(releases.calls),
                                                 quiet=0.2, max_delay=30, release=releases))
    try:
        for _ in range(5):
            changed.set()
            await asyncio.sleep(0.02)  # the burst's pace: well inside the quiet time
            assert releases.calls == 0
        await until(lambda: trimmed == [1], "a trim once the burst stopped", 5)
        changed.set()  # a later change: one more trim
        await until(lambda: trimmed == [1, 2], "a trim after a later change", 5)
    finally:
        task.cancel()


async def test_changes_that_never_stop_are_trimmed_after_max_delay():
    changed, releases = asyncio.Event(), Releases()
    task = asyncio.create_task(keep_heap_trimmed(changed, quiet=10, max_delay=0.1, release=releases))
    try:
        def trimmed() -> bool:
            changed.set()  # a change every 10 ms, never a quiet 10 s
            return releases.calls > 0

        await until(trimmed, "a trim once max_delay passed", 5, interval=0.01)
    finally:
        task.cancel()


async def test_without_malloc_trim_the_task_ends():
    changed, releases, trimmed = asyncio.Event(), Releases(available=False), []
    changed.set()
    await asyncio.wait_for(keep_heap_trimmed(changed, lambda: trimmed.append(1), quiet=0.01, max_delay=1,
                                             release=releases), 5)
    assert releases.calls == 1 and trimmed == []


@pytest.mark.parametrize(
    "quiet, max_delay, pokes, returns_after",
    [
        (0.05, 10.0, 0, "quiet"),  # set once: returns after the quiet time
        (0.5, 10.0, 3, "quiet"),  # each poke inside the quiet time starts it again
        (10.0, 0.05, 0, "max_delay"),  # max_delay shorter than the quiet time: max_delay wins
    ],
    ids=["quiet", "postponed_by_pokes", "max_delay_first"],
)
async def test_quiet_moment(quiet, max_delay, pokes, returns_after):
    loop = asyncio.get_running_loop()
    wanted = asyncio.Event()
    wanted.set()
    started = last_poke = loop.time()
    waiting = asyncio.create_task(quiet_moment(wanted, quiet=quiet, max_delay=max_delay))
    for _ in range(pokes):
        await asyncio.sleep(0.02)
        assert not waiting.done(), "returned inside the quiet time"
        wanted.set()
        last_poke = loop.time()
    await asyncio.wait_for(waiting, 5)
    waited = loop.time() - (last_poke if returns_after == "quiet" else started)
    assert waited >= (quiet if returns_after == "quiet" else max_delay) * 0.9  # timer granularity
    assert not wanted.is_set()

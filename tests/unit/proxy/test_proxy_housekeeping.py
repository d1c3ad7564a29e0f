"""One sweep for every ClientIP affinity table: bounded work, resumes where it stopped."""

from __future__ import annotations

import asyncio

import pytest

from kubeport.proxy.affinity import AffinityTable
from kubeport.proxy.housekeeping import AffinitySweeper, sweep_tables

from support.proxy_loopback import on_uvloop
from support.wait import until


def table_with(clients: int, *, timeout: float = 10.0, last_used: float = 0.0) -> AffinityTable:
    table = AffinityTable(timeout)
    for i in range(clients):
        table.record(f"10.0.0.{i}", "10.244.0.1:80", last_used)
    return table


@pytest.mark.parametrize(
    ("sizes", "budget", "start", "removed", "next_start", "left"),
    [
        pytest.param([3, 2], 10, 0, 5, 0, [0, 0], id="everything_expired_within_budget"),
        pytest.param([3, 2], 4, 0, 4, 1, [0, 1], id="budget_reached__resume_at_the_unfinished_table"),
        pytest.param([3, 2], 4, 1, 4, 0, [1, 0], id="starts_where_the_last_sweep_stopped"),
        pytest.param([], 4, 0, 0, 0, [], id="no_tables__nothing"),
    ],
)
def test_sweep_tables__bounded(sizes, budget, start, removed, next_start, left):
    tables = [table_with(n) for n in sizes]
    assert sweep_tables(tables, now=100.0, budget=budget, start=start) == (removed, next_start)
    assert [len(t) for t in tables] == left


def test_sweep_tables__fresh_entries_stay__sliding_timeout():
    """Expiry counts from the last use, as roundrobin.go expires entries idle for the timeout."""
    stale, fresh = table_with(2, last_used=0.0), table_with(2, last_used=95.0)
    assert sweep_tables([stale, fresh], now=100.0, budget=100) == (2, 0)
    assert (len(stale), len(fresh)) == (0, 2)


@on_uvloop
async def test_sweeper__one_timer_expires_every_tracked_table():
    now = [0.0]
    sweeper = AffinitySweeper(asyncio.get_running_loop(), lambda: now[0], interval=0.01, budget=100)
    try:
        a, b = table_with(3, timeout=1.0), table_with(1, timeout=1.0)
        sweeper.track("a", a)
        sweeper.track("b", b)
        sweeper.track("b", None)  # the port lost its affinity: no longer swept
        now[0] = 5.0
        await until(lambda: len(a) == 0, "the sweep")
        assert len(b) == 1 and sweeper.expired == 3
    finally:
        sweeper.close()

"""The full sync of the host (kube-proxy's full syncs): when it runs, what it puts right, and
that a failure neither ends the daemon nor leaves the next incremental sync building on a
table that is not there."""

from __future__ import annotations

import asyncio

import pytest

from kubeport.proxy import fullsync
from kubeport.proxy.host.nftables import FirewallError, NftFirewall
from kubeport.proxy.table import Frontend

DROPPED = Frontend("10.96.0.20", 80, "TCP")


class FakeProxier:
    def __init__(self, fail: bool = False):
        self.resyncs = 0
        self.host_problems = False
        self.fail = fail

    async def resync_host(self) -> None:
        self.resyncs += 1
        if self.fail:
            raise OSError("nft: no such file")

    async def refresh_node_addresses(self) -> bool:
        self.refreshes = getattr(self, "refreshes", 0) + 1
        return self.refreshes == 1  # the node's addresses changed once


async def test_the_node_addresses_are_read_at_each_event_and_health_checks_follow_a_change():
    proxier = FakeProxier()
    moved: list[bool] = []
    events: asyncio.Queue[None] = asyncio.Queue()

    async def addresses_moved() -> None:
        moved.append(True)

    task = asyncio.create_task(fullsync.follow_node_addresses(proxier, events.get, addresses_moved))
    for _ in range(3):
        events.put_nowait(None)

    async def three_reads() -> None:
        while getattr(proxier, "refreshes", 0) < 3:
            await asyncio.sleep(0)

    await asyncio.wait_for(three_reads(), 5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert proxier.refreshes == 3 and moved == [True]


async def test_the_node_addresses_are_read_on_sighup_not_on_a_timer():
    proxier = FakeProxier()
    await run_for(proxier, asyncio.Event(), True)
    assert getattr(proxier, "refreshes", 0) == 0, "no poll of the node's addresses"
    requested = asyncio.Event()
    requested.set()
    await run_for(proxier, requested, True)
    assert proxier.refreshes == 1


async def run_for(proxier: FakeProxier, requested: asyncio.Event, allowed: bool, turns: int = 3) -> None:
    task = asyncio.create_task(fullsync.keep_host_in_sync(proxier, requested, lambda: allowed))
    for _ in range(turns):
        await asyncio.sleep(0.03)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@pytest.fixture(autouse=True)
def quick_periods(monkeypatch):
    monkeypatch.setattr(fullsync, "RETRY_PERIOD", 0.01)


@pytest.mark.parametrize(("requested", "problems", "allowed", "at_least", "at_most"), [
    pytest.param(False, False, True, 0, 0, id="quiet__nothing_before_the_hour"),
    pytest.param(True, False, True, 1, 1, id="sighup__once"),
    pytest.param(False, True, True, 2, 99, id="host_problems__retried_every_sync_period"),
    pytest.param(True, True, False, 0, 0, id="beside_another_instance__never"),
])
async def test_when_the_full_sync_runs(requested, problems, allowed, at_least, at_most):
    proxier = FakeProxier()
    proxier.host_problems = problems
    event = asyncio.Event()
    if requested:
        event.set()
    await run_for(proxier, event, allowed)
    assert at_least <= proxier.resyncs <= at_most


async def test_a_failed_full_sync_is_logged_and_retried_not_fatal(caplog):
    proxier = FakeProxier(fail=True)
    proxier.host_problems = True
    await run_for(proxier, asyncio.Event(), True)
    assert proxier.resyncs >= 2 and "full sync" in caplog.text


@pytest.mark.parametrize(("fail", "problems", "failed"), [
    pytest.param(False, False, False, id="written__a_full_sync"),
    pytest.param(False, True, True, id="host_problems_after_it__a_failed_full_sync"),
    pytest.param(True, False, True, id="raised__a_failed_full_sync"),
])
async def test_each_full_sync_is_reported_for_the_metrics(fail, problems, failed):
    """kubeproxy_sync_full_proxy_rules_duration_seconds and the failure counter (ProxyMetrics)."""
    proxier = FakeProxier(fail=fail)
    proxier.host_problems = problems
    reported: list[tuple[bool, bool]] = []
    requested = asyncio.Event()
    requested.set()
    task = asyncio.create_task(fullsync.keep_host_in_sync(
        proxier, requested, lambda: True,
        synced=lambda seconds, *, full, failed: reported.append((full, failed))))

    async def one() -> None:
        while not reported:
            await asyncio.sleep(0.001)

    await asyncio.wait_for(one(), 5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert reported[0] == (True, failed)


async def test_a_failed_incremental_nft_batch_makes_the_next_one_whole():
    """kube-proxy: a failed sync sets needFullSync. A delta against a table deleted by hand
    fails every time; the whole table does not."""
    scripts: list[str] = []
    failing: list[bool] = []

    async def run(script: str) -> None:
        scripts.append(script)
        if failing and failing.pop():
            raise FirewallError("No such file or directory")

    firewall = NftFirewall(run=run)
    firewall.enabled = True
    await firewall.sync({})  # the first sync writes the whole table
    assert "delete table" in scripts[-1]
    failing.append(True)  # ...which is then deleted by hand
    with pytest.raises(FirewallError):
        await firewall.sync({DROPPED: False})  # a delta: add one element
    assert "delete table" not in scripts[-1]
    await firewall.sync({DROPPED: False})
    assert "delete table" in scripts[-1]  # the whole table, replacing whatever is there

"""Relay workers: child processes fed the same snapshots, sharing the listeners (SO_REUSEPORT)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from support.proxy_loopback import (
    NODE,
    apply_states,
    echoed,
    greeted_connection,
    greeting,
    on_uvloop,
    running_proxier,
    web,
)
from support.wait import DEADLINE, until

from kubeport.endpoints.types import ServiceName
from kubeport.proxy.stats import ServicePortStats
from kubeport.proxy.table import Frontend
from kubeport.proxy.workers.parent import SAME_NODE, ProxyWorkerError, create_proxier
from kubeport.proxy.workers.worker import SnapshotMirror, StatsReporter

WEB, API = ServiceName("default", "web"), ServiceName("default", "api")


def test_snapshot_mirror__consecutive_generations_changes_and_a_stable_node():
    mirror = SnapshotMirror()
    first = mirror.update(True, NODE, {WEB: web(1), API: web(2, name="api")})
    second = mirror.update(True, SAME_NODE, {API: None})
    assert (first.generation, second.generation) == (1, 2)
    assert set(second.services) == {WEB} and second.changed == frozenset({API})
    assert second.node is first.node and not second.node_changed  # the table context is kept
    assert second.changed_since(first) == frozenset({API})


def test_stats_reporter__only_what_changed_and_what_went_away():
    class Stub:
        stats = {WEB: ServicePortStats(total=1), API: ServicePortStats()}

    reporter = StatsReporter(Stub)
    assert set(reporter.changes()[0]) == {WEB, API}
    assert reporter.changes() is None
    Stub.stats = {WEB: ServicePortStats(total=2)}
    changed, gone = reporter.changes()
    assert changed == {WEB: ServicePortStats(total=2)} and gone == [API]


def test_one_worker__a_plain_proxier():
    from kubeport.proxy.config import ProxyConfig
    from kubeport.proxy.proxier import Proxier

    assert type(create_proxier(ProxyConfig(), "node-a")) is Proxier


@on_uvloop
async def test_two_workers__both_serve__stats_summed__children_gone_after_stop():
    async with running_proxier(workers=2, worker_stats_interval=0.05) as (proxier, _, _, backends):
        await apply_states(proxier, [web(await backends.tcp("a"))])
        assert proxier.ready and proxier.workers == 2
        assert proxier.listening == frozenset({Frontend("127.0.0.10", 80, "TCP")})
        for _ in range(40):
            assert await greeting("127.0.0.10") == "a"
        await until(lambda: proxier.stats[next(iter(proxier.stats))].total == 40, "the workers' reports")
        child = proxier.pids[0]
        await proxier.stop(1.0)
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)


@on_uvloop
async def test_two_workers__endpoint_change_reaches_every_worker():
    async with running_proxier(workers=2) as (proxier, _, _, backends):
        first = await apply_states(proxier, [web(await backends.tcp("a"))])
        await apply_states(proxier, [web(await backends.tcp("b"))], previous=first)
        assert {await greeting("127.0.0.10") for _ in range(30)} == {"b"}


@on_uvloop
async def test_two_workers__client_affinity_holds_across_workers():
    """One client, one worker, so one affinity table (steered over SO_REUSEPORT, socket(7))."""
    async with running_proxier(workers=2) as (proxier, _, _, backends):
        state = web(await backends.tcp("a"), await backends.tcp("b"), affinity_timeout=600)
        await apply_states(proxier, [state])
        for client in (f"127.0.0.{i}" for i in range(100, 106)):
            assert len({await greeting("127.0.0.10", source=client) for _ in range(8)}) == 1, client


@on_uvloop
async def test_a_worker_that_dies_is_started_again_and_a_crash_loop_is_reported():
    """Only the dead worker's connections are lost; dying three times within a minute fails."""
    async with running_proxier(workers=2) as (proxier, _, _, backends):
        await apply_states(proxier, [web(await backends.tcp("a"))])
        reader, writer, _ = await greeted_connection("127.0.0.10")
        holder = _relaying(writer.get_extra_info("sockname")[1], proxier.pids)
        for crash in (1, 2):
            doomed = next(pid for pid in proxier.pids if pid != holder)
            os.kill(doomed, signal.SIGKILL)
            await until(lambda crash=crash: proxier.replaced == crash and proxier.workers == 2,
                        "the worker started again")
            assert doomed not in proxier.pids and holder in proxier.pids
            assert {await greeting("127.0.0.10") for _ in range(10)} == {"a"}  # its table came whole
            assert await echoed(reader, writer, b"kept\n") == b"kept\n"
        assert proxier.worker_status.endswith(", 2 started again after a crash")
        writer.close()
        os.kill(holder, signal.SIGKILL)
        with pytest.raises(ProxyWorkerError, match="worker"):
            await asyncio.wait_for(proxier.wait_failed(), DEADLINE)


def _relaying(client_port: int, pids: tuple[int, ...]) -> int:
    """The worker holding the accepted end of the client's connection to 127.0.0.10:80."""
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.read().splitlines()[1:]]
    inode = next(row[9] for row in rows if row[1] == "0A00007F:0050" and row[2] == f"0100007F:{client_port:04X}")
    return next(pid for pid in pids if any(os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]"
                                           for fd in os.listdir(f"/proc/{pid}/fd")))

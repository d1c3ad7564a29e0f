"""Seamless-restart coordination, configuration reloads (SIGHUP, a changed file) and log set-up: the pure or in-process parts."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

import pytest

from kubeport import components, config
from kubeport.survival import handover
from kubeport.readiness import LIVE_VALIDITY, LiveFile, ReadyFile
from kubeport.reload import Reloader

from support.wait import until


def unique_node() -> str:
    return f"test-node-{os.getpid()}-{id(object())}"


async def test_first_instance_claims_the_node_and_a_second_takes_over():
    node = unique_node()
    left = asyncio.Event()
    first = handover.Instance(node, left.set)
    assert await first.claim()
    second = handover.Instance(node, lambda: None)
    assert not await second.claim()
    assert second.predecessor
    async with asyncio.timeout(5):
        await second.take_over()
        await left.wait()
    assert not second.predecessor
    assert handover.abstract_name_in_use(node)
    # A third instance now talks to the second one.
    third = handover.Instance(node, lambda: None)
    assert not await third.claim()
    second.release()
    assert not handover.abstract_name_in_use(node)


async def announced(on_takeover=lambda: None, successor_on_takeover=lambda: None,
                    ) -> tuple[str, handover.Instance, handover.Instance]:
    """A running instance and a successor that has announced itself to it."""
    node = unique_node()
    first = handover.Instance(node, on_takeover)
    assert await first.claim()
    second = handover.Instance(node, successor_on_takeover)
    assert not await second.claim()
    await second.announce()
    await until(lambda: first.successors == 1, "the successor announced", 5)
    return node, first, second


def end_the_predecessor(first: handover.Instance) -> None:
    """What its process ending does: the name and its side of every link close."""
    first.release()
    for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
        task.cancel()


async def test_an_announced_successor_is_known_until_it_takes_over():
    """From its start, the successor holds a connection: a predecessor stopped before the
    handover then leaves the node's addresses to it (see Daemon._shutdown)."""
    left = asyncio.Event()
    node, first, second = await announced(left.set)
    async with asyncio.timeout(5):
        await second.take_over()  # over the announced connection
        await left.wait()
    await until(lambda: first.successors == 0, "the successor gone", 5)
    assert handover.abstract_name_in_use(node)
    second.release()


async def test_a_successor_that_dies_before_taking_over_is_forgotten():
    _, first, second = await announced()
    second._link[1].close()  # what the kernel does when the process dies
    await until(lambda: first.successors == 0, "the successor gone", 5)
    first.release()


async def test_a_predecessor_gone_after_the_announcement_is_not_waited_for():
    node, first, second = await announced()
    end_the_predecessor(first)
    async with asyncio.timeout(5):
        await second.take_over(timeout=2)
    assert not second.predecessor and handover.abstract_name_in_use(node)
    second.release()


async def test_a_predecessor_gone_before_the_successor_is_ready_is_taken_over_at_once():
    node, first, second = await announced()
    end_the_predecessor(first)
    async with asyncio.timeout(5):
        await second.take_over_once(asyncio.Event())  # never ready
    assert handover.abstract_name_in_use(node)
    second.release()


async def test_a_ready_successor_takes_over_over_the_announced_link():
    left = asyncio.Event()
    _, first, second = await announced(left.set)
    ready = asyncio.Event()
    ready.set()
    async with asyncio.timeout(5):
        await second.take_over_once(ready)
        await left.wait()
    second.release()


async def test_take_over_without_a_living_predecessor_just_claims():
    node = unique_node()
    instance = handover.Instance(node, lambda: None)
    async with asyncio.timeout(5):
        await instance.take_over(timeout=1)
    assert handover.abstract_name_in_use(node)
    instance.release()


class FakeDns:
    def __init__(self):
        self.configs = []

    async def reconfigure(self, dns_config):
        self.configs.append(dns_config)


@pytest.mark.parametrize(
    "change, applied, kept",
    [
        pytest.param({"dns": {"ttl": 30}}, {"dns"}, [], id="dns_ttl_live"),
        pytest.param({"logFormat": "json"}, {"log_format", "verbosity"}, [], id="log_format_live"),
        pytest.param({"stateDir": "/elsewhere"}, set(), ["state_dir"], id="state_dir_needs_restart"),
        pytest.param({}, set(), [], id="nothing_changed"),
    ],
)
async def test_apply_live(change, applied, kept):
    running = config.build(None, {"manifests": "examples"})
    new = config.build(None, {"manifests": "examples", **change})
    dns = FakeDns()
    done, restart = await components.apply_live(running, new, dns)
    assert set(done) == applied
    assert restart == kept
    assert len(dns.configs) == (1 if "dns" in applied else 0)
    if dns.configs:
        assert dns.configs[0].ttl == 30
    config_module_reset()


def config_module_reset():
    from kubeport.lib.logformat import configure_logging

    configure_logging("text", 0)


async def test_reloader_keeps_running_config_on_a_bad_file(tmp_path: Path):
    path = tmp_path / "c.yaml"
    path.write_text("apiVersion: kubeport.io/v1alpha1\nkind: KubeportConfiguration\ndns: {ttl: 7}\n")
    seen = []

    async def apply(new):
        seen.append(new.dns.ttl)

    reloader = Reloader(path, {})
    task = asyncio.create_task(reloader.run(apply))
    reloader.request()
    async with asyncio.timeout(2):
        while not seen:
            await asyncio.sleep(0)
    path.write_text("apiVersion: kubeport.io/v1alpha1\nkind: KubeportConfiguration\ndns: {ttl: lots}\n")
    reloader.request()
    async with asyncio.timeout(2):
        while not reloader.failures:
            await asyncio.sleep(0)
    task.cancel()
    assert seen == [7] and reloader.reloads == 1



def test_handover_works_on_uvloop_too():
    import uvloop

    uvloop.run(test_first_instance_claims_the_node_and_a_second_takes_over())



@pytest.mark.parametrize(
    ("verbosity", "library_level"),
    [pytest.param(0, "WARNING", id="default"),
     pytest.param(4, "WARNING", id="kube_proxy_manifests_v4__libraries_stay_quiet"),
     pytest.param(6, "DEBUG", id="klog_request_level__libraries_debug")],
)
def test_library_debug_only_from_klog_level_6(verbosity, library_level):
    import logging

    from kubeport.lib.logformat import configure_logging

    root = logging.getLogger()
    saved = root.handlers[:], root.level, logging.getLogger("asyncio").level
    try:
        configure_logging("text", verbosity)
        assert logging.getLevelName(logging.getLogger("asyncio").level) == library_level
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
        logging.getLogger("asyncio").setLevel(saved[2])


async def test_reloader_watch_requests_a_reload_when_the_content_changes(tmp_path: Path):
    path = tmp_path / "c.yaml"
    path.write_text("apiVersion: kubeport.io/v1alpha1\nkind: KubeportConfiguration\n")
    reloader = Reloader(path, {})
    ticks = asyncio.Queue()
    proceed = asyncio.Event()

    async def sleep(_seconds):
        await ticks.put(None)
        await proceed.wait()
        proceed.clear()

    async def tick():
        proceed.set()
        await ticks.get()  # the watch made its comparison and sleeps again

    task = asyncio.create_task(reloader.watch(sleep=sleep))
    async with asyncio.timeout(2):
        await ticks.get()
        await tick()
        assert not reloader._requested.is_set()  # unchanged content: nothing to do
        path.unlink()
        await tick()
        assert not reloader._requested.is_set()  # gone for a moment: keep the last content
        path.write_text("apiVersion: kubeport.io/v1alpha1\nkind: KubeportConfiguration\ndns: {ttl: 9}\n")
        await tick()
        assert reloader._requested.is_set()  # new content, as a ConfigMap update writes it
    task.cancel()


def test_ready_file_is_present_only_while_ready_and_never_half_written(tmp_path: Path):
    path = tmp_path / "ready"
    ready = ReadyFile(path)
    ready.update(True)
    assert path.read_text() == f"{os.getpid()}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["ready"]  # the scratch file was renamed
    ready.update(False)
    assert not path.exists()
    ReadyFile(None).update(True)  # no file asked for: nothing written anywhere


def test_ready_file_that_cannot_be_written_is_retried_at_the_next_update(tmp_path: Path, caplog):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    ready = ReadyFile(blocker / "ready")
    ready.update(True)
    assert "readiness file" in caplog.text
    blocker.unlink()
    blocker.mkdir()
    ready.update(True)  # not remembered as written: tried again
    assert (blocker / "ready").exists()


def test_ready_file_left_by_a_killed_process_is_removed_at_start(tmp_path: Path):
    """A container restarted after SIGKILL or an OOM kill finds its predecessor's file in the
    pod's emptyDir: it must not look ready before it is."""
    path = tmp_path / "ready"
    path.write_text("4242\n")
    (tmp_path / ".ready.4242").write_text("42")  # a write cut short
    ReadyFile(path)
    assert list(tmp_path.iterdir()) == []


async def test_an_instance_of_an_earlier_generation_never_asks_a_later_one_to_leave():
    """A DaemonSet's old pod restarted during a rollout must not take the node back."""
    node = unique_node()
    left = asyncio.Event()
    holder = handover.Instance(node, left.set, generation=2)
    assert await holder.claim()
    older = handover.Instance(node, lambda: None, generation=1)
    assert not await older.claim()
    await older.announce()
    assert older.refused
    ready = asyncio.Event()
    ready.set()
    taking = asyncio.create_task(older.take_over_once(ready))
    await until(lambda: holder.successors == 1, "the successor announced", 5)
    assert not taking.done() and not left.is_set()  # ready, and still waiting
    holder.leave()  # the later one goes: the earlier one takes the node rather than none
    async with asyncio.timeout(5):
        await taking
    assert handover.abstract_name_in_use(node)
    older.release()


async def test_leaving_on_its_own_hands_the_node_to_the_successors_at_once():
    node, first, second = await announced()
    first.leave()
    assert first.left_to == 1
    async with asyncio.timeout(5):
        await second.take_over_once(asyncio.Event())  # not ready: taken all the same
    assert await first.claimed_by_another()
    second.release()


async def test_a_handed_over_instance_idles_until_signalled_or_nothing_serves_the_node():
    node = unique_node()
    holder = handover.Instance(node, lambda: None)
    assert await holder.claim()
    signalled = asyncio.Event()
    waiting = asyncio.create_task(handover.idle_until(signalled, node, interval=0.01))
    await asyncio.sleep(0.05)  # several checks find the node held
    assert not waiting.done()
    holder.release()
    async with asyncio.timeout(5):
        assert await waiting is False
    signalled.set()
    assert await handover.idle_until(signalled, node) is True


async def test_two_successors__the_later_one_takes_the_node_from_the_first_to_take_it():
    """A third instance started during a handover: the predecessor acknowledges it too, but the
    name is held by then; it follows the new holder instead of failing."""
    left = [asyncio.Event(), asyncio.Event()]
    node, first, second = await announced(left[0].set, successor_on_takeover=left[1].set)
    third = handover.Instance(node, lambda: None)
    assert not await third.claim()
    await third.announce()
    await until(lambda: first.successors == 2, "both successors announced", 5)
    ready = asyncio.Event()
    ready.set()
    async with asyncio.timeout(10):
        await second.take_over_once(ready)
        await third.take_over_once(ready)
        await left[1].wait()  # the second was asked to leave in turn
    assert left[0].is_set() and not third.predecessor
    third.release()


def test_live_file_vouches_for_a_while_only_while_live(tmp_path: Path, caplog):
    path = tmp_path / "live"
    now = [1000.0]
    live = LiveFile(path, clock=lambda: now[0])
    live.renew(True)
    assert path.read_text() == f"{int(1000 + LIVE_VALIDITY)}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["live"]  # written whole, then renamed
    now[0] = 1005.0
    live.renew(False)  # not live (an update pending past the health timeout): left to expire
    assert path.read_text() == f"{int(1000 + LIVE_VALIDITY)}\n"
    path.unlink()
    path.mkdir()  # cannot be written: said once, not at every renewal
    live.renew(True)
    live.renew(True)
    assert caplog.text.count("liveness file") == 1
    LiveFile(None).renew(True)  # no file asked for: nothing written anywhere


def test_live_file_left_by_a_killed_process_is_removed_at_start(tmp_path: Path):
    path = tmp_path / "live"
    path.write_text("99999999999\n")
    (tmp_path / ".live.4242").write_text("9")
    LiveFile(path)
    assert list(tmp_path.iterdir()) == []


async def test_live_file_is_renewed_until_the_process_ends_then_removed(tmp_path: Path):
    path = tmp_path / "live"
    keeping = asyncio.create_task(LiveFile(path).keep(lambda now: True))
    await until(path.exists, "the live file written", 5)
    assert 0 < int(path.read_text()) - time.time() <= LIVE_VALIDITY
    keeping.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await keeping
    assert not path.exists()

"""A manifest file broken at start-up is served from the last version of it that parsed,
saved in the state directory: a restart loses nothing that worked before it."""

from __future__ import annotations

import asyncio
import logging

from kubeport.endpoints.registry.store import AllocationStore
from kubeport.endpoints.manifests.lastgood import DIRECTORY_NAME, LastGoodFiles
from kubeport.endpoints.manifests.read import content_digest
from kubeport.endpoints.types import ServiceName

from support.manifests import WEB, Harness, endpoint_slice, manifests, running, service  # noqa: F401  (a fixture)
from support.wait import until

BROKEN = "  oops: [\n"


def start(manifests, state_dir, store=None) -> Harness:
    harness = Harness(manifests, store, last_good=LastGoodFiles.in_state_dir(state_dir))
    harness.source.load()
    return harness


def test_a_file_broken_at_start_up_is_served_from_its_saved_version(manifests, tmp_path):
    store = AllocationStore(tmp_path / "allocations.db")
    harness = Harness(manifests, store, last_good=LastGoodFiles.in_state_dir(tmp_path))
    harness.write("web.yaml", service(port=80) + "---\n" + endpoint_slice())
    harness.source.load()
    cluster_ip = harness.state.snapshot.services[WEB].service.cluster_ips

    # Broken while the daemon was down: the restart serves what the file held, and says so.
    harness.write("web.yaml", service(port=81) + BROKEN)
    restarted = start(manifests, tmp_path, store)
    snap = restarted.state.snapshot
    assert restarted.ports() == [80] and len(snap.services[WEB].slices) == 1
    assert snap.services[WEB].service.cluster_ips == cluster_ip
    problems = restarted.source.problems
    assert problems[0].startswith("web.yaml: YAML syntax error at line")
    assert problems[-1].startswith("web.yaml: serving the version that last parsed (saved ")
    assert len(problems) == 2


async def test_fixing_the_file_replaces_the_saved_version(manifests, tmp_path):
    first = Harness(manifests, last_good=LastGoodFiles.in_state_dir(tmp_path))
    first.write("web.yaml", service(port=80) + "---\n" + service(name="old", port=80))
    first.source.load()
    first.write("web.yaml", service(port=81) + BROKEN)
    harness = start(manifests, tmp_path)
    assert ServiceName("default", "old") in harness.state.snapshot.services
    async with running(harness):
        harness.write("web.yaml", service(port=82))
        await harness.until(lambda: harness.ports() == [82])
        assert harness.source.problems == []
        assert ServiceName("default", "old") not in harness.state.snapshot.services
    # The fixed version is the one saved now.
    harness.write("web.yaml", BROKEN)
    assert start(manifests, tmp_path).ports() == [82]


async def test_a_deleted_file_takes_its_saved_version_with_it(manifests, tmp_path):
    harness = Harness(manifests, last_good=LastGoodFiles.in_state_dir(tmp_path))
    harness.write("web.yaml", service(port=80))
    async with running(harness):
        (manifests / "web.yaml").unlink()
        await harness.until(lambda: WEB not in harness.state.snapshot.services)
    harness.write("web.yaml", BROKEN)
    assert WEB not in start(manifests, tmp_path).state.snapshot.services


def test_a_file_deleted_while_the_daemon_was_down_is_forgotten(manifests, tmp_path):
    start_with = Harness(manifests, last_good=LastGoodFiles.in_state_dir(tmp_path))
    start_with.write("web.yaml", service(port=80))
    start_with.source.load()
    (manifests / "web.yaml").unlink()
    start(manifests, tmp_path)  # sees no web.yaml
    start_with.write("web.yaml", BROKEN)
    assert WEB not in start(manifests, tmp_path).state.snapshot.services


def test_an_unchanged_file_is_not_saved_again(manifests, tmp_path):
    Harness(manifests).write("web.yaml", service(port=80))
    start(manifests, tmp_path)
    saved_at = saved_times(tmp_path)
    start(manifests, tmp_path)
    assert saved_times(tmp_path) == saved_at and "web.yaml" in saved_at


def saved_times(state_dir) -> dict[str, int]:
    files = state_dir / DIRECTORY_NAME / "files"
    return {copy.name: copy.stat().st_mtime_ns for copy in files.iterdir()}


def test_a_state_directory_that_cannot_hold_the_copies_costs_only_the_copies(manifests, tmp_path, caplog):
    caplog.set_level(logging.ERROR)
    Harness(manifests).write("web.yaml", service(port=80))
    not_a_directory = tmp_path / "state"
    not_a_directory.write_text("")
    harness = start(manifests, not_a_directory)
    assert harness.ports() == [80] and harness.source.problems == []
    assert "last good manifests" in caplog.text and "cannot keep copies" in caplog.text


async def test_copies_wait_for_a_quiet_moment(tmp_path):
    """A burst of changes is saved once it stops (or at the latest after max_delay), never
    between two changes of the burst."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    last_good = LastGoodFiles(tmp_path / "state")
    copy = last_good.files / "web.yaml"
    wanted = asyncio.Event()
    saver = asyncio.create_task(last_good.keep_saving(wanted, manifests, quiet=0.2, max_delay=30))
    try:
        for port in (80, 81, 82):
            (manifests / "web.yaml").write_text(service(port=port))
            last_good.keep("web.yaml", content_digest((manifests / "web.yaml").read_bytes()))
            wanted.set()
            await asyncio.sleep(0.02)  # the burst's pace: well inside the quiet time
            assert not copy.exists()
        await until(copy.exists, "a copy once the burst stopped", 5)
        assert copy.read_text() == service(port=82)
    finally:
        saver.cancel()


async def test_a_burst_that_never_stops_is_saved_after_max_delay(tmp_path):
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    last_good = LastGoodFiles(tmp_path / "state")
    wanted = asyncio.Event()
    saver = asyncio.create_task(last_good.keep_saving(wanted, manifests, quiet=10, max_delay=0.1))
    try:
        (manifests / "web.yaml").write_text(service(port=80))
        last_good.keep("web.yaml", content_digest((manifests / "web.yaml").read_bytes()))
        def saved() -> bool:
            wanted.set()  # a change every 10 ms, never a quiet 10 s
            return (last_good.files / "web.yaml").exists()

        await until(saved, "a copy once max_delay passed", 5, interval=0.01)
    finally:
        saver.cancel()

"""Files replaced in every way a tool saves them, and directories emptied: the source keeps each
object and its allocations throughout, and deletes only what is deleted for good. Real files
and a real inotify watch; waits are on conditions with deadlines."""

from __future__ import annotations

import asyncio
import contextlib
import shutil

from kubeport.endpoints.manifests.lastgood import LastGoodFiles
from kubeport.endpoints.manifests.watch import ALLOW_EMPTY_MARKER
from kubeport.endpoints.registry.store import AllocationStore
from kubeport.endpoints.types import ServiceName

from support.manifests import WEB, Harness, manifests, running, service  # noqa: F401  (a fixture)

API = ServiceName("default", "api")


@contextlib.asynccontextmanager
async def every_snapshot(harness: Harness):
    """The snapshots published meanwhile, each as the set of its services."""
    seen: list[set[ServiceName]] = []

    async def follow() -> None:
        generation = harness.state.snapshot.generation
        while True:
            snap = await harness.state.wait_newer(generation)
            seen.append(set(snap.services))
            generation = snap.generation

    task = asyncio.create_task(follow())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def allocation(harness: Harness, name: ServiceName = WEB) -> tuple:
    svc = harness.state.snapshot.services[name].service
    return svc.uid, svc.cluster_ips


async def test_unlinked_then_written_slowly__never_absent(manifests):
    harness = Harness(manifests, gone_grace_ms=60_000)
    harness.write("web.yaml", service(port=80))
    async with running(harness), every_snapshot(harness) as seen:
        before = allocation(harness)
        (manifests / "web.yaml").unlink()
        with open(manifests / "web.yaml", "w") as writer:  # created empty, held open
            harness.write("sentinel.yaml", service("sentinel"))  # a batch runs meanwhile
            await harness.until(lambda: ServiceName("default", "sentinel") in harness.state.snapshot.services)
            assert harness.ports() == [80]
            writer.write(service(port=81))
        await harness.until(lambda: harness.ports() == [81])
        assert allocation(harness) == before
        assert all(WEB in services for services in seen), seen


async def test_moved_away_then_recreated_within_the_grace__kept(manifests, tmp_path):
    harness = Harness(manifests, gone_grace_ms=60_000)
    harness.write("web.yaml", service(port=80))
    async with running(harness), every_snapshot(harness) as seen:
        before = allocation(harness)
        batches = harness.batches()
        (manifests / "web.yaml").rename(tmp_path / "web.yaml.old")
        await harness.until(lambda: harness.batches() > batches)
        assert harness.ports() == [80] and harness.source.problems == []
        harness.write("web.yaml", service(port=81))
        await harness.until(lambda: harness.ports() == [81])
        assert allocation(harness) == before
        assert all(WEB in services for services in seen), seen


async def test_deleted_for_good__released_after_the_grace(manifests):
    harness = Harness(manifests, gone_grace_ms=200)
    harness.write("web.yaml", service(cluster_ip="10.96.0.50"))
    harness.write("api.yaml", service("api"))
    async with running(harness):
        (manifests / "web.yaml").unlink()
        await harness.until(lambda: WEB not in harness.state.snapshot.services)
        assert "10.96.0.50" not in harness.registry.registry.service_cluster_ips()
        assert harness.source.problems == [] and harness.source.files_loaded == 1


async def test_emptied_then_appended_within_the_grace__never_absent(manifests):
    """`: > web.yaml; cat new >> web.yaml`: closed empty in between, held as a deleted file is."""
    harness = Harness(manifests, gone_grace_ms=60_000)
    harness.write("web.yaml", service(port=80))
    async with running(harness), every_snapshot(harness) as seen:
        before = allocation(harness)
        (manifests / "web.yaml").write_text("")
        batches = harness.batches()
        harness.write("sentinel.yaml", service("sentinel"))  # a batch after the emptying's
        await harness.until(lambda: harness.batches() > batches
                            and ServiceName("default", "sentinel") in harness.state.snapshot.services)
        assert harness.ports() == [80]
        with open(manifests / "web.yaml", "a") as out:
            out.write(service(port=81))
        await harness.until(lambda: harness.ports() == [81])
        assert allocation(harness) == before
        assert all(WEB in services for services in seen), seen


async def test_emptied_for_good__deleted_after_the_grace(manifests):
    harness = Harness(manifests, gone_grace_ms=200)
    harness.write("web.yaml", service(cluster_ip="10.96.0.50"))
    harness.write("api.yaml", service("api"))
    async with running(harness):
        (manifests / "web.yaml").write_text("")
        await harness.until(lambda: WEB not in harness.state.snapshot.services)
        assert "10.96.0.50" not in harness.registry.registry.service_cluster_ips()
        assert harness.source.problems == []


async def test_edited_to_declare_nothing__deleted_at_once__not_held(manifests):
    """Only zero bytes is an emptying in progress; a file saved with comments alone is an edit."""
    harness = Harness(manifests, gone_grace_ms=60_000)
    harness.write("web.yaml", service())
    harness.write("api.yaml", service("api"))
    async with running(harness):
        (manifests / "web.yaml").write_text("# moved to api.yaml\n")
        await harness.until(lambda: WEB not in harness.state.snapshot.services)
        assert harness.source.problems == []


async def test_files_removed_one_by_one__deleted(manifests):
    harness = Harness(manifests, gone_grace_ms=100)
    harness.write("web.yaml", service())
    harness.write("api.yaml", service("api"))
    async with running(harness):
        (manifests / "web.yaml").unlink()
        await harness.until(lambda: WEB not in harness.state.snapshot.services)
        (manifests / "api.yaml").unlink()  # the last one: the directory is empty, one file at a time
        await harness.until(lambda: not harness.state.snapshot.services)
        assert harness.source.problems == []


async def test_every_file_removed_at_once__held_until_the_marker(manifests):
    harness = Harness(manifests, gone_grace_ms=100)
    harness.write("web.yaml", service())
    harness.write("api.yaml", service("api"))
    async with running(harness):
        before = allocation(harness), allocation(harness, API)
        for path in list(manifests.iterdir()):  # as `rm M/*`
            path.unlink()
        await harness.until(lambda: bool(harness.source.problems))
        [problem] = harness.source.problems
        assert "all its 2 manifest files disappeared at once: serving the objects of api.yaml, web.yaml" in problem
        assert ALLOW_EMPTY_MARKER in problem
        batches = harness.batches()
        harness.write("other.yaml", service("other"))  # later batches, past the grace: still held
        await harness.until(lambda: harness.batches() > batches + 1 or len(harness.state.snapshot.services) == 3)
        assert (allocation(harness), allocation(harness, API)) == before
        (manifests / ALLOW_EMPTY_MARKER).touch()
        await harness.until(lambda: set(harness.state.snapshot.services) == {ServiceName("default", "other")})
        assert harness.source.problems == []


async def test_directory_recreated_empty__held__files_back_keep_their_allocations(manifests):
    harness = Harness(manifests, gone_grace_ms=100)
    harness.write("web.yaml", service())  # one file: the directory's own identity tells
    async with running(harness), every_snapshot(harness) as seen:
        before = allocation(harness)
        shutil.rmtree(manifests)
        manifests.mkdir()
        await harness.until(lambda: any("the directory was replaced" in p for p in harness.source.problems))
        assert allocation(harness) == before
        harness.write("web.yaml", service())
        await harness.until(lambda: harness.source.problems == [])
        assert allocation(harness) == before
        assert all(WEB in services for services in seen), seen


async def test_directory_gone__reported_and_kept(manifests, tmp_path):
    harness = Harness(manifests, gone_grace_ms=100)
    harness.write("web.yaml", service())
    async with running(harness):
        before = allocation(harness)
        manifests.rename(tmp_path / "elsewhere")
        await harness.until(lambda: any("the manifest directory is gone" in p for p in harness.source.problems))
        assert allocation(harness) == before


async def test_restart_on_an_emptied_directory__serves_the_copies_until_the_files_return(manifests, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    store = AllocationStore(state / "allocations.db")

    def start() -> Harness:
        return Harness(manifests, store, last_good=LastGoodFiles.in_state_dir(state))

    first = start()
    first.write("web.yaml", service())
    first.write("api.yaml", service("api"))
    first.source.load()  # the copies are saved, as at a stop
    before = allocation(first), allocation(first, API)
    saved = tmp_path / "saved"
    shutil.copytree(manifests, saved)
    for path in manifests.iterdir():  # a volume not mounted yet when the daemon starts again
        path.unlink()
    harness = start()
    async with running(harness):
        assert (allocation(harness), allocation(harness, API)) == before
        [problem] = harness.source.problems
        assert "the directory is empty at start-up, and held 2 files before" in problem
        shutil.copytree(saved, manifests, dirs_exist_ok=True)
        await harness.until(lambda: harness.source.problems == [])
        assert (allocation(harness), allocation(harness, API)) == before


async def test_restart_on_an_emptied_directory_with_the_marker__deletes(manifests, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    store = AllocationStore(state / "allocations.db")
    first = Harness(manifests, store, last_good=LastGoodFiles.in_state_dir(state))
    first.write("web.yaml", service())
    first.write("api.yaml", service("api"))
    first.source.load()
    for path in manifests.iterdir():
        path.unlink()
    harness = Harness(manifests, store, last_good=LastGoodFiles.in_state_dir(state))
    async with running(harness):
        assert WEB in harness.state.snapshot.services and harness.source.problems
        (manifests / ALLOW_EMPTY_MARKER).touch()
        await harness.until(lambda: not harness.state.snapshot.services)
        assert harness.source.problems == [] and not harness.registry.allocated_services()


async def test_renamed_to_another_name__taken_over_at_once(manifests):
    harness = Harness(manifests, gone_grace_ms=60_000)
    harness.write("a.yaml", service())
    async with running(harness), every_snapshot(harness) as seen:
        before = allocation(harness)
        (manifests / "a.yaml").rename(manifests / "b.yaml")
        await harness.until(lambda: harness.source.files_loaded == 1 and harness.source.problems == [])
        assert allocation(harness) == before
        assert all(WEB in services for services in seen), seen
        harness.write("b.yaml", service(port=81))  # b.yaml holds it: its edits apply
        await harness.until(lambda: harness.ports() == [81])


async def test_back_but_written_slower_than_the_grace__kept_until_complete(manifests):
    harness = Harness(manifests, gone_grace_ms=300)
    harness.write("web.yaml", service(port=80))
    async with running(harness):
        before = allocation(harness)
        batches = harness.batches()
        (manifests / "web.yaml").unlink()
        await harness.until(lambda: harness.batches() > batches)  # seen gone: its grace runs
        with open(manifests / "web.yaml", "w") as writer:  # back, open past the grace's end
            batches = harness.batches()
            harness.write("sentinel.yaml", service("sentinel"))  # waits for the writer, up to 1 s
            await harness.until(lambda: ServiceName("default", "sentinel") in harness.state.snapshot.services)
            assert harness.ports() == [80]
            assert harness.batches() < batches + 5  # the grace's end is one batch, not one per loop turn
            writer.write(service(port=81))
        await harness.until(lambda: harness.ports() == [81])
        assert allocation(harness) == before


async def test_restart_on_another_empty_directory__serves_even_a_single_copy(manifests, tmp_path):
    # A volume not mounted yet: its one file is not deleted, the directory is another one.
    state = tmp_path / "state"
    state.mkdir()
    store = AllocationStore(state / "allocations.db")
    first = Harness(manifests, store, last_good=LastGoodFiles.in_state_dir(state))
    first.write("web.yaml", service())
    first.source.load()
    before = allocation(first)
    saved = tmp_path / "saved"
    manifests.rename(saved)
    manifests.mkdir()  # another directory at the path
    harness = Harness(manifests, store, last_good=LastGoodFiles.in_state_dir(state))
    async with running(harness):
        assert allocation(harness) == before
        [problem] = harness.source.problems
        assert "(it was another directory or file system then)" in problem
        shutil.copy(saved / "web.yaml", manifests / "web.yaml")
        await harness.until(lambda: harness.source.problems == [])
        assert allocation(harness) == before

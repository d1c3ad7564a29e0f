"""What the manifest reader refuses: files that are not regular files, files over a limit.

Each is a failed read (its objects kept) with a problem line naming the file, and none of
them is opened for reading: a named pipe would block, a device would never end."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import pytest

from kubeport.endpoints.manifests.lastgood import LastGoodFiles
from kubeport.endpoints.manifests.read import (
    MiB,
    NotRegularFile,
    ReadBudget,
    ReadLimits,
    open_regular,
    read_bytes,
    read_manifest,
)
from kubeport.endpoints.manifests.batch import Disk, DiskThreads
from kubeport.endpoints.manifests.source import ManifestSource
from kubeport.endpoints.types import ServiceName

from support.manifests import WEB, Harness, manifests, running, service  # noqa: F401  (a fixture)
from support.wait import DEADLINE, until

SERVICE = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\nspec: {ports: [{port: 80}]}\n"


def _fifo(path):
    os.mkfifo(path)


def _socket(path):
    server = socket.socket(socket.AF_UNIX)
    server.bind(os.fspath(path))
    server.close()  # the socket file stays


def _link_to_zero(path):
    path.symlink_to("/dev/zero")


def _link_to_fifo(path):
    os.mkfifo(path.with_name("pipe"))
    path.symlink_to("pipe")


@pytest.mark.parametrize(
    "make, problem",
    [
        pytest.param(_fifo, "x.yaml: not read: a named pipe (FIFO), not a regular file", id="fifo"),
        pytest.param(_socket, "x.yaml: not read: a socket, not a regular file", id="socket"),
        pytest.param(_link_to_zero, "x.yaml: not read: a symbolic link to a character device (/dev/zero), "
                     "not a regular file", id="link_to_dev_zero"),
        pytest.param(_link_to_fifo, "x.yaml: not read: a symbolic link to a named pipe (FIFO) ({dir}/pipe), "
                     "not a regular file", id="link_to_fifo"),
    ],
)
def test_not_a_regular_file_is_a_failed_read_never_opened(tmp_path, make, problem):
    make(tmp_path / "x.yaml")
    read = read_manifest(tmp_path, "x.yaml")  # a FIFO opened for reading would block here
    assert read.parsed is not None and read.parsed.failed
    assert read.parsed.problems == (problem.format(dir=tmp_path),)


def test_swapped_for_a_fifo_after_the_check_is_opened_without_blocking_and_refused(tmp_path, monkeypatch):
    (tmp_path / "regular.yaml").write_text(SERVICE)
    os.mkfifo(tmp_path / "x.yaml")
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda path, *a, **k: real_stat(tmp_path / "regular.yaml"))
    with pytest.raises(NotRegularFile, match="named pipe"):
        open_regular(tmp_path / "x.yaml")


@pytest.mark.parametrize(
    "sizes, limits, refused",
    [
        pytest.param({"a.yaml": 100}, ReadLimits(file_bytes=100), {}, id="at_the_file_limit_read"),
        pytest.param({"a.yaml": 101}, ReadLimits(file_bytes=100),
                     {"a.yaml": "a.yaml: not read: 101 bytes, over the limit of 100 bytes per file "
                                "(manifestLimits.fileBytes)"}, id="over_the_file_limit"),
        pytest.param({"a.yaml": 60, "b.yaml": 60}, ReadLimits(total_bytes=100),
                     {"b.yaml": "b.yaml: not read: 60 bytes, and the other files read hold 60 bytes: over the "
                                "limit of 100 bytes in all (manifestLimits.totalBytes)"}, id="over_the_total"),
        pytest.param({"a.yaml": 50, "b.yaml": 50}, ReadLimits(total_bytes=100), {}, id="at_the_total"),
    ],
)
def test_size_limits(tmp_path, sizes, limits, refused):
    budget = ReadBudget(limits)
    for name, size in sizes.items():
        (tmp_path / name).write_text("#" * size)
    for name in sizes:
        read = read_manifest(tmp_path, name, budget=budget)
        if name in refused:
            assert read.parsed.failed and read.parsed.problems == (refused[name],)
        else:
            assert not read.parsed.failed, read.parsed.problems


def test_sizes_in_mib():
    budget = ReadBudget()
    assert budget.refusal("a.yaml", 70 * MiB) == (
        "70 MiB, over the limit of 64 MiB per file (manifestLimits.fileBytes)")
    assert budget.refusal("a.yaml", 64 * MiB) is None


def test_a_file_read_again_counts_once_and_a_deleted_one_frees_its_bytes(tmp_path):
    budget = ReadBudget(ReadLimits(total_bytes=100))
    (tmp_path / "a.yaml").write_text("#" * 60)
    (tmp_path / "b.yaml").write_text("#" * 60)
    assert not read_manifest(tmp_path, "a.yaml", budget=budget).parsed.failed
    assert not read_manifest(tmp_path, "a.yaml", budget=budget).parsed.failed  # its own bytes, not twice
    assert read_manifest(tmp_path, "b.yaml", budget=budget).parsed.failed
    (tmp_path / "a.yaml").unlink()
    assert read_manifest(tmp_path, "a.yaml", budget=budget).gone
    assert not read_manifest(tmp_path, "b.yaml", budget=budget).parsed.failed


def test_a_file_growing_while_read_stops_at_the_limit(tmp_path, monkeypatch):
    from kubeport.endpoints.manifests import read as read_module

    (tmp_path / "a.yaml").write_text("#" * 1000)
    real_fstat = os.fstat

    def small_fstat(fd):  # the size when it was opened; the file holds more by the time it is read
        result = real_fstat(fd)
        return os.stat_result((*result[:6], 10, *result[7:]))

    monkeypatch.setattr(read_module.os, "fstat", small_fstat)
    read = read_manifest(tmp_path, "a.yaml", budget=ReadBudget(ReadLimits(file_bytes=100)))
    assert read.parsed.problems == ("a.yaml: not read: grew past 100 bytes while it was read",)


def test_a_read_past_its_timeout_is_abandoned(tmp_path):
    (tmp_path / "a.yaml").write_text("#" * (3 << 20))  # several chunks: the clock is read after each
    read = read_manifest(tmp_path, "a.yaml", budget=ReadBudget(ReadLimits(read_timeout=1e-9)))
    assert read.parsed.failed
    assert read.parsed.problems[0].startswith("a.yaml: not read: not read to its end within the read timeout")


def test_last_good_copy_skips_a_file_swapped_for_a_fifo(tmp_path):
    manifests, state = tmp_path / "m", tmp_path / "state"
    manifests.mkdir()
    (manifests / "x.yaml").write_text(SERVICE)
    read = read_manifest(manifests, "x.yaml")
    copies = LastGoodFiles(state)
    copies.keep("x.yaml", read.content)
    (manifests / "x.yaml").unlink()
    os.mkfifo(manifests / "x.yaml")
    saver = threading.Thread(target=copies.save, args=(copies.take(), manifests), daemon=True)
    saver.start()
    saver.join(5)  # a copy opening the FIFO for reading would block here
    assert not saver.is_alive()
    assert not copies.has("x.yaml")


async def test_a_read_stuck_in_the_kernel_is_left_behind_and_the_loop_keeps_serving(manifests):
    """A read that never returns, as read(2) on a hung FUSE or NFS mount does (put at the
    source's disk seam, ``read_file``: no test can hang a real file system), is abandoned at
    the read timeout: its file is a problem line, the other files load, and the event loop
    is never held."""
    released = threading.Event()

    def hangs_once(directory, path, limits):
        if path == "hung.yaml":
            released.wait(DEADLINE)  # its thread blocks, as in the kernel
        return read_bytes(directory, path, limits)

    harness = Harness(manifests)
    harness.source = ManifestSource(manifests, harness.registry, harness.state, limits=ReadLimits(read_timeout=1.0),
                                    read_file=hangs_once, may_hang=lambda device: True)  # as on NFS or FUSE
    harness.write("hung.yaml", service("hung"))
    harness.write("web.yaml", service())
    loop = asyncio.get_running_loop()
    gaps = [0.0]
    last = [time.monotonic()]

    def tick() -> None:  # the loop's longest stall: gaps between turns of this callback
        now = time.monotonic()
        gaps[0] = max(gaps[0], now - last[0])
        last[0] = now
        handle[0] = loop.call_soon(tick)

    handle = [loop.call_soon(tick)]
    try:
        async with running(harness):
            assert WEB in harness.state.snapshot.services
            assert ServiceName("default", "hung") not in harness.state.snapshot.services
            assert ("hung.yaml: not read: not read within the read timeout (1 s): the file system does not answer"
                    in harness.source.problems)
            assert harness.source._disk.stuck == 1
            assert gaps[0] < 0.5
            released.set()  # the file system answers again: the thread left behind ends
            await until(lambda: harness.source._disk.stuck == 0, "the stuck read to return")
            harness.write("hung.yaml", service("hung", port=81))
            await harness.until(lambda: ServiceName("default", "hung") in harness.state.snapshot.services)
    finally:
        handle[0].cancel()
        released.set()


async def test_while_reads_are_stuck_no_more_threads_are_started():
    disk = DiskThreads(max_stuck=2)
    released = threading.Event()
    started: list[str] = []

    def hang() -> str:
        started.append("read")
        released.wait(DEADLINE)
        return "late"

    try:
        for _ in range(3):
            assert await disk.run(Disk(hang, 0.05, lambda why: why)) in (
                "not read within the read timeout (0.05 s): the file system does not answer",
                "2 earlier reads are still stuck in the file system")
        assert len(started) == 2 and disk.stuck == 2
    finally:
        released.set()
    await until(lambda: disk.stuck == 0, "the stuck reads to return")
    assert await disk.run(Disk(lambda: "read", 1.0, lambda why: why)) == "read"

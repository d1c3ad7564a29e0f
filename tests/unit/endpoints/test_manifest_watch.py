"""The manifest directory watch: inotify events parsed, bursts coalesced (pure, time passed
in), and the asyncio adapter on a real directory (waits on conditions with deadlines)."""

from __future__ import annotations

import asyncio
import itertools
import os
import struct
from pathlib import Path

import pytest

from kubeport.endpoints.manifests.watch import (
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_ISDIR,
    IN_MODIFY,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    Burst,
    Changes,
    DirectoryWatch,
    RawEvent,
    parse_events,
)

from support.wait import DEADLINE

QUIET, SETTLE, MAX_DELAY, WRITE_QUIET = 0.001, 0.05, 1.0, 2.0


def raw(wd: int, mask: int, name: str, pad_to: int = 16) -> bytes:
    encoded = name.encode()
    length = 0 if not encoded else (len(encoded) // pad_to + 1) * pad_to
    return struct.pack("iIII", wd, mask, 0, length) + encoded.ljust(length, b"\0")


def test_parse_events_reads_names_padded_with_nuls():
    buffer = raw(1, IN_MOVED_TO, "web.yaml") + raw(2, IN_DELETE | IN_ISDIR, "team") + raw(1, 0x4000, "")
    assert parse_events(buffer) == [
        RawEvent(1, IN_MOVED_TO, "web.yaml"),
        RawEvent(2, IN_DELETE | IN_ISDIR, "team"),
        RawEvent(1, 0x4000, ""),
    ]


def burst_after(*events: tuple[float, str, int]) -> Burst:
    burst = Burst(QUIET, SETTLE, MAX_DELAY, WRITE_QUIET)
    for now, path, mask in events:
        if path:
            burst.file_event(path, mask, now)
        else:
            burst.structure_event(now)
    return burst


@pytest.mark.parametrize(
    "events, due",
    [
        pytest.param([], None, id="nothing_happened"),
        pytest.param([(10.0, "web.yaml", IN_MOVED_TO)], 10.0 + QUIET, id="atomic_rename__quiet"),
        pytest.param([(10.0, "web.yaml", IN_CREATE), (10.001, "web.yaml", IN_MODIFY),
                      (10.002, "web.yaml", IN_CLOSE_WRITE)], 10.002 + QUIET, id="written_and_closed__quiet"),
        pytest.param([(10.0, "web.yaml", IN_MODIFY)], 10.0 + WRITE_QUIET,
                     id="still_open_for_writing__read_once_quiet_never_half_a_file"),
        pytest.param([(10.0, "web.yaml", IN_CREATE)], 10.0 + WRITE_QUIET, id="created_empty__waits_for_its_writer"),
        pytest.param([(10.0, "web.yaml", IN_CREATE), (10.0, "api.yaml", IN_MOVED_TO)], 10.0 + MAX_DELAY,
                     id="another_file_ready__waits_for_the_writer_up_to_the_cap"),
        pytest.param([(10.0, "web.yaml", IN_MOVED_FROM)], 10.0 + SETTLE, id="file_gone__settles_for_its_successor"),
        pytest.param([(10.0, "web.yaml", IN_MOVED_FROM), (10.01, "web.yaml", IN_CREATE), (10.2, "web.yaml", IN_MODIFY),
                      (10.21, "web.yaml", IN_CLOSE_WRITE)], 10.21 + QUIET, id="editor_renames_old_away_then_writes"),
        pytest.param([(10.0, "web.yaml", IN_DELETE), (10.0, "web.yaml", IN_CREATE), (11.5, "web.yaml", IN_MODIFY),
                      (11.6, "web.yaml", IN_CLOSE_WRITE)], 10.0 + MAX_DELAY,
                     id="slow_writer_past_the_cap__read_at_once_when_closed"),
        pytest.param([(10.0, "", 0)], 10.0 + SETTLE, id="tree_changed_shape__settles"),
        pytest.param([(10.0, "web.yaml", IN_MOVED_FROM)] + [(10.0 + 0.04 * i, "a.yaml", IN_MOVED_TO) for i in range(40)],
                     10.0 + MAX_DELAY, id="endless_stream__capped"),
    ],
)
def test_burst_due(events, due):
    assert burst_after(*events).due() == pytest.approx(due) if due is not None else burst_after(*events).due() is None


# How tools replace a file, event by event, with the time each takes between its steps.
REPLACEMENTS = {
    "rm_then_cp": [(0.0, IN_DELETE), (0.004, IN_CREATE), (0.006, IN_MODIFY), (0.007, IN_CLOSE_WRITE)],
    "writer_pausing_300ms_after_create": [(0.0, IN_DELETE), (0.001, IN_CREATE), (0.301, IN_MODIFY),
                                          (0.302, IN_CLOSE_WRITE)],
    "vim_backup_rename_then_write": [(0.0, IN_MOVED_FROM), (0.002, IN_CREATE), (0.02, IN_MODIFY),
                                     (0.021, IN_CLOSE_WRITE)],
    "shell_redirect_of_a_slow_command": [(0.0, IN_MODIFY), (1.8, IN_MODIFY), (1.81, IN_CLOSE_WRITE)],
    "rm_then_a_writer_slower_than_the_cap": [(0.0, IN_DELETE), (0.001, IN_CREATE), (1.5, IN_MODIFY),
                                             (1.6, IN_CLOSE_WRITE)],
    "git_checkout_unlink_create": [(0.0, IN_DELETE), (0.0005, IN_CREATE), (0.0007, IN_MODIFY),
                                   (0.0008, IN_CLOSE_WRITE)],
}


@pytest.mark.parametrize("steps", REPLACEMENTS.values(), ids=REPLACEMENTS.keys())
def test_a_replaced_file_is_read_only_once_closed(steps):
    """Between each step and the next the burst is not due: the file is read once, complete."""
    burst = Burst(QUIET, SETTLE, MAX_DELAY, WRITE_QUIET)
    for (now, mask), (after, _) in itertools.pairwise(steps):
        burst.file_event("web.yaml", mask, 10.0 + now)
        assert burst.due() > 10.0 + after, f"due before the event at +{after}"
    now, mask = steps[-1]
    burst.file_event("web.yaml", mask, 10.0 + now)
    assert burst.take(burst.due()) == Changes(frozenset({"web.yaml"}), False)


def test_burst_take_resets_but_keeps_files_still_open():
    burst = burst_after((1.0, "a.yaml", IN_MOVED_TO), (1.0, "b.yaml", IN_MODIFY), (1.0, "", 0))
    assert burst.take(1.1) == Changes(frozenset({"a.yaml"}), True, frozenset({"b.yaml"}))
    assert burst.due() == 1.0 + WRITE_QUIET  # b.yaml is read once quiet, if never closed
    burst.file_event("c.yaml", IN_MOVED_TO, 1.2)
    assert burst.due() == 1.2 + MAX_DELAY  # b.yaml was never closed: wait for it, up to the cap
    burst.file_event("b.yaml", IN_CLOSE_WRITE, 1.3)
    assert burst.due() == pytest.approx(1.3 + QUIET)
    assert burst.take(1.4) == Changes(frozenset({"b.yaml", "c.yaml"}), False)


def test_a_file_open_and_quiet_is_read_unless_empty():
    burst = burst_after((1.0, "full.yaml", IN_MODIFY), (1.0, "empty.yaml", IN_CREATE))
    taken = burst.take(1.0 + WRITE_QUIET, is_empty=lambda path: path == "empty.yaml")
    assert taken == Changes(frozenset({"full.yaml"}), False, frozenset({"empty.yaml"}))
    assert burst.due() is None  # the empty one waits for its writer's next event
    assert burst.deferred() == {"empty.yaml"}  # a rescan leaves it out too
    burst.file_event("empty.yaml", IN_CLOSE_WRITE, 9.0)
    assert burst.take(9.1) == Changes(frozenset({"empty.yaml"}), False)


def test_a_link_created_complete_is_not_waited_for():
    burst = Burst(QUIET, SETTLE, MAX_DELAY, WRITE_QUIET)
    burst.file_event("web.yaml", IN_CREATE, 1.0, complete=True)
    assert burst.due() == pytest.approx(1.0 + QUIET)


class Watching:
    def __init__(self, directory: Path) -> None:
        self.watch = DirectoryWatch(directory, quiet_ms=0, settle_ms=20, max_delay_ms=1000,
                                    rescan_interval_ms=60_000)

    async def changes(self) -> Changes:
        async with asyncio.timeout(DEADLINE):
            return await self.watch.next_changes()


@pytest.fixture
async def watching(tmp_path: Path):
    watching = Watching(tmp_path)
    watching.watch.start()
    assert watching.watch.active
    try:
        yield watching
    finally:
        watching.watch.close()


async def test_atomic_rename_names_the_file_and_no_rescan(watching, tmp_path):
    temporary = tmp_path / ".web.yaml.tmp"  # hidden: its own events are not ours
    temporary.write_text("kind: Service\n")
    os.replace(temporary, tmp_path / "web.yaml")
    assert await watching.changes() == Changes(frozenset({"web.yaml"}), False)


async def test_new_subdirectory_is_watched_and_rescanned(watching, tmp_path):
    (tmp_path / "team").mkdir()
    assert (await watching.changes()).rescan
    (tmp_path / "team" / "api.json").write_text("{}")
    assert await watching.changes() == Changes(frozenset({"team/api.json"}), False)


async def test_symlink_swap_of_a_hidden_name_rescans__kubelet_atomic_writer(watching, tmp_path):
    (tmp_path / "..2024_01").mkdir()
    (tmp_path / "..data_tmp").symlink_to("..2024_01")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    assert (await watching.changes()).rescan


async def test_other_files_are_ignored(watching, tmp_path):
    (tmp_path / "README.md").write_text("notes")
    (tmp_path / ".web.yaml.swp").write_text("swap")
    (tmp_path / "web.yaml").write_text("kind: Service\n")
    assert await watching.changes() == Changes(frozenset({"web.yaml"}), False)


async def test_without_inotify_the_directory_is_rescanned_periodically(tmp_path):
    watch = DirectoryWatch(tmp_path / "missing", quiet_ms=0, settle_ms=20, max_delay_ms=1000, rescan_interval_ms=10)
    watch.start()  # the directory does not exist: no watch, a warning, rescans
    try:
        assert not watch.active
        async with asyncio.timeout(DEADLINE):
            assert await watch.next_changes() == Changes(frozenset(), True)
    finally:
        watch.close()


async def test_a_directory_moved_within_the_tree_is_watched_at_its_new_path(watching, tmp_path):
    (tmp_path / "team").mkdir()
    assert (await watching.changes()).rescan
    (tmp_path / "team").rename(tmp_path / "squad")
    assert (await watching.changes()).rescan
    (tmp_path / "squad" / "api.json").write_text("{}")
    assert await watching.changes() == Changes(frozenset({"squad/api.json"}), False)


async def test_a_directory_moved_out_of_the_tree_is_no_longer_reported(watching, tmp_path):
    (tmp_path / "team").mkdir()
    assert (await watching.changes()).rescan
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    (tmp_path / "team").rename(outside)
    assert (await watching.changes()).rescan
    (outside / "api.json").write_text("{}")  # no longer ours: not reported as team/api.json
    (tmp_path / "web.yaml").write_text("kind: Service\n")
    assert await watching.changes() == Changes(frozenset({"web.yaml"}), False)


async def test_a_file_created_empty_is_reported_once_written_and_closed(watching, tmp_path):
    with open(tmp_path / "web.yaml", "w") as writer:
        (tmp_path / "api.yaml").write_text("kind: Service\n")  # ready meanwhile: waits up to the cap
        changes = await watching.changes()
        assert changes == Changes(frozenset({"api.yaml"}), False, frozenset({"web.yaml"}))
        writer.write("kind: Service\n")
    assert await watching.changes() == Changes(frozenset({"web.yaml"}), False)


async def test_a_hard_link_is_complete_when_created(watching, tmp_path):
    (tmp_path / ".staged").write_text("kind: Service\n")
    os.link(tmp_path / ".staged", tmp_path / "web.yaml")
    assert await watching.changes() == Changes(frozenset({"web.yaml"}), False)


async def test_the_directory_itself_deleted_says_so(tmp_path):
    directory = tmp_path / "manifests"
    directory.mkdir()
    watching = Watching(directory)
    watching.watch.start()
    try:
        (directory / "web.yaml").write_text("kind: Service\n")
        assert not (await watching.changes()).replaced
        (directory / "web.yaml").unlink()
        directory.rmdir()
        directory.mkdir()
        changes = await watching.changes()
        assert changes.rescan and changes.replaced
    finally:
        watching.watch.close()

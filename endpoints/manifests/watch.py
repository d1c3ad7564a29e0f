"""Watching the manifest directory: inotify read on the event loop, bursts coalesced.

Why not watchfiles: its Rust side polls its change list every ``step`` ms in a thread that
takes the GIL back at each step, and yields a burst only after a quiet step, so a change
waits one to two steps, and short steps cost a core idling. Here the inotify descriptor is a reader of the event loop: an
event is seen when it happens, and an idle daemon does nothing.

The core (:class:`Burst`, and :func:`~kubeport.lib.inotify.parse_events`) is pure, with time passed in. A burst ends
- ``quiet`` after its last event when it only created or rewrote manifest files (an atomic
  rename, a write that was closed): the common edit is applied within milliseconds;
- ``settle`` after its last event when a manifest file disappeared (an editor that renames
  the old file away before writing the new one must not delete its objects for a moment),
  or when the tree changed shape (a directory, a symlink swap as in a mounted ConfigMap);
- once every file written in it is closed again (never half a file), at the latest
  ``max_delay`` after its first event, without the files still open then.
A file open for writing is never read: one created empty (``rm`` then ``cp``, ``git
checkout``, a shell's ``>``, vim writing its new copy) or being rewritten is read once it
is closed after writing, or once no event came for ``write_quiet`` while it holds bytes (a
writer that never closes it). Until then a batch leaves it out, rescans included
(:attr:`Changes.deferred`), so its objects stay as they were: a tool that unlinks a file and
pauses before writing the new one does not delete them for a moment.
A burst that needs more than its named files (a directory or symlink event, lost events, an
unmount) asks for a rescan of the whole directory by stat. Without inotify (none on this
system, or its limits reached) the directory is rescanned every ``rescan_interval``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from kubeport.endpoints.manifests.read import is_manifest_path
from kubeport.lib import inotify
from kubeport.lib.inotify import (
    IN_ATTRIB,
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_ISDIR,
    IN_MODIFY,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    IN_UNMOUNT,
    RawEvent,
    parse_events,
)

log = logging.getLogger(__name__)

_WATCH_MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
               | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
_GONE = IN_DELETE | IN_MOVED_FROM

#: With no event for this long, the directory is rescanned by stat (missed or remote changes).
RESCAN_INTERVAL_MS = 5_000
#: Quiet time after a burst that removed a manifest file or changed the tree's shape: an
#: editor that renames the old file away before writing the new one gets that long.
SETTLE_MS = 50
#: A burst is applied at the latest this long after its first event.
MAX_DELAY_MS = 1_000
#: A file open for writing that has bytes and no event for this long is read although it was
#: never closed (a writer holding it open; a hard link, which has no close of its own).
WRITE_QUIET_MS = 2_000
#: A file of this name at the top of the directory says that the directory is meant to be
#: emptied (see :mod:`~kubeport.endpoints.manifests.source`): its events ask for a rescan.
ALLOW_EMPTY_MARKER = ".kubeport-allow-empty"


class Changes(NamedTuple):
    """One burst: manifest paths (relative, POSIX) to read again, and whether to rescan all;
    files still open for writing, not to be read even by a rescan; the directories that went
    away as a whole, whatever is at their path now: the directory itself ("") deleted, moved
    or unmounted, a subdirectory unmounted or mounted over."""

    paths: frozenset[str]
    rescan: bool
    deferred: frozenset[str] = frozenset()
    replaced: frozenset[str] = frozenset()


@dataclass
class Burst:
    """Events since the last batch, and when they are due. Pure: ``now`` is passed in."""

    quiet: float
    settle: float
    max_delay: float
    write_quiet: float = WRITE_QUIET_MS / 1e3
    first: float | None = None
    last: float = 0.0
    paths: set[str] = field(default_factory=set)
    #: open for writing (created empty, or modified) and not closed: path -> its last event
    writing: dict[str, float] = field(default_factory=dict)
    #: open for writing, quiet and still empty: left out until their next event
    stalled: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)
    rescan: bool = False
    unsettled: bool = False  # the tree changed shape in this burst
    replaced: set[str] = field(default_factory=set)  # directories gone as a whole in this burst

    def file_event(self, path: str, mask: int, now: float, *, complete: bool = False) -> None:
        """An event on a manifest file (``path`` relative to the directory). ``complete``: an
        IN_CREATE of a file that already holds what it will hold (a link, not an empty file
        opened for writing)."""
        self._touch(now)
        self.paths.add(path)
        self.stalled.discard(path)
        if mask & (IN_CLOSE_WRITE | _GONE | IN_MOVED_TO) or (mask & IN_CREATE and complete):
            self.writing.pop(path, None)
        elif mask & (IN_CREATE | IN_MODIFY) or path in self.writing:
            self.writing[path] = now
        if mask & _GONE:
            self.gone.add(path)
        elif mask & (IN_CREATE | IN_MOVED_TO):
            self.gone.discard(path)

    def structure_event(self, now: float, *, replaced: str | None = None) -> None:
        """A directory or symlink came or went, or events were lost: rescan everything.
        ``replaced``: a directory (relative, "" for the top) that went away as a whole."""
        self._touch(now)
        self.rescan = self.unsettled = True
        if replaced is not None:
            self.replaced.add(replaced)

    def _touch(self, now: float) -> None:
        if self.first is None:
            self.first = now
        self.last = now

    def due(self) -> float | None:
        """When the burst should be applied; None while there is none."""
        written = min(self.writing.values(), default=None)
        written_due = None if written is None else written + self.write_quiet
        if self.first is None or not (self.rescan or self.paths - self.writing.keys()):
            return written_due  # nothing to read but files still being written
        cap = self.first + self.max_delay
        if self.writing:
            ready_due = cap
        else:
            wait = self.settle if self.gone or self.unsettled else self.quiet
            ready_due = min(self.last + wait, cap)
        return ready_due if written_due is None else min(ready_due, written_due)

    def deferred(self) -> frozenset[str]:
        """Files not to read now: open for writing, or quiet while still empty."""
        return frozenset(self.writing.keys() | self.stalled)

    def take(self, now: float, is_empty=lambda path: False) -> Changes:
        """The burst's changes; files open for writing stay out of them until closed, or
        until quiet for ``write_quiet`` while not ``is_empty``."""
        quiet = [path for path, last in self.writing.items() if now >= last + self.write_quiet]
        for path in quiet:
            del self.writing[path]
            if is_empty(path):
                self.stalled.add(path)  # never read empty: its writer's next event brings it back
            else:
                self.paths.add(path)
        deferred = self.deferred()
        changes = Changes(frozenset(self.paths - deferred), self.rescan, deferred, frozenset(self.replaced))
        self.first, self.rescan, self.unsettled, self.replaced = None, False, False, set()
        self.paths, self.gone = set(), set()
        return changes


class DirectoryWatch:
    """The asyncio side: an inotify descriptor on the running loop, feeding a :class:`Burst`."""

    def __init__(self, directory: Path, *, quiet_ms: float = 0, settle_ms: float = SETTLE_MS,
                 max_delay_ms: float = MAX_DELAY_MS, rescan_interval_ms: float = RESCAN_INTERVAL_MS,
                 write_quiet_ms: float = WRITE_QUIET_MS) -> None:
        self.directory = directory
        self._burst = Burst(quiet_ms / 1e3, max(settle_ms, quiet_ms) / 1e3, max_delay_ms / 1e3,
                            write_quiet_ms / 1e3)
        self._rescan_interval = rescan_interval_ms / 1e3
        self._fd: int | None = None
        self._dirs: dict[int, str] = {}  # watch descriptor -> directory, relative ("" for the root)
        self._wakeup = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def active(self) -> bool:
        """inotify works: changes are seen as they happen (else only by periodic rescans)."""
        return self._fd is not None

    def start(self) -> None:
        """Watch the tree; call before the first scan so that no edit falls in between."""
        self._loop = asyncio.get_running_loop()
        try:
            self._fd = inotify.init()
            self._watch_tree("")
            if not self._dirs:
                raise FileNotFoundError(errno.ENOENT, "no such directory")
        except OSError as exc:
            self.close()
            log.warning("manifest directory %s: no inotify (%s): rescanning every %.0f s instead",
                        self.directory, exc.strerror or exc, self._rescan_interval)
            return
        self._loop.add_reader(self._fd, self._on_readable)

    def close(self) -> None:
        if self._fd is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None
        self._dirs.clear()

    async def next_changes(self, wake_after: float | None = None) -> Changes:
        """The next burst, once due; a rescan when nothing happened for ``rescan_interval``;
        no change at all after ``wake_after`` seconds, if given and nothing came first."""
        loop = asyncio.get_running_loop()
        idle_until = loop.time() + self._rescan_interval
        wake_at = None if wake_after is None else loop.time() + max(0.0, wake_after)
        while True:
            due = self._burst.due()
            deadline = idle_until if due is None else due
            if wake_at is not None and wake_at < deadline:
                if loop.time() >= wake_at:
                    return Changes(frozenset(), False, self._burst.deferred())
                deadline = wake_at
            if loop.time() >= deadline:
                if due is not None:
                    changes = self._burst.take(loop.time(), self._is_empty)
                else:
                    changes = Changes(frozenset(), True, self._burst.deferred())
                if changes.rescan and (replaced := self._rewatch()):
                    changes = changes._replace(replaced=changes.replaced | replaced)
                return changes
            self._wakeup.clear()
            try:
                async with asyncio.timeout_at(deadline):
                    await self._wakeup.wait()
            except TimeoutError:
                pass

    # --- inotify ------------------------------------------------------------------------

    def _watch_tree(self, relative: str) -> None:
        """Watch a directory and every non-hidden directory under it (symlinks not followed,
        as the listing does)."""
        top = self.directory / relative if relative else self.directory
        for root, dirs, _files in os.walk(top):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            path = Path(root).relative_to(self.directory).as_posix()
            try:
                wd = inotify.add_watch(self._fd, root, _WATCH_MASK)  # type: ignore[arg-type]
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    continue  # gone meanwhile: its removal is an event of its parent
                raise
            self._dirs[wd] = "" if path == "." else path

    def _rewatch(self) -> frozenset[str]:
        """Bring the watches in line with the tree: directories moved within it or away, the
        directory itself come back (a watch follows an inode, not a path). The directories
        now another inode at the same path: recreated, or a mount come or gone there (an
        unmount has no event while another mount namespace still holds the file system)."""
        if self._fd is None:
            return frozenset()
        before, self._dirs = self._dirs, {}
        try:
            self._watch_tree("")
        except OSError as exc:
            log.warning("manifest directory %s: cannot watch (%s): it is rescanned every %.0f s",
                        self.directory, exc.strerror or exc, self._rescan_interval)
        for wd in before.keys() - self._dirs.keys():
            with contextlib.suppress(OSError):  # already gone with its directory
                inotify.rm_watch(self._fd, wd)
        watched = {path: wd for wd, path in before.items()}
        return frozenset(path for wd, path in self._dirs.items() if watched.get(path, wd) != wd)

    def _on_readable(self) -> None:
        now = self._loop.time()  # type: ignore[union-attr]
        while self._fd is not None:
            try:
                buffer = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            for event in parse_events(buffer):
                self._on_event(event, now)
        self._wakeup.set()

    def _on_event(self, event: RawEvent, now: float) -> None:
        burst = self._burst
        if event.mask & IN_Q_OVERFLOW:
            return burst.structure_event(now)
        directory = self._dirs.get(event.wd)
        if directory is None:
            return None  # a watch dropped by _rewatch: its directory left the tree
        if event.mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT):
            if event.mask & IN_UNMOUNT:
                log.warning("manifest directory %s: the file system under %s was unmounted",
                            self.directory, self.directory / directory if directory else self.directory)
            if event.mask & IN_IGNORED:
                del self._dirs[event.wd]
            # The top directory going is an accident more often than not; a subdirectory
            # deleted is as deliberate as its files deleted, one unmounted is not.
            gone_whole = directory == "" or bool(event.mask & IN_UNMOUNT)
            return burst.structure_event(now, replaced=directory if gone_whole else None)
        path = f"{directory}/{event.name}" if directory else event.name
        hidden = event.name.startswith(".")
        if event.mask & IN_ISDIR:
            if hidden:
                return None  # never read (a ConfigMap's data directories count through `..data`)
            if event.mask & (IN_CREATE | IN_MOVED_TO):
                self._add_subtree(path)  # now: files written into it before the rescan are seen
            return burst.structure_event(now)  # files came or went with it, without events of their own
        if is_manifest_path(path):
            complete = bool(event.mask & IN_CREATE) and not self._empty_regular_file(path)
            return burst.file_event(path, event.mask, now, complete=complete)
        if path == ALLOW_EMPTY_MARKER:
            return burst.structure_event(now)
        if hidden and event.mask & (IN_CREATE | IN_MOVED_TO) and self._symlink(path):
            return burst.structure_event(now)  # a symlink swapped, as kubelet does a ConfigMap's `..data`
        return None  # editors' temporary files, other extensions: nothing we read

    def _add_subtree(self, relative: str) -> None:
        try:
            self._watch_tree(relative)
        except OSError as exc:
            log.warning("manifest directory %s: cannot watch %s (%s): it is rescanned every %.0f s",
                        self.directory, relative, exc.strerror or exc, self._rescan_interval)

    def _empty_regular_file(self, relative: str) -> bool:
        """Created empty (opened for writing), or gone already: not complete. A symlink or a
        hard link holds its content from the start."""
        try:
            found = os.lstat(self.directory / relative)
        except OSError:
            return True
        return stat.S_ISREG(found.st_mode) and found.st_size == 0

    def _is_empty(self, relative: str) -> bool:
        try:
            return os.stat(self.directory / relative).st_size == 0
        except OSError:
            return False  # gone: that is for the batch to see

    def _symlink(self, relative: str) -> bool:
        """Is it a symlink now? (A temporary file already renamed away is not.)"""
        try:
            return stat.S_ISLNK(os.lstat(self.directory / relative).st_mode)
        except OSError:
            return False

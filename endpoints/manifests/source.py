"""The manifest-directory source: files on disk -> registry admission -> ClusterState.

The first load reads every file in path order; then inotify reports changes
(:mod:`~kubeport.endpoints.manifests.watch`), bursts are coalesced, and each batch of changed
files becomes one commit. A batch reads only the files its events name (a rescan by stat
of the whole tree when the tree changed shape, and every 5 s without events). Large files
are parsed in a worker thread, one chunk of objects at a time, and each chunk is admitted
and dropped before the next: no more than a chunk of API objects is alive. Small files are
parsed on the event loop: a thread hop would cost more than the parse. Every file's bytes
are read in a thread, with the read timeout as its deadline: a read stuck in the kernel (a
hung FUSE or NFS mount) is left there, and its file is a problem line that keeps its objects
(:mod:`~kubeport.endpoints.manifests.batch`); the loop never makes a call that can hang.

Last good state wins:
- a file that fails to parse (syntax error, unreadable) keeps every object it held;
- an object that fails validation or admission keeps its previous version, if any, as does
  an object the file no longer declares while a broken or unread document of the file may
  stand for it (:mod:`~kubeport.endpoints.manifests.objects`);
- an object that disappears from a parsable file is deleted (``ClusterState.delete`` and
  ``Registry.release``) at the end of the batch; one whose file is deleted, once the file
  stayed away for ``gone_grace_ms``: a tool that replaces a file by unlinking it, or by
  moving it away, and then writes the new one keeps every object, with its allocations, and
  no client sees it absent meanwhile (the watch does not read the new file until it is
  written, :mod:`~kubeport.endpoints.manifests.watch`); a file truncated to zero bytes is
  held the same way, for a tool that empties a file and appends the new content in a second
  open;
- a directory emptied all at once is not every object deleted: when the files that disappear
  in one batch are all there were and more than one, or the directory itself was replaced
  (recreated, mounted over, unmounted: another inode or file system at its path; for a
  subdirectory, another file system), or it is gone, their objects are held and served,
  with a problem line, until the files come back, or until ``ALLOW_EMPTY_MARKER`` in the
  directory says the emptying is meant; so are the saved copies of a directory found empty
  at start-up that held more than one file, or any while it was another directory. Files
  removed one by one are deleted each after its grace; a file whose objects another file
  now declares (a rename) lets go at once.
Across a restart too: each file's objects as served are saved in ``--state-dir``
(:mod:`~kubeport.endpoints.manifests.lastgood`), and at start-up a file whose saved copy is
not its current version is applied on top of that copy, as an edit of it, by the same rules:
a restart serves what the daemon served before it.

Duplicates: an object (kind, namespace, name) belongs to the first file that declared it, in
time: later, the file already holding it; at start-up, the one that held it before the
restart (saved with the copies), else one whose copy declares it (the other declared it while
the daemon was down), else the first in path order. Another file declaring it is
reported (``declared also in <file>, ignored``). When the holder drops the object, the other
declaration takes over in the same batch (its file is read again) and updates it in place:
it keeps its ClusterIP and nodePorts, as does an object moved from one file to another. A
file whose objects were refused is read again once the batch has freed something, so an
object refused for a conflict gets in once the conflict is gone.

Memory: per file only the keys it declares and a digest of its bytes are kept, per
object only the digest of the applied version; no API objects are held.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kubeport.endpoints.manifests.batch import Batch, Disk, DiskThreads, Inline, collector_paused, drive, run_sync
from kubeport.endpoints.manifests.filesystems import FileSystems
from kubeport.endpoints.manifests.holders import Holders
from kubeport.endpoints.manifests.lastgood import LastGoodFiles
from kubeport.endpoints.manifests.objects import SOURCE_KINDS, FileApply, ManifestObjects, Progress
from kubeport.endpoints.manifests.parse import ObjectKey, ParsedFile
from kubeport.endpoints.manifests.read import (
    FileBytes,
    FileRead,
    ReadBudget,
    ReadLimits,
    StatKey,
    list_manifest_files,
    not_read,
    parse_bytes,
    read_bytes,
    stat_manifest_files,
)
from kubeport.endpoints.manifests.watch import ALLOW_EMPTY_MARKER, DirectoryWatch
from kubeport.endpoints.registry.registry import Admitter
from kubeport.endpoints.state import ClusterState

log = logging.getLogger(__name__)

__all__ = ["SOURCE_KINDS", "ManifestSource"]

#: Files up to this size are parsed on the event loop, larger ones in a thread.
INLINE_BYTES = 64 * 1024
#: A deleted file's objects are kept this long, in case the file is being replaced.
GONE_GRACE_MS = 3_000


@dataclass(slots=True)
class _FileRecord:
    keys: frozenset[ObjectKey] = frozenset()  # declared, held or not
    content: bytes = b""
    stat: StatKey | None = None
    problems: tuple[str, ...] = ()
    retry: bool = False  # an object was refused at admission
    failed: bool = False  # the last read could not be parsed
    skipped: tuple[str, ...] = ()  # objects of kinds not read


class ManifestSource:
    """The manifest directory as a :class:`~kubeport.endpoints.interfaces.Source`."""

    kind = "manifests"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        registry: Admitter,
        state: ClusterState,
        *,
        debounce_ms: float = 0,
        log_problems: bool = True,
        last_good: LastGoodFiles | None = None,
        duplicate_note: str = "",
        limits: ReadLimits | None = None,
        gone_grace_ms: float = GONE_GRACE_MS,
        read_file: Callable[[Path, str, ReadLimits], FileBytes | FileRead] = read_bytes,
        may_hang: Callable[[int | None], bool] | None = None,
    ) -> None:
        """
        :param directory: the manifest directory, read recursively.
        :param registry: admits (validates, allocates) every object before it reaches ``state``.
        :param debounce_ms: quiet time that ends a burst of file events that only wrote
            (created, rewrote, renamed in) manifest files; other bursts wait longer
            (:mod:`~kubeport.endpoints.manifests.watch`). None by default: a complete file is
            read at once, and what lands while a batch runs is the next batch (the quiet time
            is a large share of the time from a rename to new connections using it).
        :param log_problems: log each new problem once at WARNING (``kubeport check`` prints them).
        :param last_good: the last good version of each file, and who held contested objects:
            what the daemon served before a restart, served again after it.
        :param duplicate_note: added to each ``declared also in`` line.
        :param limits: what is read at most (:class:`~kubeport.endpoints.manifests.read.ReadLimits`).
        :param gone_grace_ms: how long a deleted file's objects are kept, in case it comes back.
        :param read_file: the disk part of reading a file
            (:func:`~kubeport.endpoints.manifests.read.read_bytes`), run in a thread with a
            deadline where ``may_hang`` says so. The seam where tests put a read that hangs as
            one in a hung mount does.
        :param may_hang: whether a read from the file system of a device (``st_dev``; None:
            not known) may hang (:mod:`~kubeport.endpoints.manifests.filesystems`).
        """
        # Resolved: inotify reports paths under the real directory.
        self._directory = Path(directory).resolve()
        self._registry = registry
        self._state = state
        self._debounce_ms = debounce_ms
        self._log_problems = log_problems
        self._last_good = last_good
        self._files: dict[str, _FileRecord] = {}
        self._budget = ReadBudget(limits)
        self._read_file = read_file
        self._may_hang = may_hang if may_hang is not None else FileSystems().may_hang
        self._disk = DiskThreads()
        self._holders = Holders(last_good.holders() if last_good is not None else None)
        self._objects = ManifestObjects(registry, state, self._holders, duplicate_note=duplicate_note)
        self._reported: set[str] = set()
        #: stored allocations of Services no file declares are released once every file parsed
        self._collect_pending = True
        self._batches = 0
        self._gone_grace = gone_grace_ms / 1e3
        #: files gone from the directory, their objects kept: path -> when the grace ends (monotonic)
        self._vanished: dict[str, float] = {}
        #: files gone as the directory emptied all at once: kept until they return or the marker says so
        self._held: set[str] = set()
        self._held_reason = ""
        self._root: tuple[int, int] | None = None  # (st_dev, st_ino) of the directory at the last listing
        #: the same, of the directory the saved copies come from
        self._saved_root = last_good.source_directory() if last_good is not None else None
        #: directories ("" the top one) not the ones the files were read from: gone as a whole
        self._replaced: set[str] = set()
        self._missing = False  # the directory itself was gone at the last look

    @property
    def problems(self) -> list[str]:
        """Every current problem, ``<path relative to the directory>: <message>``."""
        lines = [line for path in sorted(self._files) for line in self._files[path].problems]
        if self._missing:
            lines.insert(0, f"{self._directory}: the manifest directory is gone (moved away or unmounted): "
                            f"serving the objects of its {len(self._files)} files until it is back")
        elif self._held:
            held = sorted(self._held)
            named = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
            lines.insert(0, f"{self._directory}: {self._held_reason}: serving the objects of {named} until they "
                            f"are back; if the emptying is meant, create {ALLOW_EMPTY_MARKER} in the directory "
                            f"to delete them")
        return lines

    @property
    def skipped(self) -> list[str]:
        """Every object skipped as of a kind (or API group) not read, ``<path>: <apiVersion> <kind> <name>``."""
        return [f"{path}: {entry}" for path in sorted(self._files) for entry in self._files[path].skipped]

    @property
    def files_loaded(self) -> int:
        """Manifest files present in the directory (broken ones included)."""
        return len(self._files)

    @property
    def objects_loaded(self) -> int:
        """Objects from the directory currently in the cluster state."""
        return len(self._objects.applied)

    def status(self) -> dict[str, int]:
        """``batches``: the first load is 1, then one per burst of changes: an edit that
        changed nothing was still read when the count moved past the one before it."""
        return {"files": self.files_loaded, "objects": self.objects_loaded, "batches": self._batches}

    # --- lifecycle ------------------------------------------------------------------------

    async def run(self, synced: asyncio.Event | None = None) -> None:
        """Load every file, publish the first snapshot, set ``synced``, then follow changes."""
        if not self._directory.is_dir():
            raise FileNotFoundError(f"manifest directory {self._directory} does not exist")
        watch = DirectoryWatch(self._directory, quiet_ms=self._debounce_ms)
        watch.start()  # before the first scan, so that no edit falls between the scan and the watch
        save_wanted = asyncio.Event()
        saver = asyncio.create_task(self._save_copies(save_wanted))
        try:
            started = time.monotonic()
            with collector_paused():
                await drive(self._batch(set(), initial=True), self._disk)
            log.info("manifests: first load of %d files, %d objects in %.2f s", len(self._files),
                     len(self._objects.applied), time.monotonic() - started)
            if synced is not None:
                synced.set()
            while True:
                save_wanted.set()
                changes = await watch.next_changes(self._next_grace_end())
                self._replaced |= changes.replaced
                await drive(self._batch(set(changes.paths), rescan=changes.rescan, deferred=changes.deferred),
                            self._disk)
        finally:
            watch.close()
            saver.cancel()
            self._save_copies_now()  # what the last batches noted (waits for a copy in progress)

    def load(self) -> None:
        """The first load, synchronously (``kubeport check``): read all, admit, commit."""
        run_sync(self._batch(set(), initial=True))
        self._save_copies_now()

    async def _save_copies(self, wanted: asyncio.Event) -> None:
        if self._last_good is not None:
            await self._last_good.keep_saving(wanted, self._directory)

    def _save_copies_now(self) -> None:
        if self._last_good is not None:
            self._last_good.save(self._last_good.take(), self._directory)

    # --- a batch ------------------------------------------------------------------------------

    def _next_grace_end(self) -> float | None:
        """Seconds until the first deleted file's grace ends, if any is running."""
        if not self._vanished:
            return None
        return min(self._vanished.values()) - time.monotonic() + 0.005  # past it, on a coarse loop clock

    def _batch(self, named: set[str], *, initial: bool = False, rescan: bool = True,
               deferred: frozenset[str] = frozenset()) -> Batch:
        """Apply what changed on disk as one commit. ``named`` files (from events) are read
        even if their stat looks unchanged: a same-size rewrite within the file system's
        timestamp granularity keeps it. Without ``rescan`` only they are looked at, and the
        deleted files whose grace ended. ``deferred`` files (open for writing) are not read."""
        for path in deferred & self._vanished.keys():
            del self._vanished[path]  # back, and being written: read once it is complete
        now = time.monotonic()
        named |= {path for path, ends in self._vanished.items() if now >= ends}
        if rescan or initial:
            listing: dict[str, StatKey] | None = yield self._list
        else:
            listing = yield Inline(lambda: self._stat_named(named))
        progress = Progress()
        if listing is None:
            work = []
        elif rescan or initial:
            work = [path for path in sorted(listing.keys() | self._files.keys())
                    if (path not in self._files or path in named or path in self._held
                        or self._files[path].stat != listing.get(path)) and path not in deferred]
        else:
            work = sorted(named - deferred)
        force = False
        with self._registry.grouped_writes():  # committed before the snapshot is published
            if initial and listing == {}:
                yield from self._hold_copies(progress)
            while work:
                gone: set[str] = set()
                for path in work:
                    progress.done.add(path)
                    yield from self._apply_file(path, progress, gone, force=force, initial=initial and not force,
                                                device=_device(listing, path, self._files.get(path)))
                if gone or self._vanished or self._held:
                    self._resolve_gone(gone, progress, initial=initial)
                if initial:  # every file was read: what a preferred holder did not take is free
                    progress.dropped |= self._holders.end_preferences()
                force = True  # files read again: their bytes may be those read last time
                reread = self._holders.waiting(progress.dropped) | self._holders.displaced()
                work = sorted(reread - progress.reread)
                progress.reread.update(work)  # once a batch: a file that fails to parse would wait forever
                if not work:
                    work = self._settle(progress)
        if initial:
            self._holders.end_preferences()  # also when there was nothing to read
        if self._last_good is not None and initial and listing is not None:
            for path in self._last_good.paths() - self._files.keys():  # deleted while the daemon was down
                self._last_good.forget(path)
        if listing is not None:
            self._replaced = set()  # said of the directory this batch read
            if self._last_good is not None and self._root != self._saved_root and not self._held and self._files:
                self._last_good.keep_source_directory(self._root)  # type: ignore[arg-type]
                self._saved_root = self._root
        if self._last_good is not None:
            self._last_good.keep_holders(self._holders.contested())
        if initial:
            for kind in SOURCE_KINDS:
                self._state.mark_synced(kind)
        self._state.commit()
        self._report()
        self._batches += 1

    def _list(self) -> dict[str, StatKey] | None:
        try:
            found = os.stat(self._directory)
        except OSError:
            found = None
        if found is None or not stat.S_ISDIR(found.st_mode):
            # Moved away or unmounted: that is not every manifest deleted. Last good state wins.
            if not self._missing:
                log.error("manifest directory %s is gone: keeping the objects loaded from it", self._directory)
            self._missing = True
            self._replaced.add("")  # whatever comes back at the path is another directory
            return None
        if self._missing:
            log.warning("manifest directory %s is back", self._directory)
        self._missing = False
        root = (found.st_dev, found.st_ino)  # a mount coming or going, seen without inotify
        if self._root is not None and root != self._root:
            self._replaced.add("")
        self._root = root
        return list_manifest_files(self._directory)

    def _stat_named(self, named: set[str]) -> dict[str, StatKey] | None:
        return stat_manifest_files(self._directory, named) if self._directory.is_dir() else self._list()

    def _resolve_gone(self, gone: set[str], progress: Progress, *, initial: bool) -> None:
        """Files this batch found gone: a grace for each, unless the directory emptied all at
        once (hold them); those whose grace ended, or held ones the marker lets go, are dropped."""
        now = time.monotonic()
        fresh = sorted(path for path in gone if path not in self._vanished and path not in self._held)
        allowed = (self._directory / ALLOW_EMPTY_MARKER).exists()
        if fresh and not initial and not allowed:
            present = self._files.keys() - gone - self._vanished.keys() - self._held
            under = [path for path in fresh if any(_within(path, directory) for directory in self._replaced)]
            if under:
                held = set(under)
                if "" in self._replaced:
                    reason = "the directory was replaced (recreated, mounted over or unmounted)"
                else:
                    reason = f"another file system at {', '.join(sorted(self._replaced))} (mounted over or unmounted)"
            elif not present and len(fresh) > 1:
                held = set(fresh) | self._vanished.keys()
                reason = f"all its {len(held)} manifest files disappeared at once"
            else:
                held, reason = set(), ""
            if held:
                self._held |= held
                for path in held:
                    self._vanished.pop(path, None)
                self._held_reason = reason
                log.error("manifest directory %s: %s: still serving the objects of %d files; create %s in it "
                          "to delete them", self._directory, reason, len(self._held), ALLOW_EMPTY_MARKER)
                fresh = [path for path in fresh if path not in held]
        for path in fresh:
            self._vanished[path] = now if initial else now + self._gone_grace
        ending = [path for path in sorted(gone)
                  if (path in self._vanished and now >= self._vanished[path]) or (path in self._held and allowed)]
        # Moved to another file (`mv a.yaml b.yaml`): the new file takes its objects over now.
        ending += [path for path in sorted((self._vanished.keys() | self._held) - set(ending))
                   if self._holders.all_declared_elsewhere(path, self._files[path].keys)]
        for path in ending:
            self._vanished.pop(path, None)
            self._held.discard(path)
            record = self._files.pop(path)
            progress.dropped |= self._holders.drop(path, record.keys)
            if self._last_good is not None:
                self._last_good.forget(path)
        kept = len(gone) - len(ending)
        if kept:
            log.debug("manifests: %d files gone, their objects kept (%d held)", kept, len(self._held))

    def _hold_copies(self, progress: Progress) -> Batch:
        """Start-up on an empty directory that held more than one file before the restart, or
        any while it was another directory (a volume not mounted yet, the directory recreated
        while the daemon was down): serve their copies, held as after an emptying, rather
        than delete every object and free its allocations."""
        if self._last_good is None or (self._directory / ALLOW_EMPTY_MARKER).exists():
            return
        copies = sorted(path for path in self._last_good.paths() if self._last_good.has(path))
        replaced = self._saved_root is not None and self._saved_root != self._root
        if not copies or (len(copies) < 2 and not replaced):
            return  # one file deleted while the daemon was down, as one removed while it runs
        for path in copies:
            record = self._files[path] = _FileRecord()
            if (yield from self._apply_copy(path, record, progress)) is not None:
                self._held.add(path)
            else:
                del self._files[path]
        if self._held:
            self._held_reason = (f"the directory is empty at start-up, and held {len(self._held)} files before"
                                 + (" (it was another directory or file system then)" if replaced else ""))
            log.error("manifest directory %s: %s: serving their last good copies; create %s in it to delete them",
                      self._directory, self._held_reason, ALLOW_EMPTY_MARKER)

    def _settle(self, progress: Progress) -> list[str]:
        """Delete what was dropped and not taken over; the files to retry if that freed anything."""
        self._objects.release(progress)
        if self._collect_pending and not any(record.failed for record in self._files.values()):
            self._collect_pending = False
            self._objects.release_undeclared(progress)
        if not progress.freed:
            return []
        retry = {path for path, record in self._files.items() if record.retry} - progress.retried
        progress.retried |= retry
        progress.freed = False
        return sorted(retry)

    def _apply_file(self, path: str, progress: Progress, gone: set[str], *, force: bool,
                    initial: bool = False, device: int | None = None) -> Batch:
        record = self._files.get(path)
        first_read = record is None
        known = None if force or record is None else record.content

        limits = self._budget.limits
        read_file, directory = self._read_file, self._directory
        read = lambda: read_file(directory, path, limits)  # noqa: E731
        # Where a read cannot hang (a local or memory file system), on the loop: the thread's
        # hand-over would cost more than the read.
        on_disk: FileBytes | FileRead = yield (
            Disk(read, limits.read_timeout, lambda why: not_read(path, why)) if self._may_hang(device) else Inline(read))

        def parse() -> FileRead:
            unchanged = lambda key, digest: self._objects.is_applied(path, key, digest)  # noqa: E731
            return parse_bytes(on_disk, known_content=known, unchanged=unchanged, budget=self._budget)

        small = not isinstance(on_disk, FileBytes) or len(on_disk.data) <= INLINE_BYTES
        read: FileRead = yield Inline(parse) if small else parse
        if read.gone:
            if record is not None:
                gone.add(path)  # what that means depends on the batch's other files: _resolve_gone
            elif self._last_good is not None:
                self._last_good.forget(path)
            return
        if record is not None and record.keys and not initial and _emptied(read) and self._hold_emptied(path):
            return
        if path in self._vanished or path in self._held:
            self._vanished.pop(path, None)
            self._held.discard(path)
            log.debug("%s: back, its objects kept throughout", path)
        if record is None:
            record = self._files[path] = _FileRecord()
        record.stat = read.stat
        if read.same:
            return
        record.content = read.content
        served, known = None, None
        if first_read and self._last_good is not None and self._last_good.differs(path, read.content):
            served = yield from self._apply_copy(path, record, progress)
        if initial and self._last_good is not None and (served is not None or not self._last_good.has(path)):
            known = record.keys  # what it declared before the restart: the copy's (nothing for a new file)
        applied = yield from self._apply_chunks(path, record, read.parsed, read.rest, progress, small=small,
                                                known=known)
        if applied is not None:
            self._note_copy(path, read.content, applied)
        elif served is not None:
            record.problems += served

    def _hold_emptied(self, path: str) -> bool:
        """A file that declared objects is now empty: held like a deleted file, for the same
        grace, since a tool that truncates a file and appends the new content in a second
        open (``: > f; cat new >> f``) closes it empty in between. True while held; at the
        grace's end the emptying is honoured as an edit that declares nothing."""
        ends = self._vanished.get(path)
        if ends is None:
            self._vanished[path] = time.monotonic() + self._gone_grace
            log.debug("%s: emptied, its objects kept for %.1f s in case it is being rewritten", path, self._gone_grace)
            return True
        return time.monotonic() < ends

    def _apply_copy(self, path: str, record: _FileRecord, progress: Progress) -> Batch:
        """The first read of a file since start-up, and its saved copy is not this version:
        apply the copy first, so that this version is applied as an edit of what was served
        before the restart (what it breaks keeps its last good version). The problem lines
        to show should the file not parse, or None without a copy."""
        assert self._last_good is not None
        if (saved := self._last_good.parsed(path)) is None:
            return None
        chunks, size, since = saved
        yield from self._apply_chunks(path, record, next(chunks, None), chunks, progress, small=size <= INLINE_BYTES)
        return record.problems + (f"{path}: serving the version that last parsed (saved {since}) until it is fixed",)

    def _note_copy(self, path: str, content: bytes, applied: FileApply) -> None:
        if self._last_good is not None:
            self._last_good.keep(path, content, stale=applied.stale, unapplied=applied.unapplied)

    def _apply_chunks(self, path: str, record: _FileRecord, chunk: ParsedFile | None, rest: Iterator[ParsedFile],
                      progress: Progress, *, small: bool, known: frozenset[ObjectKey] | None = None) -> Batch:
        """Apply a file's chunks of objects; how they fared when it parsed to the end, else None."""
        read = FileApply(path, known=known)
        while chunk is not None:
            if chunk.failed:
                # Keep every object: those it held, and those this read already applied.
                record.keys, record.problems, record.failed = record.keys | read.keys, chunk.problems, True
                return None
            self._objects.apply_chunk(read, chunk, progress)
            if chunk.skipped:
                log.debug("%s: skipped (kind not read): %s", path, ", ".join(chunk.skipped))
            next_chunk = lambda: next(rest, None)  # noqa: E731
            chunk = yield Inline(next_chunk) if small else next_chunk
        self._objects.finish(read, record.keys, progress)
        record.keys, record.problems, record.retry, record.failed = (
            frozenset(read.keys), tuple(read.problems), read.retry, False)
        record.skipped = tuple(read.skipped)
        return read

    def _report(self) -> None:
        current = self.problems
        if self._log_problems:
            for line in current:
                if line not in self._reported:
                    log.warning("%s", line)
        self._reported = set(current)


def _emptied(read: FileRead) -> bool:
    """Zero bytes on disk: truncated, not edited to declare nothing."""
    return read.stat is not None and read.stat[2] == 0 and not read.same


def _device(listing: dict[str, StatKey] | None, path: str, record: _FileRecord | None) -> int | None:
    """The file's device: from this batch's stat, else from the last read's."""
    key = None if listing is None else listing.get(path)
    if key is None and record is not None:
        key = record.stat
    return None if key is None else key[0]


def _within(path: str, directory: str) -> bool:
    return directory == "" or path.startswith(f"{directory}/")

"""The manifest-directory source: files on disk -> registry admission -> ClusterState.

The first load reads every file in path order; then inotify reports changes
(:mod:`~kubeport.endpoints.manifest_watch`), bursts are coalesced, and each batch of changed
files becomes one commit. A batch reads only the files its events name (a rescan by stat
of the whole tree when the tree changed shape, and every 5 s without events). Large files
are parsed in a worker thread, one chunk of objects at a time, and each chunk is admitted
and dropped before the next: no more than a chunk of API objects is alive. Small files are
read on the event loop: a thread hop would cost more than the read.

Last good state wins:
- a file that fails to parse (syntax error, unreadable) keeps every object it held; across a
  restart too: the last version of each file that parsed is saved in ``--state-dir``
  (:mod:`~kubeport.endpoints.manifest_lastgood`), and a file broken at start-up is served
  from it until it is fixed;
- an object that fails validation or admission keeps its previous version, if any;
- an object that disappears from a parsable file, or whose file is deleted, is deleted
  (``ClusterState.delete`` and ``Registry.release``) at the end of the batch.

Duplicates: an object (kind, namespace, name) belongs to the first file that declared
it (at startup, in path order; later, the file already holding it). Another file
declaring it is reported (``declared also in <file>, ignored``). When the holder drops
the object, the other declaration takes over in the same batch (its file is read again)
and updates it in place: it keeps its ClusterIP and nodePorts, as does an object moved
from one file to another. A file whose objects were refused is read again once the batch
has freed something, so an object refused for a conflict gets in once the conflict is gone.

Memory: per file only the keys it declares and a digest of its bytes are kept, per
object only the digest of the applied version; no API objects are held.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .allocstore import StoreError
from .fielderrors import Invalid
from .manifest_batch import Batch, Inline, collector_paused, drive, run_sync
from .manifest_files import ObjectKey, ParsedFile, ParsedObject, describe
from .manifest_holders import Holders
from .manifest_lastgood import LastGoodFiles
from .manifest_reader import FileRead, StatKey, list_manifest_files, read_manifest, stat_manifest_files
from .manifest_watch import DirectoryWatch
from .registry import Admitter
from .state import ClusterState

log = logging.getLogger(__name__)

SOURCE_KINDS = ("Namespace", "Node", "Service", "EndpointSlice")
#: Admission order inside a chunk: a Service before the slices that must not use its ClusterIP.
_KIND_ORDER = {kind: rank for rank, kind in enumerate(SOURCE_KINDS)}
#: Files up to this size are read and parsed on the event loop, larger ones in a thread.
INLINE_BYTES = 64 * 1024


@dataclass(slots=True)
class _FileRecord:
    keys: frozenset[ObjectKey] = frozenset()  # declared, held or not
    content: bytes = b""
    stat: StatKey | None = None
    problems: tuple[str, ...] = ()
    retry: bool = False  # an object was refused at admission
    failed: bool = False  # the last read could not be parsed


@dataclass(slots=True)
class _Progress:
    """What the current batch did so far."""

    done: set[str] = field(default_factory=set)
    retried: set[str] = field(default_factory=set)
    #: objects whose holder stopped declaring them (another file may take them over)
    dropped: set[ObjectKey] = field(default_factory=set)
    #: allocations may have been freed (an object deleted, a Service re-admitted)
    freed: bool = False


class ManifestSource:
    def __init__(
        self,
        directory: str | os.PathLike[str],
        registry: Admitter,
        state: ClusterState,
        *,
        debounce_ms: float = 0,
        log_problems: bool = True,
        last_good: LastGoodFiles | None = None,
    ) -> None:
        """
        :param directory: the manifest directory, read recursively.
        :param registry: admits (validates, allocates) every object before it reaches ``state``.
        :param debounce_ms: quiet time that ends a burst of file events that only wrote
            (created, rewrote, renamed in) manifest files; other bursts wait longer
            (:mod:`~kubeport.endpoints.manifest_watch`). None by default: a complete file is
            read at once, and what lands while a batch runs is the next batch (measured at
            10,000 services: a 2 ms quiet time was 2 of the ~5 ms from a rename to new
            connections using it).
        :param log_problems: log each new problem once at WARNING (``kubeport check`` prints them).
        :param last_good: the last version of each file that parsed, served when it is broken at start-up.
        """
        # Resolved: inotify reports paths under the real directory.
        self._directory = Path(directory).resolve()
        self._registry = registry
        self._state = state
        self._debounce_ms = debounce_ms
        self._log_problems = log_problems
        self._last_good = last_good
        self._files: dict[str, _FileRecord] = {}
        self._holders = Holders()
        #: digest of the version in the state, per object
        self._applied: dict[ObjectKey, bytes] = {}
        self._reported: set[str] = set()
        #: stored allocations of Services no file declares are released once every file parsed
        self._collect_pending = True
        self._batches = 0
        self._batch_applied = asyncio.Event()

    @property
    def problems(self) -> list[str]:
        """Every current problem, ``<path relative to the directory>: <message>``."""
        return [line for path in sorted(self._files) for line in self._files[path].problems]

    @property
    def files_loaded(self) -> int:
        """Manifest files present in the directory (broken ones included)."""
        return len(self._files)

    @property
    def objects_loaded(self) -> int:
        """Objects from the directory currently in the cluster state."""
        return len(self._applied)

    @property
    def batches(self) -> int:
        """Batches applied so far: the first load is 1, then one per burst of changes."""
        return self._batches

    async def wait_batch(self, after: int) -> int:
        """The batch count once it is greater than ``after``."""
        while self._batches <= after:
            await self._batch_applied.wait()
        return self._batches

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
                await drive(self._batch(set(), initial=True))
            log.info("manifests: first load of %d files, %d objects in %.2f s", len(self._files),
                     len(self._applied), time.monotonic() - started)
            if synced is not None:
                synced.set()
            while True:
                save_wanted.set()
                changes = await watch.next_changes()
                await drive(self._batch(set(changes.paths), rescan=changes.rescan))
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

    def _batch(self, named: set[str], *, initial: bool = False, rescan: bool = True) -> Batch:
        """Apply what changed on disk as one commit. ``named`` files (from events) are read
        even if their stat looks unchanged: a same-size rewrite within the file system's
        timestamp granularity keeps it. Without ``rescan`` only they are looked at."""
        if rescan or initial:
            listing: dict[str, StatKey] | None = yield self._list
        else:
            listing = yield Inline(lambda: self._stat_named(named))
        progress = _Progress()
        if listing is None:
            work = []
        elif rescan or initial:
            work = [path for path in sorted(listing.keys() | self._files.keys())
                    if path not in self._files or path in named or self._files[path].stat != listing.get(path)]
        else:
            work = sorted(named)
        force = False
        with self._registry.grouped_writes():  # committed before the snapshot is published
            while work:
                for path in work:
                    progress.done.add(path)
                    yield from self._apply_file(path, progress, force=force, size=_size(listing, path))
                force = True  # files read again: their bytes may be those read last time
                work = sorted(self._holders.waiting(progress.dropped) - progress.done)
                if not work:
                    work = self._settle(progress)
        if self._last_good is not None and initial and listing is not None:
            for path in self._last_good.paths() - self._files.keys():  # deleted while the daemon was down
                self._last_good.forget(path)
        if initial:
            for kind in SOURCE_KINDS:
                self._state.mark_synced(kind)
        self._state.commit()
        self._report()
        self._batches += 1
        self._batch_applied.set()
        self._batch_applied = asyncio.Event()

    def _list(self) -> dict[str, StatKey] | None:
        if self._directory.is_dir():
            return list_manifest_files(self._directory)
        # Moved away or unmounted: that is not every manifest deleted. Last good state wins.
        log.error("manifest directory %s is gone: keeping the objects loaded from it", self._directory)
        return None

    def _stat_named(self, named: set[str]) -> dict[str, StatKey] | None:
        return stat_manifest_files(self._directory, named) if self._directory.is_dir() else self._list()

    def _settle(self, progress: _Progress) -> list[str]:
        """Delete what was dropped and not taken over; the files to retry if that freed anything."""
        self._release(progress)
        if self._collect_pending and not any(record.failed for record in self._files.values()):
            self._release_undeclared(progress)
        if not progress.freed:
            return []
        retry = {path for path, record in self._files.items() if record.retry} - progress.retried
        progress.retried |= retry
        progress.freed = False
        return sorted(retry)

    def _apply_file(self, path: str, progress: _Progress, *, force: bool, size: int | None) -> Batch:
        record = self._files.get(path)
        known = None if force or record is None else record.content

        def read_file() -> FileRead:
            unchanged = lambda key, digest: self._is_applied(path, key, digest)  # noqa: E731
            return read_manifest(self._directory, path, known_content=known, unchanged=unchanged)

        small = size is not None and size <= INLINE_BYTES
        read: FileRead = yield Inline(read_file) if small else read_file
        if read.gone:
            if record is not None:
                progress.dropped |= self._holders.drop(path, record.keys)
                del self._files[path]
            if self._last_good is not None:
                self._last_good.forget(path)
            return
        if record is None:
            record = self._files[path] = _FileRecord()
        record.stat = read.stat
        if read.same:
            return
        record.content = read.content
        holding = bool(record.keys)
        parsed = yield from self._apply_chunks(path, record, read.parsed, read.rest, progress, small=small)
        if parsed:
            if self._last_good is not None:
                self._last_good.keep(path, read.content)
        elif not holding and self._last_good is not None:
            yield from self._serve_last_good(path, record, progress)

    def _apply_chunks(self, path: str, record: _FileRecord, chunk: ParsedFile | None, rest: Iterator[ParsedFile],
                      progress: _Progress, *, small: bool) -> Batch:
        """Apply a file's chunks of objects; True when it parsed to the end."""
        keys: set[ObjectKey] = set()
        problems: list[str] = []
        retry = False
        while chunk is not None:
            if chunk.failed:
                # Keep every object: those it held, and those this read already applied.
                record.keys, record.problems, record.failed = record.keys | keys, chunk.problems, True
                return False
            problems.extend(chunk.problems)
            retry |= self._apply_chunk(path, chunk, keys, problems, progress)
            if chunk.skipped:
                log.debug("%s: skipped (kind not read): %s", path, ", ".join(chunk.skipped))
            next_chunk = lambda: next(rest, None)  # noqa: E731
            chunk = yield Inline(next_chunk) if small else next_chunk
        progress.dropped |= self._holders.drop(path, record.keys - keys)
        record.keys, record.problems, record.retry, record.failed = frozenset(keys), tuple(problems), retry, False
        return True

    def _serve_last_good(self, path: str, record: _FileRecord, progress: _Progress) -> Batch:
        """A file that holds nothing (the daemon just started) and does not parse: serve the
        version saved when it last parsed, until it is fixed, so that a restart loses nothing."""
        assert self._last_good is not None
        if (saved := self._last_good.parsed(path)) is None:
            return
        chunks, size, since = saved
        broken = record.problems
        yield from self._apply_chunks(path, record, next(chunks, None), chunks, progress, small=size <= INLINE_BYTES)
        record.problems = broken + record.problems + (
            f"{path}: serving the version that last parsed (saved {since}) until it is fixed",)
        record.failed = True  # still broken: what it declares now is unknown

    def _is_applied(self, path: str, key: ObjectKey, digest: bytes) -> bool:
        return self._holders.holder(key) == path and self._applied.get(key) == digest

    # --- objects ------------------------------------------------------------------------------

    def _apply_chunk(
        self, path: str, chunk: ParsedFile, keys: set[ObjectKey], problems: list[str], progress: _Progress
    ) -> bool:
        """Hold and admit a chunk's objects; ``keys`` collects the file's keys. True if one was refused."""
        admissions: list[ParsedObject] = []
        for obj in chunk.objects:
            key = obj.key
            if key in keys:
                problems.append(f"{path}: {describe(key)}: declared more than once in this file, {obj.where} ignored")
                continue
            keys.add(key)
            if not self._holders.hold(path, key):
                problems.append(f"{path}: {describe(key)}: declared also in {self._holders.holder(key)}, ignored")
            elif self._applied.get(key) != obj.digest:
                admissions.append(obj)
        for key in chunk.invalid_keys - keys:
            keys.add(key)
            self._holders.hold(path, key)  # a broken declaration still holds its object
        refused = False
        for obj in sorted(admissions, key=lambda o: _KIND_ORDER[o.key[0]]):
            error = self._admit(obj, progress)
            if error:
                problems.extend(f"{path}: {line}" for line in error)
                refused = True
        return refused

    def _admit(self, parsed: ParsedObject, progress: _Progress) -> list[str]:
        """Admit one object into the state; the problem lines if refused."""
        assert parsed.obj is not None  # only unchanged objects skip validation
        try:
            admitted = self._registry.admit(parsed.obj)
        except Invalid as exc:
            return exc.lines()
        except StoreError as exc:
            return [f"{describe(parsed.key)}: {exc}"]
        self._state.upsert(admitted)
        if parsed.key[0] == "Service" and parsed.key in self._applied:
            progress.freed = True  # a changed Service may have let go of a ClusterIP or nodePort
        self._applied[parsed.key] = parsed.digest
        return []

    def _release(self, progress: _Progress) -> None:
        """Delete the dropped objects that no file took over."""
        for key in progress.dropped:
            if key in self._holders or self._applied.pop(key, None) is None:
                continue  # taken over (updated in place), or it never got in
            kind, namespace, name = key
            self._state.delete(kind, namespace, name)
            progress.freed = True
            try:
                self._registry.release(kind, namespace, name)
            except StoreError as exc:
                log.error("%s: allocations not released: %s", describe(key), exc)
        progress.dropped.clear()

    def _release_undeclared(self, progress: _Progress) -> None:
        """Free what Services deleted while the daemon was down still hold in the store.

        Waits until every file has parsed once: a file broken at start-up may declare them."""
        self._collect_pending = False
        for namespace, name in self._registry.allocated_services():
            if ("Service", namespace, name) not in self._holders:
                log.info("releasing the allocations of Service %s/%s: no manifest declares it", namespace, name)
                self._registry.release("Service", namespace, name)
                progress.freed = True

    def _report(self) -> None:
        current = self.problems
        if self._log_problems:
            for line in current:
                if line not in self._reported:
                    log.warning("%s", line)
        self._reported = set(current)


def _size(listing: dict[str, StatKey] | None, path: str) -> int | None:
    key = None if listing is None else listing.get(path)
    return None if key is None else key[2]

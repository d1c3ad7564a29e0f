"""The last good version of each manifest file, kept in ``--state-dir`` across restarts.

While the daemon runs, a file that stops parsing keeps the objects it held, and an object
that turns invalid keeps its last good version. A restart would lose them: the daemon would
start with the broken file and nothing to fall back on, and services that worked before the
restart would be gone. So each file's objects as the daemon serves them are saved in
``<state-dir>/last-good/files/<its path>``, and at start-up a file whose copy is not its
current version is applied on top of its copy, as an edit of it: what the current version
gets right replaces the copy's objects, what it gets wrong (or does not parse) keeps them.

The copy of a file is
- the file itself (a plain copy) when every object it holds is at the version it declares;
- else a merged copy, JSON: the file's objects that were accepted, and for those that were
  invalid or refused (and so kept their last good version), that version, taken from the
  previous copy. A file that mixes a newly broken object with other, valid changes keeps
  both across a restart: the changes, and the broken object's last good version.
  (Should a file change twice within a few seconds, before its copy was made, the version
  in the copy is the last one saved: only a copy that was made can be kept.)
The holders of objects declared in more than one file are saved too (``holders.json``):
ownership by the first file in time holds across restarts (:mod:`.manifest_holders`).

Cheap by design: a batch only notes which files parsed (``keep``). The copies are made in a
quiet moment after it (a clean stop makes the last ones; a crash can lose the copies of the
last few seconds, never a manifest), by the kernel (``copy_file_range``: no bytes pass
through Python, no memory held; large files off the event loop), checked against the digest
of the bytes that parsed, and only for files whose bytes changed since they were copied: a
restart copies nothing. ``index.json`` maps each path to that digest (for a merged copy:
the digest of the version it was made from, and its own). Best effort: the copies are a
safety net, never a reason to refuse a file or to stop; a copy that cannot be made is
logged once. Only regular files are copied (:func:`~.read.open_regular`): a file that parsed
and was then replaced by a named pipe or a device is left alone, as its read is.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubeport.endpoints.manifests.documents import SyntaxProblem
from kubeport.endpoints.manifests.parse import ObjectKey, ParsedFile, declared_values, iter_manifest
from kubeport.endpoints.manifests.read import DIGEST_SIZE, NotRegularFile, content_digest, decode, open_regular
from kubeport.endpoints.manifests.yaml_nodes import YAMLError
from kubeport.lib.quiet import quiet_moment

log = logging.getLogger(__name__)

DIRECTORY_NAME = "last-good"
INDEX_NAME = "index.json"
HOLDERS_NAME = "holders.json"
SOURCE_DIRECTORY_NAME = "source-directory.json"
_CHUNK = 1 << 20
#: A save copying no more than this is made on the event loop (see ``keep_saving``).
INLINE_SAVE_BYTES = 256 * 1024
#: Copies are saved once no batch came for this long (seconds), at the latest after SAVE_MAX_DELAY.
SAVE_QUIET = 0.2
SAVE_MAX_DELAY = 5.0


@dataclass(frozen=True, slots=True)
class Note:
    """A version of a file to save: its digest, and for a merged copy the objects whose last
    good version comes from the previous copy (``stale``) and those left out (``unapplied``)."""

    digest: bytes
    stale: frozenset[ObjectKey] = frozenset()
    unapplied: frozenset[ObjectKey] = frozenset()


@dataclass(slots=True)
class Pending:
    """What to save: per path a version (None: delete its copy), and the holders if they changed."""

    files: dict[str, Note | None] = field(default_factory=dict)
    holders: dict[ObjectKey, str] | None = None

    def __bool__(self) -> bool:
        return bool(self.files) or self.holders is not None


class LastGoodFiles:
    """Copies of manifest files by their path inside the manifest directory."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.files = self.directory / "files"  # apart from the index: a manifest may be called index.json
        #: digest of the version each copy is of (from the index: a start-up copies nothing unchanged)
        self._digests: dict[str, bytes] = {}
        #: the digest of each merged copy's own bytes
        self._merged: dict[str, bytes] = {}
        #: noted since the last ``take``
        self._pending = Pending()
        self._lock = threading.Lock()  # one save at a time (a last one runs at shutdown)
        self._failing = False
        try:
            index = json.loads((self.directory / INDEX_NAME).read_text())
            for path, digest in index.items():
                if isinstance(digest, list):
                    self._merged[path] = bytes.fromhex(digest[1])
                    digest = digest[0]
                self._digests[path] = bytes.fromhex(digest)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, AttributeError, IndexError, TypeError) as exc:
            log.error("last good manifests %s: unreadable index (%s): starting a new one", self.directory, exc)
            self._digests, self._merged = {}, {}
        #: the holders of contested objects, as saved
        self._holders: dict[ObjectKey, str] = _read_holders(self.directory / HOLDERS_NAME)

    @classmethod
    def in_state_dir(cls, state_dir: str | os.PathLike[str]) -> "LastGoodFiles":
        return cls(Path(state_dir) / DIRECTORY_NAME)

    def paths(self) -> set[str]:
        return set(self._digests)

    def differs(self, path: str, digest: bytes) -> bool:
        """There is a copy of ``path``, and it is not (only) the version of this digest: at
        start-up, the file is applied on top of it."""
        return self.has(path) and (self._digests[path] != digest or path in self._merged)

    def has(self, path: str) -> bool:
        """There is a copy of ``path`` (it parsed before), not forgotten since (the file deleted)."""
        forgotten = path in self._pending.files and self._pending.files[path] is None
        return path in self._digests and not forgotten

    def holders(self) -> dict[ObjectKey, str]:
        """The saved holders of contested objects."""
        return dict(self._holders)

    def keep(self, path: str, digest: bytes, *, stale: Iterable[ObjectKey] = (),
             unapplied: Iterable[ObjectKey] = ()) -> None:
        """``path`` parsed with bytes of this digest: to be copied unless copied already. With
        ``stale`` objects (kept at an older version), a merged copy is made (module docstring)."""
        note = Note(digest, frozenset(stale), frozenset(unapplied))
        if note.stale or self._digests.get(path) != digest or path in self._merged:
            self._pending.files[path] = note
        else:
            self._pending.files.pop(path, None)  # back to the version copied

    def keep_holders(self, holders: dict[ObjectKey, str]) -> None:
        """The holders of contested objects now: saved if they changed."""
        if holders != (self._holders if self._pending.holders is None else self._pending.holders):
            self._pending.holders = holders

    def source_directory(self) -> tuple[int, int] | None:
        """(st_dev, st_ino) of the manifest directory the copies were made from, if saved."""
        try:
            saved = json.loads((self.directory / SOURCE_DIRECTORY_NAME).read_text())
            return int(saved[0]), int(saved[1])
        except (OSError, ValueError, TypeError, IndexError, KeyError):
            return None

    def keep_source_directory(self, identity: tuple[int, int]) -> None:
        """The manifest directory the copies come from: another one at its path at start-up
        (a volume not mounted yet) is not the files deleted. Written now, when it changed."""
        if identity == self.source_directory():
            return
        try:
            self._write(SOURCE_DIRECTORY_NAME, list(identity))
        except OSError as exc:
            log.warning("last good manifests %s: cannot save %s (%s)", self.directory, SOURCE_DIRECTORY_NAME, exc)

    def forget(self, path: str) -> None:
        """``path`` is gone from the directory: so is its copy."""
        if path in self._digests or path in self._pending.files:
            self._pending.files[path] = None

    def take(self) -> Pending:
        """What was noted since the last call, for ``save``."""
        pending, self._pending = self._pending, Pending()
        return pending

    async def keep_saving(self, wanted: asyncio.Event, manifests: Path, *, quiet: float = SAVE_QUIET,
                          max_delay: float = SAVE_MAX_DELAY) -> None:
        """Save what was noted once ``wanted`` was set and then stayed unset for ``quiet`` seconds
        (at the latest ``max_delay`` after it was first set): the copies matter at the next
        start, the next change matters now. Small files are copied on the event loop, large
        ones in a thread.

        Why not always at once in a thread: under a steady stream of changes a save in a
        thread convoys with the loop on the GIL, and the loop stalls up to the interpreter's
        switch interval while it applies the next change. On the loop the same save is a
        few syscalls, which a quiet moment can spare (bench/RESULTS.md, "Measurements
        behind the design")."""
        while True:
            await quiet_moment(wanted, quiet=quiet, max_delay=max_delay)
            pending = self.take()
            if _bytes_to_copy(pending.files, manifests) <= INLINE_SAVE_BYTES:
                self.save(pending, manifests)
            else:
                await asyncio.to_thread(self.save, pending, manifests)

    def save(self, pending: Pending, manifests: Path) -> None:
        """Copy (or delete) the files noted in ``pending``, then write the index (and the
        holders). Blocking: runs after the batch that noted them published its snapshot."""
        if not pending:
            return
        with self._lock:
            problems = []
            for path, note in pending.files.items():
                try:
                    if note is None:
                        (self.files / path).unlink(missing_ok=True)
                        self._digests.pop(path, None)
                        self._merged.pop(path, None)
                    elif note.stale:
                        self._merge(manifests, path, note)
                    elif self._copy(manifests / path, self.files / path, note.digest):
                        self._digests[path] = note.digest
                        self._merged.pop(path, None)
                except OSError as exc:
                    problems.append(f"{path}: {exc.strerror or exc}")
            try:
                if pending.files:
                    self._write_index()
                if pending.holders is not None:
                    self._write_holders(pending.holders)
            except OSError as exc:
                problems.append(f"{exc.filename or INDEX_NAME}: {exc.strerror or exc}")
        if problems and not self._failing:
            log.error("last good manifests %s: cannot keep copies (%s); files broken at start-up are served "
                      "from the copies that exist", self.directory, "; ".join(problems[:3]))
        self._failing = bool(problems)

    def parsed(self, path: str) -> tuple[Iterator[ParsedFile], int, str] | None:
        """The copy of ``path`` as chunks of objects, its size, and when it was made."""
        read = self._read_copy(path)
        if read is None:
            return None
        text, merged, size, made = read
        return iter_manifest(path, text, as_json=merged), size, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(made))

    def _read_copy(self, path: str) -> tuple[str, bool, int, float] | None:
        """(text, merged, size, mtime) of the copy of ``path``, if there is a sound one."""
        if path not in self._digests:
            return None
        copy = self.files / path
        try:
            data = copy.read_bytes()
            made = copy.stat().st_mtime
        except OSError as exc:
            log.error("last good manifests %s: cannot read the copy of %s: %s", self.directory, path, exc)
            return None
        text, _ = decode(path, data)
        merged = path in self._merged
        if text is None or content_digest(data) != (self._merged[path] if merged else self._digests[path]):
            return None
        return text, merged, len(data), made

    def _merge(self, manifests: Path, path: str, note: Note) -> None:
        """Make the merged copy of ``path`` (module docstring) if its bytes still have the noted digest."""
        try:
            fd, _ = open_regular(manifests / path)
        except (FileNotFoundError, NotRegularFile):
            return  # replaced since: its next version is noted by its own batch, if it parses
        with open(fd, "rb") as file:
            data = file.read()
        text, _ = decode(path, data)
        if text is None or content_digest(data) != note.digest:
            return  # rewritten since: its next version is noted by its own batch
        previous = self._read_copy(path)
        kept = declared_values(path, previous[0], as_json=previous[1]) if previous is not None else iter(())
        try:
            merged, missing = merged_copy(declared_values(path, text), kept, note.stale, note.unapplied)
        except (SyntaxProblem, YAMLError, RecursionError) as exc:  # both parsed before: not expected
            log.error("last good manifests %s: %s: cannot merge a copy: %s", self.directory, path, exc)
            return
        if missing:
            log.warning("last good manifests %s: %s: no saved version of %s to keep across a restart",
                        self.directory, path, ", ".join(sorted("/".join(key) for key in missing)))
        payload = merged.encode()
        target = self.files / path
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = target.with_name(f".{target.name}.tmp")
        scratch.write_bytes(payload)
        os.replace(scratch, target)
        self._digests[path] = note.digest
        self._merged[path] = content_digest(payload)

    def _copy(self, source: Path, target: Path, digest: bytes) -> bool:
        """Copy ``source`` to ``target`` if its bytes still have ``digest`` (else the file was
        rewritten since it parsed: its next version is copied once it parses)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = target.with_name(f".{target.name}.tmp")
        try:
            fd, _ = open_regular(source)
        except (FileNotFoundError, NotRegularFile):
            return False  # replaced since it parsed: its next version is copied once it parses
        with open(fd, "rb") as src, open(scratch, "wb") as dst:
            _copy_by_kernel(src, dst)
        if _file_digest(scratch) != digest:
            scratch.unlink(missing_ok=True)
            return False
        os.replace(scratch, target)
        return True

    def _write_index(self) -> None:
        index = {path: [digest.hex(), self._merged[path].hex()] if path in self._merged else digest.hex()
                 for path, digest in sorted(self._digests.items())}
        self._write(INDEX_NAME, index)

    def _write_holders(self, holders: dict[ObjectKey, str]) -> None:
        self._write(HOLDERS_NAME, [[*key, path] for key, path in sorted(holders.items())])
        self._holders = holders

    def _write(self, name: str, value: Any) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        scratch = self.directory / f".{name}.tmp"
        scratch.write_text(json.dumps(value))
        os.replace(scratch, self.directory / name)


def merged_copy(current: Iterable[tuple[ObjectKey, Any]], previous: Iterable[tuple[ObjectKey, Any]],
                stale: frozenset[ObjectKey], unapplied: frozenset[ObjectKey]) -> tuple[str, frozenset[ObjectKey]]:
    """A file's objects as served, as a JSON stream (one object a line): those of its
    ``current`` version but the ``stale`` and ``unapplied`` ones, and the ``stale`` ones'
    versions from the ``previous`` copy. Also the stale objects the previous copy lacks."""
    lines = [_json(value) for key, value in current if key not in stale and key not in unapplied]
    found: set[ObjectKey] = set()
    for key, value in previous:
        if key in stale and key not in found:
            found.add(key)
            lines.append(_json(value))
    return "".join(f"{line}\n" for line in lines), stale - found


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=_jsonable)


def _jsonable(value: Any) -> Any:
    """Values YAML can hold and JSON cannot (only in fields kubeport ignores: the object validated)."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()  # as the API encodes []byte
    return str(value)


def _read_holders(path: Path) -> dict[ObjectKey, str]:
    try:
        entries = json.loads(path.read_text())
        return {(kind, namespace, name): holder for kind, namespace, name, holder in entries}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError) as exc:
        log.error("last good manifests: unreadable %s (%s): duplicates go to the first file in path order", path, exc)
        return {}


def _bytes_to_copy(pending: dict[str, Note | None], manifests: Path) -> int:
    total = 0
    for path, note in pending.items():
        if note is not None:
            try:
                total += os.stat(manifests / path).st_size
            except OSError:
                pass  # gone: nothing to copy
    return total


def _copy_by_kernel(source: Any, target: Any) -> None:
    """``copy_file_range``: no bytes pass through Python; a file system without it is copied in chunks."""
    try:
        while os.copy_file_range(source.fileno(), target.fileno(), 1 << 30):
            pass
    except OSError:
        source.seek(0)
        target.seek(0)
        target.truncate()
        shutil.copyfileobj(source, target, _CHUNK)


def _file_digest(path: Path) -> bytes:
    digest = hashlib.blake2b(digest_size=DIGEST_SIZE)
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.digest()

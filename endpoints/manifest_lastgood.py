"""The last version of each manifest file that parsed, kept in ``--state-dir`` across restarts.

While the daemon runs, a file that stops parsing keeps the objects it held. A restart would
lose them: the daemon would start with the broken file and nothing to fall back on, and
services that worked before the restart would be gone. So every file that parsed is copied
to ``<state-dir>/last-good/files/<its path>``, and a file that does not parse at start-up is
served from its copy until it is fixed.

Cheap by design: a batch only notes which files parsed (``keep``). The copies are made in a
quiet moment after it (a clean stop makes the last ones; a crash can lose the copies of the
last few seconds, never a manifest), by the kernel (``copy_file_range``: no bytes pass
through Python, no memory held; large files off the event loop), checked against the digest
of the bytes that parsed, and only for files whose bytes changed since they were copied: a
restart copies nothing. ``index.json`` maps each path to that digest. Best effort: the
copies are a safety net, never a reason to refuse a file or to stop; a copy that cannot be
made is logged once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from kubeport.quiet import quiet_moment

from .manifest_files import ParsedFile, iter_manifest
from .manifest_reader import DIGEST_SIZE, content_digest, decode

log = logging.getLogger(__name__)

DIRECTORY_NAME = "last-good"
INDEX_NAME = "index.json"
_CHUNK = 1 << 20
#: A save copying no more than this is made on the event loop (see ``keep_saving``).
INLINE_SAVE_BYTES = 256 * 1024
#: Copies are saved once no batch came for this long (seconds), at the latest after SAVE_MAX_DELAY.
SAVE_QUIET = 0.2
SAVE_MAX_DELAY = 5.0


class LastGoodFiles:
    """Copies of manifest files by their path inside the manifest directory."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.files = self.directory / "files"  # apart from the index: a manifest may be called index.json
        #: digest of each copy (from the index: a start-up copies nothing unchanged)
        self._digests: dict[str, bytes] = {}
        #: noted since the last ``take``: a digest to copy, None to delete
        self._pending: dict[str, bytes | None] = {}
        self._lock = threading.Lock()  # one save at a time (a last one runs at shutdown)
        self._failing = False
        try:
            index = json.loads((self.directory / INDEX_NAME).read_text())
            self._digests = {path: bytes.fromhex(digest) for path, digest in index.items()}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, AttributeError) as exc:
            log.error("last good manifests %s: unreadable index (%s): starting a new one", self.directory, exc)

    @classmethod
    def in_state_dir(cls, state_dir: str | os.PathLike[str]) -> "LastGoodFiles":
        return cls(Path(state_dir) / DIRECTORY_NAME)

    def paths(self) -> set[str]:
        return set(self._digests)

    def keep(self, path: str, digest: bytes) -> None:
        """``path`` parsed with bytes of this digest: to be copied unless copied already."""
        if self._digests.get(path) != digest:
            self._pending[path] = digest

    def forget(self, path: str) -> None:
        """``path`` is gone from the directory: so is its copy."""
        if path in self._digests or path in self._pending:
            self._pending[path] = None

    def take(self) -> dict[str, bytes | None]:
        """What was noted since the last call, for ``save``."""
        pending, self._pending = self._pending, {}
        return pending

    async def keep_saving(self, wanted: asyncio.Event, manifests: Path, *, quiet: float = SAVE_QUIET,
                          max_delay: float = SAVE_MAX_DELAY) -> None:
        """Save what was noted once ``wanted`` was set and then stayed unset for ``quiet`` seconds
        (at the latest ``max_delay`` after it was first set): the copies matter at the next
        start, the next change matters now. Small files are copied on the event loop, large
        ones in a thread.

        Why not always at once in a thread: measured at 10,000 services with a change every
        few ms, saving two 1 KiB files took 1-7 ms in a thread (three renames of ~0.25 ms each
        on overlayfs), convoying with the loop on the GIL: the loop stalled up to 5 ms (the
        switch interval) while it applied the next change. On the loop the same save is ~1 ms
        of syscalls, which a quiet moment can spare."""
        while True:
            await quiet_moment(wanted, quiet=quiet, max_delay=max_delay)
            pending = self.take()
            if _bytes_to_copy(pending, manifests) <= INLINE_SAVE_BYTES:
                self.save(pending, manifests)
            else:
                await asyncio.to_thread(self.save, pending, manifests)

    def save(self, pending: dict[str, bytes | None], manifests: Path) -> None:
        """Copy (or delete) the files noted in ``pending``, then write the index. Blocking:
        runs in a worker thread, after the batch that noted them published its snapshot."""
        if not pending:
            return
        with self._lock:
            problems = []
            for path, digest in pending.items():
                try:
                    if digest is None:
                        (self.files / path).unlink(missing_ok=True)
                        self._digests.pop(path, None)
                    elif self._copy(manifests / path, self.files / path, digest):
                        self._digests[path] = digest
                except OSError as exc:
                    problems.append(f"{path}: {exc.strerror or exc}")
            try:
                self._write_index()
            except OSError as exc:
                problems.append(f"{INDEX_NAME}: {exc.strerror or exc}")
        if problems and not self._failing:
            log.error("last good manifests %s: cannot keep copies (%s); files broken at start-up are served "
                      "from the copies that exist", self.directory, "; ".join(problems[:3]))
        self._failing = bool(problems)

    def parsed(self, path: str) -> tuple[Iterator[ParsedFile], int, str] | None:
        """The copy of ``path`` as chunks of objects, its size, and when it was made."""
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
        if text is None or content_digest(data) != self._digests[path]:
            return None
        return iter_manifest(path, text), len(data), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(made))

    def _copy(self, source: Path, target: Path, digest: bytes) -> bool:
        """Copy ``source`` to ``target`` if its bytes still have ``digest`` (else the file was
        rewritten since it parsed: its next version is copied once it parses)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = target.with_name(f".{target.name}.tmp")
        try:
            shutil.copyfile(source, scratch)
        except FileNotFoundError:
            return False
        if _file_digest(scratch) != digest:
            scratch.unlink(missing_ok=True)
            return False
        os.replace(scratch, target)
        return True

    def _write_index(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        scratch = self.directory / f".{INDEX_NAME}.tmp"
        scratch.write_text(json.dumps({path: digest.hex() for path, digest in sorted(self._digests.items())}))
        os.replace(scratch, self.directory / INDEX_NAME)


def _bytes_to_copy(pending: dict[str, bytes | None], manifests: Path) -> int:
    total = 0
    for path, digest in pending.items():
        if digest is not None:
            try:
                total += os.stat(manifests / path).st_size
            except OSError:
                pass  # gone: nothing to copy
    return total


def _file_digest(path: Path) -> bytes:
    digest = hashlib.blake2b(digest_size=DIGEST_SIZE)
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.digest()

"""Manifest files on disk: which to read, and reading one (bytes -> parsed file).

Nothing here touches the cluster state. The source runs :func:`read_bytes` (the disk) in a
thread of its own with a deadline (``batch.py``), and :func:`parse_bytes` on the event loop
(a small file) or in a worker thread.
Hidden files and directories (a name starting with ``.``) are never read: they hold
editors' swap files, ``.git`` and the ``..data`` twins of a mounted ConfigMap.

Only regular files are read, and none past a size limit: anyone who can write the directory
could otherwise stop the daemon. A named pipe blocks its reader until a writer comes, a
device (``/dev/zero``, also behind a symbolic link) never ends, a socket cannot be read.
Such a file is a problem line and keeps the objects it held; it is never opened for reading
(:func:`open_regular` checks before and after the open, so a file swapped in between is
caught too).
"""

from __future__ import annotations

import hashlib
import os
import stat as stat_mode
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kubeport.endpoints.manifests.documents import check_syntax, syntax_checked_lazily
from kubeport.endpoints.manifests.parse import ParsedFile, UnchangedCheck, iter_manifest

#: What kubectl reads from a directory (case-sensitive, as kubectl compares them).
MANIFEST_EXTENSIONS = (".yaml", ".yml", ".json")

#: (device, inode, size, mtime, ctime): a file whose key is unchanged need not be read.
StatKey = tuple[int, int, int, int, int]


def stat_key(stat: os.stat_result) -> StatKey:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def is_manifest_path(relative: str) -> bool:
    """A path (relative to the manifest directory) that kubeport reads."""
    parts = Path(relative).parts
    return (
        bool(parts)
        and relative.endswith(MANIFEST_EXTENSIONS)
        and not any(part.startswith(".") for part in parts)
    )


def list_manifest_files(directory: Path) -> dict[str, StatKey]:
    """Every manifest file under ``directory`` (recursively), relative POSIX path -> stat key.

    Symlinked files are followed (the key is the target's, so a swapped link is a change),
    symlinked directories are not (no loops). Files that vanish while listing are left out.
    The periodic rescan runs this every few seconds: ``scandir`` entries and string paths,
    not ``os.walk`` and ``Path.relative_to``, leave the stat calls themselves as most of
    its cost.
    """
    found: dict[str, StatKey] = {}
    pending = [(os.fspath(directory), "")]
    while pending:
        path, prefix = pending.pop()
        try:
            entries = os.scandir(path)
        except OSError:
            continue  # gone or unreadable meanwhile, as os.walk skips it
        with entries:
            for entry in entries:
                name = entry.name
                if name.startswith("."):
                    continue
                try:
                    if entry.is_dir():
                        if not entry.is_symlink():
                            pending.append((entry.path, f"{prefix}{name}/"))
                        continue
                    if not name.endswith(MANIFEST_EXTENSIONS):
                        continue
                    stat = entry.stat()
                except OSError:
                    continue
                found[prefix + name] = stat_key(stat)
    return found


def stat_manifest_files(directory: Path, paths: Iterable[str]) -> dict[str, StatKey]:
    """The stat keys of some manifest files (relative paths) that exist, as listed."""
    found: dict[str, StatKey] = {}
    for path in paths:
        try:
            found[path] = stat_key(os.stat(directory / path))
        except OSError:
            continue
    return found


MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """How much of the manifest directory is read (the configuration's ``manifestLimits``)."""

    #: a larger file is not read; real manifests, even of a large cluster, are far smaller
    file_bytes: int = 64 * MiB
    #: the files read and held together: past it, a further file (or a file grown) is not read
    total_bytes: int = 256 * MiB
    #: a read (of one file) taking longer is abandoned: a slow or hung file system
    read_timeout: float = 10.0


class NotRegularFile(OSError):
    """The path is not a regular file (after following symbolic links): what it is instead."""


_KINDS = (
    (stat_mode.S_ISFIFO, "a named pipe (FIFO)"),
    (stat_mode.S_ISSOCK, "a socket"),
    (stat_mode.S_ISCHR, "a character device"),
    (stat_mode.S_ISBLK, "a block device"),
    (stat_mode.S_ISDIR, "a directory"),
)


def file_kind(mode: int) -> str:
    """What a non-regular file is, as a problem line says it."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _not_regular(path: str | os.PathLike[str], mode: int) -> NotRegularFile:
    kind = file_kind(mode)
    try:
        if os.path.islink(path):
            kind = f"a symbolic link to {kind} ({os.path.realpath(path)})"
    except OSError:
        pass
    return NotRegularFile(f"{kind}, not a regular file")


def open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file at ``path`` (symbolic links followed), and its stat.

    Anything else raises :class:`NotRegularFile` without being opened; a file swapped for
    something else between the check and the open is opened without blocking
    (``O_NONBLOCK``: a named pipe does not wait for a writer) and closed at once unread."""
    before = os.stat(path)
    if not stat_mode.S_ISREG(before.st_mode):
        raise _not_regular(path, before.st_mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        after = os.fstat(fd)
        if not stat_mode.S_ISREG(after.st_mode):
            raise _not_regular(path, after.st_mode)
        # Another regular file renamed into place meanwhile (an editor's save) is read as it is.
    except BaseException:
        os.close(fd)
        raise
    return fd, after


class TooLarge(OSError):
    """A file over a :class:`ReadLimits` limit; the message says which."""


_READ_CHUNK = 1 << 20


def read_limited(fd: int, size: int, limit: int, deadline: float) -> bytes:
    """Read ``fd`` to its end: no more than ``limit`` bytes, no later than ``deadline``
    (``time.monotonic``). ``size`` (from fstat) sizes the first read."""
    chunks = []
    total = 0
    while True:
        chunk = os.read(fd, min(max(size - total, 0) + 1, _READ_CHUNK, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > limit:
            raise TooLarge(f"grew past {_mib(limit)} while it was read")
        chunks.append(chunk)
        if time.monotonic() > deadline:
            raise TimeoutError(f"not read to its end within the read timeout ({total} bytes read)")


def _mib(size: int) -> str:
    if size < MiB:
        return f"{size} bytes"
    return f"{size / MiB:.1f} MiB" if size % MiB else f"{size // MiB} MiB"


class ReadBudget:
    """The bytes of the files read, against :attr:`ReadLimits.total_bytes`. Files are read one
    at a time (a batch is sequential), so no lock."""

    def __init__(self, limits: ReadLimits | None = None) -> None:
        self.limits = limits or ReadLimits()
        self._held: dict[str, int] = {}
        self.total = 0

    def refusal(self, path: str, size: int) -> str | None:
        """Why ``path`` of ``size`` bytes is not read, or None."""
        limits = self.limits
        if size > limits.file_bytes:
            return (f"{_mib(size)}, over the limit of {_mib(limits.file_bytes)} per file "
                    f"(manifestLimits.fileBytes)")
        others = self.total - self._held.get(path, 0)
        if others + size > limits.total_bytes:
            return (f"{_mib(size)}, and the other files read hold {_mib(others)}: over the limit of "
                    f"{_mib(limits.total_bytes)} in all (manifestLimits.totalBytes)")
        return None

    def hold(self, path: str, size: int) -> None:
        self.total += size - self._held.get(path, 0)
        self._held[path] = size

    def release(self, path: str) -> None:
        self.total -= self._held.pop(path, 0)


DIGEST_SIZE = 16


def content_digest(data: bytes) -> bytes:
    """What identifies a file's bytes: a file whose digest is unchanged need not be parsed again."""
    return hashlib.blake2b(data, digest_size=DIGEST_SIZE).digest()


def decode(path: str, data: bytes) -> tuple[str | None, str | None]:
    """(text, None) or (None, problem line). A UTF-8 byte-order mark is dropped."""
    try:
        return data.decode("utf-8-sig"), None
    except UnicodeDecodeError as exc:
        return None, f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})"


@dataclass(frozen=True, slots=True)
class FileRead:
    """One file as read from disk: its first chunk of objects, and the rest to come."""

    path: str
    #: None when the file is gone, or when ``same``
    parsed: ParsedFile | None
    #: digest of the file's bytes
    content: bytes = b""
    stat: StatKey | None = None
    #: the bytes are those read last time: nothing to do
    same: bool = False
    #: the following chunks of a large file (parsed as they are taken)
    rest: Iterator[ParsedFile] = field(default_factory=lambda: iter(()))

    @property
    def gone(self) -> bool:
        return self.parsed is None and not self.same


@dataclass(frozen=True, slots=True)
class FileBytes:
    """A file's bytes as read from disk, not parsed yet."""

    path: str
    data: bytes
    stat: StatKey


#: Above this size a file is checked for syntax errors before its objects stream in
#: chunks, so that a broken file changes nothing (its last good objects stay).
STREAM_ABOVE_BYTES = 256 * 1024


def not_read(path: str, why: str) -> FileRead:
    """A file that could not be read: a failed parse, so its objects are kept."""
    return FileRead(path, ParsedFile(problems=(f"{path}: not read: {why}",), failed=True))


def read_bytes(directory: Path, path: str, limits: ReadLimits) -> FileBytes | FileRead:
    """The disk part of reading ``directory/path``: its bytes, or the FileRead that says why
    there are none (gone; not a regular file, over ``limits.file_bytes``, too slow: a failed
    parse). Safe in any thread: it changes nothing but the file descriptor it opens (the
    total of the budget is the caller's to check and to hold, see :func:`parse_bytes`)."""
    full = directory / path
    try:
        fd, opened = open_regular(full)
        try:
            if opened.st_size > limits.file_bytes:
                raise TooLarge(f"{_mib(opened.st_size)}, over the limit of {_mib(limits.file_bytes)} per file "
                               f"(manifestLimits.fileBytes)")
            deadline = time.monotonic() + limits.read_timeout
            data = read_limited(fd, opened.st_size, limits.file_bytes, deadline)
        finally:
            os.close(fd)
    except FileNotFoundError:
        return FileRead(path, None)
    except (NotRegularFile, TooLarge, TimeoutError) as exc:
        return not_read(path, str(exc))
    except OSError as exc:
        return FileRead(path, ParsedFile(problems=(f"{path}: cannot read: {exc.strerror or exc}",), failed=True))
    return FileBytes(path, data, stat_key(opened))


def parse_bytes(read: FileBytes | FileRead, *, known_content: bytes | None = None,
                unchanged: UnchangedCheck | None = None, budget: ReadBudget | None = None) -> FileRead:
    """What :func:`read_bytes` returned, parsed (its first chunk), held in ``budget`` (over
    its total: not read); nothing when the bytes digest to ``known_content``."""
    budget = budget or ReadBudget()
    if isinstance(read, FileRead):
        if read.gone:
            budget.release(read.path)
        return read
    path, data = read.path, read.data
    if (refusal := budget.refusal(path, len(data))) is not None:
        return not_read(path, refusal)
    budget.hold(path, len(data))
    content = content_digest(data)
    if content == known_content:
        return FileRead(path, None, content, read.stat, same=True)
    text, problem = decode(path, data)
    if text is None:
        return FileRead(path, ParsedFile(problems=(problem or path,), failed=True), content, read.stat)
    if len(text) > STREAM_ABOVE_BYTES and syntax_checked_lazily(path):
        problem = check_syntax(path, text)
        if problem is not None:
            return FileRead(path, ParsedFile(problems=(problem,), failed=True), content, read.stat)
    chunks = iter_manifest(path, text, unchanged=unchanged)
    return FileRead(path, next(chunks), content, read.stat, rest=chunks)


def read_manifest(
    directory: Path, path: str, *, known_content: bytes | None = None, unchanged: UnchangedCheck | None = None,
    budget: ReadBudget | None = None,
) -> FileRead:
    """Read ``directory/path`` and parse its first chunk (:func:`read_bytes`, then
    :func:`parse_bytes`); nothing when its bytes digest to ``known_content``. An unreadable
    file (not a regular file, over a limit of ``budget``) is a failed parse (its objects are
    kept), a missing one is gone."""
    budget = budget or ReadBudget()
    return parse_bytes(read_bytes(directory, path, budget.limits), known_content=known_content,
                       unchanged=unchanged, budget=budget)

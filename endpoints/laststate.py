"""The last applied state, kept in the state directory as it changes, so that a daemon started
again (after a crash, a ``kill -9``, an OOM kill) serves it at once, before its source has
synced, instead of refusing every connection and query until then.

What is kept is what the ClusterState holds from its source: the slim Services,
EndpointSlices, Nodes and Namespaces (``ServiceInfo``, ``SliceInfo``, ``NodeInfo``, names).
Everything a snapshot is built from, and nothing more: the snapshot is rebuilt from them.

The cost of a change grows with the change, not the cluster: each change is appended to a
journal (one record per committed batch, written off the event loop), and the journal is
folded into a new base file only once it has grown past the base's size, so the full rewrite
costs about as much as the changes it absorbs; a forked child writes it. Measured at 10,000
services x 10 endpoints (bench/laststate_cost.py): a 5.4 MB base, 570 bytes and about 0.25 ms
of CPU off the loop per endpoint change. No fsync: this survives the process dying,
which is what it is for; after a power loss the source is read again, as without it.

The records are pickles of kubeport's own frozen dataclasses, in a directory only root
writes (the state directory, where the allocations are too): reading them back is about
ten times faster than validating the objects again, and anything that does not load (a
truncated last record, another kubeport version's format) is skipped, never served half.
"""

from __future__ import annotations

import asyncio
import copyreg
import logging
import os
import pickle
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

log = logging.getLogger(__name__)


def _mapping_view(view: Mapping[str, str]) -> tuple[Any, tuple[dict[str, str]]]:
    return read_only, (dict(view),)


def read_only(mapping: dict[str, str]) -> Mapping[str, str]:
    """A kept view, read back (pickle names this function: mappingproxy has no importable name)."""
    return MappingProxyType(mapping)


# A Pod's labels are a read-only view (PodInfo.labels), which pickle cannot write as such:
# kept as the dict it shows, read back as a view of it.
copyreg.pickle(MappingProxyType, _mapping_view)  # type: ignore[arg-type]

#: Bumped whenever the kept dataclasses change shape: an older state is then not served.
FORMAT = 2
BASE = "base.pickle"
JOURNAL = "journal"
_LENGTH = struct.Struct("!I")
#: the journal is folded into the base once it is larger than this, or than the base
MIN_FOLD_BYTES = 4 << 20

#: (kind, key, value): key as ClusterState.keys gives it, value None for a deletion.
Entry = tuple[str, tuple[str, str], Any]


@dataclass(frozen=True)
class SavedState:
    entries: dict[tuple[str, tuple[str, str]], Any]
    #: Unix time of the last change it holds
    saved_at: float

    def age(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.saved_at


def _header() -> tuple[int, str]:
    from kubeport import __version__

    return FORMAT, __version__


class LastState:
    """Records the ClusterState's changes (``record``, from the event loop) and writes them
    (``run``, a task); ``load`` reads what an earlier process wrote."""

    def __init__(self, directory: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self._clock = clock
        self._pending: dict[tuple[str, tuple[str, str]], Any] = {}
        self._wake = asyncio.Event()
        self._full: Callable[[], Iterable[Entry]] | None = None
        self._base_bytes = 0
        self._journal_bytes = 0
        #: the last write failed: a problem line (the state is kept in memory and retried)
        self.problem: str | None = None
        self.saved_at: float | None = None
        self._writing = False

    @property
    def settled(self) -> bool:
        """Everything recorded so far is written."""
        return not self._pending and not self._writing and self.saved_at is not None

    # --- reading ----------------------------------------------------------------------

    def load(self) -> SavedState | None:
        """The state an earlier process kept here, or None (none, or unusable: logged)."""
        base = self.directory / BASE
        if not base.exists():
            return None
        try:
            with base.open("rb") as f:
                header, saved_at, items = pickle.load(f)
            if tuple(header) != _header():
                log.info("last applied state in %s: written by another kubeport version (%s); not served",
                         self.directory, header)
                return None
            entries = dict(items)
            saved_at = self._replay(entries, saved_at)
        except Exception as exc:  # a damaged file is no reason not to start
            log.warning("last applied state in %s cannot be read (%s: %s); not served",
                        self.directory, type(exc).__name__, exc)
            return None
        return SavedState({k: v for k, v in entries.items() if v is not None}, saved_at)

    def _replay(self, entries: dict, saved_at: float) -> float:
        journal = self.directory / JOURNAL
        if not journal.exists():
            return saved_at
        data = journal.read_bytes()
        offset = 0
        while offset + _LENGTH.size <= len(data):
            (length,) = _LENGTH.unpack_from(data, offset)
            end = offset + _LENGTH.size + length
            if end > len(data):
                break  # the process died while writing this record: the ones before it hold
            at, changes = pickle.loads(data[offset + _LENGTH.size:end])
            for kind, key, value in changes:
                entries[(kind, key)] = value
            saved_at = at
            offset = end
        return saved_at

    # --- writing ----------------------------------------------------------------------

    def attach(self, full: Callable[[], Iterable[Entry]]) -> None:
        """``full`` lists every entry the state holds now (for a fold into a new base)."""
        self._full = full

    def record(self, kind: str, key: tuple[str, str], value: Any) -> None:
        self._pending[(kind, key)] = value
        self._wake.set()

    async def run(self) -> None:
        """Write what was recorded, after each batch, until cancelled. The first write is a
        new base: what an earlier process left is replaced by what this one holds."""
        loop = asyncio.get_running_loop()
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        first = True
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(0)  # let the batch that woke us finish recording
            pending, self._pending = self._pending, {}
            now = self._clock()
            self._writing = True
            try:
                if first or self._journal_bytes > max(self._base_bytes, MIN_FOLD_BYTES):
                    assert self._full is not None
                    self._base_bytes = await self._write_base_aside(list(self._full()), now)
                    self._journal_bytes = 0
                    first = False
                else:
                    changes = [(kind, key, value) for (kind, key), value in pending.items()]
                    self._journal_bytes += await loop.run_in_executor(None, self._append, changes, now)
            except OSError as exc:
                self._writing = False
                for item, value in pending.items():  # kept for the next attempt
                    self._pending.setdefault(item, value)
                message = f"cannot keep the last applied state in {self.directory}: {exc}"
                if self.problem != message:
                    log.error("%s", message)
                self.problem = message
                await asyncio.sleep(1.0)  # a full disk: retried, not spun on
                self._wake.set()
                continue
            self.saved_at = now
            self._writing = False
            if self.problem is not None:
                log.info("the last applied state is kept in %s again", self.directory)
                self.problem = None

    async def _write_base_aside(self, entries: list[Entry], now: float) -> int:
        """The base, written by a forked copy of this process: pickling 10,000 services and
        their 100,000 endpoints takes about half a second of the interpreter (each slots
        dataclass is reduced in Python), which a thread would take from the event loop too
        (the GIL); a child has its own and leaves the loop alone (Redis's BGSAVE). Its pages
        are shared copy-on-write; the ones it touches are copied while it runs."""
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child: nothing but the write, then _exit
            code = 1
            try:
                self._write_base(entries, now)
                code = 0
            finally:
                os._exit(code)
        _, status = await asyncio.get_running_loop().run_in_executor(None, os.waitpid, pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise OSError(f"the process writing {self.directory / BASE} failed ({os.waitstatus_to_exitcode(status)})")
        return (self.directory / BASE).stat().st_size

    def _write_base(self, entries: list[Entry], now: float) -> int:
        data = pickle.dumps((_header(), now, [((kind, key), value) for kind, key, value in entries]),
                            protocol=pickle.HIGHEST_PROTOCOL)
        tmp = self.directory / (BASE + ".tmp")
        tmp.write_bytes(data)
        # The journal belongs to the base it follows: empty it before the new base is in
        # place, so that a crash in between leaves the old base and no journal (older, whole).
        (self.directory / JOURNAL).write_bytes(b"")
        os.replace(tmp, self.directory / BASE)
        return len(data)

    def _append(self, changes: list[Entry], now: float) -> int:
        record = pickle.dumps((now, changes), protocol=pickle.HIGHEST_PROTOCOL)
        fd = os.open(self.directory / JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, _LENGTH.pack(len(record)) + record)
        finally:
            os.close(fd)
        return _LENGTH.size + len(record)

"""The last applied state, kept in the state directory as it changes, so that a daemon started
again (after a crash, a ``kill -9``, an OOM kill) serves it at once, before its source has
synced, instead of refusing every connection and query until then.

What is kept is what the ClusterState holds from its source: the slim Services,
EndpointSlices, Nodes, Pods and Namespaces (``ServiceInfo``, ``SliceInfo``, ``NodeInfo``,
``PodInfo``, names).
Everything a snapshot is built from, and nothing more: the snapshot is rebuilt from them.

The cost of a change grows with the change, not the cluster: each burst of changes is
appended to a journal once the proxy and DNS have applied it, and the journal is folded into a
new base only once it has grown past the base's size, so the full rewrite costs about as much
as the changes it absorbs. A base is written on the event loop in pieces of 25
entries, each in a quiet moment (no change for 0.2 s), so that a change never waits behind
more than one piece (the sizes and times: bench/laststate_cost.py). No fsync: this survives the process dying, which is what it is for; after a power loss the
source is read again, as without it. Recording starts with the first base, once the daemon is
ready: the first sync's objects recorded one by one leave holes in the heap, for entries
the first base holds anyway.

The records are pickles of kubeport's own frozen dataclasses, in a directory only root
writes (the state directory, where the allocations are too): reading them back is about
ten times faster than validating the objects again, and anything that does not load (a
truncated last record, another kubeport version's format) is skipped, never served half.
"""

from __future__ import annotations

import asyncio
import copyreg
import dataclasses
import io
import itertools
import logging
import operator
import os
import pickle
import struct
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from kubeport.endpoints import types as kept_types
from kubeport.endpoints.interfaces import Entry

log = logging.getLogger(__name__)



def _read_only(mapping: dict) -> types.MappingProxyType:
    return types.MappingProxyType(mapping)


# Read-only maps (a Pod's labels, a Service's selector) are kept as the dicts they wrap.
copyreg.pickle(types.MappingProxyType, lambda proxy: (_read_only, (dict(proxy),)))


def _by_constructor(cls: type) -> Callable[[Any], tuple]:
    """Pickle an instance as ``cls(*fields)``. A frozen slotted dataclass pickles by default as
    its state, restored by dataclasses' ``_dataclass_setstate``, which calls ``fields()`` for
    every object, most of a load's time. Its
    generated ``__init__`` takes the fields as they are."""
    names = [f.name for f in dataclasses.fields(cls)]
    values = operator.attrgetter(*names)
    if len(names) == 1:
        return lambda obj: (cls, (values(obj),))
    return lambda obj: (cls, values(obj))


def _constructible(cls: Any) -> bool:
    """A dataclass whose ``__init__`` takes every field, and does nothing more with them."""
    return (isinstance(cls, type) and dataclasses.is_dataclass(cls) and not hasattr(cls, "__post_init__")
            and all(f.init for f in dataclasses.fields(cls)))


#: the kept classes, pickled by their constructors (Pickler.dispatch_table, for these pickles only)
_DISPATCH = {**copyreg.dispatch_table,
             **{cls: _by_constructor(cls) for cls in vars(kept_types).values() if _constructible(cls)}}


def _dumps(value: Any) -> bytes:
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = _DISPATCH
    pickler.dump(value)
    return out.getvalue()


#: Bumped whenever the kept dataclasses change shape: an older state is then not served.
FORMAT = 4
BASE = "base.pickle"
JOURNAL = "journal"
_LENGTH = struct.Struct("!I")
#: the journal is folded into a new base once it is larger than this, or than the base
MIN_FOLD_BYTES = 4 << 20
#: seconds a change waits to be written, with the ones that follow it
COALESCE = 0.05
#: a base is written in pieces of this many entries, each only after this many seconds
#: without a change (pickling a large state takes the interpreter long enough to delay the
#: changes arriving meanwhile, were it done in one go)
CHUNK = 25
QUIET = 0.2
#: ...unless the journal has grown this many times past the base: churn that never pauses
FORCE_FACTOR = 4

def journal_name(generation: int) -> str:
    return f"{JOURNAL}.{generation}"


@dataclass(frozen=True)
class SavedState:
    entries: dict[tuple[str, tuple[str, str]], Any]
    #: Unix time of the last change it holds
    saved_at: float

    def age(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.saved_at


def _header() -> tuple[int, str]:
    from kubeport.lib.version import __version__

    return FORMAT, __version__


class LastState:
    """Records the ClusterState's changes (``record``, from the event loop) and writes them
    (``run``, a task); ``load`` reads what an earlier process wrote."""

    def __init__(self, directory: Path, *, clock: Callable[[], float] = time.time,
                 base_written: Callable[[], None] = lambda: None) -> None:
        """:param base_written: called after each base is whole: pickling one leaves the
            heap larger until it is trimmed (lib/heap.py)."""
        self.directory = directory
        self._clock = clock
        self._base_written = base_written
        self._pending: dict[tuple[str, tuple[str, str]], Any] = {}
        self._wake = asyncio.Event()
        self._full: Callable[[], Iterable[Entry]] | None = None
        self._base_bytes = 0
        self._journal_bytes = 0
        #: the last write failed: a problem line (the state is kept in memory and retried)
        self.problem: str | None = None
        self.saved_at: float | None = None
        self._writing = False
        #: the generation of the base on disk (the one load read, or the last written), the one
        #: being written or last begun (its journal takes the changes), and the last one whole
        self._generation = 0
        self._generation_in_use = 0
        self._written_generation = -1
        self._last_change = 0.0
        #: the base being written, or the last one
        self._base_task: asyncio.Task | None = None

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
            records = _records(base.read_bytes())
            header, generation, saved_at = pickle.loads(next(records))
            if tuple(header) != _header():
                log.info("last applied state in %s: written by another kubeport version (%s); not served",
                         self.directory, header)
                return None
            entries: dict = {}
            for chunk in records:
                entries.update(((kind, key), value) for kind, key, value in pickle.loads(chunk))
            journal = self.directory / journal_name(generation)
            if journal.exists():
                for record in _records(journal.read_bytes()):
                    at, changes = pickle.loads(record)
                    entries.update(((kind, key), value) for kind, key, value in changes)
                    saved_at = at
        except Exception as exc:  # a damaged file is no reason not to start
            log.warning("last applied state in %s cannot be read (%s: %s); not served",
                        self.directory, type(exc).__name__, exc)
            return None
        self._generation = generation
        return SavedState({k: v for k, v in entries.items() if v is not None}, saved_at)

    # --- writing ----------------------------------------------------------------------

    def attach(self, full: Callable[[], Iterable[Entry]]) -> None:
        """``full`` lists every entry the state holds now (for a fold into a new base)."""
        self._full = full

    def record(self, kind: str, key: tuple[str, str], value: Any) -> None:
        self._pending[(kind, key)] = value
        self._last_change = self._clock()
        self._wake.set()

    async def run(self) -> None:
        """Write what was recorded until cancelled: first a new base of everything held (what
        an earlier process left is replaced by it once it is whole), then each burst of
        changes appended to the journal of that base; a new base when the journal outgrew it.

        A base holds the state at the moment it was begun; the changes after that moment go
        to the new base's own journal (``journal.<generation>``), so a crash before the base
        is whole leaves the previous base and journal, older but consistent."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._generation = max(self._generation, self._generation_on_disk())
        base: asyncio.Task | None = self._begin_base()
        try:
            await self._keep_writing(base)
        finally:
            # A base being written when the writer stops is abandoned (its temporary file is
            # not the base); one that failed was reported by _base_done.
            if self._base_task is not None and not self._base_task.done():
                self._base_task.cancel()

    async def _keep_writing(self, base: asyncio.Task | None) -> None:
        while True:
            await self._wake.wait()
            # After the change is applied, not before it: the proxy and DNS go first, and the
            # changes of a burst share one record.
            await asyncio.sleep(COALESCE)
            self._wake.clear()
            pending, self._pending = self._pending, {}
            now = self._clock()
            self._writing = True
            try:
                if base is not None and base.done():
                    base.result()  # its error, if any
                    base = None
                if pending:
                    # On the loop: a thread would hold the GIL while pickling and keep the loop
                    # waiting for it up to the interpreter's switch interval, on the path of
                    # every change.
                    changes = [(kind, key, value) for (kind, key), value in pending.items()]
                    self._journal_bytes += self._append(changes, now)
                if base is None and (self._written_generation != self._generation_in_use
                                     or self._journal_bytes > max(self._base_bytes, MIN_FOLD_BYTES)):
                    base = self._begin_base()  # the first one failed, or a fold
            except Exception as exc:  # noqa: BLE001 - keeping a copy must never stop the serving
                self._writing = False
                base = None
                for item, value in pending.items():  # kept for the next attempt
                    self._pending.setdefault(item, value)
                message = self._problem_of(exc)
                if self.problem != message:
                    log.error("%s", message)
                self.problem = message
                await asyncio.sleep(1.0)  # a full disk: retried, not spun on
                self._wake.set()
                continue
            self.saved_at = now if self._written_generation == self._generation_in_use else self.saved_at
            self._writing = base is not None
            if self.problem is not None and self._written_generation == self._generation_in_use:
                log.info("the last applied state is kept in %s again", self.directory)
                self.problem = None

    def _generation_on_disk(self) -> int:
        try:
            with (self.directory / BASE).open("rb") as f:
                (length,) = _LENGTH.unpack(f.read(_LENGTH.size))
                return int(pickle.loads(f.read(length))[1])
        except Exception:  # none, or unreadable: a new history
            return 0

    def _begin_base(self) -> asyncio.Task:
        """Start a new base of everything held now; the journal of what follows is its own."""
        assert self._full is not None
        entries = self._full()  # the state now; its entries are made as the pieces are written
        self._pending.clear()  # in the base already; the journal takes what follows
        self._generation_in_use = self._generation + 1
        (self.directory / journal_name(self._generation_in_use)).unlink(missing_ok=True)  # a leftover
        self._journal_bytes = 0
        self._writing = True
        task = asyncio.ensure_future(self._write_base(self._generation_in_use, entries, self._clock()))
        task.add_done_callback(self._base_done)
        self._base_task = task
        return task

    def _base_done(self, task: asyncio.Task) -> None:
        """A base written, or not: its error is reported here, at once (EMFILE, a full disk),
        and not only when the writer next wakes; a writer stopped before that would leave it
        "never retrieved". The writer retries from the same message, logged once."""
        self._wake.set()
        if task.cancelled() or task.exception() is None:
            return
        message = self._problem_of(task.exception())
        if self.problem != message:
            log.error("%s", message)
        self.problem = message

    def _problem_of(self, exc: BaseException) -> str:
        return f"cannot keep the last applied state in {self.directory}: {exc}"

    async def _write_base(self, generation: int, entries: Iterable[Entry], now: float) -> None:
        tmp = self.directory / (BASE + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        written = 0
        try:
            written += _write_record(fd, _dumps((_header(), generation, now)))
            pieces = iter(entries)
            while piece := list(itertools.islice(pieces, CHUNK)):
                while (self._clock() - self._last_change < QUIET
                       and self._journal_bytes <= FORCE_FACTOR * max(self._base_bytes, MIN_FOLD_BYTES)):
                    await asyncio.sleep(QUIET)
                written += _write_record(fd, _dumps(piece))
                await asyncio.sleep(0)
        finally:
            os.close(fd)
        os.replace(tmp, self.directory / BASE)
        for old in self.directory.glob(f"{JOURNAL}.*"):
            if old.name != journal_name(generation):
                old.unlink(missing_ok=True)
        self._generation = self._written_generation = generation
        self._base_bytes = written
        self.saved_at = now if self.saved_at is None or self.saved_at < now else self.saved_at
        self._base_written()

    def _append(self, changes: list[Entry], now: float) -> int:
        record = _dumps((now, changes))
        fd = os.open(self.directory / journal_name(self._generation_in_use), os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                     0o600)
        try:
            return _write_record(fd, record)
        finally:
            os.close(fd)


def _write_record(fd: int, data: bytes) -> int:
    os.write(fd, _LENGTH.pack(len(data)) + data)
    return _LENGTH.size + len(data)


def _records(data: bytes) -> Iterator[bytes]:
    """The length-prefixed records of a file; a truncated last one (the process died while
    writing it) ends the file: the records before it hold."""
    offset = 0
    while offset + _LENGTH.size <= len(data):
        (length,) = _LENGTH.unpack_from(data, offset)
        end = offset + _LENGTH.size + length
        if end > len(data):
            return
        yield data[offset + _LENGTH.size:end]
        offset = end

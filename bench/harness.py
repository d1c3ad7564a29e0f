"""Rounds, samples, medians, ratios and targets: the bookkeeping every benchmark shares.

A benchmark has subjects (peers and kubeport) and figures. Each round measures every
subject, alternating the order (forward in odd rounds, reversed in even ones), so slow
drift of a shared, noisy machine hits all subjects alike. Absolute numbers are not
comparable across runs; the ratio kubeport/peer *within one round* is, so ratios are
taken per round and their median is what a target is judged on. A miss is reported,
never hidden; a figure that could not be measured says why.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field

from .procinfo import CpuMeter, MachineMeter

KUBEPORT = "kubeport"
#: kubeport with --tcp-relay sockmap, beside "kubeport" in the proxy benchmark (bench/proxy.py)
KUBEPORT_SOCKMAP = "kubeport-sockmap"


@dataclass(frozen=True)
class Figure:
    key: str
    title: str
    unit: str
    higher_is_better: bool = True
    digits: int = 1
    label: str = ""  # short name for the chart

    @property
    def short(self) -> str:
        return self.label or self.title


@dataclass(frozen=True)
class Target:
    """A performance target: a ratio to ``peer`` (median over rounds) or, without a peer, kubeport's own value."""

    figure: str
    op: str  # ">=" or "<="
    value: float
    peer: str | None = None

    @property
    def text(self) -> str:
        if self.peer is None:
            return f"{self.op} {self.value:g}"
        return f"{self.op} {self.value:g}x {self.peer}"

    def met_by(self, observed: float) -> bool:
        return observed >= self.value if self.op == ">=" else observed <= self.value


@dataclass
class Sample:
    bench: str
    figure: str
    subject: str
    round: int
    value: float | None
    cpu_seconds: float | None = None
    note: str = ""
    #: percent of all the machine's cores busy during the run (every process, kernel included)
    machine_busy: float | None = None
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Stats:
    median: float
    low: float
    high: float
    n: int


@dataclass(frozen=True)
class RatioRow:
    figure: str
    peer: str
    per_round: tuple[float, ...]
    stats: Stats | None
    target: Target | None
    met: bool | None


@dataclass(frozen=True)
class AbsoluteRow:
    figure: str
    stats: Stats | None
    target: Target
    met: bool | None


def stats_of(values: Sequence[float]) -> Stats | None:
    if not values:
        return None
    return Stats(statistics.median(values), min(values), max(values), len(values))


@dataclass
class Bench:
    """One benchmark's declaration plus the samples it gathered."""

    name: str
    title: str
    subjects: list[str]
    figures: list[Figure]
    targets: list[Target]
    notes: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    profiles: list = field(default_factory=list)
    #: kubeport's --workers and the peers' worker count in this benchmark's runs; None: one count
    #: for the whole run (results that predate per-benchmark counts, or a benchmark without workers)
    workers: int | None = None
    #: how kubeport serves this benchmark's figures at this worker count (the report puts it beside them)
    workers_note: str = ""

    @property
    def label(self) -> str:
        """The benchmark's name, with its worker count when it has one."""
        if self.workers is None:
            return self.name
        return f"{self.name}, {workers_text(self.workers)}"

    def figure(self, key: str) -> Figure:
        return next(f for f in self.figures if f.key == key)

    def values(self, figure: str, subject: str) -> dict[int, float]:
        return {s.round: s.value for s in self.samples
                if s.figure == figure and s.subject == subject and s.value is not None}

    def stats(self, figure: str, subject: str) -> Stats | None:
        return stats_of(list(self.values(figure, subject).values()))

    def cpu(self, figure: str, subject: str) -> Stats | None:
        return stats_of([s.cpu_seconds for s in self.samples if s.figure == figure
                         and s.subject == subject and s.cpu_seconds is not None])

    def machine_busy(self, figure: str, subject: str) -> Stats | None:
        return stats_of([s.machine_busy for s in self.samples if s.figure == figure
                         and s.subject == subject and s.machine_busy is not None])

    def machine_steal(self, figure: str, subject: str) -> Stats | None:
        return stats_of([s.extra["machine_steal"] for s in self.samples if s.figure == figure
                         and s.subject == subject and s.extra.get("machine_steal") is not None])

    def failures(self) -> list[Sample]:
        return [s for s in self.samples if s.value is None]

    def ratio_rows(self) -> list[RatioRow]:
        """kubeport/peer per round for every figure and peer measured in the same round."""
        rows = []
        for fig in self.figures:
            mine = self.values(fig.key, KUBEPORT)
            for peer in self.subjects:
                if peer == KUBEPORT:
                    continue
                theirs = self.values(fig.key, peer)
                target = next((t for t in self.targets if t.figure == fig.key and t.peer == peer), None)
                per_round = tuple(mine[r] / theirs[r] for r in sorted(mine) if r in theirs and theirs[r])
                if not theirs and target is None:
                    continue
                st = stats_of(per_round)
                met = None if (st is None or target is None) else target.met_by(st.median)
                rows.append(RatioRow(fig.key, peer, per_round, st, target, met))
        return rows

    def absolute_rows(self) -> list[AbsoluteRow]:
        rows = []
        for target in self.targets:
            if target.peer is None:
                st = self.stats(target.figure, KUBEPORT)
                rows.append(AbsoluteRow(target.figure, st, target, None if st is None else target.met_by(st.median)))
        return rows

    def to_json(self) -> dict:
        return {
            "name": self.name, "title": self.title, "subjects": self.subjects,
            "figures": [asdict(f) for f in self.figures],
            "targets": [asdict(t) | {"text": t.text} for t in self.targets],
            "notes": self.notes,
            "profiles": [asdict(p) for p in self.profiles],
            "samples": [asdict(s) for s in self.samples],
            "workers": self.workers, "workers_note": self.workers_note,
        }


def bench_from_json(data: dict) -> Bench:
    """The inverse of Bench.to_json (profiles stay plain dicts)."""
    from .profiles import Profile
    notes = list(data.get("notes", []))
    if "source" in data:
        machine = data.get("machine", {})
        notes.append(f"From {data['source']} (started {machine.get('started', '?')}, "
                     f"{machine.get('rounds', '?')} rounds).")
    return Bench(data["name"], data["title"], data["subjects"],
                 [Figure(**f) for f in data["figures"]],
                 [Target(**{k: v for k, v in t.items() if k != "text"}) for t in data["targets"]],
                 notes, [Sample(**s) for s in data["samples"]],
                 [Profile(**p) for p in data.get("profiles", [])],
                 data.get("workers"), data.get("workers_note", ""))


def workers_text(count: int) -> str:
    return f"{count} worker" + ("" if count == 1 else "s")


def round_order(subjects: Sequence[str], round_no: int) -> list[str]:
    """Forward in odd rounds, reversed in even ones: peers and kubeport alternate."""
    return list(subjects) if round_no % 2 else list(reversed(subjects))


def run_rounds(bench: Bench, rounds: int, measure: Callable[[str, int], list[Sample]],
               progress: "Progress", order_round: int | None = None) -> None:
    """Measure every subject in every round; a subject that fails is recorded, never fatal.

    ``order_round`` fixes the alternation when a caller runs its rounds one at a time."""
    progress.bench = bench  # so an interrupted run can still report what it measured
    for round_no in range(1, rounds + 1):
        for subject in round_order(bench.subjects, order_round or round_no):
            label = f"r{round_no}/{rounds}" if order_round is None else f"r{order_round}"
            progress.context = f"{bench.label} {label} {subject}"
            try:
                bench.samples.extend(measure(subject, round_no))
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # a peer or kubeport that cannot run is a result, not a crash
                progress.say(f"FAILED: {exc}")
                bench.samples.append(Sample(bench.name, "(setup)", subject, round_no, None, note=str(exc)[:500]))


PlanItem = tuple[str, Callable[[], tuple[float, dict]], str]  # figure key, measurement, unit


def run_plan(bench: str, subject: str, round_no: int, progress: "Progress", plan: Sequence[PlanItem],
             pid: Callable[[], int | None], seconds: float, only: set[str] | None = None,
             profile: Callable[[str, int | None], AbstractContextManager] | None = None) -> list[Sample]:
    """Measure each planned figure, metering the CPU of the process under test; ``only`` filters,
    ``profile(key, pid)`` wraps a measurement (a py-spy recording)."""
    samples = []
    for key, fn, unit in plan:
        if only is not None and key not in only:
            continue

        def run(key=key, fn=fn) -> tuple[float, float | None, dict]:
            meter, machine = CpuMeter(pid()).start(), MachineMeter().start()
            with progress.ticking(key, seconds), (profile(key, pid()) if profile else nullcontext()):
                value, extra = fn()
            cpu = meter.stop()
            busy = machine.stop()
            extra = {**extra, "machine_busy": busy, "machine_steal": machine.stolen}
            return value, cpu, extra

        samples.append(measured(bench, key, subject, round_no, progress, run, unit))
    return samples


def measured(bench: str, figure: str, subject: str, round_no: int, progress: "Progress",
             fn: Callable[[], tuple[float, float | None, dict]], unit: str = "") -> Sample:
    """Run one measurement; an error becomes a sample with value None and the reason."""
    try:
        value, cpu, extra = fn()
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        progress.say(f"{figure}: FAILED: {exc}")
        return Sample(bench, figure, subject, round_no, None, note=str(exc)[:500])
    cpu_text = "" if cpu is None else f"  (cpu {cpu:.2f} s)"
    progress.say(f"{figure}: {value:,.3f} {unit}{cpu_text}")
    return Sample(bench, figure, subject, round_no, value, cpu, extra=extra,
                  machine_busy=extra.pop("machine_busy", None))


class Progress:
    """Progress lines on stderr, and a ticking line while a long tool runs (on a terminal)."""

    def __init__(self, stream=sys.stderr) -> None:
        self.stream = stream
        self.started = time.monotonic()
        self.context = ""
        self.bench: Bench | None = None
        self._tty = stream.isatty()

    def _stamp(self) -> str:
        elapsed = int(time.monotonic() - self.started)
        return f"[{elapsed // 60:02d}:{elapsed % 60:02d}]"

    def say(self, message: str) -> None:
        prefix = f"{self._stamp()} {self.context}: " if self.context else f"{self._stamp()} "
        self.stream.write(("\r\033[K" if self._tty else "") + prefix + message + "\n")
        self.stream.flush()

    @contextmanager
    def ticking(self, label: str, expected_seconds: float) -> Iterator[None]:
        if not self._tty:
            yield
            return
        done = threading.Event()

        def tick() -> None:
            start = time.monotonic()
            while not done.wait(0.5):
                spent = time.monotonic() - start
                self.stream.write(f"\r\033[K{self._stamp()} {self.context}: {label} "
                                  f"{spent:4.1f}/{expected_seconds:.0f} s")
                self.stream.flush()

        thread = threading.Thread(target=tick, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            self.stream.write("\r\033[K")
            self.stream.flush()

"""py-spy profiles of kubeport while a figure runs, and which figures most need one.

A profile pass is extra: it reruns a figure for kubeport with py-spy attached (sampling
slows the process a little), and its numbers are never mixed into the rounds. The raw
collapsed stacks are kept next to the results; the report shows where the samples fall.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from .harness import Bench


def furthest_from_target(bench: Bench, count: int = 2) -> list[tuple[str, float]]:
    """Figures whose target kubeport misses, worst first, as (figure, how many times off)."""
    misses: dict[str, float] = {}
    rows = [(r.figure, r.target, r.stats) for r in bench.ratio_rows() if r.met is False]
    rows += [(r.figure, r.target, r.stats) for r in bench.absolute_rows() if r.met is False]
    for figure, target, stats in rows:
        observed = stats.median
        if target.op == ">=":
            off = target.value / observed if observed > 0 else float("inf")
        else:
            off = observed / target.value if target.value > 0 else float("inf")
        misses[figure] = max(off, misses.get(figure, 0.0))
    return sorted(misses.items(), key=lambda item: -item[1])[:count]


def profile_name(bench: Bench) -> str:
    """The benchmark as a profile (and its file) names it: with the worker count above one, so the
    profiles of both counts of a run keep their own files."""
    return bench.name if (bench.workers or 1) == 1 else f"{bench.name}-{bench.workers}workers"


@dataclass
class Profile:
    bench: str
    figure: str
    how_far: float
    path: str
    scope: str = ""
    samples: int = 0
    self_top: list[tuple[str, float]] = field(default_factory=list)
    inclusive_top: list[tuple[str, float]] = field(default_factory=list)
    error: str = ""


def summarize(raw: Path, top: int = 12) -> tuple[int, list[tuple[str, float]], list[tuple[str, float]]]:
    """Collapsed stacks ('a;b;c N' per line) -> total samples, top self frames, top inclusive frames (%)."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if not f.startswith("process ")]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    if not total:
        return 0, [], []

    def share(counter: collections.Counter[str], keep) -> list[tuple[str, float]]:
        return [(_label(frame), 100.0 * n / total) for frame, n in counter.most_common() if keep(frame)][:top]

    return total, share(own, lambda frame: True), share(inclusive, _own_code)


#: kubeport's packages as py-spy names their files; the entry points are the trunk of every stack.
_OWN = ("(proxy/", "(dns/", "(endpoints/", "(kubeport/")
_TRUNK = ("(kubeport/__main__.py", "(kubeport/cli.py", "run (kubeport/daemon.py")


def _own_code(frame: str) -> bool:
    return any(part in frame for part in _OWN) and not any(part in frame for part in _TRUNK)


def _label(frame: str) -> str:
    if frame.startswith("Runner.run (asyncio/runners.py"):
        return f"{frame} = the uvloop event loop itself (C: epoll, transports)"
    return frame


def py_spy() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return found if Path(found).exists() else None


class Profiler:
    def __init__(self, directory: Path, stamp: str) -> None:
        self.directory = directory
        self.stamp = stamp
        self.profiles: list[Profile] = []

    @contextmanager
    def record(self, bench: str, figure: str, how_far: float, pid: int | None,
               seconds: float | None, scope: str = "") -> Iterator[None]:
        """py-spy on ``pid`` and its children for ``seconds`` (None: until the process exits)."""
        profile = Profile(bench, figure, how_far, "", scope)
        self.profiles.append(profile)
        binary = py_spy()
        if binary is None or pid is None:
            profile.error = "py-spy not installed" if binary is None else "no process to profile"
            yield
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        raw = self.directory / f"{self.stamp}-profile-{bench}-{figure}.txt"
        duration = [] if seconds is None else ["--duration", f"{max(1, int(seconds))}"]
        proc = subprocess.Popen([binary, "record", "--pid", str(pid), "--subprocesses", "--nonblocking",
                                 "--rate", "200", "--format", "raw", *duration, "--output", str(raw)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            yield
        finally:
            try:
                _, err = proc.communicate(timeout=(seconds or 30) + 30)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if raw.exists():
                profile.path = raw.name
                profile.samples, profile.self_top, profile.inclusive_top = summarize(raw)
            else:
                profile.error = (err or b"").decode(errors="replace").strip()[-300:] or "no output"


def markdown(profiles: list[Profile]) -> str:
    if not profiles:
        return ""
    lines = ["### Profiles of the figures furthest from target", "",
             "py-spy (200 Hz, non-blocking, all kubeport processes) during an extra kubeport-only run of the "
             "figure; raw collapsed stacks in the named file.", ""]
    for p in profiles:
        lines.append(f"#### {p.bench}: {p.figure} ({p.how_far:.1f}x off target)")
        lines.append("")
        if p.scope:
            lines += [p.scope, ""]
        if p.error:
            lines += [f"No profile: {p.error}", ""]
            continue
        lines += [f"{p.samples:,} samples, `{p.path}`. Most self time:", "",
                  "| frame | self % |", "|---|---|"]
        lines += [f"| `{frame}` | {pct:.1f} |" for frame, pct in p.self_top[:8]]
        lines += ["", "| kubeport frame (inclusive) | % |", "|---|---|"]
        lines += [f"| `{frame}` | {pct:.1f} |" for frame, pct in p.inclusive_top[:8]]
        lines.append("")
    return "\n".join(lines) + "\n"

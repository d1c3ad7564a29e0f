"""Results out: JSON, a markdown report (tables, ratios, targets, verdicts) and a PNG chart."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Callable

from . import profiles
from .harness import KUBEPORT, Bench, Stats, stats_of, workers_text

PEER_VERSIONS = {
    "haproxy": ["haproxy", "-v"], "nginx": ["nginx", "-v"], "iperf3": ["iperf3", "-v"], "wrk": ["wrk", "-v"],
    "dnsperf": ["dnsperf", "-h"], "knot": ["knotd", "-V"], "nsd": ["nsd", "-v"], "unbound": ["unbound", "-V"],
    "dnsmasq": ["dnsmasq", "-v"], "nft": ["nft", "-v"],
}


def _first_line(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return "missing"
    text = (proc.stdout + proc.stderr).strip().splitlines()
    return next((line.strip() for line in text if any(ch.isdigit() for ch in line)), text[0] if text else "?")


def machine() -> dict:
    cpu = "?"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(memory_kib / 2**20, 1),
        "kernel": platform.release(), "python": platform.python_version(),
        # which build runs kubeport matters as much as its version (netns-scripts/setup.sh)
        "interpreter": os.path.realpath(sys.executable),
        "os": _os_name(), "versions": {name: _first_line(argv) for name, argv in PEER_VERSIONS.items()},
    }


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.platform()


def _fmt(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}"


def _cell(st: Stats | None, digits: int) -> str:
    if st is None:
        return "—"
    if st.n == 1:
        return _fmt(st.median, digits)
    return f"{_fmt(st.median, digits)} ({_fmt(st.low, digits)}–{_fmt(st.high, digits)})"


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "**MISSED**", None: "not measured"}[met]


#: unit of a rate figure -> (unit of work per second, cost unit, factor from CPU s per unit of work)
_COSTS = {"req/s": ("µs CPU per request", 1e6), "qps": ("µs CPU per query", 1e6),
          "Gbit/s": ("CPU s per GB moved", 8.0)}


def _cost_table(bench: Bench, seconds: float | None) -> list[str]:
    """CPU per unit of work: on a shared machine this moves less than throughput does."""
    if not seconds:
        return []
    rows = []
    for fig in bench.figures:
        if fig.unit not in _COSTS:
            continue
        label, factor = _COSTS[fig.unit]
        cells = []
        for subject in bench.subjects:
            costs = [s.cpu_seconds / (s.value * seconds) * factor for s in bench.samples
                     if s.figure == fig.key and s.subject == subject and s.value and s.cpu_seconds is not None]
            cells.append(_cell(stats_of(costs), 2))
        if any(c != "—" for c in cells):
            rows.append(f"| {fig.title} | {label} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return ["", "CPU cost per unit of work (process under test), median (min–max):", "",
            "| figure | cost | " + " | ".join(bench.subjects) + " |", "|---|---|" + "---|" * len(bench.subjects),
            *rows]


def _subject_table(bench: Bench, stat: Callable[[str, str], Stats | None], digits: int, caption: str) -> list[str]:
    """One row per figure, one column per subject; nothing when no subject has a value."""
    rows = []
    for fig in bench.figures:
        cells = [_cell(stat(fig.key, s), digits) for s in bench.subjects]
        if any(c != "—" for c in cells):
            rows.append(f"| {fig.title} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return ["", caption, "", "| figure | " + " | ".join(bench.subjects) + " |",
            "|---|" + "---|" * len(bench.subjects), *rows]


def several_counts(benches: list[Bench]) -> set[str]:
    """Names of the benchmarks that ran at more than one worker count."""
    counts: dict[str, set[int | None]] = {}
    for bench in benches:
        counts.setdefault(bench.name, set()).add(bench.workers)
    return {name for name, seen in counts.items() if len(seen) > 1}


def _by_name(benches: list[Bench]) -> list[list[Bench]]:
    """Benchmarks grouped by name in the order they ran; a group holds one per worker count."""
    groups: dict[str, list[Bench]] = {}
    for bench in benches:
        groups.setdefault(bench.name, []).append(bench)
    return list(groups.values())


def _ratio_cell(stats: Stats | None, met: bool | None, judged: bool) -> str:
    if stats is None:
        return "—"
    verdict = {True: " met", False: " **MISSED**", None: ""}[met] if judged else ""
    return f"{stats.median:.2f}x{verdict}"


def side_by_side(group: list[Bench]) -> str:
    """One benchmark at each of its worker counts: kubeport, the peer and their same-round ratio
    (medians; each count's own tables below have the ranges and rounds)."""
    first = group[0]
    head = ["| figure | peer | target |"]
    rule = ["|---|---|---|"]
    for bench in group:
        count = workers_text(bench.workers or 1)
        head.append(f" kubeport, {count} | peer, {count} | kubeport / peer, {count} |")
        rule.append("---|---|---|")
    keys: list[tuple[str, str | None]] = []
    for bench in group:
        keys += [(row.figure, row.peer) for row in bench.ratio_rows()]
        keys += [(row.figure, None) for row in bench.absolute_rows()]
    order = {fig.key: i for i, fig in enumerate(first.figures)}
    keys = sorted(dict.fromkeys(keys), key=lambda k: (order.get(k[0], len(order)), k[1] is None))
    rows = []
    for figure, peer in keys:
        fig = next(b.figure(figure) for b in group if any(f.key == figure for f in b.figures))
        target = next((t for b in group for t in b.targets if t.figure == figure and t.peer == peer), None)
        target_text = "—" if target is None else target.text + ("" if peer else f" {fig.unit}")
        cells = [f"| {fig.title} ({fig.unit}) | {peer or '(absolute)'} | {target_text} |"]
        for bench in group:
            if not any(f.key == figure for f in bench.figures):
                cells.append(" — | — | — |")
                continue
            mine = _cell_median(bench.stats(figure, KUBEPORT), fig.digits)
            if peer is None:
                row = next((r for r in bench.absolute_rows() if r.figure == figure), None)
                verdict = "" if row is None or row.met is None else f" ({_verdict(row.met)})"
                cells.append(f" {mine}{verdict} | — | — |")
                continue
            row = next((r for r in bench.ratio_rows() if r.figure == figure and r.peer == peer), None)
            theirs = _cell_median(bench.stats(figure, peer), fig.digits)
            ratio = "—" if row is None else _ratio_cell(row.stats, row.met, row.target is not None)
            cells.append(f" {mine} | {theirs} | {ratio} |")
        rows.append("".join(cells))
    numbers = [str(b.workers or 1) for b in group]
    counts = ", ".join(numbers[:-1]) + " and " + numbers[-1]
    lines = [f"### {first.title}: {counts} workers side by side", "",
             ("Medians over rounds; the ratio is the median of same-round ratios (each worker count ran "
              "its own rounds, peers included)."), ""]
    lines += [f"- {workers_text(b.workers or 1)}: {b.workers_note}" for b in group if b.workers_note]
    if any(b.workers_note for b in group):
        lines.append("")
    lines += ["".join(head), "".join(rule), *rows]
    return "\n".join(lines) + "\n"


def _cell_median(st: Stats | None, digits: int) -> str:
    return "—" if st is None else _fmt(st.median, digits)


def bench_markdown(bench: Bench, seconds: float | None = None, with_workers: bool = False) -> str:
    title = f"{bench.title} — {workers_text(bench.workers or 1)}" if with_workers else bench.title
    lines = [f"### {title}", ""]
    if bench.workers_note:
        lines += [f"Workers: {bench.workers_note}", ""]
    lines += ["Median (min–max) over rounds.", "",
             "| figure | unit | " + " | ".join(bench.subjects) + " |",
             "|---|---|" + "---|" * len(bench.subjects)]
    for fig in bench.figures:
        cells = [_cell(bench.stats(fig.key, s), fig.digits) for s in bench.subjects]
        lines.append(f"| {fig.title} | {fig.unit} | " + " | ".join(cells) + " |")
    lines += _subject_table(bench, bench.cpu, 2,
                            "CPU seconds of the process under test per run (— : kernel path or not metered):")
    lines += _subject_table(bench, bench.machine_busy, 0,
                            "Machine busy during each run, % of all cores (load generator, backends and the path "
                            "under test together; near 100 the machine, not the path, sets the figure):")
    if any((s.extra.get("machine_steal") or 0) >= 1 for s in bench.samples):
        lines += _subject_table(bench, bench.machine_steal, 1,
                                "Stolen by the hypervisor during each run, % of all cores (the host ran other "
                                "guests on them: every figure of such a run is lower and noisier):")
    lines += _cost_table(bench, seconds)
    ratio_rows = bench.ratio_rows()
    if ratio_rows:
        lines += ["", "kubeport / peer, per round and median (same-round ratios):", "",
                  "| figure | peer | per round | median | target | verdict |", "|---|---|---|---|---|---|"]
        for row in ratio_rows:
            fig = bench.figure(row.figure)
            per_round = ", ".join(f"{r:.2f}" for r in row.per_round) or "—"
            median = "—" if row.stats is None else f"{row.stats.median:.2f}x"
            target = row.target.text if row.target else "—"
            verdict = _verdict(row.met) if row.target else ""
            lines.append(f"| {fig.title} | {row.peer} | {per_round} | {median} | {target} | {verdict} |")
    absolute = bench.absolute_rows()
    if absolute:
        lines += ["", "| figure | kubeport median (range) | target | verdict |", "|---|---|---|---|"]
        for row in absolute:
            fig = bench.figure(row.figure)
            lines.append(f"| {fig.title} | {_cell(row.stats, fig.digits)} {fig.unit} | "
                         f"{row.target.text} {fig.unit} | {_verdict(row.met)} |")
    if bench.notes:
        lines += [""] + [f"- {note}" for note in bench.notes]
    if bench.profiles:
        lines += ["", profiles.markdown(bench.profiles)]
    failures = bench.failures()
    if failures:
        lines += ["", "Failures (recorded, not hidden):", ""]
        seen = set()
        for sample in failures:
            key = (sample.figure, sample.subject, sample.note)
            if key not in seen:
                seen.add(key)
                lines.append(f"- round {sample.round}, {sample.subject}, {sample.figure}: {sample.note}")
    return "\n".join(lines) + "\n"


def verdicts(benches: list[Bench]) -> tuple[list[str], list[str], list[str]]:
    met, missed, unmeasured = [], [], []
    several = several_counts(benches)
    for bench in benches:
        count = f", {workers_text(bench.workers or 1)}" if bench.name in several else ""
        for row in bench.ratio_rows():
            if row.target is None:
                continue
            text = f"{bench.figure(row.figure).title} vs {row.peer} ({row.target.text}{count})"
            if row.met is None:
                unmeasured.append(text)
            else:
                (met if row.met else missed).append(f"{text}: {row.stats.median:.2f}x")
        for row in bench.absolute_rows():
            fig = bench.figure(row.figure)
            text = f"{fig.title} ({row.target.text} {fig.unit}{count})"
            if row.met is None:
                unmeasured.append(text)
            else:
                (met if row.met else missed).append(f"{text}: {_fmt(row.stats.median, fig.digits)} {fig.unit}")
    return met, missed, unmeasured


#: the steal (percent of the cores' time) in one run from which a report warns
CONTENDED_STEAL = 5.0


def _worker_counts(info: dict) -> str:
    counts = info.get("workers")
    if not isinstance(counts, list) or len(counts) < 2:
        return ""
    return f", the proxy and DNS benchmarks at {', '.join(map(str, counts[:-1]))} and {counts[-1]} workers"


def markdown(benches: list[Bench], info: dict, chart: Path | None) -> str:
    lines = ["## Performance", "",
             f"Machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB, {info['os']}, "
             f"kernel {info['kernel']}, Python {info['python']}"
             f"{' (' + info['interpreter'] + ')' if info.get('interpreter') else ''}. Started {info.get('started', '?')}, "
             f"{info.get('rounds', '?')} rounds{_worker_counts(info)}.", ""]
    stolen = stats_of([s.extra["machine_steal"] for b in benches for s in b.samples
                       if s.extra.get("machine_steal") is not None])
    if stolen is not None and stolen.high >= CONTENDED_STEAL:
        lines += [f"**A contended host:** the hypervisor took {_fmt(stolen.median, 1)}% of the cores' time "
                  f"in the median run and up to {_fmt(stolen.high, 1)}% in one (steal, /proc/stat). Runs "
                  "it hit are slower and noisier, unevenly between subjects: read the per-round ratios "
                  "with that in mind.", ""]
    several = several_counts(benches)
    for group in _by_name(benches):
        with_workers = group[0].name in several
        if with_workers:
            lines.append(side_by_side(group))
        for bench in group:
            lines.append(bench_markdown(bench, info.get("seconds_per_run"), with_workers))
    if chart is not None:
        lines += [f"![kubeport / peer]({chart.name})", ""]
    met, missed, unmeasured = verdicts(benches)
    lines += ["### Targets", "", f"Met ({len(met)}):"] + [f"- {t}" for t in met]
    lines += ["", f"Missed ({len(missed)}):"] + [f"- {t}" for t in missed]
    lines += ["", f"Not measured ({len(unmeasured)}):"] + [f"- {t}" for t in unmeasured]
    ranked = sorted(((off, f"{b.label if b.name in several else b.name}: {b.figure(fig).title}") for b in benches
                     for fig, off in profiles.furthest_from_target(b, len(b.figures))), reverse=True)
    if ranked:
        lines += ["", "Furthest from target (how many times off):"]
        lines += [f"{i}. {name}: {off:.1f}x" for i, (off, name) in enumerate(ranked, 1)]
    versions = ", ".join(f"{k}: {v}" for k, v in info.get("versions", {}).items())
    lines += ["", f"Peer versions: {versions}", ""]
    return "\n".join(lines)


def _chart_rows(benches: list[Bench]) -> list[tuple[str, float, float, float, float | None, bool | None]]:
    """(label, value, low, high, target, met) as 'kubeport better by': > 1 means kubeport is better.

    Ratios of lower-is-better figures (latency, memory) are inverted so every bar reads the same
    way; an absolute target becomes target/value (or value/target), so 1 is the target itself.
    """
    rows = []
    # Benchmarks that share figure names (the control plane from manifests and through the API)
    # say which one a bar is.
    # (one benchmark at two worker counts is one name)
    names = [short for _, short in dict.fromkeys((b.name, fig.short) for b in benches for fig in b.figures)]
    several = several_counts(benches)
    for bench in benches:
        shared = {fig.key for fig in bench.figures if names.count(fig.short) > 1}
        count = f" ({bench.workers or 1}w)" if bench.name in several else ""
        for row in bench.ratio_rows():
            if row.stats is None:
                continue
            fig = bench.figure(row.figure)
            st, flip = row.stats, not fig.higher_is_better
            value, low, high = (1 / st.median, 1 / st.high, 1 / st.low) if flip else (st.median, st.low, st.high)
            target = None if row.target is None else (1 / row.target.value if flip else row.target.value)
            rows.append((f"{fig.short} / {row.peer}{count}", value, low, high, target, row.met))
        for row in bench.absolute_rows():
            if row.stats is None or row.stats.median <= 0:
                continue
            fig, st, goal = bench.figure(row.figure), row.stats, row.target.value
            if fig.higher_is_better:
                value, low, high = st.median / goal, st.low / goal, st.high / goal
            else:
                value, low, high = goal / st.median, goal / st.high, goal / max(st.low, 1e-9)
            where = f"{bench.name}: " if fig.key in shared else ""
            rows.append((f"{where}{fig.short} / target {row.target.text}{count}", value, low, high, 1.0, row.met))
    return rows


def chart(benches: list[Bench], path: Path) -> Path | None:
    """Horizontal bars on a log scale: how much better (> 1) or worse (< 1) kubeport is than each peer."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _chart_rows(benches)
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(rows) + 1.8))
    for y, (label, value, low, high, target, met) in enumerate(rows):
        color = {True: "#2e7d32", False: "#c62828", None: "#9e9e9e"}[met]
        ax.barh(y, value, left=0, color=color, alpha=0.85)
        ax.plot([low, high], [y, y], color="black", linewidth=1)
        ax.text(value, y, f" {value:.2f}", va="center", fontsize=7)
        if target is not None:
            ax.plot([target] * 2, [y - 0.4, y + 0.4], color="black", linewidth=2)
    ax.set_xscale("log")
    ax.axvline(1.0, color="#555", linestyle=":", linewidth=1)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("times better (> 1) or worse (< 1) than the peer; latency and memory ratios inverted\n"
                  "bar: median of same-round ratios; whisker: range; black tick: target\n"
                  "green: target met, red: missed, grey: no target")
    ax.set_title("kubeport relative to each peer and target")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_json(path: Path, benches: list[Bench], info: dict) -> None:
    path.write_text(json.dumps({"machine": info, "benchmarks": [b.to_json() for b in benches],
                                "kubeport": KUBEPORT}, indent=1, default=str))

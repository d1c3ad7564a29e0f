"""The benchmark report at several worker counts: bench/report.py's tables, verdicts and chart
rows, bench/run.py's --workers and --render (results of one count, in bench/latest, included)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys

import pytest

from support.bench import BENCH_DIR, bench_module

report = bench_module("report")
harness = bench_module("harness")
Bench, Figure, Sample, Target = harness.Bench, harness.Figure, harness.Sample, harness.Target

FIGURES = [Figure("rate", "requests/s", "req/s", digits=0), Figure("rss", "RSS per connection", "KiB",
                                                                  higher_is_better=False, digits=2)]
TARGETS = [Target("rate", ">=", 1.0, "haproxy"), Target("rss", "<=", 10.0)]


def bench_of(workers: int | None, values: dict[str, list[float]], note: str = "", name: str = "proxy") -> Bench:
    """A benchmark whose subjects measured ``values[subject]`` (one per round) for "rate", and
    kubeport 5 KiB per connection."""
    bench = Bench(name, "Service proxy", list(values), FIGURES, TARGETS, workers=workers, workers_note=note)
    for subject, per_round in values.items():
        for round_no, value in enumerate(per_round, 1):
            bench.samples.append(Sample(name, "rate", subject, round_no, value))
    bench.samples.append(Sample(name, "rss", "kubeport", 1, 5.0))
    return bench


def table_rows(text: str) -> list[list[str]]:
    """The cells of the markdown table rows after the header and rule."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


ONE = {"haproxy": [100.0, 100.0, 100.0], "kubeport": [110.0, 120.0, 105.0]}
TWO = {"haproxy": [200.0, 200.0, 200.0], "kubeport": [150.0, 160.0, 170.0]}


@pytest.mark.parametrize(("groups", "heading", "expected"), [
    pytest.param(
        [(1, ONE), (2, TWO)], "1 and 2",
        [["requests/s (req/s)", "haproxy", ">= 1x haproxy", "110", "100", "1.10x met", "160", "200", "0.80x **MISSED**"],
         ["RSS per connection (KiB)", "(absolute)", "<= 10 KiB", "5.00 (met)", "—", "—", "5.00 (met)", "—", "—"]],
        id="a ratio met at one count and missed at the other, an absolute target at both"),
    pytest.param(
        [(1, ONE), (2, {"kubeport": [150.0]})], "1 and 2",
        [["requests/s (req/s)", "haproxy", ">= 1x haproxy", "110", "100", "1.10x met", "150", "—", "—"],
         ["RSS per connection (KiB)", "(absolute)", "<= 10 KiB", "5.00 (met)", "—", "—", "5.00 (met)", "—", "—"]],
        id="the peer did not run at one count"),
    pytest.param(
        [(1, ONE), (2, TWO), (4, {"haproxy": [400.0], "kubeport": [400.0]})], "1, 2 and 4",
        [["requests/s (req/s)", "haproxy", ">= 1x haproxy", "110", "100", "1.10x met", "160", "200",
          "0.80x **MISSED**", "400", "400", "1.00x met"],
         ["RSS per connection (KiB)", "(absolute)", "<= 10 KiB", "5.00 (met)", "—", "—", "5.00 (met)", "—", "—",
          "5.00 (met)", "—", "—"]],
        id="three counts: one column group each"),
])
def test_side_by_side_has_a_column_group_per_worker_count(groups, heading, expected):
    text = report.side_by_side([bench_of(workers, values) for workers, values in groups])
    assert table_rows(text) == expected
    assert text.startswith(f"### Service proxy: {heading} workers side by side\n")
    header = next(line for line in text.splitlines() if line.startswith("| figure"))
    for workers, _ in groups:
        assert f"kubeport, {harness.workers_text(workers)}" in header


def test_side_by_side_puts_each_counts_note_before_the_table():
    text = report.side_by_side([bench_of(1, ONE, "one process"), bench_of(2, TWO, "daemon answers DNS alone")])
    before_table = text.split("| figure")[0]
    assert "- 1 worker: one process" in before_table
    assert "- 2 workers: daemon answers DNS alone" in before_table


MACHINE = {"cpu": "test", "cores": 2, "memory_gib": 1, "os": "test", "kernel": "6", "python": "3.11",
           "rounds": 3, "seconds_per_run": 5}


@pytest.mark.parametrize(("workers", "machine_line_ends"), [
    (None, "3 rounds."), (1, "3 rounds."), ([1], "3 rounds."),
    ([1, 2], "3 rounds, the proxy and DNS benchmarks at 1 and 2 workers."),
    ([1, 2, 4], "3 rounds, the proxy and DNS benchmarks at 1, 2 and 4 workers."),
])
def test_machine_line_names_the_worker_counts(workers, machine_line_ends):
    info = MACHINE if workers is None else MACHINE | {"workers": workers}
    line = next(line for line in report.markdown([], info, None).splitlines() if line.startswith("Machine:"))
    assert line.endswith(machine_line_ends)


@pytest.mark.parametrize(("benches", "present", "absent"), [
    pytest.param([bench_of(1, ONE, "one process"), bench_of(2, TWO, "N+1 processes, DNS in the daemon")],
                 ["### Service proxy: 1 and 2 workers side by side", "### Service proxy — 1 worker",
                  "### Service proxy — 2 workers", "Workers: N+1 processes, DNS in the daemon",
                  "requests/s vs haproxy (>= 1x haproxy, 1 worker): 1.10x",
                  "requests/s vs haproxy (>= 1x haproxy, 2 workers): 0.80x",
                  "RSS per connection (<= 10 KiB, 2 workers): 5.00 KiB"],
                 ["### Service proxy\n"], id="two counts: a side-by-side table, then each count's own"),
    pytest.param([bench_of(None, ONE)],
                 ["### Service proxy\n", "requests/s vs haproxy (>= 1x haproxy): 1.10x"],
                 ["side by side", "worker", "Workers:"], id="results of one count read as before"),
    pytest.param([bench_of(2, TWO, "N+1 processes")],
                 ["### Service proxy\n", "Workers: N+1 processes", "(>= 1x haproxy): 0.80x"],
                 ["side by side", "— 2 workers"], id="one count, not 1: its note, no side-by-side table"),
])
def test_markdown_by_worker_count(benches, present, absent):
    text = report.markdown(benches, MACHINE, None)
    for part in present:
        assert part in text
    for part in absent:
        assert part not in text


def test_the_2_worker_dns_note_says_the_daemon_answers_alone():
    dns = bench_module("dns")
    note = dns.workers_note(2)
    assert "2 relay processes besides the daemon (3 processes)" in note
    assert "DNS is answered by the daemon's one process" in note
    assert "dnsmasq has no worker setting" in note
    assert "one process" in dns.workers_note(1) and "daemon's one process" not in dns.workers_note(1)


def test_chart_rows_and_ranking_name_the_worker_count():
    benches = [bench_of(1, ONE), bench_of(2, TWO)]
    labels = [row[0] for row in report._chart_rows(benches)]
    assert labels == ["requests/s / haproxy (1w)", "RSS per connection / target <= 10 (1w)",
                      "requests/s / haproxy (2w)", "RSS per connection / target <= 10 (2w)"]
    assert "1. proxy, 2 workers: requests/s: " in report.markdown(benches, MACHINE, None)


def test_bench_json_keeps_its_worker_count():
    bench = bench_of(2, TWO, "N+1 processes")
    back = harness.bench_from_json(json.loads(json.dumps(bench.to_json())))
    assert (back.workers, back.workers_note, back.label) == (2, "N+1 processes", "proxy, 2 workers")
    old = {k: v for k, v in bench.to_json().items() if k not in ("workers", "workers_note")}
    assert harness.bench_from_json(old).workers is None


@pytest.fixture(scope="module")
def run_module():
    saved = sys.path[:]
    try:
        return bench_module("run")
    finally:
        sys.path[:] = saved  # run.py drops the repo and bench folders from the path


@pytest.mark.parametrize(("text", "expected"), [
    ("1,2", (1, 2)), ("2", (2,)), ("2,1", (2, 1)), ("1, 4", (1, 4)),
    ("1,1", "given twice"), ("0", "below 1"), ("two", "not a number"), ("1,", "not a number"),
])
def test_worker_counts(run_module, text, expected):
    if isinstance(expected, tuple):
        assert run_module.worker_counts(text) == expected
    else:
        with pytest.raises(argparse.ArgumentTypeError, match=expected):
            run_module.worker_counts(text)


def test_workers_default_to_one_and_two(run_module):
    assert run_module.parse_args([]).workers == (1, 2)
    assert run_module.parse_args(["--workers", "1"]).workers == (1,)


LATEST = sorted(p for p in (BENCH_DIR / "latest").glob("*.json")
                if isinstance(json.loads(p.read_text()), dict) and "benchmarks" in json.loads(p.read_text()))


def worker_counts_of(path) -> set:
    """The worker counts a results file ran (older files have none: one count)."""
    return {bench.get("workers") or 1 for bench in json.loads(path.read_text())["benchmarks"]}


@pytest.mark.parametrize("path", LATEST, ids=[p.name for p in LATEST])
def test_render_of_results_in_latest(run_module, tmp_path, path, capsys):
    """Every kept run renders; side by side exactly when it ran several worker counts."""
    copy = tmp_path / path.name
    shutil.copy(path, copy)
    assert run_module.render([copy]) == 0
    text = copy.with_suffix(".md").read_text()
    assert "## Performance" in text and "### Targets" in text
    assert ("side by side" in text) == (len(worker_counts_of(path)) > 1)


def test_render_merges_one_count_results_with_two_count_ones(run_module, tmp_path, capsys):
    old = tmp_path / "old.json"
    shutil.copy(BENCH_DIR / "latest" / "20261201-231242.json", old)
    data = json.loads(old.read_text())
    proxy = next(b for b in data["benchmarks"] if b["name"] == "proxy")
    two = dict(proxy, workers=2, workers_note="kubeport in 3 processes")
    new = tmp_path / "new.json"
    new.write_text(json.dumps({"machine": data["machine"] | {"workers": [2]}, "benchmarks": [two]}))
    assert run_module.render([old, new]) == 0
    text = (tmp_path / "new-combined.md").read_text()
    assert "### Service proxy: client -> ClusterIP -> backend: 1 and 2 workers side by side" in text
    assert "— 1 worker\n" in text and "— 2 workers\n" in text
    merged = json.loads((tmp_path / "new-combined.json").read_text())
    assert [(b["name"], b["workers"]) for b in merged["benchmarks"]] == [
        ("proxy", 1), ("dns", 1), ("control", None), ("proxy", 2)]

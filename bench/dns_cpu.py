#!/usr/bin/env python3
"""CPU per DNS query and system calls per query, for kubeport's DNS server and its peers.

    sudo .venv/bin/python bench/dns_cpu.py [--subjects kubeport,knot,unbound] [--seconds 3] [--repeat 3]

The topology and load of ``bench/dns.py`` (1,000 services, dnsperf with 8 sockets and 200
outstanding from the client namespace, 1,000 example.com names from knot upstream), but
only the costs that a shared machine moves little: the subject's CPU seconds (its
``/proc/<pid>/stat``) per answered query, and from ``perf stat`` tracepoints on its pid the
system calls per query, the recvmmsg/sendmmsg calls per query and the mean number of
datagrams a recvmmsg that read any returned. ``cached``: cluster names (kubeport's answers
kept encoded; knot); ``forwarded``: example.com names with a warm cache (kubeport; unbound as
a caching forwarder). ``--rate`` caps dnsperf's query rate (the same load for every subject).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() not in (BENCH_DIR, REPO)]
_package = types.ModuleType("kubeport_bench")
_package.__path__ = [str(BENCH_DIR)]  # type: ignore[attr-defined]
sys.modules["kubeport_bench"] = _package

from kubeport_bench import dns, dnspeers, generate, probes, tools  # noqa: E402
from kubeport_bench.kubeport_daemon import KubeportDaemon  # noqa: E402
from kubeport_bench.procinfo import _TICKS, cpu_seconds  # noqa: E402
from kubeport_bench.topology import Topology, raise_nofile, stop_process, wait_for  # noqa: E402

#: tracepoint -> what it counts; the recvmmsg exits with ret > 0 give the mean batch
EVENTS = {
    "raw_syscalls:sys_enter": "syscalls",
    "syscalls:sys_enter_recvmmsg": "recvmmsg",
    "syscalls:sys_exit_recvmmsg": "recvmmsg_read",
    "syscalls:sys_enter_sendmmsg": "sendmmsg",
    "syscalls:sys_enter_sendto": "sendto",
    "syscalls:sys_enter_recvfrom": "recvfrom",
    "syscalls:sys_enter_epoll_wait": "epoll_wait",
}


def perf_argv(pid: int, seconds: float, output: Path) -> list[str]:
    argv = ["perf", "stat", "-x", ",", "-o", str(output), "-p", str(pid)]
    for event in EVENTS:
        argv += ["-e", event]
        if event == "syscalls:sys_exit_recvmmsg":
            argv += ["--filter", "ret > 0"]
    return argv + ["--", "sleep", f"{seconds:g}"]


def parse_perf(text: str) -> dict[str, int]:
    counts = {}
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) > 3 and fields[2] in EVENTS and re.fullmatch(r"\d+", fields[0]):
            counts[EVENTS[fields[2]]] = int(fields[0])
    return counts


def user_system(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of one process (fields 14 and 15 of its stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[11]) / _TICKS, int(fields[12]) / _TICKS


def measure(topo: Topology, pid: int, queries: Path, seconds: float, rate: int | None,
            syscalls: bool) -> dict:
    """One dnsperf run at max load (or ``rate``): µs CPU per query and the call counts."""
    perf = None
    output = topo.workdir / "perf.txt"
    if syscalls:
        # perf's window starts a moment after dnsperf's and ends before it: the counts are
        # scaled by the queries dnsperf completed over the longer window, so slightly low.
        perf = subprocess.Popen(perf_argv(pid, seconds - 0.5, output), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    before, (user, system) = cpu_seconds(pid), user_system(pid)
    result = tools.dnsperf(topo, "client", dns.SERVER, queries, seconds, max_qps=rate, clients=8, outstanding=200)
    cpu = cpu_seconds(pid) - before  # type: ignore[operator]
    user_after, system_after = user_system(pid)
    per_query = 1e6 / max(result.completed, 1)
    row = {"qps": round(result.qps), "completed": result.completed, "lost": result.lost,
           "us_cpu_per_query": round(cpu * per_query, 3), "us_user_per_query": round((user_after - user) * per_query, 3),
           "us_system_per_query": round((system_after - system) * per_query, 3)}
    if perf is not None:
        perf.wait(timeout=seconds + 10)
        counts = parse_perf(output.read_text())
        window = result.completed * (seconds - 0.5) / seconds
        for name, count in counts.items():
            row[f"{name}_per_query"] = round(count / window, 4)
        if counts.get("recvmmsg_read"):
            row["mean_batch"] = round(window / counts["recvmmsg_read"], 2)
    return row


#: where each package of the distribution lives in a source tree (pyproject's package-dir)
PACKAGE_DIRS = {"kubeport": "kubeport", "kubeport.dns": "dns", "kubeport.endpoints": "endpoints",
                "kubeport.proxy": "proxy"}


def launcher(tree: Path) -> list[str]:
    """``python -m kubeport`` from another source tree (a checkout of the commit to compare
    with), on this interpreter and its packages: a finder placed before the editable install's."""
    mapping = {name: str(tree / folder) for name, folder in PACKAGE_DIRS.items()}
    program = f"""
import importlib.machinery, importlib.util, runpy, sys
MAPPING = {mapping!r}
class Tree:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name in MAPPING:
            return importlib.util.spec_from_file_location(name, MAPPING[name] + "/__init__.py",
                                                          submodule_search_locations=[MAPPING[name]])
        return None
sys.meta_path.insert(0, Tree)
sys.argv[0] = "kubeport"
runpy.run_module("kubeport", run_name="__main__", alter_sys=True)
"""
    return [sys.executable, "-c", program]


class TreeDaemon(KubeportDaemon):
    def __init__(self, *args, tree: Path | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tree = tree

    def argv(self) -> list[str]:
        argv = super().argv()
        return argv if self.tree is None else launcher(self.tree) + argv[3:]


def start_kubeport(topo: Topology, workdir: Path, manifests: Path, tree: Path | None) -> KubeportDaemon:
    daemon = TreeDaemon(topo, "node", workdir / "kubeport", manifests, dns.SERVER,
                        upstream=f"{topo.addr('up')}:53", tree=tree)
    daemon.start()
    daemon.wait_ready(60)
    dns.wait_serving(topo, daemon.proc, "kubeport", "kubeport")
    return daemon


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subjects", default="kubeport,knot,unbound",
                        help="kubeport, knot, unbound; kubeport@DIR runs the daemon from the source tree DIR")
    parser.add_argument("--figures", default="cached,forwarded")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rate", type=int, default=None, help="dnsperf -Q (default: max load)")
    parser.add_argument("--no-syscalls", action="store_true", help="no perf stat (its tracepoints cost a little)")
    parser.add_argument("--record", default=None,
                        help="a profiler's command line run beside the last run of each figure, with {pid}, "
                             "{seconds}, {figure} and {subject} filled in (py-spy record, perf record)")
    parser.add_argument("--record-subjects", default="kubeport")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    raise_nofile()
    subjects, figures = args.subjects.split(","), args.figures.split(",")
    workdir = Path(tempfile.mkdtemp(prefix="kubeport-dnscpu-"))
    zone = dnspeers.Zone(generate.ZONE, tuple(generate.zone_records(dns.SERVICES)))
    manifests = workdir / "manifests"
    generate.write_cluster(manifests, dns.SERVICES, 1)
    cluster = generate.write_lines(workdir / "cluster-queries.txt", generate.cluster_queries(dns.SERVICES))
    external = generate.write_lines(workdir / "external-queries.txt", generate.external_queries(dns.EXTERNAL_NAMES))
    rows = []
    try:
        with Topology("dnscpu", ["client", "up"], workdir) as topo:
            upstream_zone = dnspeers.Zone("example.com", tuple(generate.external_records(dns.EXTERNAL_NAMES)),
                                          ttl=3600)
            dnspeers.start_knot(topo, "up", workdir, topo.addr("up"), [upstream_zone], workers=1, tag="knot-upstream")
            probe = generate.external_queries(1)[0].split()[0]
            wait_for(lambda: topo.call_in("client", probes.dns_answers, topo.addr("up"), probe, "A", 53, 0.3)
                     is not None, 30, "upstream knot")
            for subject in subjects:
                for figure in figures:
                    if (subject, figure) in (("knot", "forwarded"), ("unbound", "cached")):
                        continue
                    queries = cluster if figure == "cached" else external
                    daemon = proc = None
                    if subject.startswith("kubeport"):
                        tree = Path(subject.partition("@")[2]) if "@" in subject else None
                        daemon = start_kubeport(topo, workdir, manifests, tree)
                        proc_pid = daemon.pid
                    else:
                        topo.ip("node", "addr", "add", f"{dns.SERVER}/32", "dev", "lo")
                        proc = (dnspeers.start_knot(topo, "node", workdir, dns.SERVER, [zone], 1)
                                if subject == "knot" else
                                dnspeers.start_unbound_forwarder(topo, "node", workdir, dns.SERVER,
                                                                 f"{topo.addr('up')}@53", 1))
                        proc_pid = proc.pid
                        name = probe if figure == "forwarded" else generate.fqdn(generate.service_name(0))
                        wait_for(lambda name=name: topo.call_in("client", probes.dns_answers, dns.SERVER, name, "A",
                                                                53, 0.3) is not None, 30, subject)
                    tools.dnsperf(topo, "client", dns.SERVER, queries, 20, clients=4, passes=1,
                                  max_qps=5000 if figure == "forwarded" else None)
                    for run in range(args.repeat):
                        recorder = None
                        if args.record and subject in args.record_subjects.split(",") and run == args.repeat - 1:
                            argv = [part.format(pid=proc_pid, seconds=int(args.seconds - 0.5), figure=figure,
                                                subject=subject) for part in args.record.split()]
                            recorder = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        row = {"subject": subject, "figure": figure, "run": run,
                               **measure(topo, proc_pid, queries, args.seconds, args.rate, not args.no_syscalls)}
                        rows.append(row)
                        if recorder is not None:
                            recorder.wait(timeout=60)
                        print(json.dumps(row), flush=True)
                    if daemon is not None:
                        daemon.stop()
                    stop_process(proc)
                    topo.ip("node", "addr", "flush", "dev", "lo", "scope", "global", check=False)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    summary: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        summary.setdefault((row["subject"], row["figure"]), []).append(row)
    for (subject, figure), group in summary.items():
        cpu = sorted(r["us_cpu_per_query"] for r in group)
        extra = {key: sorted(r[key] for r in group)[len(group) // 2] for key in group[0]
                 if key.endswith("_per_query") and key != "us_cpu_per_query" or key == "mean_batch"}
        extra = {key: value for key, value in extra.items() if value}
        print(f"{subject:9} {figure:9} µs CPU/query median {cpu[len(cpu) // 2]:.2f} (runs {cpu}) "
              f"qps {[r['qps'] for r in group]} {extra}")


if __name__ == "__main__":
    main()

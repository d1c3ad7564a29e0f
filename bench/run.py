#!/usr/bin/env python3
"""Run kubeport's benchmarks against the peers, in one invocation.

    sudo .venv/bin/python bench/run.py [--quick]
                                       [--only proxy|client-address|pod-path|dns|control|control-api|scale|scale-api]
                                       [--rounds 3] [--workers 1,2]

Installs missing peers from Debian's packages, builds one network-namespace topology per
benchmark, alternates peers and kubeport within each round, then writes
bench/results/<timestamp>.{json,md,png} and prints the markdown. Timing never fails it:
the exit code is 0 unless the harness itself could not run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import types
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
# bench/dns.py and bench/proxy.py must never become the top-level modules `dns` and `proxy`:
# load this folder as the package `kubeport_bench` instead of putting it on sys.path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() not in (BENCH_DIR, REPO)]
_package = types.ModuleType("kubeport_bench")
_package.__path__ = [str(BENCH_DIR)]  # type: ignore[attr-defined]
sys.modules["kubeport_bench"] = _package

from kubeport_bench import report  # noqa: E402
from kubeport_bench.harness import Progress, bench_from_json  # noqa: E402
from kubeport_bench.profiles import Profiler  # noqa: E402
from kubeport_bench.topology import raise_nofile  # noqa: E402

#: binary -> Debian package that provides it.
PEERS = {"haproxy": "haproxy", "iperf3": "iperf3", "wrk": "wrk", "dnsperf": "dnsperf", "knotd": "knot",
         "nsd": "nsd", "unbound": "unbound", "dnsmasq": "dnsmasq-base", "nginx": "nginx-light",
         "nft": "nftables", "ss": "iproute2", "ip": "iproute2", "conntrack": "conntrack"}
POLICY_RC = Path("/usr/sbin/policy-rc.d")


def install_peers(progress: Progress) -> None:
    """apt-get install what is missing; services must not start on the host, so policy-rc.d says no."""
    missing = sorted({pkg for binary, pkg in PEERS.items()
                      if shutil.which(binary) is None and not Path(f"/usr/sbin/{binary}").exists()})
    if not missing:
        return
    progress.say(f"installing from Debian: {' '.join(missing)}")
    created_policy = not POLICY_RC.exists()
    if created_policy:
        POLICY_RC.write_text("#!/bin/sh\nexit 101\n")
        POLICY_RC.chmod(0o755)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
                       env=env, check=True, timeout=1200)
    finally:
        if created_policy:
            POLICY_RC.unlink(missing_ok=True)


def install_bench_extras(progress: Progress) -> None:
    """The chart (matplotlib) and the profiles (py-spy): the `bench` extra, into this interpreter."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None and shutil.which("py-spy", path=_bin_path()):
        return
    progress.say("installing kubeport's bench extra (matplotlib, py-spy) into this interpreter")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", f"{REPO}[bench]"], check=False, timeout=900)


def _bin_path() -> str:
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def kubeport_runs() -> tuple[bool, str]:
    """Whether `kubeport run` exists in this interpreter (the daemon may still fail later: that is a result)."""
    try:
        proc = subprocess.run([sys.executable, "-m", "kubeport", "run", "--help"], capture_output=True,
                              text=True, timeout=30, cwd=tempfile.gettempdir())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    return proc.returncode == 0, (proc.stderr or proc.stdout).strip()[-300:]


#: in the order they run; client-address is kubeport's proxy with and without --keep-client-address,
#: pod-path a pod of the node balanced at connect(), control-api the control plane through the API watch.
#: scale: the control plane at two published kube-proxy scales (bench/scale.py), scale-api through the API watch.
BENCHMARKS = ["proxy", "client-address", "pod-path", "dns", "control", "control-api", "scale", "scale-api"]
#: run only when --only names them: the published scales take ~7 min each and CAP_SYS_RESOURCE for their limit
ON_REQUEST = ("scale", "scale-api")


#: the benchmarks whose subjects take a worker count; the others run once, whatever --workers says
PER_WORKER_COUNT = ("proxy", "client-address", "dns")
DEFAULT_WORKERS = (1, 2)


def worker_counts(text: str) -> tuple[int, ...]:
    """'1,2' -> (1, 2): each count once, in the order given."""
    counts: list[int] = []
    for part in text.split(","):
        try:
            count = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"worker count {part.strip()!r} is not a number") from None
        if count < 1:
            raise argparse.ArgumentTypeError(f"worker count {count} is below 1")
        if count in counts:
            raise argparse.ArgumentTypeError(f"worker count {count} is given twice")
        counts.append(count)
    return tuple(counts)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="kubeport benchmarks against peers")
    parser.add_argument("--quick", action="store_true", help="2 s tool runs, smaller scales (a smoke run)")
    parser.add_argument("--only", action="append", choices=BENCHMARKS,
                        help="run only this benchmark (repeatable); scale and scale-api run only when named")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per benchmark (>= 3 for a real run)")
    parser.add_argument("--seconds", type=float, help="duration of each tool run (default 5, quick 2)")
    parser.add_argument("--workers", type=worker_counts, default=DEFAULT_WORKERS, metavar="N[,N...]",
                        help="the proxy, client-address and DNS benchmarks run once per count: kubeport "
                             "--workers N = HAProxy nbthread N = the DNS peers' workers (default 1,2; --workers 1 "
                             "for one worker only)")
    parser.add_argument("--no-kubeport", action="store_true", help="measure the peers only")
    parser.add_argument("--tcp-relay", choices=["both", "splice", "sockmap"], default="both",
                        help="kubeport's TCP relay path in the proxy benchmark: both (two subjects, "
                             "kubeport = splice and kubeport-sockmap), or one of them as kubeport")
    parser.add_argument("--no-install", action="store_true", help="do not apt-get install missing peers")
    parser.add_argument("--results", type=Path, default=BENCH_DIR / "results", help="results directory")
    parser.add_argument("--no-profile", action="store_true",
                        help="skip the py-spy profile runs of kubeport's figures furthest from target")
    parser.add_argument("--render", type=Path, nargs="+", metavar="JSON",
                        help="only re-render the markdown and chart of earlier results; several files are "
                             "merged (a later file's benchmark replaces an earlier one of the same name)")
    parser.add_argument("--keep-workdir", action="store_true", help="keep configs and logs of the run")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    args.seconds = args.seconds or (2.0 if args.quick else 5.0)
    return args


def idle_connection_count(quick: bool) -> int:
    """10,000 as the target asks, unless the hard descriptor limit cannot hold 2 per connection."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    wanted = 2000 if quick else 10000
    return min(wanted, (hard - 2000) // 2 // 1000 * 1000)


#: a benchmark interrupted half-way: its samples so far still go into the results.
interrupted: list = []


def run_one(name: str, args: argparse.Namespace, workdir: Path, with_kubeport: bool, progress: Progress,
            profiler: Profiler | None, workers: int = 1):
    """One benchmark (at one worker count); if its harness breaks, say so and go on with the next."""
    try:
        if name == "proxy":
            from kubeport_bench import proxy
            relays = ("splice", "sockmap") if args.tcp_relay == "both" else (args.tcp_relay,)
            return proxy.run(workdir, args.rounds, args.seconds, idle_connection_count(args.quick),
                             workers, with_kubeport, progress, profiler, tcp_relays=relays)
        if name == "client-address":
            if not with_kubeport:
                progress.say("client-address: skipped with --no-kubeport (both its subjects are kubeport)")
                return None
            from kubeport_bench import proxy
            return proxy.run_client_address(workdir, args.rounds, args.seconds, workers, progress)
        if name == "pod-path":
            if not with_kubeport:
                progress.say("pod-path: skipped with --no-kubeport (it measures kubeport's connect() balancing)")
                return None
            from kubeport_bench import pod_path
            return pod_path.run(workdir, args.rounds, args.seconds, progress)
        if name == "dns":
            from kubeport_bench import dns
            return dns.run(workdir, args.rounds, args.seconds, workers, with_kubeport, progress, profiler)
        if name in ("scale", "scale-api"):
            from kubeport_bench import control, scale
            source = control.API if name == "scale-api" else control.MANIFESTS
            return scale.run(workdir, args.rounds, args.quick, with_kubeport, progress, profiler, source)
        from kubeport_bench import control
        source = control.API if name == "control-api" else control.MANIFESTS
        return control.run(workdir, args.rounds, args.quick, with_kubeport, progress, profiler, source)
    except KeyboardInterrupt:
        if progress.bench is not None and progress.bench.name == name:
            interrupted.append(progress.bench)
        raise
    except Exception as exc:
        progress.context = ""
        progress.say(f"{name}: the benchmark could not run: {type(exc).__name__}: {exc}")
        return None


def _terminate(signum, frame):  # SIGTERM tears down like Ctrl-C
    raise KeyboardInterrupt


def bench_key(bench: dict, machine: dict) -> tuple[str, int | None]:
    """A benchmark of a results file: its name and worker count (the run's one count in files
    that give it only in the machine line)."""
    workers = bench.get("workers")
    if workers is None and bench["name"] in PER_WORKER_COUNT and isinstance(machine.get("workers"), int):
        workers = machine["workers"]
    return bench["name"], workers


def render(paths: list[Path]) -> int:
    """Re-render results; several files (each its own invocation) merge into `<last>-combined`."""
    data = json.loads(paths[0].read_text())
    if len(paths) > 1:
        by_key = {}
        for part in paths:
            part_data = json.loads(part.read_text())
            for bench in part_data["benchmarks"]:
                key = bench_key(bench, part_data["machine"])
                by_key[key] = bench | {"workers": key[1], "source": part.name, "machine": part_data["machine"]}
        data = {"machine": data["machine"] | {"merged_from": [p.name for p in paths]},
                "benchmarks": list(by_key.values())}
        path = paths[-1].with_name(f"{paths[-1].stem}-combined.json")
        path.write_text(json.dumps(data, indent=1, default=str))
    else:
        path = paths[0]
    benches = [bench_from_json(b | {"workers": bench_key(b, data["machine"])[1]}) for b in data["benchmarks"]]
    try:
        png = report.chart(benches, path.with_suffix(".png"))
    except ImportError as exc:  # as in a run: the chart is optional, the tables are not
        png = None
        print(f"no chart ({exc}): pip install '.[bench]'", file=sys.stderr)
    text = report.markdown(benches, data["machine"], png)
    path.with_suffix(".md").write_text(text)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        return render(args.render)
    if os.geteuid() != 0:
        print("bench/run.py needs root (network namespaces): sudo .venv/bin/python bench/run.py", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    raise_nofile()
    progress = Progress()
    if not args.no_install:
        install_peers(progress)
        install_bench_extras(progress)
    with_kubeport = not args.no_kubeport
    if with_kubeport:
        ok, why = kubeport_runs()
        if not ok:
            progress.say(f"`kubeport run` is not available ({why}); its rows will say so")
    if args.rounds < 3:
        progress.say(f"note: {args.rounds} round(s); a real comparison needs >= 3")
    started = datetime.datetime.now()
    stamp = started.strftime("%Y%m%d-%H%M%S")
    workdir = Path(tempfile.mkdtemp(prefix=f"kubeport-bench-{stamp}-"))
    info = report.machine() | {"started": started.isoformat(timespec="seconds"), "rounds": args.rounds,
                               "quick": args.quick, "seconds_per_run": args.seconds,
                               "workers": list(args.workers)}
    profiler = None if args.no_profile else Profiler(args.results, stamp)
    benches = []
    only = args.only or [name for name in BENCHMARKS if name not in ON_REQUEST]
    try:
        for name in BENCHMARKS:
            if name not in only:
                continue
            for workers in args.workers if name in PER_WORKER_COUNT else (1,):
                where = workdir / (name if workers == 1 else f"{name}-{workers}workers")
                bench = run_one(name, args, where, with_kubeport, progress, profiler, workers)
                if bench is not None:
                    benches.append(bench)
    except KeyboardInterrupt:
        benches += interrupted
        progress.say("interrupted: topologies torn down; writing what was measured")
    finally:
        if not args.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            progress.say(f"work directory kept: {workdir}")
    args.results.mkdir(parents=True, exist_ok=True)
    report.write_json(args.results / f"{stamp}.json", benches, info)  # first: the measurements are safe
    try:
        png = report.chart(benches, args.results / f"{stamp}.png")
    except ImportError as exc:  # the chart is optional; the tables are not
        png = None
        progress.say(f"no chart ({exc}): pip install '.[bench]', then --render {stamp}.json")
    text = report.markdown(benches, info, png)
    (args.results / f"{stamp}.md").write_text(text)
    print(text)
    progress.context = ""
    progress.say(f"results: {args.results / stamp}.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

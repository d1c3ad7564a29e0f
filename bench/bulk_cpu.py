#!/usr/bin/env python3
"""Where the machine's CPU goes while a bulk TCP transfer crosses each proxy path.

    .venv/bin/python bench/bulk_cpu.py [--subjects direct,nft-dnat,haproxy,kubeport] [--streams 1,4]

Needs the proxy benchmark's peers and perf: ``netns-scripts/apt-install.sh haproxy iperf3
nginx-light knot linux-perf`` (``bench/run.py`` installs all but perf).

The topology and iperf3 load of ``bench/proxy.py`` (client -> VIP -> be, one worker), with
``perf record -a`` sampling every CPU (cpu-clock: this machine's hypervisor exposes no PMU)
through the middle of each transfer. Each sample falls to a process (``comm``) and a function;
the report gives, per path, the throughput and the CPU seconds per GB moved: the whole
machine's busy time, the load generator's share (iperf3: its copies into and out of user space
and the TCP work the kernel does in its context), the proxy's (haproxy, kubeport's python),
and the two copies on their own. Kernel paths have no proxy process: what they cost lands in
iperf3's context (softirq on the sender's CPU) or the idle task's.

Why this exists: the ``bulk_4`` ratio to nftables DNAT is bound by the whole machine (two
cores shared by the sender, the receiver and the proxy), not by the proxy process, which
runs well under one core. This shows the bill per GB of each path, all parts included.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

if not __package__:  # run as a script: the bench folder is the package kubeport_bench (as run.py loads it)
    BENCH_DIR = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() not in (BENCH_DIR, BENCH_DIR.parent)]
    _package = types.ModuleType("kubeport_bench")
    _package.__path__ = [str(BENCH_DIR)]  # type: ignore[attr-defined]
    sys.modules["kubeport_bench"] = _package

from kubeport_bench import backends, proxy, tools  # noqa: E402
from kubeport_bench.harness import Progress  # noqa: E402
from kubeport_bench.topology import Topology, raise_nofile  # noqa: E402

SUBJECTS = {"direct": proxy.Direct, "nft-dnat": proxy.NftDnat, "haproxy": proxy.HAProxy,
            "kubeport": proxy.Kubeport}
#: the idle loop: samples here are a CPU with nothing to run
IDLE_SYMBOLS = {"pv_native_safe_halt", "default_idle", "native_safe_halt", "acpi_safe_halt", "cpu_idle_poll",
                "poll_idle", "intel_idle", "mwait_idle", "acpi_idle_do_entry"}
COPY_SYMBOLS = {"_copy_from_iter": "copy_from_user", "_copy_to_iter": "copy_to_user"}
#: the proxy's own process, per subject
PROXY_COMMS = {"haproxy": {"haproxy"}, "kubeport": {"python", "python3", "kubeport"}}
#: perf report -q --stdio --sort comm,sym -g none: "  12.34%  iperf3  [k] _copy_from_iter"
_ROW = re.compile(r"^\s*([\d.]+)%\s+(.+?)\s+\[([k.])\]\s+(\S+)")
SAMPLE_HZ = 999


def parse_report(text: str) -> list[tuple[float, str, str]]:
    """perf report rows -> (share of all samples, comm, symbol)."""
    rows = []
    for line in text.splitlines():
        match = _ROW.match(line)
        if match:
            rows.append((float(match.group(1)) / 100.0, match.group(2).strip(), match.group(4)))
    return rows


def bill(rows: list[tuple[float, str, str]], cpus: int, gbytes_per_s: float, proxy_comms: set[str]) -> dict:
    """Shares of the sampled CPU time -> CPU seconds per GB moved, by part."""
    def per_gb(share: float) -> float:
        return round(share * cpus / gbytes_per_s, 3) if gbytes_per_s else 0.0

    idle = sum(s for s, _, sym in rows if sym in IDLE_SYMBOLS)
    loadgen = sum(s for s, comm, sym in rows if comm == "iperf3" and sym not in IDLE_SYMBOLS)
    proxy_share = sum(s for s, comm, _ in rows if comm in proxy_comms)
    copies = {name: per_gb(sum(s for s, _, sym in rows if sym == fn)) for fn, name in COPY_SYMBOLS.items()}
    return {"machine_busy": per_gb(1.0 - idle), "iperf3": per_gb(loadgen), "proxy": per_gb(proxy_share),
            "other": per_gb(1.0 - idle - loadgen - proxy_share), **copies, "busy_share": round(1.0 - idle, 3)}


def profile_transfer(topo: Topology, host: str, streams: int, seconds: float, output: Path) -> tuple[float, str]:
    """One iperf3 transfer with ``perf record -a`` over its middle: (Gbit/s, perf report text)."""
    result: dict[str, float | BaseException] = {}

    def transfer() -> None:
        try:
            result["gbit"] = tools.iperf3(topo, "client", host, proxy.IPERF, streams, seconds + 2)
        except BaseException as exc:  # reported by the caller
            result["error"] = exc

    thread = threading.Thread(target=transfer)
    thread.start()
    time.sleep(1.0)  # skip slow start and the connection set-up: the profile is of the steady transfer
    subprocess.run(["perf", "record", "-a", "-F", str(SAMPLE_HZ), "-o", str(output), "--", "sleep", f"{seconds:g}"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    thread.join()
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    report = subprocess.run(["perf", "report", "-i", str(output), "--no-children", "--sort", "comm,sym",
                             "-g", "none", "-q", "--stdio"], check=True, capture_output=True, text=True).stdout
    return float(result["gbit"]), report  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subjects", default=",".join(SUBJECTS))
    parser.add_argument("--streams", default="1,4")
    parser.add_argument("--seconds", type=float, default=4.0, help="profiled seconds per transfer")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    missing = [tool for tool in ("perf", "iperf3", "haproxy", "nginx", "knotd") if shutil.which(tool) is None]
    if missing:
        sys.exit(f"bulk_cpu: not installed: {', '.join(missing)} (netns-scripts/apt-install.sh haproxy iperf3 "
                 "nginx-light knot linux-perf)")
    raise_nofile()
    cpus = len(os.sched_getaffinity(0))
    workdir = Path(tempfile.mkdtemp(prefix="kubeport-bulkcpu-"))
    forwards = [backends.Forward("http", "TCP", proxy.HTTP, "10.77.2.2", proxy.HTTP),
                backends.Forward("iperf", "TCP", proxy.IPERF, "10.77.2.2", proxy.IPERF),
                backends.Forward("idle", "TCP", proxy.IDLE, "10.77.2.2", proxy.IDLE)]
    rows = []
    with Topology("bulkcpu", ["client", "be"], workdir) as topo:
        setup = proxy.Setup(topo, workdir, args.seconds, 100, 1, forwards=forwards)
        proxy.build(topo, workdir, Progress())
        for name in args.subjects.split(","):
            subject = SUBJECTS[name](setup)
            subject.start()
            try:
                for streams in (int(s) for s in args.streams.split(",")):
                    for run in range(args.repeat):
                        gbit, report = profile_transfer(topo, subject.host(), streams, args.seconds,
                                                        workdir / f"perf-{name}-{streams}-{run}.data")
                        row = {"subject": name, "streams": streams, "run": run, "gbit_s": round(gbit, 2),
                               **bill(parse_report(report), cpus, gbit / 8, PROXY_COMMS.get(name, set()))}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
            finally:
                subject.stop()
    print()
    print("| path | streams | Gbit/s | CPU s per GB: machine | iperf3 | proxy process | other "
          "| copy from user | copy to user |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['subject']} | {row['streams']} | {row['gbit_s']} | {row['machine_busy']} | {row['iperf3']} "
              f"| {row['proxy']} | {row['other']} | {row['copy_from_user']} | {row['copy_to_user']} |")
    if args.json:
        args.json.write_text(json.dumps({"cpus": cpus, "seconds": args.seconds, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()

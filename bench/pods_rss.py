#!/usr/bin/env python3
"""The daemon's RSS with the Pods DNS reads from an API server: none, this node's, every one.

    .venv/bin/python bench/pods_rss.py [--pods 10000] [--pods-on-node 30] [--json FILE]   (as root)

The fake kube-apiserver (bench/apiserver.py) in the node namespace of a benchmark topology
(bench/topology.py) serves 100 Services of 10 endpoints and ``--pods`` Pods shaped as a
Deployment's (with the kubelet's status, ~4 KiB of JSON each), ``--pods-on-node`` of them on
this node. kubeport runs against it three times: `--pods disabled` (no Pod watch),
`--dns-autopath` (a watch of this node's Pods), `--pods verified` (a watch of every Pod, as
CoreDNS's). The RSS is read once every kind is listed and the daemon has given back the heap
the first sync freed (as control.py's figure).
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import types
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
# As run.py: this folder is the package `kubeport_bench`, never top-level modules (bench/dns.py).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() not in (BENCH_DIR, REPO)]
_package = types.ModuleType("kubeport_bench")
_package.__path__ = [str(BENCH_DIR)]  # type: ignore[attr-defined]
sys.modules["kubeport_bench"] = _package

from kubeport_bench import probes  # noqa: E402
from kubeport_bench.kubeport_daemon import KubeportDaemon  # noqa: E402
from kubeport_bench.topology import Topology, TopologyError, stop_process, wait_for  # noqa: E402

API_PORT = 6443
MODES = {"no Pod watch": ["--pods", "disabled"], "autopath: this node's Pods": ["--dns-autopath"],
         "pods verified: every Pod": ["--pods", "verified"]}


def start_api_server(topo: Topology, workdir: Path, pods: int, on_node: int) -> tuple[object, Path]:
    host = topo.node_addr("client")
    token = secrets.token_hex(16)
    proc = topo.spawn("node", [sys.executable, str(BENCH_DIR / "apiserver.py"), "--listen", host,
                               "--port", str(API_PORT), "--control-port", str(API_PORT + 1),
                               "--services", "100", "--endpoints", "10", "--pods", str(pods),
                               "--pods-on-node", str(on_node), "--token", token, "--node", "node"], "apiserver")

    def serving() -> bool:
        if proc.poll() is not None:
            raise TopologyError(f"the fake API server exited {proc.returncode}: {topo.log_tail('apiserver', 8)}")
        return topo.call_in("client", probes.tcp_open, host, API_PORT + 1)

    wait_for(serving, 600, "the fake API server", interval=0.2)
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "clusters": [{"name": "bench", "cluster": {"server": f"http://{host}:{API_PORT}"}}],
        "users": [{"name": "bench", "user": {"token": token}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
    }))
    return proc, kubeconfig


def measure(topo: Topology, workdir: Path, kubeconfig: Path, flags: list[str]) -> dict[str, float]:
    daemon = KubeportDaemon(topo, "node", workdir / "kubeport", None, "10.96.0.10",
                            upstream=f"{topo.addr('be')}:53", extra_args=flags, kubeconfig=kubeconfig)
    daemon.start()
    try:
        daemon.wait_ready(300)

        def listed() -> bool:
            resources = ((daemon.status() or {}).get("source") or {}).get("resources") or {}
            return bool(resources) and all(kind.get("synced") for kind in resources.values())

        wait_for(listed, 300, "every kind listed", interval=0.5)
        pods = daemon.status_api("/api/v1/pods", 10.0)
        listed_mib = daemon.rss() / 2**20
        try:
            daemon.wait_at_rest(60)
            at_rest = True
        except TopologyError:  # the figure is then the one right after the lists
            at_rest = False
        print(f"{flags}: listed at {listed_mib:.1f} MiB, at rest: {at_rest}", file=sys.stderr)
        return {"rss_mib": round(daemon.rss() / 2**20, 1), "listed_mib": round(listed_mib, 1), "at_rest": at_rest,
                "pods_held": len((pods or {}).get("items", []))}
    finally:
        daemon.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--pods-on-node", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as work:
        workdir = Path(work)
        with Topology("pods-rss", ["client", "be"], workdir) as topo:
            api, kubeconfig = start_api_server(topo, workdir, args.pods, args.pods_on_node)
            try:
                for mode, flags in MODES.items():
                    results[mode] = measure(topo, workdir, kubeconfig, flags)
            finally:
                stop_process(api)  # type: ignore[arg-type]
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(f"kubeport RSS, 100 Services x 10 endpoints and {args.pods:,} Pods ({args.pods_on_node} on this node)\n")
    print("| Pods read | Pods held | RSS (MiB) |\n|---|---|---|")
    for mode, figures in results.items():
        print(f"| {mode} | {figures['pods_held']:,} | {figures['rss_mib']} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A daemon killed with SIGKILL and started again while the API server is unreachable: how
soon it answers DNS and forwards a connection from its last applied state, against the same
daemon's cold start with the API server up (its only other way to serve).

    .venv/bin/python bench/restart.py [--services 10000] [--rounds 3] [--json FILE]   (as root)

The topology and objects are control.py's: the fake kube-apiserver (bench/apiserver.py) in the
node namespace serves ``--services`` ClusterIP Services of 10 endpoints, plus the two probe
Services whose endpoint is nginx in the `be` namespace. Per round:

1. cold start with no kept state (`--state-dir` emptied), the API server up: from spawn until
   the probe's headless name resolves and a connection through the probe's ClusterIP is
   answered by nginx (the figures), then until /readyz is 200 and the state is kept;
2. the API server made unreachable (an nftables reject of its port in the node namespace: a
   connect is refused, as with a stopped server), the daemon killed with SIGKILL;
3. the restart: the same two figures from the spawn, with the source refusing every connect.

The probes run in the client namespace from before the spawn: a DNS query every 5 ms on one
unconnected socket (so the node's rate-limited ICMP unreachables cost nothing) and a TCP
request every 5 ms, each until its first answer. Target: <= 0.5 s for the restart.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import statistics
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
# As run.py: this folder is the package `kubeport_bench`, never top-level modules (bench/dns.py).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() not in (BENCH_DIR, REPO)]
_package = types.ModuleType("kubeport_bench")
_package.__path__ = [str(BENCH_DIR)]  # type: ignore[attr-defined]
sys.modules["kubeport_bench"] = _package

from dnslib import DNSRecord  # noqa: E402

from kubeport_bench import control  # noqa: E402
from kubeport_bench.harness import Progress  # noqa: E402
from kubeport_bench.kubeport_daemon import KubeportDaemon  # noqa: E402
from kubeport_bench.topology import Topology, stop_process, wait_for  # noqa: E402

PACE = 0.005
TARGET_S = 0.5
BLOCK_TABLE = "kpbench_api_down"


def first_answers(deadline_s: float) -> dict[str, float | None]:
    """In the client namespace: CLOCK_MONOTONIC of the first DNS answer naming the probe's
    endpoint and of the first connection through the probe's ClusterIP answered by nginx."""
    found: dict[str, float | None] = {"dns": None, "conn": None}
    deadline = time.monotonic() + deadline_s

    def dns() -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setblocking(False)
        query = DNSRecord.question(control.probe_dns_name(), "A")
        while time.monotonic() < deadline:
            query.header.id = (query.header.id + 1) % 65536
            try:
                sock.sendto(query.pack(), (control.DNS, 53))
            except OSError:
                pass
            ready, _, _ = select.select([sock], [], [], PACE)
            while ready:
                try:
                    reply = DNSRecord.parse(sock.recv(4096))
                except (OSError, Exception):  # noqa: BLE001 - a refusal or a malformed reply: not yet
                    break
                if any(str(rr.rdata) == control.PROBE_ENDPOINTS[0] for rr in reply.rr):
                    found["dns"] = time.monotonic()
                    return
                ready, _, _ = select.select([sock], [], [], 0)

    def conn() -> None:
        while time.monotonic() < deadline:
            if control.served_by() == control.PROBE_ENDPOINTS[0].encode():
                found["conn"] = time.monotonic()
                return
            time.sleep(PACE)  # pacing of the probe, not synchronisation

    threads = [threading.Thread(target=dns), threading.Thread(target=conn)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return found


def timed_start(topo: Topology, daemon: KubeportDaemon, fresh_state: bool) -> dict[str, float | None]:
    """Seconds from the spawn until the first DNS answer and the first forwarded connection."""
    result: dict[str, dict] = {}
    probe = threading.Thread(target=lambda: result.setdefault("at", topo.call_in("client", first_answers, 120.0,
                                                                                  timeout=180)))
    probe.start()
    time.sleep(0.05)  # the probe's first queries go out before the spawn; pacing, not synchronisation
    started = time.monotonic()
    daemon.start(fresh_state=fresh_state)
    probe.join()
    at = result.get("at") or {}
    return {kind: (when - started if when is not None else None) for kind, when in at.items()}


def api_reachable(topo: Topology, reachable: bool) -> None:
    if reachable:
        topo.run("node", ["nft", "delete", "table", "inet", BLOCK_TABLE], timeout=10, check=False)
        return
    topo.run("node", ["nft", "-f", "-"], timeout=10, input=(
        f"table inet {BLOCK_TABLE} {{\n chain out {{\n  type filter hook output priority 0;\n"
        f"  tcp dport {control.API_PORT} reject with tcp reset\n }}\n}}\n"))


def kept(daemon: KubeportDaemon) -> bool:
    status = daemon.status() or {}
    return bool((status.get("lastState") or {}).get("keptAt")) and status.get("synced", False)


def round_(setup: control.Setup, daemon: KubeportDaemon) -> dict[str, dict]:
    topo = setup.topo
    cold = timed_start(topo, daemon, fresh_state=True)
    daemon.wait_ready(300)
    wait_for(lambda: kept(daemon), 120, "the last applied state kept", interval=0.2)
    api_reachable(topo, False)
    try:
        assert daemon.proc is not None
        daemon.proc.kill()
        daemon.proc.wait(10)
        restart = timed_start(topo, daemon, fresh_state=False)
    finally:
        api_reachable(topo, True)
    daemon.wait_ready(300)
    daemon.stop()
    return {"cold_start_api_up": cold, "restart_api_down": restart}


def main(args: argparse.Namespace) -> dict:
    progress = Progress()
    with tempfile.TemporaryDirectory(prefix="kpbench-restart-") as tmp:
        workdir = args.keep_workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        with Topology("restart", ["client", "be"], workdir) as topo:
            for address in control.PROBE_ENDPOINTS:
                topo.ip("be", "addr", "add", f"{address}/32", "dev", "eth0")
            topo.ip("node", "route", "add", "10.201.0.0/24", "via", topo.addr("be"))
            control.start_identity_nginx(topo, workdir)
            setup = control.Setup(topo, workdir, workdir / "manifests", args.services, 10, 0, control.API)
            api = control.start_api_server(setup, progress)
            try:
                daemon = KubeportDaemon(topo, "node", workdir / "kubeport", None, control.DNS,
                                        upstream=f"{topo.addr('be')}:53", kubeconfig=setup.kubeconfig)
                rounds = []
                for number in range(args.rounds):
                    rounds.append(round_(setup, daemon))
                    print(f"round {number + 1}: {json.dumps(rounds[-1])}", file=sys.stderr, flush=True)
            finally:
                stop_process(api)
    summary = {scenario: {kind: statistics.median(r[scenario][kind] for r in rounds) for kind in ("dns", "conn")}
               for scenario in rounds[0]}
    return {"services": args.services, "endpoints_per_service": 10, "rounds": rounds, "median": summary,
            "target_s": TARGET_S}


def render(result: dict) -> str:
    median = result["median"]
    cold, restart = median["cold_start_api_up"], median["restart_api_down"]
    lines = [f"{result['services']:,} services x 10 endpoints, median of {len(result['rounds'])} rounds (s from spawn)",
             "| first ... | restart, API down, last state | cold start, API up | ratio | target |",
             "|---|---|---|---|---|"]
    for kind, label in (("dns", "DNS answer"), ("conn", "forwarded connection")):
        lines.append(f"| {label} | {restart[kind]:.3f} | {cold[kind]:.3f} | {restart[kind] / cold[kind]:.2f}x "
                     f"| <= {TARGET_S} s {'met' if restart[kind] <= TARGET_S else 'missed'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the samples here")
    parser.add_argument("--keep-workdir", type=Path, metavar="DIR", help="run in DIR and keep its logs")
    arguments = parser.parse_args()
    outcome = main(arguments)
    if arguments.json:
        arguments.json.write_text(json.dumps(outcome, indent=2) + "\n")
    print(render(outcome))

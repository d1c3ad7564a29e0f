"""Control plane at scale: N services x M endpoints, from a manifests directory or through the
API watch (the test suite's fake kube-apiserver, bench/apiserver.py, in the node namespace).

Figures, each round starting the daemon cold:
- cold start: from spawn until /readyz is 200 and the last service's listener accepts and its
  name resolves (every listener open, DNS ready);
- one endpoint change: the probe service's only endpoint moves to the other backend address
  (and the headless probe's, for DNS); time from the file's rename (or from the request that
  applies the new slices to the API server) until a new connection reaches the new endpoint /
  the DNS answer names it (open-loop probes, a connection every 1 ms and a query every
  0.5 ms: bench/change_watch.py); p99 over the changes;
- daemon RSS with everything loaded, at rest after the changes: once the daemon has given the
  heap the changes freed back to the kernel (it does 1 s after the last change; the RSS right
  after the changes is kept in the sample's extra).

Topology: client -> node (kubeport) -> be, where nginx answers with the address it was
reached on ($server_addr), so a reply names the endpoint that served it.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import backends, generate, probes
from .change_watch import ChangeWatch
from .harness import KUBEPORT, Bench, Figure, Progress, Sample, Target, measured, run_rounds
from .kubeport_daemon import HEALTHZ, KubeportDaemon
from .procinfo import CpuMeter, cpu_seconds, process_tree
from .profiles import Profiler, furthest_from_target
from .topology import Topology, TopologyError, stop_process, wait_for

PROBE_VIP = "10.99.0.1"
PROBE_ENDPOINTS = ("10.201.0.1", "10.201.0.2")
PROBE_PORT = 8080
DNS = "10.96.0.10"

FIGURES = [
    Figure("cold_start", "cold start to every listener open and DNS ready", "s", higher_is_better=False,
           digits=2, label="cold start"),
    Figure("change_conn_p99", "endpoint change -> new connections reach it, p99", "ms",
           higher_is_better=False, digits=1, label="change -> conn p99"),
    Figure("change_dns_p99", "endpoint change -> DNS answer names it, p99", "ms", higher_is_better=False,
           digits=1, label="change -> DNS p99"),
    Figure("rss_mib", "daemon RSS, proxy and DNS together", "MiB", higher_is_better=False, digits=1,
           label="daemon RSS"),
]
TARGETS = [Target("cold_start", "<=", 10.0), Target("change_conn_p99", "<=", 10.0),
           Target("change_dns_p99", "<=", 10.0), Target("rss_mib", "<=", 150.0)]


MANIFESTS, API = "manifests", "api"
API_PORT, API_CONTROL_PORT = 6443, 6444


@dataclass
class Setup:
    topo: Topology
    workdir: Path
    manifests: Path
    services: int
    endpoints: int
    changes: int
    source: str = MANIFESTS
    #: the API source: the daemon's kubeconfig, and where the probes' slices are applied
    kubeconfig: Path | None = None
    apply_url: str = ""
    #: the benchmark's name and what its figure keys end with (one benchmark, several cluster sizes:
    #: bench/scale.py); "" for the control benchmarks
    bench: str = ""
    suffix: str = ""
    #: also measure the descriptors the daemon's process tree holds at rest ("fds" figure)
    count_fds: bool = False
    #: the API source's ports (several API servers may run at once, one per cluster size)
    api_port: int = API_PORT
    api_control_port: int = API_CONTROL_PORT

    def move_probes(self, endpoint: str) -> float:
        """Point both probe services at ``endpoint`` (from the client namespace); when it began."""
        if self.source == API:
            return apply_probes(self.apply_url, endpoint)
        return write_probes(self.manifests, endpoint)


def probe_objects(endpoint: str) -> tuple[list[dict], list[dict]]:
    ports = [{"name": "http", "port": 80, "targetPort": PROBE_PORT, "protocol": "TCP"}]
    slice_ports = [{"name": "http", "port": PROBE_PORT, "protocol": "TCP"}]
    clusterip = [generate.service("probe", PROBE_VIP, ports),
                 generate.endpoint_slice("probe", [endpoint], slice_ports)]
    headless = [generate.service("probe-dns", None, ports, headless=True),
                generate.endpoint_slice("probe-dns", [endpoint], slice_ports)]
    return clusterip, headless


def write_probes(manifests: Path, endpoint: str) -> float:
    """Point both probe services at ``endpoint``; returns the perf_counter just before the renames."""
    clusterip, headless = probe_objects(endpoint)
    start = time.perf_counter()
    generate.write_list(manifests / "probe.json", clusterip)
    generate.write_list(manifests / "probe-dns.json", headless)
    return start


def served_by() -> bytes | None:
    reply = probes.http_body(PROBE_VIP, 80, 0.5)
    return None if reply is None else reply.rsplit(b"\r\n\r\n", 1)[-1].strip()


def probe_dns_name() -> str:
    return generate.fqdn("probe-dns")


CHANGE_WATCH = ChangeWatch(conn=(PROBE_VIP, 80), dns=(DNS, probe_dns_name()))


def apply_probes(apply_url: str, endpoint: str, with_services: bool = False) -> float:
    """Point both probe services at ``endpoint`` through the API server; returns the perf_counter
    just before the request (the latency includes the apply itself, as a controller's write would).
    As the EndpointSlice controller does, an endpoint change writes only the slices: the
    Services, written once (``with_services``), are not touched again."""
    clusterip, headless = probe_objects(endpoint)
    objects = clusterip + headless if with_services else [clusterip[1], headless[1]]
    body = json.dumps(objects).encode()
    request = urllib.request.Request(apply_url, body, {"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()
    return start


def change_and_watch(change: Callable[[str], float], endpoint: str, deadline_s: float = 30.0) -> tuple[float, float]:
    """Runs in the client namespace: ``change(endpoint)`` moves the probes to ``endpoint`` (and returns
    when it began); ms until new connections and DNS answers show it."""
    start = change(endpoint)
    return CHANGE_WATCH.first_seen(endpoint, start, deadline_s)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def last_service_ready(topo: Topology, services: int) -> bool:
    last = services - 1
    name = generate.fqdn(generate.service_name(last))
    answer = topo.call_in("client", probes.dns_answers, DNS, name, "A", 53, 0.3)
    if answer != ("NOERROR", [generate.cluster_ip(last)]):
        return False
    return topo.call_in("client", probes.tcp_open, generate.cluster_ip(last), generate.SERVICE_PORT, 0.5)


def measure_round(setup: Setup, round_no: int, progress: Progress, profile=None) -> list[Sample]:
    """One cold start, the endpoint changes, RSS. ``profile(pid)`` wraps the daemon's whole life."""
    topo = setup.topo
    topo.call_in("client", setup.move_probes, PROBE_ENDPOINTS[0])
    daemon = KubeportDaemon(topo, "node", setup.workdir / "kubeport", setup.manifests, DNS,
                            upstream=f"{topo.addr('be')}:53", kubeconfig=setup.kubeconfig)
    samples: list[Sample] = []
    daemon.start()
    try:
        if profile is not None:
            # py-spy needs an initialised interpreter: attach once the status server answers.
            wait_for(lambda: topo.call_in("node", probes.http_status, f"http://{HEALTHZ}/healthz", 0.5)
                     is not None, 60, "kubeport's status server")
        with profile(daemon.pid) if profile is not None else nullcontext():
            try:
                samples += measure_running(setup, daemon, round_no, progress)
            finally:
                daemon.stop()  # inside the profile: py-spy writes its file when the daemon exits
    finally:
        daemon.stop()
    return samples


def measure_running(setup: Setup, daemon: KubeportDaemon, round_no: int, progress: Progress) -> list[Sample]:
    topo = setup.topo

    def cold_start():
        with progress.ticking("cold start", 10):
            ready_s = daemon.wait_ready(600)
            wait_for(lambda: last_service_ready(topo, setup.services), 120, "the last service's listener and name")
            wait_for(lambda: topo.call_in("client", served_by) == PROBE_ENDPOINTS[0].encode(), 60,
                     "the probe service")
        total = time.perf_counter() - daemon.started_at
        return total, cpu_seconds(daemon.pid), {"readyz_s": ready_s}

    name, suffix = setup.bench or bench_name(setup.source), setup.suffix
    samples = [measured(name, "cold_start" + suffix, KUBEPORT, round_no, progress, cold_start, "s")]
    if samples[-1].value is None:
        return samples
    conn, dns = [], []
    meter = CpuMeter(daemon.pid).start()
    for k in range(setup.changes):
        endpoint = PROBE_ENDPOINTS[(k + 1) % 2]
        conn_ms, dns_ms = topo.call_in("client", change_and_watch, setup.move_probes, endpoint, timeout=60)
        conn.append(conn_ms)
        dns.append(dns_ms)
    cpu = meter.stop()
    for key, values in (("change_conn_p99", conn), ("change_dns_p99", dns)):
        extra = {"median_ms": sorted(values)[len(values) // 2], "max_ms": max(values), "changes": len(values),
                 "all_ms": [round(v, 2) for v in values]}
        samples.append(measured(name, key + suffix, KUBEPORT, round_no, progress,
                                lambda v=values, e=extra: (p99(v), cpu, e), "ms"))
    def rss_at_rest():
        # As a node's daemon spends its life: the changes over, the heap they freed given back.
        busy_mib = daemon.rss() / 2**20
        waited = daemon.wait_at_rest(30)
        return daemon.rss() / 2**20, None, {"right_after_changes_mib": round(busy_mib, 1),
                                            "waited_s": round(waited, 2)}

    samples.append(measured(name, "rss_mib" + suffix, KUBEPORT, round_no, progress, rss_at_rest, "MiB"))
    if setup.count_fds:
        def descriptors():
            return fds_in_use(daemon.pid), None, {"nofile_limit": nofile_limit(daemon.pid)}
        samples.append(measured(name, "fds" + suffix, KUBEPORT, round_no, progress, descriptors, "fds"))
    return samples


def fds_in_use(pid: int | None) -> int:
    """Open descriptors of ``pid``'s whole process tree (entries of /proc/<pid>/fd)."""
    if pid is None:
        raise TopologyError("the daemon is not running")
    total = 0
    for member in process_tree(pid):
        try:
            total += len(os.listdir(f"/proc/{member}/fd"))
        except OSError:  # a member that exited in between holds nothing
            pass
    return total


def nofile_limit(pid: int | None) -> dict:
    """The open-file limit ``pid`` runs under (after the daemon raised its soft limit to the hard one)."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return {"soft": int(soft) if soft.isdigit() else soft, "hard": int(hard) if hard.isdigit() else hard}
    return {}


def bench_name(source: str) -> str:
    return "control" if source == MANIFESTS else "control-api"


def run(workdir: Path, rounds: int, quick: bool, with_kubeport: bool, progress: Progress,
        profiler: Profiler | None = None, source: str = MANIFESTS) -> Bench:
    # 200 changes: the p99 is then the second worst; of 50 it would be the worst, one hiccup of a
    # shared machine.
    services, endpoints, changes = (1000, 10, 20) if quick else (10000, 10, 200)
    name = bench_name(source)
    how = ("manifests source" if source == MANIFESTS
           else "API watch: the test suite's fake kube-apiserver")
    bench = Bench(name, f"Control plane: {services:,} services x {endpoints} endpoints ({how})",
                  [KUBEPORT], FIGURES, TARGETS)
    change = ("an atomic rename of the probe slices' files; latency from the rename" if source == MANIFESTS
              else "one POST to the fake API server applying the probe slices (MODIFIED events on the daemon's "
                   "watches); latency from just before the POST")
    bench.notes += [
        f"{services:,} ClusterIP services, {services * endpoints:,} endpoints, plus two probe services "
        f"(ClusterIP and headless); {changes} endpoint changes per round, each {change} until a new connection "
        "/ a DNS answer shows the new endpoint (probes open loop: a connection every 1 ms, a query every 0.5 ms; "
        "a change counts when the first reply naming the new endpoint has been read).",
        "cold start: spawn -> /readyz 200 -> last service's VIP accepts and its name resolves -> probe serves.",
        "RSS: after the changes, once the daemon has returned the heap they freed to the kernel (1 s after the "
        "last change; waited on as its RSS unchanged over 5 reads 0.2 s apart); the RSS right after the last "
        "change is in the JSON (extra.right_after_changes_mib).",
        "kube-proxy for scale: nftables mode needs ~141 ms to add one service with 10k present; "
        "CoreDNS sizes at (pods+services)/1000 + 54 MB = 164 MB for this cluster.",
        "No peer runs here: kube-proxy and CoreDNS need a kube-apiserver; their published figures are quoted.",
    ]
    if source == API:
        bench.notes.append(
            "API source: bench/apiserver.py serves tests/support/apiserver/server.py (the real list/watch protocol; "
            "objects shaped like a real server's, with uids, managedFields and ownerReferences) over plain HTTP "
            "with a bearer token, from the node namespace, in a process of its own (not in the daemon's RSS or "
            "CPU). The daemon takes its initial state as a streaming list (watch with sendInitialEvents=true), "
            "which the fake encodes in Python: part of the cold start, where a real kube-apiserver's watch cache "
            "would be faster.")
    if not with_kubeport:
        bench.notes.append("kubeport not run (--no-kubeport): nothing measured.")
        return bench
    manifests = workdir / "manifests"
    progress.context = name
    if source == MANIFESTS:
        progress.say(f"generating {services:,} services x {endpoints} endpoints")
        generate.write_cluster(manifests, services, endpoints)
    with Topology(name, ["client", "be"], workdir) as topo:
        prepare(topo, workdir)
        setup = Setup(topo, workdir, manifests, services, endpoints, changes, source)
        api = start_api_server(setup, progress) if source == API else None
        try:
            run_rounds(bench, rounds, lambda _subject, r: measure_round(setup, r, progress), progress)
            worst = furthest_from_target(bench, 1)
            if profiler is not None and worst:
                progress.context = f"{name} profile"
                figure, how_far = worst[0]
                first = len(profiler.profiles)
                try:
                    measure_round(setup, 0, progress,
                                  profile=lambda pid: profiler.record(
                                      name, figure, how_far, pid, None,
                                      scope="The profile spans a whole round: cold start, the endpoint changes, "
                                            "then shutdown; wall-clock waits (file-watch debounce) do not show "
                                            "in a CPU profile."))
                except Exception as exc:  # a failed profile run is reported, not fatal
                    progress.say(f"profile run failed: {exc}")
                bench.profiles.extend(profiler.profiles[first:])
        finally:
            stop_process(api)
    return bench


def start_api_server(setup: Setup, progress: Progress) -> subprocess.Popen:
    """bench/apiserver.py in the node namespace, on the node's address toward the client (the
    probes apply their slices from there); the daemon's kubeconfig points at it."""
    topo = setup.topo
    host = topo.node_addr("client")
    token = secrets.token_hex(16)
    progress.say(f"fake kube-apiserver: loading {setup.services:,} services x {setup.endpoints} endpoints")
    proc = topo.spawn("node", [sys.executable, str(Path(__file__).with_name("apiserver.py")), "--listen", host,
                               "--port", str(setup.api_port), "--control-port", str(setup.api_control_port),
                               "--services", str(setup.services), "--endpoints", str(setup.endpoints),
                               "--token", token, "--node", "node"], "apiserver" + setup.suffix)

    def serving() -> bool:
        if proc.poll() is not None:
            raise TopologyError(f"the fake API server exited {proc.returncode}: "
                                f"{topo.log_tail('apiserver' + setup.suffix, 8)}")
        return topo.call_in("client", probes.tcp_open, host, setup.api_control_port)

    wait_for(serving, 300, "the fake API server", interval=0.2)
    setup.apply_url = f"http://{host}:{setup.api_control_port}/bench/apply"
    topo.call_in("client", apply_probes, setup.apply_url, PROBE_ENDPOINTS[0], True)
    setup.kubeconfig = setup.workdir / f"kubeconfig{setup.suffix}"
    setup.kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "clusters": [{"name": "bench", "cluster": {"server": f"http://{host}:{setup.api_port}"}}],
        "users": [{"name": "bench", "user": {"token": token}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
    }))
    return proc


def prepare(topo: Topology, workdir: Path) -> None:
    """The probe endpoints on ``be``, routed from the node, served by nginx naming them."""
    for address in PROBE_ENDPOINTS:
        topo.ip("be", "addr", "add", f"{address}/32", "dev", "eth0")
    topo.ip("node", "route", "add", "10.201.0.0/24", "via", topo.addr("be"))
    start_identity_nginx(topo, workdir)


def start_identity_nginx(topo: Topology, workdir: Path) -> None:
    backends.start_echo_nginx(topo, workdir, "nginx-identity", PROBE_PORT, "$server_addr", connections=4096)
    for address in PROBE_ENDPOINTS:
        wait_for(lambda a=address: topo.call_in("client", probes.tcp_open, a, PROBE_PORT), 20, f"nginx on {address}")

"""DNS benchmark: 1,000 services; kubeport's DNS versus knot, nsd, unbound (local-data) and
dnsmasq serving the same records, plus upstream forwarding with a warm cache versus unbound.

Topology: client (10.77.1.2) -> node: the server under test on 10.96.0.10:53 -> up
(10.77.2.2): knot, authoritative for example.com, the fake upstream of the forwarding figure.
Queries (dnsperf): 80% A of a service, 10% SRV of its named port, 10% NXDOMAIN.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import dnspeers, generate, probes, tools
from .harness import KUBEPORT, Bench, Figure, Progress, Sample, Target, run_plan, run_rounds
from .kubeport_daemon import KubeportDaemon
from .profiles import Profiler, furthest_from_target, profile_name
from .topology import Topology, TopologyError, stop_process, wait_for

SERVER = "10.96.0.10"
SERVICES = 1000
EXTERNAL_NAMES = 1000
P99_RATE = 20000

FIGURES = [
    Figure("max_qps", "max queries/s, UDP (cluster names)", "qps", digits=0, label="DNS max qps"),
    Figure("p99_20k", f"p99 latency at {P99_RATE // 1000}k qps", "ms", higher_is_better=False, digits=3,
           label=f"DNS p99 at {P99_RATE // 1000}k qps"),
    Figure("fwd_qps", "forwarded queries/s, warm cache", "qps", digits=0, label="DNS forwarding qps"),
]
TARGETS = [
    Target("max_qps", ">=", 1.0, "knot"),
    Target("p99_20k", "<=", 1.0),
    Target("fwd_qps", ">=", 1.0, "unbound"),
]
SUBJECTS = ["knot", "nsd", "unbound", "dnsmasq", KUBEPORT]


@dataclass
class Setup:
    topo: Topology
    workdir: Path
    seconds: float
    workers: int
    zone: dnspeers.Zone
    cluster_queries: Path
    external_queries: Path
    manifests: Path


def check_answers(topo: Topology, who: str, server: str = SERVER) -> None:
    """The server answers the benchmark's records as the zone says (same records for every subject)."""
    name = generate.fqdn(generate.service_name(SERVICES - 1))
    expected = {
        (name, "A"): ("NOERROR", [generate.cluster_ip(SERVICES - 1)]),
        (f"_http._tcp.{name}", "SRV"): ("NOERROR", [f"0 100 {generate.SERVICE_PORT} {name}"]),
        (f"nx-1.{generate.NAMESPACE}.svc.{generate.ZONE}.", "A"): ("NXDOMAIN", []),
    }
    for (qname, qtype), want in expected.items():
        got = topo.call_in("client", probes.dns_answers, server, qname, qtype, 53, 1.0)
        if got is None or got[0] != want[0] or got[1] != want[1]:
            raise TopologyError(f"{who}: {qname} {qtype}: expected {want}, got {got}")


def wait_serving(topo: Topology, proc: subprocess.Popen | None, who: str, log: str, timeout: float = 30) -> None:
    name = generate.fqdn(generate.service_name(0))

    def answers() -> bool:
        if proc is not None and proc.poll() is not None:
            raise TopologyError(f"{who} exited {proc.returncode}: {topo.log_tail(log, 6)}")
        got = topo.call_in("client", probes.dns_answers, SERVER, name, "A", 53, 0.3)
        return got is not None and got[0] == "NOERROR" and bool(got[1])

    wait_for(answers, timeout, f"{who} answering")


class Server:
    """A DNS server under test on SERVER:53 in the node namespace."""

    def __init__(self, setup: Setup, name: str) -> None:
        self.setup = setup
        self.name = name
        self.proc: subprocess.Popen | None = None
        self.daemon: KubeportDaemon | None = None

    @property
    def pid(self) -> int | None:
        if self.daemon is not None:
            return self.daemon.pid
        return None if self.proc is None else self.proc.pid

    def start_cluster(self) -> None:
        s, topo = self.setup, self.setup.topo
        if self.name == KUBEPORT:
            self.daemon = KubeportDaemon(topo, "node", s.workdir / "kubeport", s.manifests, SERVER,
                                         upstream=f"{topo.addr('up')}:53",
                                         extra_args=["--workers", str(s.workers)])
            self.daemon.start()
            self.daemon.wait_ready(60)
        else:
            topo.ip("node", "addr", "add", f"{SERVER}/32", "dev", "lo")
            start = {"knot": lambda: dnspeers.start_knot(topo, "node", s.workdir, SERVER, [s.zone], s.workers),
                     "nsd": lambda: dnspeers.start_nsd(topo, "node", s.workdir, SERVER, [s.zone], s.workers),
                     "unbound": lambda: dnspeers.start_unbound_local(topo, "node", s.workdir, SERVER, s.zone,
                                                                     s.workers),
                     "dnsmasq": lambda: dnspeers.start_dnsmasq(topo, "node", s.workdir, SERVER, s.zone)}
            self.proc = start[self.name]()
        wait_serving(topo, self.proc, self.name, self.name)
        check_answers(topo, self.name)

    def start_forwarder(self) -> None:
        """unbound as a caching forwarder (kubeport forwards with the daemon already running)."""
        s, topo = self.setup, self.setup.topo
        topo.ip("node", "addr", "add", f"{SERVER}/32", "dev", "lo")
        self.proc = dnspeers.start_unbound_forwarder(topo, "node", s.workdir, SERVER, f"{topo.addr('up')}@53",
                                                     s.workers)
        probe = generate.external_queries(1)[0].split()[0]

        def answers() -> bool:
            if self.proc.poll() is not None:
                raise TopologyError(f"unbound exited {self.proc.returncode}: {topo.log_tail('unbound-forward', 4)}")
            return topo.call_in("client", probes.dns_answers, SERVER, probe, "A", 53, 0.3) is not None

        wait_for(answers, 30, "unbound forwarder answering")

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
            self.daemon = None
        stop_process(self.proc)
        self.proc = None
        self.setup.topo.ip("node", "addr", "flush", "dev", "lo", "scope", "global", check=False)


def measure_subject(setup: Setup, name: str, round_no: int, progress: Progress,
                    only: set[str] | None = None, profile=None) -> list[Sample]:
    topo, seconds = setup.topo, setup.seconds
    server = Server(setup, name)

    def max_qps():
        result = tools.dnsperf(topo, "client", SERVER, setup.cluster_queries, seconds, clients=8, outstanding=200)
        return result.qps, {"rcodes": result.rcodes, "lost": result.lost}

    def p99_20k():
        # 50 outstanding carry 20k qps at up to 2.5 ms each; more only queue inside dnsperf and the server.
        result = tools.dnsperf(topo, "client", SERVER, setup.cluster_queries, seconds, max_qps=P99_RATE,
                               clients=4, outstanding=50, verbose=True)
        return result.latency_ms["p99"], {"qps": result.qps, "latency_ms": result.latency_ms, "lost": result.lost}

    def fwd_qps():
        # Warm the cache: every external name once, then the measured run hits the cache.
        tools.dnsperf(topo, "client", SERVER, setup.external_queries, 20, max_qps=5000, clients=4, passes=1)
        result = tools.dnsperf(topo, "client", SERVER, setup.external_queries, seconds, clients=8, outstanding=200)
        return result.qps, {"rcodes": result.rcodes, "lost": result.lost}

    def pid() -> int | None:
        return server.pid

    samples: list[Sample] = []
    try:
        if only is None or only & {"max_qps", "p99_20k"}:
            server.start_cluster()
            # One untimed pass of the query file first, for every server: the figures are the
            # steady state of a server that has run a while. kubeport builds an answer once per
            # question; cold, those 4,000 builds were ~6% of a 5 s max-qps run's profile.
            tools.dnsperf(topo, "client", SERVER, setup.cluster_queries, 20, clients=4, passes=1)
            plan = [("max_qps", max_qps, "qps"), ("p99_20k", p99_20k, "ms")]
            samples += run_plan("dns", name, round_no, progress, plan, pid, seconds, only, profile)
        if name not in ("unbound", KUBEPORT) or (only is not None and "fwd_qps" not in only):
            return samples
        if name == KUBEPORT and server.daemon is None:
            server.start_cluster()
        if name == "unbound":
            server.stop()
            try:
                server.start_forwarder()
            except TopologyError as exc:
                progress.say(f"fwd_qps: FAILED: {exc}")
                return samples + [Sample("dns", "fwd_qps", name, round_no, None, note=str(exc)[:500])]
        samples += run_plan("dns", name, round_no, progress, [("fwd_qps", fwd_qps, "qps")], pid, seconds,
                            only, profile)
        return samples
    finally:
        server.stop()


def profile_pass(setup: Setup, bench: Bench, profiler: Profiler, progress: Progress) -> None:
    """Rerun kubeport's worst-missed figures under py-spy; the numbers are not kept."""
    for figure, how_far in furthest_from_target(bench):
        progress.context = f"{bench.label} profile {figure}"
        first = len(profiler.profiles)
        try:
            measure_subject(setup, KUBEPORT, 0, progress, only={figure},
                            profile=lambda key, pid: profiler.record(profile_name(bench), key, how_far, pid,
                                                                     setup.seconds))
        except Exception as exc:  # a failed profile run is reported, not fatal
            progress.say(f"profile run failed: {exc}")
        bench.profiles.extend(profiler.profiles[first:])


def workers_note(workers: int) -> str:
    """Which processes answer at ``workers``: kubeport's DNS server lives in the daemon alone."""
    peers = (f"knot `udp-workers: {workers}`, nsd `server-count: {workers}`, unbound `num-threads: {workers}`; "
             "dnsmasq has no worker setting and answers from one process at every count")
    if workers == 1:
        return f"kubeport answers in its one process (`--workers 1`); {peers}."
    return (f"kubeport `--workers {workers}` runs {workers} relay processes besides the daemon ({workers + 1} "
            f"processes), but DNS is answered by the daemon's one process: these kubeport figures are one "
            f"process against {workers}-worker peers; its CPU is the sum of all {workers + 1}. {peers}.")


def run(workdir: Path, rounds: int, seconds: float, workers: int, with_kubeport: bool,
        progress: Progress, profiler: Profiler | None = None) -> Bench:
    subjects = [s for s in SUBJECTS if with_kubeport or s != KUBEPORT]
    bench = Bench("dns", f"Cluster DNS: {SERVICES:,} services", subjects, FIGURES, TARGETS,
                  workers=workers, workers_note=workers_note(workers))
    zone = dnspeers.Zone(generate.ZONE, tuple(generate.zone_records(SERVICES)))
    manifests = workdir / "manifests"
    generate.write_cluster(manifests, SERVICES, 1)
    setup = Setup(None, workdir, seconds, workers, zone,  # type: ignore[arg-type]
                  generate.write_lines(workdir / "cluster-queries.txt", generate.cluster_queries(SERVICES)),
                  generate.write_lines(workdir / "external-queries.txt", generate.external_queries(EXTERNAL_NAMES)),
                  manifests)
    with Topology("dns", ["client", "up"], workdir) as topo:
        setup.topo = topo
        progress.context = bench.label
        progress.say("starting the fake upstream (knot, example.com) in its own namespace")
        upstream_zone = dnspeers.Zone("example.com", tuple(generate.external_records(EXTERNAL_NAMES)), ttl=3600)
        dnspeers.start_knot(topo, "up", workdir, topo.addr("up"), [upstream_zone], workers=1,
                            tag="knot-upstream")
        probe = generate.external_queries(1)[0].split()[0]
        wait_for(lambda: topo.call_in("client", probes.dns_answers, topo.addr("up"), probe, "A", 53, 0.3)
                 is not None, 30, "upstream knot")
        bench.notes += [
            f"Each server: {SERVICES:,} ClusterIP services (A + SRV of the named port), {workers} worker(s) "
            f"(knot udp-workers, nsd server-count, unbound num-threads; dnsmasq is single-threaded; "
            f"kubeport `--workers {workers}`, its DNS in the daemon's one process).",
            "dnsperf: 1 thread, 8 sockets, up to 200 outstanding; queries 80% A, 10% SRV, 10% NXDOMAIN; "
            "each server gets one untimed pass of the query file after its start (steady state).",
            f"p99 at {P99_RATE:,} qps: dnsperf -Q {P99_RATE} -c 4 -q 50 -v, percentile over every query "
            "(a lost one counts as the 2 s timeout); the rate reached is in the JSON (extra.qps).",
            f"forwarding: {EXTERNAL_NAMES:,} names of example.com (TTL 3600) from knot in another namespace; "
            "cache warmed by one pass before the measured run; unbound as forward-zone '.' with its cache.",
        ]
        run_rounds(bench, rounds, lambda name, r: measure_subject(setup, name, r, progress), progress)
        if profiler is not None and with_kubeport:
            profile_pass(setup, bench, profiler, progress)
    return bench

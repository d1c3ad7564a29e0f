"""Proxy benchmark: client -> VIP -> backend, versus direct, nftables DNAT and HAProxy.

Topology: client (10.77.1.2) -> node (the thing under test) -> be (10.77.2.2) running nginx
(HTTP on 80, idle holder on 9000), an iperf3 server on 5201 and knot answering `q.bench.`
on UDP 53. The service VIP is 10.96.0.20 with those four ports.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from . import backends, dnspeers, generate, probes, tools
from .harness import KUBEPORT, KUBEPORT_SOCKMAP, Bench, Figure, Progress, Sample, Target, run_plan, run_rounds
from .kubeport_daemon import KubeportDaemon, missing_run_flag
from .procinfo import CpuMeter, MachineMeter, rss_bytes
from .profiles import Profiler, furthest_from_target, profile_name
from .topology import Topology, TopologyError, stop_process, wait_for

VIP = "10.96.0.20"
DNS_VIP = "10.96.0.10"
HTTP, IPERF, IDLE, UDP = 80, 5201, 9000, 53

FIGURES = [
    Figure("bulk_1", "bulk TCP, 1 stream (iperf3)", "Gbit/s", digits=2, label="bulk 1 stream"),
    Figure("bulk_4", "bulk TCP, 4 streams (iperf3)", "Gbit/s", digits=2, label="bulk 4 streams"),
    Figure("conn_rate", "new connections/s (wrk, Connection: close, 64 conc.)", "req/s", digits=0,
           label="new conn/s"),
    Figure("keepalive", "keep-alive requests/s (wrk, 64 conc.)", "req/s", digits=0, label="keep-alive req/s"),
    Figure("p99_half", "p99 latency at half HAProxy's max keep-alive rate", "ms", higher_is_better=False,
           digits=3, label="p99 at half HAProxy max"),
    Figure("udp_rr", "UDP request/response per second (dnsperf)", "req/s", digits=0, label="UDP req/s"),
    Figure("idle_kib", "proxy RSS per idle TCP connection", "KiB", higher_is_better=False, digits=2,
           label="RSS per idle conn"),
]
TARGETS = [
    Target("bulk_1", ">=", 0.80, "direct"), Target("bulk_1", ">=", 1.5, "haproxy"),
    Target("bulk_4", ">=", 0.80, "direct"), Target("bulk_4", ">=", 1.5, "haproxy"),
    Target("conn_rate", ">=", 1.0, "haproxy"),
    Target("keepalive", ">=", 1.0, "haproxy"),
    Target("p99_half", "<=", 1.2, "haproxy"),
    Target("udp_rr", ">=", 0.6, "nft-dnat"),
    Target("idle_kib", "<=", 10.0),
]


@dataclass
class Setup:
    topo: Topology
    workdir: Path
    seconds: float
    idle_connections: int
    workers: int
    rate: float = 0.0
    queries: Path = Path()
    forwards: list[backends.Forward] = field(default_factory=list)


class Subject:
    """A path under test: where the client connects, and the process to meter (None: kernel)."""

    name = ""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup

    def host(self) -> str:
        return VIP

    def pid(self) -> int | None:
        return None

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Direct(Subject):
    name = "direct"

    def host(self) -> str:
        return self.setup.topo.addr("be")


class NftDnat(Subject):
    name = "nft-dnat"

    def start(self) -> None:
        backends.apply_nft(self.setup.topo, "node", backends.nft_dnat_ruleset(VIP, self.setup.forwards))

    def stop(self) -> None:
        backends.flush_nft(self.setup.topo, "node")


class HAProxy(Subject):
    name = "haproxy"
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        topo = self.setup.topo
        topo.ip("node", "addr", "add", f"{VIP}/32", "dev", "lo")
        config = backends.haproxy_config(VIP, self.setup.forwards, self.setup.workers,
                                         maxconn=self.setup.idle_connections + 100)
        self.proc = backends.start_haproxy(topo, "node", self.setup.workdir, config)

        def listening() -> bool:
            if self.proc.poll() is not None:
                raise TopologyError(f"haproxy exited {self.proc.returncode}: {topo.log_tail('haproxy', 5)}")
            return topo.call_in("client", probes.tcp_open, VIP, HTTP)

        wait_for(listening, 20, "haproxy listening")

    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def stop(self) -> None:
        stop_process(self.proc)
        self.setup.topo.ip("node", "addr", "flush", "dev", "lo", "scope", "global", check=False)


class Kubeport(Subject):
    name = KUBEPORT
    #: --tcp-relay of this subject: both paths are subjects of one run (run.py --tcp-relay)
    tcp_relay = "splice"
    daemon: KubeportDaemon | None = None

    def start(self) -> None:
        setup = self.setup
        manifests = setup.workdir / "kubeport-manifests"
        ports = [{"name": f.name, "port": f.port, "targetPort": f.target_port, "protocol": f.protocol}
                 for f in setup.forwards]
        slice_ports = [{"name": f.name, "port": f.target_port, "protocol": f.protocol} for f in setup.forwards]
        generate.write_list(manifests / "bench.json", [
            generate.service("bench", VIP, ports, namespace="default"),
            generate.endpoint_slice("bench", [setup.topo.addr("be")], slice_ports, namespace="default"),
        ])
        self.daemon = KubeportDaemon(setup.topo, "node", setup.workdir / "kubeport", manifests,
                                     dns_address=DNS_VIP, upstream=f"{setup.topo.addr('be')}:53",
                                     extra_args=self.daemon_args())
        self.daemon.start()
        self.daemon.wait_ready(60)

    def daemon_args(self) -> list[str]:
        return ["--workers", str(self.setup.workers), "--tcp-relay", self.tcp_relay]

    def pid(self) -> int | None:
        return None if self.daemon is None else self.daemon.pid

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()


class KubeportSockmap(Kubeport):
    """kubeport with bulk TCP directions relayed in the kernel (a BPF sockhash, sockmap.py)."""

    name = KUBEPORT_SOCKMAP
    tcp_relay = "sockmap"


def kubeport_subjects(tcp_relays: tuple[str, ...]) -> dict[str, type[Kubeport]]:
    """The kubeport subjects for ``--tcp-relay``: "kubeport" is the first path named."""
    first = type("KubeportFirst", (Kubeport,), {"tcp_relay": tcp_relays[0]})
    makers: dict[str, type[Kubeport]] = {KUBEPORT: first}
    if "sockmap" in tcp_relays[1:]:
        makers[KUBEPORT_SOCKMAP] = KubeportSockmap
    return makers


def build(topo: Topology, workdir: Path, progress: Progress) -> None:
    progress.say("starting backends: nginx, iperf3, knot (UDP responder)")
    backends.start_nginx(topo, "be", workdir, HTTP, IDLE)
    backends.start_iperf3(topo, "be", IPERF)
    dnspeers.start_knot(topo, "be", workdir, topo.addr("be"),
                        [dnspeers.Zone("bench", ("q.bench. 60 IN A 192.0.2.1",), ttl=60)], workers=2)
    be = topo.addr("be")
    for port in (HTTP, IDLE, IPERF):
        wait_for(lambda: topo.call_in("client", probes.tcp_open, be, port), 20, f"backend port {port}")
    wait_for(lambda: topo.call_in("client", probes.dns_answers, be, "q.bench.") is not None, 20, "knot in be")


def established(topo: Topology, role: str, port: int) -> int:
    out = topo.run(role, ["ss", "-Htn", "state", "established", f"( sport = :{port} )"], timeout=20).stdout
    return sum(1 for line in out.splitlines() if line.strip())


def idle_rss_per_connection(setup: Setup, subject: Subject) -> tuple[float, dict]:
    topo, count, pid = setup.topo, setup.idle_connections, subject.pid()
    if pid is None:
        raise TopologyError("kernel path: no process RSS to measure")
    before = rss_bytes(pid)
    sockets = topo.call_in("client", probes.open_idle, subject.host(), IDLE, count, timeout=120)
    try:
        wait_for(lambda: established(topo, "be", IDLE) >= count, 60, f"{count} idle connections at the backend",
                 interval=0.2)
        after = rss_bytes(pid)
    finally:
        topo.call_in("client", probes.close_all, sockets)
    wait_for(lambda: established(topo, "be", IDLE) == 0, 60, "idle connections to close", interval=0.2)
    per_connection = (after - before) / count / 1024
    return per_connection, {"connections": count, "rss_before": before, "rss_after": after}


def measure_subject(setup: Setup, subject: Subject, round_no: int, progress: Progress,
                    only: set[str] | None = None, profile=None) -> list[Sample]:
    topo, seconds, host = setup.topo, setup.seconds, subject.host()
    subject.start()
    try:
        reply = topo.call_in("client", probes.http_body, host, HTTP, 2.0)
        if not reply or b"200 OK" not in reply:
            raise TopologyError(f"{subject.name}: HTTP through {host}:{HTTP} does not work: {reply!r}")

        def bulk_1():
            return tools.iperf3(topo, "client", host, IPERF, 1, seconds), {}

        def bulk_4():
            return tools.iperf3(topo, "client", host, IPERF, 4, seconds), {}

        def conn_rate():
            result = tools.wrk(topo, "client", f"http://{host}:{HTTP}/", seconds, close=True)
            return result.requests_per_second, {"errors": result.errors, "latency_ms": result.latency_ms}

        def keepalive():
            result = tools.wrk(topo, "client", f"http://{host}:{HTTP}/", seconds)
            return result.requests_per_second, {"errors": result.errors, "latency_ms": result.latency_ms}

        def p99_half():
            result = tools.fixed_rate(topo, "client", host, HTTP, setup.rate, seconds)
            return result["p99_ms"], result

        def udp_rr():
            result = tools.dnsperf(topo, "client", host, setup.queries, seconds, clients=8, outstanding=256)
            return result.qps, {"lost": result.lost, "completed": result.completed}

        def idle_kib():
            return idle_rss_per_connection(setup, subject)

        plan = []
        if subject.pid() is not None:
            # First, on the fresh process: after the load figures, freed heap and pools would absorb the
            # new connections and hide their cost. Kernel paths have no process RSS.
            plan.append(("idle_kib", idle_kib, "KiB"))
        plan += [("bulk_1", bulk_1, "Gbit/s"), ("bulk_4", bulk_4, "Gbit/s"), ("conn_rate", conn_rate, "req/s"),
                 ("keepalive", keepalive, "req/s"), ("p99_half", p99_half, "ms")]
        if subject.name != "haproxy":  # HAProxy 2.6 does not proxy UDP
            plan.append(("udp_rr", udp_rr, "req/s"))
        return run_plan("proxy", subject.name, round_no, progress, plan, subject.pid, seconds, only, profile)
    finally:
        subject.stop()


def calibrate_rate(setup: Setup, progress: Progress) -> float:
    """Half of HAProxy's max keep-alive request rate, measured now."""
    haproxy = HAProxy(setup)
    haproxy.start()
    try:
        result = tools.wrk(setup.topo, "client", f"http://{VIP}:{HTTP}/", setup.seconds)
    finally:
        haproxy.stop()
    progress.say(f"calibration: HAProxy keep-alive max {result.requests_per_second:,.0f} req/s "
                 f"-> fixed rate {result.requests_per_second / 2:,.0f} req/s")
    return result.requests_per_second / 2


def latency_rounds(setup: Setup, bench: Bench, rounds: int, makers: dict, progress: Progress) -> None:
    """p99 at half HAProxy's max: per round, calibrate right before, then every subject at that rate.

    A shared machine's capacity drifts by tens of percent within minutes; a rate fixed once
    would put some subjects near saturation and others not.
    """
    for round_no in range(1, rounds + 1):
        progress.context = f"{bench.label} latency r{round_no}/{rounds}"
        setup.rate = calibrate_rate(setup, progress)
        run_rounds(bench, 1, lambda name, _r: measure_subject(setup, makers[name](setup), round_no, progress,
                                                              only={"p99_half"}),
                   progress, order_round=round_no)


def workers_note(workers: int) -> str:
    """How each process-based subject uses ``workers`` cores."""
    if workers == 1:
        return "kubeport relays in its one process (`--workers 1`); HAProxy `nbthread 1`."
    return (f"kubeport `--workers {workers}`: {workers} relay processes besides the daemon ({workers + 1} "
            f"processes; the daemon relays nothing), its CPU and RSS the sum of all {workers + 1}; HAProxy one "
            f"process, `nbthread {workers}`. direct and nft-dnat forward in the kernel on every core at any count.")


def run(workdir: Path, rounds: int, seconds: float, idle_connections: int, workers: int,
        with_kubeport: bool, progress: Progress, profiler: Profiler | None = None,
        tcp_relays: tuple[str, ...] = ("splice", "sockmap")) -> Bench:
    kubeports = kubeport_subjects(tcp_relays) if with_kubeport else {}
    subjects = ["direct", "nft-dnat", "haproxy", *kubeports]
    bench = Bench("proxy", "Service proxy: client -> ClusterIP -> backend", subjects, FIGURES, TARGETS,
                  workers=workers, workers_note=workers_note(workers))
    forwards = [backends.Forward("http", "TCP", HTTP, "10.77.2.2", HTTP),
                backends.Forward("iperf", "TCP", IPERF, "10.77.2.2", IPERF),
                backends.Forward("idle", "TCP", IDLE, "10.77.2.2", IDLE),
                backends.Forward("dns", "UDP", UDP, "10.77.2.2", UDP)]
    with Topology("proxy", ["client", "be"], workdir) as topo:
        assert topo.addr("be") == "10.77.2.2"
        setup = Setup(topo, workdir, seconds, idle_connections, workers, forwards=forwards,
                      queries=generate.write_lines(workdir / "udp-queries.txt", ["q.bench. A"]))
        progress.context = bench.label
        build(topo, workdir, progress)
        bench.notes += [
            "p99 latency: bench/fixedrate.py (asyncio open-loop, keep-alive, 64 connections; wrk2 is not in "
            "Debian) at half of HAProxy's keep-alive max, calibrated right before each latency round "
            "(each run's rate is in the JSON: extra.target_rate).",
            f"HAProxy 2.6: mode tcp, option splice-auto/splice-request/splice-response, nbthread {workers} "
            f"(= kubeport workers); no UDP, so no UDP figure.",
            "nft-dnat: kube-proxy nftables-mode shape (vmap on daddr . l4proto . dport -> numgen -> dnat).",
            f"idle connections: {idle_connections:,} connections through the VIP to nginx; RSS delta of the "
            f"process tree / connections. Kernel paths have no process RSS.",
            "CPU seconds: user+system of the process tree under test during each run (/proc/<pid>/stat).",
        ]
        if kubeports:
            bench.notes.append(
                f"kubeport: --tcp-relay {kubeports[KUBEPORT].tcp_relay}"
                + (f"; {KUBEPORT_SOCKMAP}: --tcp-relay sockmap (bulk directions relayed in the kernel; its CPU is "
                   "softirq and kworker time outside the process tree, so its CPU per GB reads low)"
                   if KUBEPORT_SOCKMAP in kubeports else "") + ".")
        makers = {"direct": Direct, "nft-dnat": NftDnat, "haproxy": HAProxy, **kubeports}
        throughput = {f.key for f in FIGURES} - {"p99_half"}
        run_rounds(bench, rounds, lambda name, r: measure_subject(setup, makers[name](setup), r, progress,
                                                                  only=throughput), progress)
        latency_rounds(setup, bench, rounds, makers, progress)
        if profiler is not None and with_kubeport:
            profile_pass(setup, bench, profiler, progress, kubeports)
    return bench


def profile_pass(setup: Setup, bench: Bench, profiler: Profiler, progress: Progress,
                 kubeports: dict[str, type[Kubeport]]) -> None:
    """Rerun kubeport's worst-missed figures under py-spy; the numbers are not kept."""
    for figure, how_far in furthest_from_target(bench):
        progress.context = f"{bench.label} profile {figure}"
        first = len(profiler.profiles)
        try:
            measure_subject(setup, kubeports[KUBEPORT](setup), 0, progress, only={figure},
                            profile=lambda key, pid: profiler.record(profile_name(bench), key, how_far, pid,
                                                                     setup.seconds))
        except Exception as exc:  # a failed profile run is reported, not fatal
            progress.say(f"profile run failed: {exc}")
        bench.profiles.extend(profiler.profiles[first:])


# --- client address (run.py --only client-address) ---------------------------------------------
#
# What keeping the client's address costs: kubeport with --keep-client-address (the relay's upstream
# socket binds the client's address, IP_TRANSPARENT; replies come back by nftables `socket transparent`,
# a fwmark and policy routing) against the same daemon with --no-keep-client-address (the upstream
# socket binds the node's address), in the same rounds. --cluster-cidr 10.77.0.0/16 makes the client
# (10.77.1.2, on the node's own subnet) a pod of this node, the clients the feature applies to.

CLIENT_ADDRESS = "client-address"
#: the subjects: kubeport (the numerator of every ratio) keeps the client's address, the other does not
KEEP, NODE_ADDRESS = KUBEPORT, "kubeport --no-keep-client-address"
KEEP_FLAG, NO_KEEP_FLAG = "--keep-client-address", "--no-keep-client-address"
CLUSTER_CIDR = "10.77.0.0/16"
#: nginx in be answers the peer address it saw ($remote_addr): the client's, or the node's
WHO = 8080
CLIENT_ADDRESS_FIGURES = [
    Figure("conn_rate", "new connections/s (wrk, Connection: close, 64 conc.)", "req/s", digits=0,
           label="new conn/s"),
    Figure("cpu_per_conn", "kubeport CPU per new connection (daemon and relay workers)", "µs",
           higher_is_better=False, digits=1, label="CPU per conn"),
]
#: targets, stated and judged in the report, never asserted: keeping the address costs at most 10%
CLIENT_ADDRESS_TARGETS = [Target("conn_rate", ">=", 0.9, NODE_ADDRESS),
                          Target("cpu_per_conn", "<=", 1.1, NODE_ADDRESS)]


class KubeportClientAddress(Kubeport):
    """kubeport with the client's address kept (``keep``) or not; the pods' CIDR holds the client."""

    name = KEEP
    keep = True
    #: "" when `kubeport run` takes --keep-client-address / --no-keep-client-address, else why not
    flag_missing = ""

    def daemon_args(self) -> list[str]:
        args = [*super().daemon_args(), "--cluster-cidr", CLUSTER_CIDR]
        if not self.flag_missing:
            args.append(KEEP_FLAG if self.keep else NO_KEEP_FLAG)
        return args

    def expected_peer(self) -> tuple[str, str]:
        """The address the backend must see, and whose it is."""
        topo = self.setup.topo
        return (topo.addr("client"), "the client") if self.keep else (topo.node_addr("be"), "the node")


class KubeportNodeAddress(KubeportClientAddress):
    name = NODE_ADDRESS
    keep = False


def start_who_nginx(topo: Topology, workdir: Path) -> None:
    """nginx in be on WHO answering the address of the peer that connected to it."""
    backends.start_echo_nginx(topo, workdir, "nginx-who", WHO, "$remote_addr")


def backend_saw(topo: Topology) -> str:
    """The peer address the backend saw on one new connection from the client through the VIP."""
    reply = topo.call_in("client", probes.http_body, VIP, WHO, 2.0)
    if not reply or b"200 OK" not in reply:
        raise TopologyError(f"no answer from the backend through {VIP}:{WHO}: {reply!r}")
    return reply.split(b"\r\n\r\n", 1)[-1].decode(errors="replace").strip()


def measure_client_address(setup: Setup, subject: KubeportClientAddress, round_no: int,
                           progress: Progress) -> list[Sample]:
    """One wrk run of new connections; the backend's view of the peer checked before and after it."""
    topo, seconds = setup.topo, setup.seconds

    seen: dict = {}

    def failed(note: str) -> list[Sample]:
        return [Sample(CLIENT_ADDRESS, f.key, subject.name, round_no, None, note=note[:500], extra=dict(seen))
                for f in CLIENT_ADDRESS_FIGURES]

    if subject.keep and subject.flag_missing:
        progress.say(f"skipped: {subject.flag_missing}")
        return failed(f"skipped: {subject.flag_missing}")
    expected, whose = subject.expected_peer()
    try:
        subject.start()
        try:
            before = backend_saw(topo)
            seen.update(backend_saw=f"backend saw {before}", expected=f"{expected} ({whose})")
            if before != expected:
                raise TopologyError(f"backend saw {before}, not {expected} ({whose})")
            meter, machine = CpuMeter(subject.pid()).start(), MachineMeter().start()
            with progress.ticking("conn_rate", seconds):
                result = tools.wrk(topo, "client", f"http://{VIP}:{HTTP}/", seconds, close=True)
            cpu, busy = meter.stop(), machine.stop()
            after = backend_saw(topo)
            seen["backend_saw"] = f"backend saw {after}" + ("" if after == before else f" (before the load {before})")
            if after != expected:
                raise TopologyError(f"backend saw {before} before the load and {after} after it, "
                                    f"not {expected} ({whose})")
        finally:
            subject.stop()
    except TopologyError as exc:
        progress.say(f"FAILED: {exc}")
        return failed(str(exc))
    connections = result.requests_per_second * seconds  # one request per connection (Connection: close)
    if cpu is None or connections <= 0:
        return failed(f"no connections or no CPU reading ({connections:.0f} connections, cpu {cpu})")
    per_connection = cpu / connections * 1e6
    extra = {**seen, "connections": round(connections), "errors": result.errors, "latency_ms": result.latency_ms,
             "machine_steal": machine.stolen, "daemon_args": subject.daemon_args()}
    progress.say(f"backend saw {after} ({whose}); {result.requests_per_second:,.0f} new conn/s, "
                 f"{per_connection:,.1f} µs CPU per connection (cpu {cpu:.2f} s)")
    return [Sample(CLIENT_ADDRESS, "conn_rate", subject.name, round_no, result.requests_per_second, cpu,
                   machine_busy=busy, extra=dict(extra)),
            Sample(CLIENT_ADDRESS, "cpu_per_conn", subject.name, round_no, per_connection, cpu,
                   machine_busy=busy, extra=dict(extra))]


def address_notes(bench: Bench) -> list[str]:
    """What the backend saw in each configuration, over every round that measured."""
    notes = []
    for subject, flag in ((KEEP, KEEP_FLAG), (NODE_ADDRESS, NO_KEEP_FLAG)):
        checked = [s for s in bench.samples if s.subject == subject and s.figure == "conn_rate"
                   and s.extra.get("backend_saw")]
        if not checked:
            notes.append(f"{flag}: the backend's view not checked (see the failures).")
            continue
        seen = ", ".join(sorted({s.extra["backend_saw"] for s in checked}))
        wrong = sum(1 for s in checked if s.value is None)
        verdict = (f"wrong in {wrong} of {len(checked)} rounds: those rounds measured nothing" if wrong
                   else "checked on a new connection before and after each round's load")
        notes.append(f"{flag}: {seen} (expected {checked[0].extra['expected']}); {verdict}.")
    return notes


def run_client_address(workdir: Path, rounds: int, seconds: float, workers: int,
                       progress: Progress) -> Bench:
    """New connections/s and kubeport's CPU per connection with and without the client's address kept."""
    flag_missing = missing_run_flag(KEEP_FLAG)
    if flag_missing:
        progress.say(f"{CLIENT_ADDRESS}: {flag_missing}: the {KEEP_FLAG} side is skipped, the other "
                     f"runs without the flag (the node's address)")
    keep = type("KubeportKeep", (KubeportClientAddress,), {"flag_missing": flag_missing, "tcp_relay": "splice"})
    node = type("KubeportNode", (KubeportNodeAddress,), {"flag_missing": flag_missing, "tcp_relay": "splice"})
    makers: dict[str, type[KubeportClientAddress]] = {KEEP: keep, NODE_ADDRESS: node}
    bench = Bench(CLIENT_ADDRESS, f"Client address: kubeport {KEEP_FLAG} (kubeport) / {NO_KEEP_FLAG}",
                  list(makers), CLIENT_ADDRESS_FIGURES, CLIENT_ADDRESS_TARGETS, workers=workers,
                  workers_note=(f"both configurations `--workers {workers}`; "
                                + ("CPU is the daemon's (it relays itself)." if workers == 1 else
                                   f"CPU is the daemon's and its {workers} relay workers' together.")))
    forwards = [backends.Forward("http", "TCP", HTTP, "10.77.2.2", HTTP),
                backends.Forward("who", "TCP", WHO, "10.77.2.2", WHO)]
    with Topology("clientaddr", ["client", "be"], workdir) as topo:
        assert topo.addr("be") == "10.77.2.2"
        setup = Setup(topo, workdir, seconds, 0, workers, forwards=forwards)
        progress.context = bench.label
        progress.say("starting backends: nginx (ok on 80, the peer's address on 8080)")
        backends.start_nginx(topo, "be", workdir, HTTP, IDLE)
        start_who_nginx(topo, workdir)
        be = topo.addr("be")
        for port in (HTTP, WHO):
            wait_for(lambda p=port: topo.call_in("client", probes.tcp_open, be, p), 20, f"backend port {port}")
        bench.notes += [
            f"Both subjects are kubeport, `--cluster-cidr {CLUSTER_CIDR}` (the client {topo.addr('client')} is a "
            f"pod on the node's own subnet), `--tcp-relay splice`: kubeport with {KEEP_FLAG} (the backend sees "
            f"the client) and with {NO_KEEP_FLAG} (the backend sees the node, {topo.node_addr('be')}). Ratios are "
            "with / without, same round; the targets (at most 10% slower, 10% more CPU) are targets.",
            "CPU per connection: user+system CPU seconds of the daemon and its relay workers (/proc/<pid>/stat) "
            "during the wrk run / connections (wrk's requests/s x run seconds, one request per connection).",
        ]
        if flag_missing:
            bench.notes.append(f"{KEEP_FLAG} skipped: {flag_missing}; the other subject ran without the flag.")
        run_rounds(bench, rounds, lambda name, r: measure_client_address(setup, makers[name](setup), r, progress),
                   progress)
        bench.notes += address_notes(bench)
    return bench

"""Pod path benchmark: a pod of the node -> ClusterIP -> a pod in another namespace.

kubeport balances the node's own pods inside connect()/sendmsg() (proxy/connectlb/): BPF
programs on the pods' cgroup rewrite the Service address to an endpoint, so nothing of
kubeport's is on the path. This measures that path against the pod's direct route to the
backend (the ceiling), kube-proxy-shaped nftables DNAT on the node and kubeport's own relay
(the same daemon, the client outside the cgroup), in the same rounds.

Topology: as the proxy benchmark's (bench/proxy.py: client 10.77.1.2 -> node -> be 10.77.2.2
with nginx, iperf3 and knot; VIP 10.96.0.20). The client's load tools are the "pod": each
joins ``<cgroup2 mount>/kubeport-bench-<pid>/pods`` before ``ip netns exec`` (which hides the
host's cgroup mount), so every socket it creates belongs to that cgroup; the daemon runs with
``--connect-balancing-cgroup /kubeport-bench-<pid>/pods``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import backends, generate, tools
from .harness import KUBEPORT, Bench, Figure, Progress, Sample, Target, run_plan, run_rounds
from .kubeport_daemon import METRICS, missing_run_flag
from .proxy import HTTP, IDLE, IPERF, UDP, Direct, Kubeport, NftDnat, Setup, build
from .topology import Topology, TopologyError, pid_alive

POD_PATH = "pod-path"
#: the subjects; "kubeport" (the numerator of every ratio) is the connect() path
DIRECT, NFT_DNAT, CONNECT, RELAY = "direct", "nft-dnat", KUBEPORT, "kubeport relay"
#: the pod to the backend's address on a node where the daemon runs: the ceiling with kubeport's
#: nftables tables in the node (they turn conntrack on), so kubeport / this is the translation alone
DIRECT_UP = "direct, kubeport up"
#: nginx in be answers the peer address it saw: the pod's on every path but the relay
WHO = 8080
CGROUP_PREFIX = "kubeport-bench-"

FIGURES = [
    Figure("bulk_1", "bulk TCP, 1 stream (iperf3)", "Gbit/s", digits=2, label="bulk 1 stream"),
    Figure("bulk_4", "bulk TCP, 4 streams (iperf3)", "Gbit/s", digits=2, label="bulk 4 streams"),
    Figure("conn_rate", "new connections/s (wrk, Connection: close, 64 conc.)", "req/s", digits=0,
           label="new conn/s"),
    Figure("udp_rr", "UDP request/response per second (dnsperf)", "req/s", digits=0, label="UDP req/s"),
]
#: connect() balancing takes kubeport off the path: within 5% of the pod's direct route
TARGETS = [Target(key, ">=", 0.95, DIRECT) for key in ("bulk_1", "bulk_4", "conn_rate", "udp_rr")]


# --- the pods' cgroup ------------------------------------------------------------------------

def cgroup2_mount() -> tuple[Path, str]:
    """Where this process sees the cgroup v2 hierarchy, and which hierarchy path that mount's root is."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            fields = left.split()
            return Path(fields[4].replace("\\040", " ")), fields[3]
    raise TopologyError("no cgroup2 mount in /proc/self/mountinfo: connect() balancing needs cgroup v2")


class PodsCgroup:
    """``kubeport-bench-<pid>/pods`` in the cgroup v2 hierarchy; removed (rmdir) once its processes exit."""

    def __init__(self) -> None:
        self.mount, root = cgroup2_mount()
        self.remove_stale(self.mount)
        self.parent = self.mount / f"{CGROUP_PREFIX}{os.getpid()}"
        self.directory = self.parent / "pods"
        self.hierarchy_path = f"{root.rstrip('/')}/{CGROUP_PREFIX}{os.getpid()}/pods"
        self.directory.mkdir(parents=True, exist_ok=True)

    @property
    def procs(self) -> Path:
        return self.directory / "cgroup.procs"

    @staticmethod
    def remove_stale(mount: Path) -> None:
        """Cgroups of earlier runs whose process is gone (a killed run could not rmdir them)."""
        for parent in mount.glob(f"{CGROUP_PREFIX}*"):
            match = re.fullmatch(rf"{CGROUP_PREFIX}(\d+)", parent.name)
            if match and not pid_alive(int(match.group(1))):
                for directory in (parent / "pods", parent):
                    try:
                        directory.rmdir()
                    except OSError:
                        pass

    def members(self) -> list[int]:
        try:
            return [int(p) for p in self.procs.read_text().split()]
        except OSError:
            return []

    def remove(self, timeout: float = 10.0) -> None:
        """rmdir, once the load tools that joined have exited (the topology's teardown kills them)."""
        deadline = time.monotonic() + timeout
        while self.members() and time.monotonic() < deadline:
            time.sleep(0.05)
        for directory in (self.directory, self.parent):
            try:
                directory.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                print(f"pod-path: could not remove cgroup {directory}: {exc} (members {self.members()})",
                      file=sys.stderr)

    def attached_programs(self) -> list | None:
        """The BPF programs attached to the pods' cgroup (bpftool), or None without bpftool."""
        try:
            proc = subprocess.run(["bpftool", "-j", "cgroup", "show", str(self.directory)], capture_output=True,
                                  text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if proc.returncode != 0:
            return None
        return json.loads(proc.stdout.strip() or "[]")


class InCgroup:
    """The topology's commands, each started in the pods' cgroup before it enters its namespace.

    A socket belongs to the cgroup of the process that creates it, and ``ip netns exec`` hides
    the host's cgroup mount, so the shell joins first and then execs ``ip netns exec``: the load
    tool keeps the pid, and with it the cgroup. The tools (bench/tools.py) only call ``run``."""

    def __init__(self, topo: Topology, cgroup: PodsCgroup) -> None:
        self.topo = topo
        self.cgroup = cgroup

    def run(self, role: str, argv: Sequence[str], timeout: float, check: bool = True,
            input: str | None = None) -> subprocess.CompletedProcess:
        joined = ["sh", "-c", f'echo $$ > {self.cgroup.procs} && exec "$@"', "sh", *self.topo.argv(role, argv)]
        try:
            proc = subprocess.run(joined, capture_output=True, text=True, timeout=timeout, input=input)
        except subprocess.TimeoutExpired as exc:
            raise TopologyError(f"{argv[0]} in {role} (pods' cgroup): no result within {timeout:.0f} s") from exc
        if check and proc.returncode != 0:
            raise TopologyError(f"{' '.join(argv)} in {role} (pods' cgroup) exited {proc.returncode}: "
                                f"{(proc.stderr or proc.stdout).strip()[-600:]}")
        return proc


# --- subjects ----------------------------------------------------------------------------------

@dataclass
class PodSetup(Setup):
    pods: PodsCgroup | None = None


class PodDirect(Direct):
    name = DIRECT
    in_cgroup = True


class PodNftDnat(NftDnat):
    name = NFT_DNAT
    in_cgroup = True


class KubeportConnect(Kubeport):
    """kubeport balancing the pods' cgroup at connect(); the client is in that cgroup."""

    name = CONNECT
    tcp_relay = "splice"
    in_cgroup = True
    #: the counter one new connection to host() must move: "balanced" (the programs), "relayed", or
    #: None (neither: the pod dials the backend's own address)
    carried_by: str | None = "balanced"

    def daemon_args(self) -> list[str]:
        setup = self.setup
        assert isinstance(setup, PodSetup) and setup.pods is not None
        # No connection drain at stop: it is not measured, and each round stops the daemon twice.
        return [*super().daemon_args(), "--connect-balancing", "--connect-balancing-cgroup",
                setup.pods.hierarchy_path, "--bpf-root", str(setup.workdir / "bpffs"),
                "--shutdown-grace-period", "0s"]


class KubeportRelay(KubeportConnect):
    """The same daemon; the client outside the cgroup, so its connections go through the relay."""

    name = RELAY
    in_cgroup = False
    carried_by = "relayed"


class DirectKubeportUp(KubeportConnect):
    """The same daemon, the pod in the cgroup dialling the backend's address: nothing to translate."""

    name = DIRECT_UP
    carried_by = None

    def host(self) -> str:
        return self.setup.topo.addr("be")


MAKERS = {DIRECT: PodDirect, NFT_DNAT: PodNftDnat, DIRECT_UP: DirectKubeportUp, CONNECT: KubeportConnect,
          RELAY: KubeportRelay}

#: one HTTP request on a new connection: the body nginx answered (the peer address it saw)
WHO_SCRIPT = r"""
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3) as sock:
    sock.sendall(b"GET / HTTP/1.0\r\nHost: who\r\n\r\n")
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
head, _, body = answer.partition(b"\r\n\r\n")
print(head.split(b"\r\n")[0].decode(), "|", body.decode().strip())
"""


def backend_saw(runner, host: str) -> str:
    """The address nginx in be saw on one new connection from the client (in the subject's cgroup)."""
    proc = runner.run("client", [sys.executable, "-c", WHO_SCRIPT, host, str(WHO)], timeout=15, check=False)
    status, _, saw = proc.stdout.strip().partition(" | ")
    if proc.returncode != 0 or " 200 " not in f"{status} ":
        raise TopologyError(f"HTTP through {host}:{WHO} does not work: {(proc.stdout + proc.stderr).strip()[-300:]}")
    return saw


#: kubeport's counters that say which path carried the traffic
COUNTERS = {"balanced": "kubeport_proxy_connects_balanced_total", "relayed": "kubeport_proxy_connections_total",
            "udp_flows": "kubeport_proxy_udp_flows_total"}


def _metrics_text() -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{METRICS}/metrics", timeout=2) as response:
        return response.read().decode()


def path_counters(topo: Topology) -> dict[str, float]:
    """Connects balanced by the programs, and connections and UDP flows the relay took, summed over ports."""
    text = topo.call_in("node", _metrics_text)
    totals = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        for key, metric in COUNTERS.items():
            if line.startswith(metric + "{") or line.startswith(metric + " "):
                totals[key] += float(line.rsplit(" ", 1)[1])
    return totals


def pod_traffic(subject: KubeportConnect, timeout: float = 10.0) -> str:
    """The daemon's status proxy.podTraffic, once it says connect() (or whatever it says at ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        traffic = (subject.daemon.status() or {}).get("proxy", {}).get("podTraffic", "?")
        if traffic.startswith("connect(): cgroup") or time.monotonic() > deadline:
            return traffic
        time.sleep(0.1)


def forget_flows(topo: Topology) -> None:
    """Empty the node's conntrack table before a subject.

    The subjects reuse the client's ports toward the same backend: a DNAT entry the nft-dnat
    subject left (client:p -> VIP:80, its reply be:80 -> client:p) clashes with a later
    connection of the pod straight to be:80 from the same port (connect() balancing, direct),
    and conntrack drops that SYN until the entry expires (120 s in TIME_WAIT): new connections/s
    fall to tens. The nftables NAT remaps a clashing source port instead, so the order of
    subjects would decide the figure."""
    proc = topo.run("node", ["conntrack", "-F"], timeout=20, check=False)
    if proc.returncode != 0 and "0 flow entries" not in proc.stderr:
        raise TopologyError(f"conntrack -F in the node: {(proc.stderr or proc.stdout).strip()[-300:]}")


def check_detached(setup: PodSetup) -> None:
    """A kernel subject must not run with a previous daemon's programs still on the pods' cgroup."""
    attached = setup.pods.attached_programs() if setup.pods else None
    if attached:
        raise TopologyError(f"BPF programs still attached to {setup.pods.directory}: {attached}")


def measure_subject(setup: PodSetup, subject, round_no: int, progress: Progress) -> list[Sample]:
    topo, seconds, host = setup.topo, setup.seconds, subject.host()
    runner = InCgroup(topo, setup.pods) if subject.in_cgroup else topo
    kubeport = isinstance(subject, KubeportConnect)
    if not kubeport:
        check_detached(setup)
    forget_flows(topo)
    subject.start()
    try:
        path: dict = {}
        if kubeport:
            traffic = pod_traffic(subject)
            path["pod_traffic"] = traffic
            if not traffic.startswith("connect(): cgroup"):
                raise TopologyError(f"kubeport's pods are not balanced at connect(): podTraffic {traffic!r}")
            before = path_counters(topo)
        path["backend_saw"] = backend_saw(runner, host)
        if kubeport:
            after = path_counters(topo)
            moved = {key: after[key] - before[key] for key in COUNTERS}
            wanted = {key: 1 if key == subject.carried_by else 0 for key in ("balanced", "relayed")}
            if any((moved[key] < 1) if want else (moved[key] > 0) for key, want in wanted.items()):
                raise TopologyError(f"one new connection to {host} moved kubeport's counters {moved}, "
                                    f"not only {subject.carried_by or 'none'}: not the path this subject measures")
            before = after

        def bulk_1():
            return tools.iperf3(runner, "client", host, IPERF, 1, seconds), {}

        def bulk_4():
            return tools.iperf3(runner, "client", host, IPERF, 4, seconds), {}

        def conn_rate():
            result = tools.wrk(runner, "client", f"http://{host}:{HTTP}/", seconds, close=True)
            return result.requests_per_second, {"errors": result.errors, "latency_ms": result.latency_ms}

        def udp_rr():
            result = tools.dnsperf(runner, "client", host, setup.queries, seconds, clients=8, outstanding=256)
            return result.qps, {"lost": result.lost, "completed": result.completed}

        plan = [("bulk_1", bulk_1, "Gbit/s"), ("bulk_4", bulk_4, "Gbit/s"), ("conn_rate", conn_rate, "req/s"),
                ("udp_rr", udp_rr, "req/s")]
        samples = run_plan(POD_PATH, subject.name, round_no, progress, plan, subject.pid, seconds)
        if kubeport:
            after = path_counters(topo)
            path["during_load"] = {key: round(after[key] - before[key]) for key in COUNTERS}
            progress.say(f"{subject.name}: {path['during_load']} during the load; backend saw {path['backend_saw']}")
        for sample in samples:
            sample.extra.update(path)
        return samples
    finally:
        subject.stop()


def path_notes(bench: Bench) -> list[str]:
    """What the backend saw and which of kubeport's counters moved, per subject, over the rounds."""
    notes = []
    for subject in bench.subjects:
        measured = [s for s in bench.samples if s.subject == subject and s.figure == "bulk_1" and s.extra]
        if not measured:
            continue
        saw = ", ".join(sorted({s.extra.get("backend_saw", "?") for s in measured}))
        text = f"{subject}: the backend saw {saw}"
        loads = [s.extra["during_load"] for s in measured if "during_load" in s.extra]
        if loads:
            totals = {key: sum(load[key] for load in loads) for key in COUNTERS}
            text += (f"; during the load, over {len(loads)} round(s): {totals['balanced']:,} connects balanced "
                     f"by the programs, {totals['relayed']:,} TCP connections and {totals['udp_flows']:,} UDP "
                     "flows through the relay")
        notes.append(text + ".")
    return notes


def run(workdir: Path, rounds: int, seconds: float, progress: Progress) -> Bench:
    """The four paths of a pod on the node to a ClusterIP, alternating in every round."""
    flag_missing = missing_run_flag("--connect-balancing-cgroup")
    subjects = [DIRECT, NFT_DNAT] + ([] if flag_missing else [DIRECT_UP, CONNECT, RELAY])
    bench = Bench(POD_PATH, "Pod path: a pod of the node -> ClusterIP -> a pod (kubeport = connect() balancing)",
                  subjects, FIGURES, TARGETS)
    if flag_missing:
        progress.say(f"{POD_PATH}: {flag_missing}: kubeport's subjects are skipped")
        bench.notes.append(f"kubeport skipped: {flag_missing}.")
    forwards = [backends.Forward("http", "TCP", HTTP, "10.77.2.2", HTTP),
                backends.Forward("iperf", "TCP", IPERF, "10.77.2.2", IPERF),
                backends.Forward("idle", "TCP", IDLE, "10.77.2.2", IDLE),
                backends.Forward("dns", "UDP", UDP, "10.77.2.2", UDP),
                backends.Forward("who", "TCP", WHO, "10.77.2.2", WHO)]
    pods = PodsCgroup()
    try:
        with Topology("podpath", ["client", "be"], workdir) as topo:
            assert topo.addr("be") == "10.77.2.2"
            setup = PodSetup(topo, workdir, seconds, 0, 1, forwards=forwards, pods=pods,
                             queries=generate.write_lines(workdir / "udp-queries.txt", ["q.bench. A"]))
            progress.context = bench.label
            build(topo, workdir, progress)
            backends.start_echo_nginx(topo, workdir, "nginx-who", WHO, "$remote_addr")
            bench.notes += [
                f"The client {topo.addr('client')} is a pod of the node: its load tools join the cgroup "
                f"{pods.hierarchy_path} before entering its namespace (every subject but `{RELAY}`). The "
                f"backend is a pod in another namespace ({topo.addr('be')}: nginx, iperf3, knot).",
                f"{CONNECT}: `kubeport run --connect-balancing --connect-balancing-cgroup {pods.hierarchy_path} "
                "--workers 1 --tcp-relay splice --shutdown-grace-period 0s`, the BPF programs on that cgroup "
                f"translate the ClusterIP inside connect()/sendmsg(); {RELAY}: the same daemon, the client outside "
                f"the cgroup, so its relay carries the connections; {DIRECT_UP}: the same daemon, the pod "
                "dialling the backend's address (kubeport / it is what the translation alone costs). Before "
                "the load of each of them one new connection must move only the counter of its path "
                "(kubeport_proxy_connects_balanced, kubeport_proxy_connections; neither for the backend's "
                "address), else the subject fails that round.",
                "nft-dnat: kube-proxy nftables-mode shape (vmap on daddr . l4proto . dport -> numgen -> dnat), "
                "in the node's prerouting. direct runs with an empty ruleset in the node; kubeport's subjects with "
                "the daemon's own tables there (its VIP filter and reply marks: conntrack on), as on a node it "
                "runs on. The node's conntrack table is emptied before every subject (conntrack -F).",
                "CPU: user+system of kubeport's process tree during each run (/proc/<pid>/stat); its cost per "
                "connection and per GB is in the cost table (connect(): the daemon is not on the path).",
            ]
            run_rounds(bench, rounds, lambda name, r: measure_subject(setup, MAKERS[name](setup), r, progress),
                       progress)
            bench.notes += path_notes(bench)
    finally:
        pods.remove()
    return bench

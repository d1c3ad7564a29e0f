"""The control plane at the scales of two published kube-proxy reports, measured as bench/control.py
measures 10,000 x 10 (its rounds, probes and figures), plus the descriptors the daemon holds.

- kubernetes/kubernetes#135639: 5,006 Services with 250,011 endpoints; an nftables full sync
  took 13 min 15 s on 32 vCPUs. The endpoints are spread as evenly as whole numbers allow:
  4,717 services with 50, 289 with 49 (generate.spread).
- kubernetes/kubernetes#139513: 44,125 Services, a 16 min 44 s nftables sync; 5 endpoints each here.

Figures per case, each round starting the daemon cold (control.measure_round): cold start,
endpoint change -> new connection p99 and -> DNS answer p99, RSS at rest, and the descriptors
the daemon's process tree holds at rest (/proc/<pid>/fd). Each Service port is one listening
socket, so 44,125 Services need more than 44,125 descriptors: the bench raises its open-file
limit, which the daemon inherits, to the shipped systemd unit's (LimitNOFILE=1048576, capped by
fs.nr_open) and the daemon raises its soft limit to the hard one. Raising a hard limit takes
CAP_SYS_RESOURCE: without it the run keeps the hard limit it was started with, and a case that
does not fit is reported as not run. The limit the daemon ran under is in each fds sample's extra.
"""

from __future__ import annotations

import json
import resource
from dataclasses import dataclass
from pathlib import Path

from . import control, generate
from .harness import KUBEPORT, Bench, Figure, Progress, Sample, Target, run_rounds
from .profiles import Profiler
from .topology import Topology, stop_process

#: deploy/kubeport.service's LimitNOFILE
NOFILE = 1 << 20
#: descriptors beyond one listener per Service port: the two reserves the daemon keeps below its
#: limit (at most 1,024 each: proxy/relay/reserve.py), DNS, status, the relayed probes
NOFILE_HEADROOM = 4096


@dataclass(frozen=True)
class Case:
    key: str  # what the case's figure keys end with
    services: int
    endpoints: int  # in all, spread over the services
    issue: str
    kube_proxy: str  # the published sync, quoted as context

    @property
    def text(self) -> str:
        q, r = generate.spread(self.endpoints, self.services)
        if r == 0:
            return f"{self.services:,} services x {q}"
        return f"{self.services:,} services / {self.endpoints:,} endpoints"


CASES = [
    Case("_endpoints", 5006, 250_011, "kubernetes/kubernetes#135639",
         "nftables full sync 13 min 15 s on 32 vCPUs"),
    Case("_services", 44_125, 44_125 * 5, "kubernetes/kubernetes#139513", "nftables sync 16 min 44 s"),
]
#: --quick: a tenth of each
QUICK_CASES = [
    Case("_endpoints", 501, 25_011, CASES[0].issue, CASES[0].kube_proxy),
    Case("_services", 4413, 4413 * 5, CASES[1].issue, CASES[1].kube_proxy),
]


def figures(cases: list[Case]) -> list[Figure]:
    out = []
    for case in cases:
        for fig in control.FIGURES:
            out.append(Figure(fig.key + case.key, f"{fig.title}, {case.text}", fig.unit, fig.higher_is_better,
                              fig.digits, f"{fig.label} {case.text}"))
        out.append(Figure("fds" + case.key, f"descriptors the daemon holds at rest, {case.text}", "fds",
                          higher_is_better=False, digits=0, label=f"descriptors {case.text}"))
    return out


def targets(cases: list[Case]) -> list[Target]:
    """The issue's: cold start under 10 s at 44,125 services, RSS under 300 MiB, change p99 under 10 ms."""
    out = []
    for case in cases:
        if case.key == "_services":
            out.append(Target("cold_start" + case.key, "<=", 10.0))
        out += [Target("change_conn_p99" + case.key, "<=", 10.0), Target("change_dns_p99" + case.key, "<=", 10.0),
                Target("rss_mib" + case.key, "<=", 300.0)]
    return out


def raise_nofile() -> tuple[int, str]:
    """This process's (hence the daemon's) open-file limit, soft and hard, to NOFILE or fs.nr_open if
    lower; the hard limit the daemon will start under, and why it is not NOFILE. Raising a hard limit
    takes CAP_SYS_RESOURCE (root in a container may lack it): without, the hard limit stays."""
    nr_open = int(Path("/proc/sys/fs/nr_open").read_text())
    wanted = min(NOFILE, nr_open)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard >= wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        return wanted, ""
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
        return wanted, "" if wanted == NOFILE else f"fs.nr_open is {nr_open:,}"
    except (ValueError, OSError) as exc:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard, f"the hard limit could not be raised from {hard:,} ({exc}: no CAP_SYS_RESOURCE)"


def too_few(case: Case, limit: int) -> str:
    """Why ``case`` cannot run under open-file limit ``limit`` ("" when it can)."""
    needed = case.services + NOFILE_HEADROOM
    if limit >= needed:
        return ""
    return (f"not run: {case.services:,} listeners need about {needed:,} descriptors and the daemon's hard "
            f"open-file limit is {limit:,}, which this run could not raise; start it where `ulimit -Hn` is higher "
            f"(a container run with --ulimit nofile={NOFILE}:{NOFILE}, systemd-run -p LimitNOFILE={NOFILE}) or as "
            "root with CAP_SYS_RESOURCE")


def run(workdir: Path, rounds: int, quick: bool, with_kubeport: bool, progress: Progress,
        profiler: Profiler | None = None, source: str = control.MANIFESTS) -> Bench:
    cases = QUICK_CASES if quick else CASES
    api = source == control.API
    # 200 changes, as in control: the p99 is then the second worst (a change takes ~10 ms here).
    changes = 20 if quick else 200
    name = "scale-api" if api else "scale"
    how = "API watch: the test suite's fake kube-apiserver" if api else "manifests source"
    bench = Bench(name, "Control plane at published kube-proxy scales: "
                  + " and ".join(case.text for case in cases) + f" ({how})",
                  [KUBEPORT], figures(cases), targets(cases))
    for case in cases:
        q, r = generate.spread(case.endpoints, case.services)
        endpoints = f"{case.endpoints:,} endpoints ({q} each)" if r == 0 else (
            f"{case.endpoints:,} endpoints ({r:,} services with {q + 1}, {case.services - r:,} with {q})")
        if api and r:
            # the fake API server is loaded with one endpoint count for every service
            endpoints = (f"{case.services * (q + 1):,} endpoints ({q + 1} each: the fake API server takes one "
                         f"count for every service; {case.services * (q + 1) - case.endpoints:,} more than the "
                         f"published {case.endpoints:,})")
        bench.notes.append(
            f"{case.text}: {case.services:,} ClusterIP services (one TCP port, one listener each), "
            f"{endpoints}, plus the two probe services of bench/control.py. "
            f"kube-proxy at this scale ({case.issue}): {case.kube_proxy}; quoted as context, not a peer: "
            "a full nftables sync is not the same work as kubeport's cold start.")
    change = ("one POST to the fake API server applying the probe slices" if api
              else "an atomic rename of the probe slices' files")
    bench.notes += [
        f"Each round starts the daemon cold once per case (the cases alternate in order); {changes} endpoint "
        f"changes per case and round, each {change}, timed until a new connection / a DNS answer shows the "
        "new endpoint, as in the control benchmark.",
        "cold start: spawn -> /readyz 200 -> last service's VIP accepts and its name resolves -> probe serves. "
        "RSS: at rest after the changes (as in control). Descriptors: entries of /proc/<pid>/fd of the daemon's "
        "process tree, read right after the RSS.",
        "No profile run: a whole extra round at these scales would take the run past ~12 minutes.",
    ]
    if api:
        bench.notes.append(
            "API source: as control-api, one fake kube-apiserver (bench/apiserver.py) per case, each in a process "
            "of its own in the node namespace (not in the daemon's RSS, CPU or descriptors), started once and "
            "kept over the rounds; the daemon's initial streaming list, encoded by the Python fake, is part of "
            "the cold start.")
    if not with_kubeport:
        bench.notes.append("kubeport not run (--no-kubeport): nothing measured.")
        return bench
    progress.context = name
    limit, why = raise_nofile()
    bench.notes.append(
        f"Open files: the bench raises its hard and soft limit, which the daemon inherits, to {NOFILE:,} "
        "(deploy/kubeport.service's LimitNOFILE; at most fs.nr_open) and the daemon raises its soft limit to "
        f"the hard one. This run: {limit:,}" + (f", as {why}." if why else ".")
        + f" A case whose services need more than the limit less {NOFILE_HEADROOM:,} is not run.")
    with Topology(name, ["client", "be"], workdir) as topo:
        control.prepare(topo, workdir)
        setups, servers = [], []
        try:
            for k, case in enumerate(cases):
                manifests = workdir / f"manifests{case.key}"
                q, r = generate.spread(case.endpoints, case.services)
                setup = control.Setup(topo, workdir, manifests, case.services, q + 1 if api and r else q, changes,
                                      source, bench=name, suffix=case.key, count_fds=True,
                                      api_port=control.API_PORT + 10 * k,
                                      api_control_port=control.API_CONTROL_PORT + 10 * k)
                setups.append(setup)
                if too_few(case, limit):
                    continue
                if api:
                    servers.append(control.start_api_server(setup, progress))
                else:
                    progress.say(f"generating {case.text}")
                    generate.write_cluster(manifests, case.services, 0, total_endpoints=case.endpoints)
            run_cases(bench, cases, setups, rounds, limit, progress)
        finally:
            for server in servers:
                stop_process(server)
    seen = {json.dumps(s.extra["nofile_limit"], sort_keys=True) for s in bench.samples if "nofile_limit" in s.extra}
    if seen:
        bench.notes.append("The daemon's open-file limit (soft/hard, /proc/<pid>/limits, read at rest): "
                           + ", ".join("{soft}/{hard}".format(**json.loads(text)) for text in sorted(seen)) + ".")
    return bench


def run_cases(bench: Bench, cases: list[Case], setups: list[control.Setup], rounds: int, limit: int,
              progress: Progress) -> None:
    """Every round, each case in turn (reversed in even rounds), the daemon started cold."""
    name = bench.name

    def measure(_subject: str, round_no: int) -> list[Sample]:
        samples: list[Sample] = []
        for case, setup in zip(cases, setups) if round_no % 2 else reversed(list(zip(cases, setups))):
            progress.context = f"{name} r{round_no}/{rounds} {setup.suffix[1:]}"
            if skip := too_few(case, limit):
                progress.say(skip)
                samples.append(Sample(name, "(setup)", KUBEPORT, round_no, None, note=f"{case.text}: {skip}"))
                continue
            try:
                samples += control.measure_round(setup, round_no, progress)
            except Exception as exc:  # one case failing is its result; the other still runs
                progress.say(f"FAILED: {exc}")
                samples.append(Sample(name, "(setup)", KUBEPORT, round_no, None,
                                      note=f"{case.text}: {exc}"[:500]))
        return samples

    run_rounds(bench, rounds, measure, progress)

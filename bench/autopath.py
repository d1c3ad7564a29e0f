#!/usr/bin/env python3
"""Queries a pod's resolver sends, and the time it takes, with and without autopath.

    .venv/bin/python bench/autopath.py [--resolves 50] [--json FILE]      (as root)

The test suite's two-node topology (tests/support/netns) with one pod on node-a, given the
kubelet's resolv.conf (``search shop.svc.cluster.local svc.cluster.local cluster.local``,
``options ndots:5``) and declared by a Pod manifest, so that kubeport finds its namespace from
its address. kubeport runs on node-a, forwarding to the suite's fake upstream
(www.example.test); it is started once without and once with ``--dns-autopath``. In the pod,
glibc's getaddrinfo (what ``getent ahosts`` calls) resolves an external name and a Service
of another namespace (``api.payments``), for A only, AAAA only, and both (AF_UNSPEC).

Queries are counted at the daemon (``coredns_dns_requests_total`` before and after N
resolves), so a loaded machine cannot change them; the time is the median of N resolves,
after one that fills the upstream cache, and is only indicative on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
from pathlib import Path

# apiserver.py is found beside this script (sys.path[0]); importing it loads tests/support.
import apiserver  # noqa: F401
from support import api
from support.netns import EXT_IPS, SERVICE_CIDRS, KubeportDaemon, Topology, python_in, unique_prefix
from support.netns.cluster_dns import NS, host_resolv_conf, pod_resolv_conf, start_fake_upstream
from support.netns.manifests import node, service, write
from support.netns.operating import scrape, total
from support.netns.proc import reap_all

OTHER_NS = "payments"
NAMES = ("www.example.test", f"api.{OTHER_NS}")
FAMILIES = {"A": socket.AF_INET, "AAAA": socket.AF_INET6, "A+AAAA": socket.AF_UNSPEC}

#: argv: name, family, count. Resolves once (the upstream cache), then `count` times; prints
#: the milliseconds of each.
PROBE = r"""
import socket, sys, time
name, family, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
socket.getaddrinfo(name, None, family, socket.SOCK_STREAM)
for _ in range(count):
    started = time.perf_counter()
    socket.getaddrinfo(name, None, family, socket.SOCK_STREAM)
    print(f"{(time.perf_counter() - started) * 1000:.3f}")
"""


def _requests(topology: Topology) -> float:
    return total(scrape(topology.node("a")), "coredns_dns_requests_total")


def measure(topology: Topology, resolves: int) -> dict[str, dict[str, dict[str, float]]]:
    pod = topology.pod("a", 1)
    figures: dict[str, dict[str, dict[str, float]]] = {}
    with pod_resolv_conf(pod):
        for name in NAMES:
            for label, family in FAMILIES.items():
                before = _requests(topology)
                out = python_in(pod, PROBE, name, int(family), resolves, timeout=120).stdout
                queries = (_requests(topology) - before) / (resolves + 1)
                times = [float(line) for line in out.split()]
                figures.setdefault(name, {})[label] = {"queries": queries, "median_ms": statistics.median(times)}
    return figures


def run(resolves: int) -> dict[str, object]:
    topology = Topology.up(unique_prefix(), pods_per_node=1)
    try:
        with tempfile.TemporaryDirectory() as work:
            manifests = Path(work) / "manifests"
            manifests.mkdir()
            a1 = topology.pod_info("a", 1)
            write(manifests, "nodes", node(topology, "a"), node(topology, "b"))
            write(manifests, "pods", api.pod("a1", NS, ips=list(a1.ips), node=a1.node.name))
            write(manifests, "api", service("api", ["10.96.0.40", "fd00:10:96::40"],
                                            [{"name": "http", "protocol": "TCP", "port": 80}], namespace=OTHER_NS))
            start_fake_upstream(topology)
            results: dict[str, object] = {}
            for mode, flags in (("off", ()), ("autopath", ("--dns-autopath",))):
                with host_resolv_conf(topology.node("a"), EXT_IPS[0]):
                    daemon = KubeportDaemon(topology.node("a"), manifests, Path(work) / f"state-{mode}", *flags,
                                            "--upstream", EXT_IPS[0],
                                            "--service-cluster-ip-range", ",".join(SERVICE_CIDRS))
                    daemon.wait_ready(timeout=30)
                try:
                    results[mode] = measure(topology, resolves)
                finally:
                    daemon.stop()
            return results
    finally:
        reap_all()
        topology.down()


def report(results: dict[str, dict], resolves: int) -> str:
    lines = [f"glibc getaddrinfo in a pod (ndots:5, 3 search domains), {resolves} resolves each; "
             "queries per resolve counted at kubeport, time the median", "",
             "| name | family | queries, without | queries, autopath | ms, without | ms, autopath |",
             "|---|---|---|---|---|---|"]
    for name in NAMES:
        for family in FAMILIES:
            off, on = results["off"][name][family], results["autopath"][name][family]
            lines.append(f"| `{name}` | {family} | {off['queries']:g} | {on['queries']:g} | "
                         f"{off['median_ms']:.2f} | {on['median_ms']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resolves", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = run(args.resolves)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(report(results, args.resolves))


if __name__ == "__main__":
    sys.exit(main())

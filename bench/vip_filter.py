"""What the VIP filter costs a node: new connections/s to a served VIP port with and without it.

    .venv/bin/python bench/vip_filter.py [--rounds 3] [--seconds 5]

The filter is kubeport's input chain that rejects every port of a VIP it does not serve
(``proxy/host/nftables.py``: ``vips4``/``vipports4`` and the ``vips`` chain, rendered by
the same ``render_setup`` the daemon loads). Topology: a client namespace and a node
namespace (bench/topology.py); the VIP 10.96.0.20 is a local route in the node, as kubeport
makes it, and nginx answers on port 80 of every address there: the filter's packets are the
same whatever accepts them, and nginx costs less per connection than the relay, so the
filter's share shows more. wrk in the client opens connections with ``Connection: close``
(64 at a time), one request each.

Variants, each run in every round, interleaved, in the same topology:

- ``none``: no nftables table; conntrack not loaded in the node's namespace.
- ``conntrack``: no filter, but conntrack tracking every flow (one ``ct`` rule that matches
  nothing), as on any Kubernetes node (the CNI's masquerade, kubelet's and kube-proxy's
  rules): the baseline a node really has.
- ``every packet``: the filter looking up every packet the node receives (its rules before
  ``ct state != new accept``), without conntrack; ``every packet+ct``: the same on a node
  with conntrack.
- ``new flows``: the filter as the daemon loads it, looking up the first packet of a flow
  (its ``ct`` rule brings conntrack in, where nothing else did).

Printed: the median of each variant's rounds and its ratio to ``none`` and ``conntrack``.
Run it on a quiet machine (check ``uptime``): wrk, nginx and the kernel share the cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import types
from pathlib import Path

if not __package__:  # run as a script: the bench folder is the package kubeport_bench (as run.py loads it)
    BENCH_DIR = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() not in (BENCH_DIR, BENCH_DIR.parent)]
    _package = types.ModuleType("kubeport_bench")
    _package.__path__ = [str(BENCH_DIR)]  # type: ignore[attr-defined]
    sys.modules["kubeport_bench"] = _package

from kubeport.proxy.host import nftables  # noqa: E402
from kubeport.proxy.table import Frontend  # noqa: E402
from kubeport_bench import backends, tools  # noqa: E402
from kubeport_bench.topology import Topology, TopologyError, wait_for  # noqa: E402

VIP = "10.96.0.20"
PORT = 80
CONNTRACK_ONLY = """table inet kpbench_ct {
  chain input {
    type filter hook input priority filter; policy accept;
    ct state untracked accept
  }
}
"""


def filter_ruleset(every_packet: bool) -> str:
    vips = nftables.Vips(frozenset({VIP}), frozenset({Frontend(VIP, PORT, "TCP")}))
    if not every_packet:
        return nftables.render_setup([], vips=vips)
    rules = nftables.VIP_RULES
    nftables.VIP_RULES = tuple(rule for rule in rules if not rule.startswith("ct state"))
    try:
        return nftables.render_setup([], vips=vips)
    finally:
        nftables.VIP_RULES = rules


VARIANTS = {
    "none": "",
    "conntrack": CONNTRACK_ONLY,
    "every packet": filter_ruleset(every_packet=True),
    "every packet+ct": CONNTRACK_ONLY + filter_ruleset(every_packet=True),
    "new flows": filter_ruleset(every_packet=False),
}


def apply(topo: Topology, ruleset: str) -> None:
    backends.flush_nft(topo, "node")
    if ruleset:
        backends.apply_nft(topo, "node", ruleset)


def refused_elsewhere(topo: Topology) -> bool:
    """With the filter, another port of the VIP is reset (the ruleset is the daemon's)."""
    probe = ("import socket\ntry:\n socket.create_connection(('%s', 22), timeout=2)\n"
             "except ConnectionRefusedError:\n print('refused')\nexcept OSError as e:\n print(e)\n"
             "else:\n print('connected')" % VIP)
    return topo.run("client", [sys.executable, "-c", probe], timeout=10).stdout.strip() == "refused"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kpbench-vipfilter-"))
    results: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with Topology("vipfilter", ["client"], workdir) as topo:
        topo.ip("node", "route", "add", "local", f"{VIP}/32", "dev", "lo")
        nginx = backends.start_nginx(topo, "node", workdir, PORT, 9000, workers=1)
        url = f"http://{VIP}:{PORT}/"

        def answering() -> bool:
            try:
                return tools.wrk(topo, "client", url, 1, connections=1, threads=1).requests_per_second > 0
            except TopologyError:
                return False

        wait_for(answering, 10, "nginx")
        apply(topo, VARIANTS["new flows"])
        if not refused_elsewhere(topo):
            raise SystemExit("the filter did not reject another port of the VIP")
        for round_no in range(args.rounds):
            for name, ruleset in VARIANTS.items():
                apply(topo, ruleset)
                result = tools.wrk(topo, "client", url, args.seconds, connections=64, threads=1, close=True)
                if result.errors:
                    raise SystemExit(f"{name}: {result.errors} failed requests")
                results[name].append(result.requests_per_second)
                print(f"round {round_no + 1} {name:>16}: {result.requests_per_second:8.0f} conn/s", file=sys.stderr)
        apply(topo, "")
        nginx.terminate()
    none = statistics.median(results["none"])
    tracked = statistics.median(results["conntrack"])
    print(f"{'variant':<16} {'new conn/s (median)':>20} {'vs none':>8} {'vs conntrack':>13}  rounds")
    for name, values in results.items():
        median = statistics.median(values)
        rounds = ", ".join(f"{v:.0f}" for v in values)
        print(f"{name:<16} {median:>20.0f} {median / none:>8.3f} {median / tracked:>13.3f}  {rounds}")


if __name__ == "__main__":
    main()

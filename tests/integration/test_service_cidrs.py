"""A ServiceCIDR added at run time (KEP-1880) in manifest mode, through the real daemon: the
flag's tiny range filled, a ServiceCIDR manifest (shaped as `kubectl get servicecidr -o yaml`
prints it) adds a second range, the next Service is allocated from it and served: curl from a
pod through its ClusterIP, `dig` for its name, and the new range in the nftables set that drops
what is routed to unallocated service addresses."""

from __future__ import annotations

import ipaddress
import json

import pytest

from support import api
from support.netns import CommandFailed, KubeportDaemon, dig_in, kubeport, pod_answering, run_in, until_sync
from support.netns.manifests import endpoint, endpoint_slice, node, remove, service, write

pytestmark = pytest.mark.integration

FLAG = "10.96.0.0/29"  # .1-.6 are the only ClusterIPs it has
EXTRA = "10.97.0.0/29"
DNS_IP = "10.96.0.10"  # the default DNS address: the flag's network + 10
HTTP = {"name": "http", "protocol": "TCP", "port": 8080}


def cluster_ips(ns: str) -> dict[str, str]:
    listing = json.loads(kubeport(ns, "get", "services", "-A", "-o", "json"))
    return {s["metadata"]["name"]: s["spec"].get("clusterIP", "") for s in listing["items"]}


def in_range(ip: str, cidr: str) -> bool:
    return bool(ip) and ipaddress.ip_address(ip) in ipaddress.ip_network(cidr)


def services4(ns: str) -> str:
    return run_in(ns, "nft", "list", "set", "inet", "kubeport", "services4").stdout


def test_a_service_cidr_added_at_run_time_serves_the_next_service(topology, pods, tmp_path):
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    write(manifests, "node", node(topology, "a"))
    for i in range(6):
        write(manifests, f"fill-{i}", service(f"fill-{i}", ports=[{"name": "http", "port": 80}]))
    node_ns = topology.node("a")
    daemon = KubeportDaemon(node_ns, manifests, tmp_path / "state", "--service-cluster-ip-range", FLAG,
                            "--cluster-cidr", "10.244.0.0/16")
    daemon.wait_ready(timeout=30)
    try:
        def flag_filled() -> dict[str, str] | None:
            ips = cluster_ips(node_ns)
            return ips if len(ips) == 6 and all(in_range(ip, FLAG) for ip in ips.values()) else None

        filled = until_sync(flag_filled, "the flag's range filled", 10)
        assert len(set(filled.values())) == 6
        assert "10.97.0.0/29" not in services4(node_ns)

        write(manifests, "service-cidr", api.service_cidr("extra", EXTRA))
        until_sync(lambda: "10.97.0.0/29" in services4(node_ns), "the new range in the drop set", 10)

        pods_a = [topology.pod_info("a", 1), topology.pod_info("a", 2)]
        write(manifests, "late",
              service("late", ports=[{"name": "http", "protocol": "TCP", "port": 80, "targetPort": "http"}]),
              endpoint_slice("late-1", "late", [HTTP], [endpoint(pod) for pod in pods_a]))
        late_ip = until_sync(lambda: cluster_ips(node_ns).get("late") or None, "late allocated", 10)
        assert in_range(late_ip, EXTRA)

        client = topology.pod("a", 2)  # node-a's pod: node-a's daemon serves it
        assert until_sync(lambda: pod_answering(client, late_ip, 80), "late served", 10,
                          ignore=(CommandFailed,)) in {"a1", "a2"}
        answer = until_sync(lambda: dig_in(client, "+short", "late.demo.svc.cluster.local", server=DNS_IP).split()
                            or None, "late's name answered", 10, ignore=(CommandFailed,))
        assert answer == [late_ip]

        # Its manifest removed, the range stays while late holds an address of it (the finalizer):
        # late keeps its ClusterIP and is still served; with late gone, the range goes too.
        remove(manifests, "service-cidr")
        # A headless Service written after it (it needs no address): once it shows, the daemon
        # has read the removal too.
        write(manifests, "marker", service("marker", ["None"], [{"name": "http", "port": 80}]))
        until_sync(lambda: "marker" in cluster_ips(node_ns), "the removal read", 10)
        assert cluster_ips(node_ns)["late"] == late_ip and "10.97.0.0/29" in services4(node_ns)
        assert pod_answering(client, late_ip, 80) in {"a1", "a2"}
        remove(manifests, "late")
        until_sync(lambda: "10.97.0.0/29" not in services4(node_ns), "the range gone with late", 10)
        assert daemon.running
    finally:
        daemon.stop()

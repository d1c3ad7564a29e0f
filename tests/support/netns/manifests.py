"""Manifest builders and daemon start-up shared by the proxy integration tests.

Every Service gets explicit clusterIPs and nodePorts: one daemon runs per node, each with its
own allocator, and the addresses must be the same on both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from . import CLUSTER_CIDRS, SERVICE_CIDRS, KubeportDaemon, Pod, Topology, curl_in, http_url, parse_pod_reply

NAMESPACE = "demo"
DAEMON_ARGS = ("--service-cluster-ip-range", ",".join(SERVICE_CIDRS), "--cluster-cidr", ",".join(CLUSTER_CIDRS))


def node(topology: Topology, which: str) -> dict:
    spec = topology.node_spec(which)
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": spec.name, "labels": {"topology.kubernetes.io/zone": spec.zone}},
        "status": {"addresses": [{"type": "InternalIP", "address": ip} for ip in spec.lan_ips]},
    }


def service(name: str, cluster_ips: list[str], ports: list[dict], **spec) -> dict:
    families = ["IPv6" if ":" in ip else "IPv4" for ip in cluster_ips]
    body = {
        "clusterIP": cluster_ips[0], "clusterIPs": cluster_ips, "ipFamilies": families,
        "ipFamilyPolicy": "RequireDualStack" if len(cluster_ips) > 1 else "SingleStack",
        "ports": ports,
    }
    status = spec.pop("status", None)
    body.update(spec)
    obj = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": body}
    if status:
        obj["status"] = status
    return obj


def endpoint_slice(name: str, service_name: str, ports: list[dict], pods: Iterable[Pod], family: int = 4,
                   port_overrides: dict[str, int] | None = None) -> dict:
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"kubernetes.io/service-name": service_name}},
        "addressType": "IPv6" if family == 6 else "IPv4",
        "ports": ports,
        "endpoints": [
            {"addresses": [pod.ip(family)], "conditions": {"ready": True}, "nodeName": pod.node.name,
             "zone": pod.node.zone, "targetRef": {"kind": "Pod", "namespace": NAMESPACE, "name": pod.name}}
            for pod in pods
        ],
    }


def write(directory: Path, name: str, *objects: dict) -> None:
    """One manifest file (a v1 List), written atomically so the watcher never reads half of it."""
    target = directory / f"{name}.json"
    scratch = directory / f".{name}.json.tmp"
    scratch.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}, indent=1))
    scratch.rename(target)


def remove(directory: Path, name: str) -> None:
    (directory / f"{name}.json").unlink(missing_ok=True)


def start_daemon(topology: Topology, which: str, manifests: Path, state: Path, *extra: str) -> KubeportDaemon:
    daemon = KubeportDaemon(topology.node(which), manifests, state / which, *DAEMON_ARGS, *extra)
    daemon.wait_ready(timeout=30)
    return daemon


def pod_answering(ns: str, host: str, port: int, path: str = "/", timeout: float = 3.0) -> str:
    """The pod name in podserver's answer to one HTTP request."""
    return parse_pod_reply(curl_in(ns, http_url(host, port, path), timeout=timeout))[0]


def pods_seen(ns: str, host: str, port: int, want: set[str], attempts: int = 80) -> set[str]:
    """Request until every pod in `want` has answered (or attempts run out); the pods seen."""
    seen: set[str] = set()
    for _ in range(attempts):
        seen.add(pod_answering(ns, host, port))
        if want <= seen:
            break
    return seen

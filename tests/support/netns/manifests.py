"""Manifests for the daemons on the topology, and starting a daemon on them.

Objects are the API dicts of support.api, placed on the topology: Nodes with their LAN
addresses and zones, endpoints for its pods. Every Service the proxy tests write has
explicit clusterIPs and nodePorts: one daemon runs per node, each with its own allocator, and
the addresses must be the same on both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from .. import api
from . import CLUSTER_CIDRS, SERVICE_CIDRS, KubeportDaemon, Pod, Topology

NAMESPACE = "demo"
DAEMON_ARGS = ("--service-cluster-ip-range", ",".join(SERVICE_CIDRS), "--cluster-cidr", ",".join(CLUSTER_CIDRS))


def node(topology: Topology, which: str, *, cpu: str | None = None) -> dict:
    """A node's Node: zone label, InternalIPs, and allocatable CPU if given (topology-mode Auto)."""
    spec = topology.node_spec(which)
    return api.node(spec.name, zone=spec.zone, addresses=[("InternalIP", ip) for ip in spec.lan_ips], cpu=cpu)


def service(name: str, cluster_ips: list[str] = (), ports: list[dict] | None = None, *,
            namespace: str = NAMESPACE, **spec) -> dict:
    """A Service; given ``cluster_ips``, with the family fields they imply (dual-stack when two).
    ``status`` goes to the object's status, the rest of ``spec`` to its spec."""
    body: dict = {}
    if cluster_ips:
        body = {
            "clusterIP": cluster_ips[0], "clusterIPs": list(cluster_ips),
            "ipFamilies": ["IPv6" if ":" in ip else "IPv4" for ip in cluster_ips],
            "ipFamilyPolicy": "RequireDualStack" if len(cluster_ips) > 1 else "SingleStack",
        }
    if ports is not None:
        body["ports"] = ports
    status = spec.pop("status", None)
    body.update(spec)
    obj = api.service(name, namespace, **body)
    if status:
        obj["status"] = status
    return obj


def endpoint(where: Pod | str, *, family: int = 4, ready: bool = True, serving: bool | None = None,
             terminating: bool = False, node: str | None = None, zone: str | None = None,
             hostname: str | None = None, namespace: str = NAMESPACE) -> dict:
    """One endpoint with explicit conditions, as the EndpointSlice controller writes them: a pod's
    (its address of ``family``, its node and zone unless ``node``/``zone`` say otherwise, a
    targetRef) or a bare address's."""
    conditions = {"ready": ready, "serving": ready if serving is None else serving, "terminating": terminating}
    fields: dict = {"conditions": conditions}
    if isinstance(where, Pod):
        address = where.ip(family)
        fields.update(nodeName=node or where.node.name, zone=zone or where.node.zone,
                      targetRef={"kind": "Pod", "namespace": namespace, "name": where.name})
    else:
        address = where
        fields.update({key: value for key, value in (("nodeName", node), ("zone", zone)) if value})
    if hostname is not None:
        fields["hostname"] = hostname
    return api.endpoint(address, **fields)


def endpoint_slice(name: str, service_name: str, ports: Iterable[dict], endpoints: Iterable[Pod | str | dict], *,
                   family: int | None = None, namespace: str = NAMESPACE) -> dict:
    """A slice of ``endpoints``: pods (their address of ``family``), bare addresses, or endpoint
    dicts. The address type is ``family``'s, else the first address's."""
    items = [e if isinstance(e, dict) else endpoint(e, family=family or 4, namespace=namespace) for e in endpoints]
    if family is None:
        family = 6 if items and ":" in items[0]["addresses"][0] else 4
    return api.endpoint_slice(service_name, namespace, name=name, address_type="IPv6" if family == 6 else "IPv4",
                              endpoints=items, ports=list(ports))


def with_annotations(obj: dict, **annotations: str) -> dict:
    obj["metadata"]["annotations"] = dict(annotations)
    return obj


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

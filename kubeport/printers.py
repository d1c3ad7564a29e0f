"""`kubeport get`: snapshot -> API-shaped objects (daemon side) -> kubectl-like tables (CLI side)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Iterable

import yaml

from kubeport.endpoints.types import PodInfo, ServiceInfo, ServiceName, SliceInfo, Snapshot


def service_to_api(info: ServiceInfo) -> dict[str, Any]:
    """The Service as the daemon holds it, allocated fields filled in (API shape, camelCase)."""
    metadata: dict[str, Any] = {"name": info.name.name, "namespace": info.name.namespace}
    if info.uid:
        metadata["uid"] = info.uid
    if info.created:
        metadata["creationTimestamp"] = info.created
    spec: dict[str, Any] = {"type": info.type}
    if info.type == "ExternalName":
        spec["externalName"] = info.external_name
    elif info.headless:
        spec["clusterIP"] = "None"
        spec["clusterIPs"] = ["None"]
    elif info.cluster_ips:
        spec["clusterIP"] = info.cluster_ips[0]
        spec["clusterIPs"] = list(info.cluster_ips)
    ports = []
    for port in info.ports:
        entry: dict[str, Any] = {"protocol": port.protocol, "port": port.port, "targetPort": port.target_port}
        if port.name:
            entry = {"name": port.name, **entry}
        if port.node_port:
            entry["nodePort"] = port.node_port
        ports.append(entry)
    if ports:
        spec["ports"] = ports
    if info.selector:
        spec["selector"] = dict(pair.split("=", 1) for pair in info.selector.split(","))
    if info.external_ips:
        spec["externalIPs"] = list(info.external_ips)
    if info.affinity_timeout:
        spec["sessionAffinity"] = "ClientIP"
        spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": info.affinity_timeout}}
    else:
        spec["sessionAffinity"] = "None"
    if info.type in ("NodePort", "LoadBalancer"):
        spec["externalTrafficPolicy"] = "Local" if info.external_policy_local else "Cluster"
    if info.type != "ExternalName":
        spec["internalTrafficPolicy"] = "Local" if info.internal_policy_local else "Cluster"
    if info.health_check_node_port:
        spec["healthCheckNodePort"] = info.health_check_node_port
    if info.traffic_distribution:
        spec["trafficDistribution"] = info.traffic_distribution
    if info.publish_not_ready_addresses:
        spec["publishNotReadyAddresses"] = True
    status = {"loadBalancer": {"ingress": [{"ip": ip} for ip in info.load_balancer_ips]}
              if info.load_balancer_ips else {}}
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec, "status": status}


def slice_to_api(service: ServiceName, info: SliceInfo, created: str | None) -> dict[str, Any]:
    endpoints = []
    for endpoint in info.endpoints:
        entry: dict[str, Any] = {
            "addresses": [endpoint.address],
            "conditions": {
                "ready": endpoint.ready,
                "serving": endpoint.serving,
                "terminating": endpoint.terminating,
            },
        }
        for key, value in (("hostname", endpoint.hostname), ("nodeName", endpoint.node_name),
                           ("zone", endpoint.zone)):
            if value:
                entry[key] = value
        hints: dict[str, Any] = {}
        if endpoint.zone_hints:
            hints["forZones"] = [{"name": z} for z in sorted(endpoint.zone_hints)]
        if endpoint.node_hints:
            hints["forNodes"] = [{"name": n} for n in sorted(endpoint.node_hints)]
        if hints:
            entry["hints"] = hints
        if endpoint.pod_name:
            entry["targetRef"] = {"kind": "Pod", "namespace": service.namespace, "name": endpoint.pod_name}
        endpoints.append(entry)
    metadata: dict[str, Any] = {
        "name": info.name,
        "namespace": service.namespace,
        "labels": {"kubernetes.io/service-name": service.name},
    }
    if info.managed_by:
        metadata["labels"]["endpointslice.kubernetes.io/managed-by"] = info.managed_by
    if created:
        metadata["creationTimestamp"] = created
    obj: dict[str, Any] = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": metadata,
        "addressType": info.address_type,
        "endpoints": endpoints,
    }
    if info.ports is not None:
        obj["ports"] = [{"name": p.name, "protocol": p.protocol, "port": p.port} for p in info.ports]
    return obj


def pod_to_api(info: PodInfo) -> dict[str, Any]:
    """The Pod as read: the fields kubeport uses and those `kubectl get pods` shows."""
    metadata: dict[str, Any] = {"name": info.name, "namespace": info.namespace}
    if info.uid:
        metadata["uid"] = info.uid
    if info.created:
        metadata["creationTimestamp"] = info.created
    if info.deletion_timestamp:
        metadata["deletionTimestamp"] = info.deletion_timestamp
    if info.labels:
        metadata["labels"] = dict(info.labels)
    spec: dict[str, Any] = {}
    for key, value in (("nodeName", info.node_name), ("hostname", info.hostname), ("subdomain", info.subdomain)):
        if value:
            spec[key] = value
    ports: dict[str, list[dict[str, Any]]] = {}
    for port in info.ports:
        ports.setdefault(port.container, []).append(
            {"name": port.name, "containerPort": port.port, "protocol": port.protocol})
    spec["containers"] = [{"name": name, **({"ports": ports[name]} if name in ports else {})}
                          for name in info.containers]
    sidecars = [{"name": name, "restartPolicy": "Always", "ports": found}
                for name, found in ports.items() if name not in info.containers]
    if sidecars:
        spec["initContainers"] = sidecars
    status: dict[str, Any] = {"phase": info.phase,
                              "conditions": [{"type": "Ready", "status": "True" if info.ready else "False"}]}
    if info.reason:
        status["reason"] = info.reason
    if info.ips:
        status["podIP"] = info.ips[0]
        status["podIPs"] = [{"ip": ip} for ip in info.ips]
    statuses = []
    for container in info.container_statuses:
        state: dict[str, Any] = {}
        if container.waiting_reason:
            state["waiting"] = {"reason": container.waiting_reason}
        if container.terminated_reason:
            state["terminated"] = {"reason": container.terminated_reason}
        statuses.append({"name": container.name, "ready": container.ready,
                         "restartCount": container.restart_count, "state": state})
    if statuses:
        status["containerStatuses"] = statuses
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}


def list_objects(snapshot: Snapshot, kind: str, namespace: str | None) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    if kind == "pods":
        items = [pod_to_api(snapshot.pods[key]) for key in sorted(snapshot.pods)
                 if namespace is None or key[0] == namespace]
        return {"apiVersion": "v1", "kind": "List", "items": items}
    for name in sorted(snapshot.services):
        if namespace is not None and name.namespace != namespace:
            continue
        state = snapshot.services[name]
        if kind == "services":
            items.append(service_to_api(state.service))
        elif kind == "endpointslices":
            items.extend(slice_to_api(name, s, state.service.created) for s in state.slices)
        else:
            raise ValueError(f"unknown resource type {kind!r}")
    return {"apiVersion": "v1", "kind": "List", "items": items}


# --- client side: kubectl-like tables ------------------------------------------------


def age(created: str | None, now: datetime | None = None) -> str:
    """kubectl's short human duration (5s, 3m, 2d4h ...)."""
    if not created:
        return "<unknown>"
    now = now or datetime.now(timezone.utc)
    seconds = max(0, int((now - datetime.fromisoformat(created.replace("Z", "+00:00"))).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        return f"{hours}h{minutes % 60}m" if hours < 8 and minutes % 60 else f"{hours}h"
    days = hours // 24
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    return f"{days}d" if days < 365 * 2 else f"{days // 365}y"


def _external_ip(svc: dict[str, Any]) -> str:
    spec = svc["spec"]
    kind = spec["type"]
    if kind == "ExternalName":
        return spec.get("externalName", "")
    external = list(spec.get("externalIPs", []))
    if kind == "LoadBalancer":
        ingress = [i.get("ip") or i.get("hostname") for i in svc["status"].get("loadBalancer", {}).get("ingress", [])]
        external = ingress + external
        return ",".join(external) if external else "<pending>"
    return ",".join(external) if external else "<none>"


def _ports(svc: dict[str, Any]) -> str:
    parts = []
    for port in svc["spec"].get("ports", []):
        node_port = f":{port['nodePort']}" if port.get("nodePort") else ""
        parts.append(f"{port['port']}{node_port}/{port['protocol']}")
    return ",".join(parts) if parts else "<none>"


def service_rows(items: Iterable[dict[str, Any]], wide: bool) -> list[list[str]]:
    rows = []
    for svc in items:
        spec = svc["spec"]
        cluster_ip = "<none>" if spec["type"] == "ExternalName" else spec.get("clusterIP", "<none>")
        row = [svc["metadata"]["namespace"], svc["metadata"]["name"], spec["type"], cluster_ip,
               _external_ip(svc), _ports(svc), age(svc["metadata"].get("creationTimestamp"))]
        if wide:
            selector = spec.get("selector")
            row.append(",".join(f"{k}={v}" for k, v in selector.items()) if selector else "<none>")
        rows.append(row)
    return rows


def slice_rows(items: Iterable[dict[str, Any]], wide: bool) -> list[list[str]]:
    rows = []
    for eps in items:
        ports = eps.get("ports")
        port_text = ",".join(str(p.get("port", "")) for p in ports) if ports else "<unset>"
        addresses = [a for e in eps.get("endpoints", []) for a in e["addresses"][:1]]
        shown = ",".join(addresses[:3]) if addresses else "<unset>"
        if len(addresses) > 3:
            shown += f" + {len(addresses) - 3} more..."
        row = [eps["metadata"]["namespace"], eps["metadata"]["name"], eps["addressType"], port_text, shown,
               age(eps["metadata"].get("creationTimestamp"))]
        if wide:
            row.append(eps["metadata"]["labels"].get("kubernetes.io/service-name", ""))
        rows.append(row)
    return rows


def pod_status(pod: dict[str, Any]) -> str:
    """kubectl's STATUS column, its main rules (pkg/printers/internalversion/printers.go
    printPod): the status reason, else the phase; a container's waiting or terminated
    reason; Terminating while deleted (unless the node is lost)."""
    status = pod.get("status", {})
    reason = status.get("reason") or status.get("phase") or "Pending"
    for container in status.get("containerStatuses", []):
        state = container.get("state", {})
        if state.get("waiting", {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif state.get("terminated", {}).get("reason"):
            reason = state["terminated"]["reason"]
    if pod["metadata"].get("deletionTimestamp") and status.get("reason") != "NodeLost":
        return "Terminating"
    return reason


def pod_rows(items: Iterable[dict[str, Any]], wide: bool) -> list[list[str]]:
    rows = []
    for pod in items:
        spec, status = pod.get("spec", {}), pod.get("status", {})
        statuses = status.get("containerStatuses", [])
        total = len(spec.get("containers", [])) or len(statuses)
        ready = sum(1 for c in statuses if c.get("ready"))
        restarts = sum(c.get("restartCount", 0) for c in statuses)
        rows.append([pod["metadata"]["namespace"], pod["metadata"]["name"], f"{ready}/{total}", pod_status(pod),
                     str(restarts), age(pod["metadata"].get("creationTimestamp")),
                     status.get("podIP", "<none>"), spec.get("nodeName", "<none>")])
    return rows


HEADERS = {
    "services": ["NAMESPACE", "NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"],
    "endpointslices": ["NAMESPACE", "NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"],
    # kubectl's -o wide columns up to NODE: a data plane is about the IP.
    "pods": ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"],
}
WIDE_HEADERS = {"services": ["SELECTOR"], "endpointslices": ["SERVICE"], "pods": []}
_ROWS = {"services": service_rows, "endpointslices": slice_rows, "pods": pod_rows}


def render(kind: str, listing: dict[str, Any], output: str | None, all_namespaces: bool) -> str:
    if output == "json":
        return json.dumps(listing, indent=4)
    if output == "yaml":
        return yaml.safe_dump(listing, sort_keys=False)
    wide = output == "wide"
    rows = _ROWS[kind](listing["items"], wide)
    headers = HEADERS[kind] + (WIDE_HEADERS[kind] if wide else [])
    if not all_namespaces:
        headers = headers[1:]
        rows = [row[1:] for row in rows]
    if not rows:
        return "No resources found."
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    lines = ["   ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip()
             for row in [headers, *rows]]
    return "\n".join(lines)


def render_status(status: dict[str, Any]) -> str:
    """`kubeport get status` as indented YAML: nested counters read better than a table."""
    return yaml.safe_dump(status, sort_keys=False).rstrip()

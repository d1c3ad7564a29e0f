"""Builders of API objects as manifest-like dicts (what a manifest file or the API server
holds), their models, and a ClusterState or Snapshot made of them.

Each builder writes only what it is given: a test states the fields it is about, and the
model's defaulting (as the API server's) fills the rest.
"""

from __future__ import annotations

from typing import Any, Iterable

from kubeport.endpoints import model
from kubeport.endpoints.state import ClusterState
from kubeport.endpoints.types import Snapshot


def service(name: str = "web", namespace: str = "default", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
            "spec": spec}


def endpoint(address: str, **fields: Any) -> dict[str, Any]:
    """One endpoint of a slice: ``fields`` as the API names them (conditions, nodeName, ...)."""
    return {"addresses": [address], **fields}


def endpoint_slice(service_name: str = "web", namespace: str = "default", *, name: str | None = None,
                   address_type: str = "IPv4", endpoints: Iterable[dict[str, Any] | str] = (),
                   ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An EndpointSlice; endpoints may be plain addresses (ready) or full endpoint dicts."""
    items = [endpoint(e) if isinstance(e, str) else e for e in endpoints]
    body: dict[str, Any] = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name or f"{service_name}-{address_type.lower()}", "namespace": namespace,
                     "labels": {model.LABEL_SERVICE_NAME: service_name}},
        "addressType": address_type,
        "endpoints": items,
    }
    if ports is not None:
        body["ports"] = ports
    return body


def node(name: str = "node-a", *, zone: str | None = None, addresses: Iterable[tuple[str, str]] = (),
         cpu: str | None = None) -> dict[str, Any]:
    """A Node as the kubelet reports it: its zone label, (type, address) pairs, allocatable CPU."""
    metadata: dict[str, Any] = {"name": name}
    if zone is not None:
        metadata["labels"] = {model.LABEL_ZONE: zone}
    status: dict[str, Any] = {"addresses": [{"type": kind, "address": address} for kind, address in addresses]}
    if cpu is not None:
        status["allocatable"] = {"cpu": cpu}
    return {"apiVersion": "v1", "kind": "Node", "metadata": metadata, "status": status}


def pod(name: str, namespace: str = "default", *, labels: dict[str, str] | None = None, ips: Iterable[str] = (),
        ready: bool | None = True, phase: str = "Running", node: str | None = None,
        ports: Iterable[tuple[str, int] | tuple[str, int, str]] = (), deleting: bool = False,
        **spec: Any) -> dict[str, Any]:
    """A Pod as the kubelet reports it: ``ips`` in status.podIPs, the Ready condition
    (None: no conditions at all), one container whose ports are (name, number[, protocol])."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels or {"app": "web"})}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    container_ports = [{"name": p[0], "containerPort": p[1], **({"protocol": p[2]} if len(p) > 2 else {})}
                       for p in ports]
    body_spec: dict[str, Any] = {"containers": [{"name": "main", "ports": container_ports}], **spec}
    if node is not None:
        body_spec["nodeName"] = node
    status: dict[str, Any] = {"phase": phase, "podIPs": [{"ip": ip} for ip in ips]}
    if ready is not None:
        status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body_spec, "status": status}


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def service_cidr(name: str, *cidrs: str, ready: bool = True) -> dict[str, Any]:
    """A ServiceCIDR as ``kubectl get servicecidr NAME -o yaml`` prints it once the servicecidrs
    controller (pkg/controller/servicecidrs) has added its finalizer and Ready condition."""
    condition = {"lastTransitionTime": "2025-05-06T10:00:00Z", "message": "Kubernetes Service CIDR is ready",
                 "reason": "", "status": "True", "type": "Ready"}
    if not ready:  # the controller's condition while a deleted range still has addresses in use
        condition.update(status="False", reason="Terminating",
                         message="There are still IPAddresses referencing the ServiceCIDR, please remove them "
                                 "or create a new ServiceCIDR")
    return {"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
            "metadata": {"creationTimestamp": "2025-05-06T10:00:00Z",
                         "finalizers": ["networking.k8s.io/service-cidr-finalizer"], "generation": 1,
                         "name": name, "resourceVersion": "1201", "uid": "0a5e6b7c-1f2d-4c3b-9a8e-7d6c5b4a3f21"},
            "spec": {"cidrs": list(cidrs)},
            "status": {"conditions": [condition]}}


def to_model(obj: dict[str, Any]) -> model.KubeObject:
    return model.KIND_MODELS[obj["kind"]].model_validate(obj)  # type: ignore[return-value]


def cluster_state(objects: Iterable[dict[str, Any]], *, synced: bool = True) -> ClusterState:
    state = ClusterState("node-1", implicit_namespaces=True)
    for obj in objects:
        state.upsert(to_model(obj))
    if synced:
        state.mark_synced("Service")
        state.mark_synced("EndpointSlice")
    return state


def snapshot_of(objects: Iterable[dict[str, Any]], *, synced: bool = True) -> Snapshot:
    state = cluster_state(objects, synced=synced)
    state.commit()
    return state.snapshot

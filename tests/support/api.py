"""Builders of API objects as manifest-like dicts (what a manifest file or the API server
holds), their models, and a ClusterState or Snapshot made of them."""

from __future__ import annotations

from typing import Any, Iterable

from kubeport.endpoints import model
from kubeport.endpoints.state import ClusterState
from kubeport.endpoints.types import Snapshot


def service(name: str, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    return {"kind": "Service", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def endpoint_slice(service_name: str, namespace: str = "default", *, name: str | None = None,
                   address_type: str = "IPv4", endpoints: Iterable[dict[str, Any] | str] = (),
                   ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An EndpointSlice; endpoints may be plain addresses (ready) or full endpoint dicts."""
    items = [{"addresses": [e]} if isinstance(e, str) else e for e in endpoints]
    body: dict[str, Any] = {
        "kind": "EndpointSlice",
        "metadata": {"name": name or f"{service_name}-{address_type.lower()}", "namespace": namespace,
                     "labels": {model.LABEL_SERVICE_NAME: service_name}},
        "addressType": address_type,
        "endpoints": items,
    }
    if ports is not None:
        body["ports"] = ports
    return body


def namespace(name: str) -> dict[str, Any]:
    return {"kind": "Namespace", "metadata": {"name": name}}


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

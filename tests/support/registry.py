"""The registry tests' registry (the embedded API server) and what they ask of it."""

from __future__ import annotations

import ipaddress
import random
from datetime import datetime, timezone
from typing import Any

import pytest

from kubeport.endpoints import model
from kubeport.endpoints.registry.store import AllocationStore
from kubeport.endpoints.registry.registry import Invalid, Registry

from . import api

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)
V4 = "10.96.0.0/12"
V6 = "fd00:10:96::/112"


def make_registry(
    store: AllocationStore | None = None,
    cidrs: tuple[str, ...] = (V4,),
    node_ports: tuple[int, int] = (30000, 32767),
    seed: int = 1,
) -> Registry:
    return Registry(
        store if store is not None else AllocationStore(None),
        [ipaddress.ip_network(c) for c in cidrs],
        node_ports,
        random.Random(seed),
        now=lambda: T0,
    )


def service(name: str = "web", namespace: str = "default", **spec: Any) -> model.Service:
    """A Service to admit: one port unless given (a ClusterIP service needs one)."""
    spec.setdefault("ports", [{"name": "http", "port": 80}])
    return api.to_model(api.service(name, namespace, **spec))


def node_port_service(name: str = "web", *node_ports: int, **spec: Any) -> model.Service:
    ports = [{"name": f"p{i}", "port": 80 + i, "nodePort": np} for i, np in enumerate(node_ports)]
    return service(name, type="NodePort", ports=ports or [{"name": "http", "port": 80}], **spec)


def snapshot(registry: Registry) -> tuple:
    """Everything observable about the registry's allocations."""
    records = {key: registry.allocation(*key) for key in sorted(registry.allocated_services())}
    return records, registry.service_cluster_ips(), registry.usage()


def refused(registry: Registry, obj: model.KubeObject) -> list[str]:
    with pytest.raises(Invalid) as exc:
        registry.admit(obj)
    return exc.value.lines()

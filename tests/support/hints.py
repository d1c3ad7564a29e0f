"""Builders shared by the topology-hint tests (test_hints.py: Auto hints;
test_hints_distribution.py: trafficDistribution and what the controller writes): nodes,
endpoints and slices in slim types, and checks on the hints they carry."""

from __future__ import annotations

from collections import Counter

from kubeport.endpoints.types import (
    EndpointInfo, EndpointPortInfo, NodeInfo, PortSpec, ServiceInfo, ServiceName, SliceInfo,
)

PORTS = (EndpointPortInfo("", "TCP", 8080),)


def node(name: str, zone: str | None, cpu: int = 1000, *, ready: bool = True, control_plane: bool = False) -> NodeInfo:
    return NodeInfo(name=name, zone=zone, allocatable_cpu_millis=cpu, ready=ready, control_plane=control_plane)


def nodes_by_cpu(**cpu_by_zone: int) -> dict[str, NodeInfo]:
    """One node per zone with that much allocatable CPU (millicores)."""
    return {f"n-{zone}": node(f"n-{zone}", zone, cpu) for zone, cpu in cpu_by_zone.items()}


def endpoint(address: str, zone: str | None, *, ready: bool = True, node_name: str | None = None,
             zones: tuple[str, ...] = (), nodes: tuple[str, ...] = ()) -> EndpointInfo:
    return EndpointInfo(
        address=address, ready=ready, serving=ready, zone=zone,
        node_name=node_name if node_name is not None else (f"n-{zone}" if zone else None),
        zone_hints=frozenset(zones) or None, node_hints=frozenset(nodes) or None,
    )


def slice_of(name: str, *endpoints: EndpointInfo, family: str = "IPv4") -> SliceInfo:
    return SliceInfo(name=name, address_type=family, ports=PORTS, endpoints=tuple(endpoints))


def zone_endpoints(**count_by_zone: int) -> SliceInfo:
    """One slice with N ready endpoints per zone, addresses numbered in zone order."""
    endpoints = []
    for zone, count in count_by_zone.items():
        for _ in range(count):
            endpoints.append(endpoint(f"10.0.0.{len(endpoints) + 1}", zone))
    return slice_of("svc-1", *endpoints)


def hint_counts(slices: tuple[SliceInfo, ...]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for slice_ in slices:
        for e in slice_.endpoints:
            if e.ready:
                assert e.zone_hints is not None and len(e.zone_hints) == 1, e
                counts.update(e.zone_hints)
    return dict(counts)


def no_hints(slices: tuple[SliceInfo, ...]) -> bool:
    return all(e.zone_hints is None and e.node_hints is None for s in slices for e in s.endpoints)


def service(*, topology_mode: str | None = None, traffic_distribution: str | None = None) -> ServiceInfo:
    return ServiceInfo(
        name=ServiceName("default", "web"), uid="u", type="ClusterIP", cluster_ips=("10.96.0.20",),
        headless=False, external_name=None, ports=(PortSpec("", "TCP", 80, 8080),),
        topology_mode=topology_mode, traffic_distribution=traffic_distribution,
    )

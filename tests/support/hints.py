"""What the topology-hint tests (test_hints.py: Auto hints; test_hints_distribution.py:
trafficDistribution and what the controller writes) share beside the slim builders: nodes
and slices by zone, and checks on the hints the endpoints carry."""

from __future__ import annotations

from collections import Counter

from kubeport.endpoints.types import EndpointInfo, EndpointPortInfo, NodeInfo, SliceInfo

from .slim import endpoint, endpoint_slice, node

#: the ports of every slice here (slim.endpoint_slice's default)
PORTS = (EndpointPortInfo("", "TCP", 8080),)


def nodes_by_cpu(**cpu_by_zone: int) -> dict[str, NodeInfo]:
    """One node per zone with that much allocatable CPU (millicores)."""
    return {f"n-{zone}": node(f"n-{zone}", zone, cpu) for zone, cpu in cpu_by_zone.items()}


def slice_of(name: str, *endpoints: EndpointInfo, family: str = "IPv4") -> SliceInfo:
    return endpoint_slice(name, endpoints, address_type=family)


def zone_endpoints(**count_by_zone: int) -> SliceInfo:
    """One slice with N ready endpoints per zone, addresses numbered in zone order."""
    endpoints = []
    for zone, count in count_by_zone.items():
        for _ in range(count):
            endpoints.append(endpoint(f"10.0.0.{len(endpoints) + 1}", zone, node=f"n-{zone}"))
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

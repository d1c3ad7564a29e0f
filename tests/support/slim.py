"""Builders of the slim frozen types (kubeport.endpoints.types): ports, services, endpoints,
slices and snapshots, as the proxy and DNS read them."""

from __future__ import annotations

from types import MappingProxyType
from typing import Iterable

from kubeport.endpoints.types import (
    EndpointInfo,
    EndpointPortInfo,
    NodeInfo,
    PortSpec,
    ServiceInfo,
    ServiceName,
    ServiceState,
    SliceInfo,
    Snapshot,
)


def port(port: int, *, name: str = "", protocol: str = "TCP", target: int | str | None = None,
         node_port: int = 0) -> PortSpec:
    return PortSpec(name=name, protocol=protocol, port=port, target_port=target if target is not None else port,
                    node_port=node_port)


def service(name: str, cluster_ips: Iterable[str], ports: Iterable[PortSpec], *, namespace: str = "default",
            type: str = "ClusterIP", **fields) -> ServiceInfo:
    cluster_ips = tuple(cluster_ips)
    return ServiceInfo(
        name=ServiceName(namespace, name), uid=f"uid-{name}", type=type, cluster_ips=cluster_ips,
        headless=fields.pop("headless", False), external_name=fields.pop("external_name", None),
        ports=tuple(ports), **fields,
    )


def endpoint(address: str, *, node: str | None = "node-a", ready: bool = True, serving: bool | None = None,
             terminating: bool = False, zone: str | None = None) -> EndpointInfo:
    return EndpointInfo(address=address, ready=ready, serving=ready if serving is None else serving,
                        terminating=terminating, node_name=node, zone=zone)


def endpoint_slice(name: str, endpoints: Iterable[EndpointInfo], ports: Iterable[tuple[str, str, int]],
                   address_type: str = "IPv4") -> SliceInfo:
    return SliceInfo(name=name, address_type=address_type,
                     ports=tuple(EndpointPortInfo(n, p, num) for n, p, num in ports),
                     endpoints=tuple(endpoints))


def snapshot(states: Iterable[ServiceState], *, generation: int = 1, node: NodeInfo | None = None,
             synced: bool = True, previous: Snapshot | None = None) -> Snapshot:
    services = {s.service.name: s for s in states}
    if previous is not None:
        names = set(services) | set(previous.services)
        changed = frozenset(n for n in names if services.get(n) != previous.services.get(n))
        generation = previous.generation + 1
    else:
        changed = frozenset(services)
    return Snapshot(
        generation=generation,
        services=MappingProxyType(services),
        node=node if node is not None else NodeInfo(name="node-a"),
        synced=synced,
        changed=changed,
        node_changed=previous is None or (node is not None and node != previous.node),
    )

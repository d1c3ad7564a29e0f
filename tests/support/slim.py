"""Builders of the slim frozen types (kubeport.endpoints.types): ports, services, endpoints,
slices, nodes and snapshots, as the proxy and DNS read them.

Left out, a service is web in default on 10.96.0.20:80 -> 8080, an endpoint runs on node-a,
and a slice serves 8080/TCP: what most tables need, so a row states only what it is about."""

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

WEB_IP = "10.96.0.20"


def port(port: int, *, name: str = "", protocol: str = "TCP", target: int | str | None = None,
         node_port: int = 0) -> PortSpec:
    return PortSpec(name=name, protocol=protocol, port=port, target_port=target if target is not None else port,
                    node_port=node_port)


def service(name: str = "web", cluster_ips: Iterable[str] = (WEB_IP,), ports: Iterable[PortSpec] | None = None, *,
            namespace: str = "default", type: str = "ClusterIP", **fields) -> ServiceInfo:
    """A service; ``fields`` are ServiceInfo's other fields (topology_mode=..., external_ips=...)."""
    return ServiceInfo(
        name=ServiceName(namespace, name), uid=f"uid-{name}", type=type, cluster_ips=tuple(cluster_ips),
        headless=fields.pop("headless", False), external_name=fields.pop("external_name", None),
        ports=tuple(ports) if ports is not None else (port(80, target=8080),), **fields,
    )


def endpoint(address: str, zone: str | None = None, *, node: str | None = "node-a", ready: bool = True,
             serving: bool | None = None, terminating: bool = False, zones: Iterable[str] = (),
             nodes: Iterable[str] = (), **fields) -> EndpointInfo:
    """An endpoint in ``zone`` on ``node``, hinted for ``zones`` and ``nodes`` (hints.forZones,
    forNodes); serving follows ready unless given, as for a pod that is not terminating."""
    return EndpointInfo(address=address, ready=ready, serving=ready if serving is None else serving,
                        terminating=terminating, node_name=node, zone=zone,
                        zone_hints=frozenset(zones) or None, node_hints=frozenset(nodes) or None, **fields)


def endpoint_slice(name: str, endpoints: Iterable[EndpointInfo],
                   ports: Iterable[tuple[str, str, int]] = (("", "TCP", 8080),),
                   address_type: str = "IPv4") -> SliceInfo:
    """A slice; ``ports`` as (name, protocol, port)."""
    return SliceInfo(name=name, address_type=address_type,
                     ports=tuple(EndpointPortInfo(n, p, num) for n, p, num in ports),
                     endpoints=tuple(endpoints))


def node(name: str = "node-a", zone: str | None = None, cpu: int = 1000, *, addresses: Iterable[tuple[str, str]] = (),
         ready: bool = True, control_plane: bool = False) -> NodeInfo:
    """A Node; ``cpu`` its allocatable millicores (one CPU: topology hints count the node)."""
    return NodeInfo(name=name, zone=zone, addresses=tuple(addresses), ready=ready, allocatable_cpu_millis=cpu,
                    control_plane=control_plane)


def snapshot(states: Iterable[ServiceState], *, generation: int = 1, node: NodeInfo | None = None,
             synced: bool = True, previous: Snapshot | None = None) -> Snapshot:
    """A published snapshot of ``states``; after ``previous``, with what changed since it."""
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
        namespaces=frozenset(n.namespace for n in services),
        node=node if node is not None else NodeInfo(name="node-a"),
        synced=synced,
        changed=changed,
        node_changed=previous is None or (node is not None and node != previous.node),
    )

"""API objects -> slim frozen types. The only place that reads the pydantic models."""

from __future__ import annotations

import functools
import ipaddress
import sys
from datetime import datetime, timezone
from types import MappingProxyType
from typing import TypeVar

from kubeport.endpoints import model, names
from kubeport.endpoints.types import (
    ContainerPortInfo,
    ContainerStatusInfo,
    EndpointInfo,
    EndpointPortInfo,
    NodeInfo,
    PodInfo,
    PortSpec,
    ServiceInfo,
    ServiceName,
    SliceInfo,
)

_intern = sys.intern
T = TypeVar("T")
TRIGGER_TIME_ANNOTATION = "endpoints.kubernetes.io/last-change-trigger-time"
#: the one value of the kubeport.io/proxy-protocol annotation acted on
PROXY_PROTOCOL_V2 = "v2"

#: Equal immutable values converted from different objects, shared: the port list of
#: thousands of services is often the same (memory, not speed). Bounded; cleared when full.
_SHARED: dict = {}
_SHARED_MAX = 4096


def _share(value: T) -> T:
    held = _SHARED.get(value)
    if held is not None:
        return held
    if len(_SHARED) >= _SHARED_MAX:
        _SHARED.clear()
    _SHARED[value] = value
    return value


def canonical_ip(address: str) -> str:
    """The canonical text of an IP (``fd00::0001`` -> ``fd00::1``); unchanged if not an IP."""
    facts = names.ip_facts(address)  # cached: validation has just looked at the same address
    if facts is not None and facts.canonical == address:
        return address  # already canonical (an IPv4-mapped IPv6 text is not: it keeps its form)
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address


def service_info(svc: model.Service) -> ServiceInfo:
    spec = svc.spec
    meta = svc.metadata
    headless = spec.headless
    cluster_ips: tuple[str, ...] = ()
    if spec.type != "ExternalName" and not headless:
        cluster_ips = tuple(canonical_ip(ip) for ip in (spec.cluster_ips or ()) if ip and ip != "None")
    annotations = meta.annotations
    # The deprecated annotation wins when present (EndpointSlice controller's hintsEnabled).
    topology_mode = annotations.get(model.ANNOTATION_TOPOLOGY_AWARE_HINTS)
    if topology_mode is None:
        topology_mode = annotations.get(model.ANNOTATION_TOPOLOGY_MODE)
    proxy_protocol = annotations.get(model.ANNOTATION_PROXY_PROTOCOL)
    return ServiceInfo(
        name=ServiceName(_intern(meta.namespace), _intern(meta.name)),
        uid=meta.uid or "",
        type=_intern(spec.type),
        cluster_ips=cluster_ips,
        headless=headless,
        external_name=spec.external_name if spec.type == "ExternalName" else None,
        ports=_share(tuple(
            PortSpec(
                name=_intern(p.name or ""),
                protocol=_intern(p.protocol),
                port=p.port,
                target_port=p.target_port if p.target_port is not None else p.port,
                node_port=p.node_port or 0,
                app_protocol=p.app_protocol,
            )
            for p in spec.ports
        )),
        external_ips=tuple(canonical_ip(ip) for ip in spec.external_ips),
        load_balancer_ips=tuple(
            canonical_ip(ingress.ip)
            for ingress in svc.status.load_balancer.ingress
            if ingress.ip and ingress.ip_mode in (None, "VIP")
        ),
        load_balancer_source_ranges=tuple(spec.load_balancer_source_ranges),
        affinity_timeout=spec.affinity_timeout_seconds,
        external_policy_local=spec.external_traffic_policy == "Local",
        internal_policy_local=spec.internal_traffic_policy == "Local",
        health_check_node_port=spec.health_check_node_port or 0,
        traffic_distribution=spec.traffic_distribution,
        topology_mode=topology_mode,
        publish_not_ready_addresses=spec.publish_not_ready_addresses,
        proxy_name=meta.labels.get(model.LABEL_SERVICE_PROXY_NAME),
        headless_label=model.LABEL_HEADLESS in meta.labels,
        created=_rfc3339(meta.creation_timestamp),
        selector=",".join(f"{k}={v}" for k, v in sorted((spec.selector or {}).items())),
        # interned and shared: a selector is most often the Service's own labels (app=name)
        selector_labels=_label_pairs(spec.selector) if spec.selector else None,
        ip_families=tuple(spec.ip_families or ()),
        # interned and shared: Services of one app carry the same keys, often the same set
        labels=_label_pairs(meta.labels),
        proxy_protocol=proxy_protocol == PROXY_PROTOCOL_V2,
        problems=_proxy_protocol_problems(meta.namespace, meta.name, proxy_protocol),
    )


def _proxy_protocol_problems(namespace: str, name: str, value: str | None) -> tuple[str, ...]:
    """A value other than "v2" is reported, and the Service served without the header (a
    typo must not take a Service down; kube-proxy likewise serves on with a bad topology
    annotation, though silently)."""
    if not value or value == PROXY_PROTOCOL_V2:
        return ()
    return (f'Service {namespace}/{name}: annotation {model.ANNOTATION_PROXY_PROTOCOL}: "{value}" is not '
            f'supported (only "{PROXY_PROTOCOL_V2}"); served without a PROXY protocol header',)


def _label_pairs(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return _share(tuple(sorted((_intern(k), _intern(v)) for k, v in labels.items())))


@functools.lru_cache(maxsize=16)
def _rfc3339(moment: datetime | None) -> str | None:
    """Cached: the services created in one second (a first load) share one value and text."""
    if moment is None:
        return None
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _names(items: list[model.ForZone] | list[model.ForNode] | None) -> frozenset[str] | None:
    if not items:
        return None
    return frozenset(_intern(item.name) for item in items)


def endpoint_info(endpoint: model.Endpoint, address_type: str) -> EndpointInfo | None:
    if not endpoint.addresses:
        return None  # kube-proxy skips endpoints without an address
    address = endpoint.addresses[0]
    if address_type != "FQDN":
        address = canonical_ip(address)
    conditions = endpoint.conditions
    hints = endpoint.hints
    ref = endpoint.target_ref
    return EndpointInfo(
        address=address,
        ready=conditions.ready is not False,
        serving=conditions.serving is not False,
        terminating=conditions.terminating is True,
        hostname=endpoint.hostname or None,
        node_name=_intern(endpoint.node_name) if endpoint.node_name else None,
        zone=_intern(endpoint.zone) if endpoint.zone else None,
        zone_hints=_names(hints.for_zones) if hints else None,
        node_hints=_names(hints.for_nodes) if hints else None,
        pod_name=ref.name if ref is not None and ref.name else None,
    )


def slice_info(eps: model.EndpointSlice) -> SliceInfo:
    ports: tuple[EndpointPortInfo, ...] | None = None
    if eps.ports is not None:
        ports = _share(tuple(
            EndpointPortInfo(_intern(p.name or ""), _intern(p.protocol or "TCP"), p.port or 0) for p in eps.ports
        ))
    endpoints = []
    more: list[tuple[str, ...]] = []
    for endpoint in eps.endpoints:
        info = endpoint_info(endpoint, eps.address_type)
        if info is not None:
            endpoints.append(info)
            more.append(_more_addresses(endpoint.addresses, eps.address_type))
    labels = eps.metadata.labels
    managed_by = labels.get(model.LABEL_MANAGED_BY)
    return SliceInfo(
        name=eps.metadata.name,
        address_type=_intern(eps.address_type),
        ports=ports,
        endpoints=tuple(endpoints),
        proxied=model.LABEL_HEADLESS not in labels and model.LABEL_SERVICE_PROXY_NAME not in labels,
        more_addresses=tuple(more) if any(more) else None,
        trigger_time=_trigger_time(eps.metadata.annotations.get(TRIGGER_TIME_ANNOTATION)),
        managed_by=_intern(managed_by) if managed_by else managed_by,  # one controller's name for all
    )


def _trigger_time(value: str | None) -> float | None:
    """RFC 3339 (the controller writes RFC3339Nano) to seconds; None if absent or unparseable,
    as kube-proxy ignores a bad annotation."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _more_addresses(addresses: list[str], address_type: str) -> tuple[str, ...]:
    if len(addresses) < 2:
        return ()
    return tuple(addresses[1:] if address_type == "FQDN" else map(canonical_ip, addresses[1:]))


def _cpu_millis(quantity: str | None) -> int:
    """A Kubernetes CPU quantity ("2", "1500m", "0.5") in millicores; 0 if unparseable."""
    if not quantity:
        return 0
    try:
        if quantity.endswith("m"):
            return int(float(quantity[:-1]))
        return int(float(quantity) * 1000)
    except ValueError:
        return 0


def node_info(node: model.Node) -> NodeInfo:
    labels = node.metadata.labels
    taints = node.spec.taints
    ready_conditions = [c for c in node.status.conditions if c.type == "Ready"]
    return NodeInfo(
        name=node.metadata.name,
        zone=labels.get(model.LABEL_ZONE) or None,
        addresses=tuple((a.type, canonical_ip(a.address)) for a in node.status.addresses),
        eligible=node.metadata.deletion_timestamp is None
        and not any(t.key == model.TAINT_TO_BE_DELETED for t in taints),
        ready=all(c.status == "True" for c in ready_conditions),
        allocatable_cpu_millis=_cpu_millis(node.status.allocatable.get("cpu")),
        control_plane="node-role.kubernetes.io/control-plane" in labels
        or "node-role.kubernetes.io/master" in labels,
    )


#: one empty label map for every Pod read for DNS (a map each would cost more than the Pod)
_NO_LABELS: MappingProxyType[str, str] = MappingProxyType({})


def pod_addresses(pod: model.PodAddresses) -> PodInfo:
    """A Pod as DNS reads it from the API server: no labels, ports or containers."""
    meta, status = pod.metadata, pod.status
    ips = [entry.ip for entry in status.pod_ips or () if entry.ip] or ([status.pod_ip] if status.pod_ip else [])
    return PodInfo(
        namespace=_intern(meta.namespace),
        name=meta.name,
        labels=_NO_LABELS,
        ips=tuple(canonical_ip(ip) for ip in ips),
        phase=_intern(status.phase or "Pending"),
        deletion_timestamp=_rfc3339(meta.deletion_timestamp),
        node_name=_intern(pod.spec.node_name) if pod.spec.node_name else None,
        created="",
    )


def pod_info(pod: model.Pod) -> PodInfo:
    meta, spec, status = pod.metadata, pod.spec, pod.status
    ports = [
        ContainerPortInfo(_intern(port.name), _intern(port.protocol), port.container_port, container.name)
        for container in spec.containers for port in container.ports if port.name
    ]
    # Sidecars (init containers that keep running) serve ports too (podutil.FindPort).
    ports += [
        ContainerPortInfo(_intern(port.name), _intern(port.protocol), port.container_port, container.name)
        for container in spec.init_containers if container.restart_policy == "Always"
        for port in container.ports if port.name
    ]
    ready_condition = [c for c in status.conditions if c.type == "Ready"]
    return PodInfo(
        namespace=_intern(meta.namespace),
        name=meta.name,
        uid=meta.uid or "",
        labels=MappingProxyType(dict(meta.labels)),
        ips=tuple(canonical_ip(entry.ip) for entry in status.pod_ips if entry.ip),
        phase=status.phase or "Pending",
        ready=bool(ready_condition) and ready_condition[0].status == "True",
        deletion_timestamp=_rfc3339(meta.deletion_timestamp),
        node_name=_intern(spec.node_name) if spec.node_name else None,
        hostname=spec.hostname or None,
        subdomain=spec.subdomain or None,
        ports=tuple(ports),
        containers=tuple(container.name for container in spec.containers),
        reason=status.reason,
        container_statuses=tuple(
            ContainerStatusInfo(c.name, c.ready, c.restart_count,
                                c.state.waiting.reason if c.state.waiting else None,
                                c.state.terminated.reason if c.state.terminated else None)
            for c in status.container_statuses),
        created=_rfc3339(meta.creation_timestamp),
    )


def service_cidrs(obj: model.ServiceCIDR) -> tuple[str, ...]:
    """A ServiceCIDR's spec.cidrs, canonical; a value that does not parse is left out (the
    API server validated it; a manifest's is refused before it gets here)."""
    found = []
    for value in obj.spec.cidrs:
        try:
            found.append(str(ipaddress.ip_network(value.strip(), strict=False)))
        except ValueError:
            continue
    return tuple(found)

"""The EndpointSlice controller's slices for a Service with a selector, from the Pods read.

Pure: a Service, the Pods of its namespace and the Nodes in, slices out. The rules are those
of ``pkg/controller/endpointslice`` and ``staging/src/k8s.io/endpointslice``:

* which Pods (``reconciler.reconcileByAddressType``, ``util.ShouldPodBeInEndpoints``): those of
  the Service's namespace whose labels match ``spec.selector``, not Succeeded or Failed, with
  an IP. A Service without a selector (or with an empty one) and an ExternalName Service get
  nothing from the controller (``Controller.syncService``);
* address types (``getAddressTypesForService``): ``spec.ipFamilies``; without them the family
  of the ClusterIP, and for a headless Service both. One set of slices per type, each Pod
  contributing its ``status.podIPs`` of that family (``getEndpointAddresses``);
* ports (``getEndpointPorts``, ``podutil.FindPort``): per Service port, a numeric
  ``targetPort`` as is, a named one looked up per Pod among its containers' ports (and its
  sidecars') of that name and protocol; a port no container names is left out for that Pod.
  The slice port takes the Service port's name and protocol. Pods whose ports resolve alike
  share slices; different numbers mean different slices (``NewPortMapKey``);
* at most 100 endpoints per slice (``--max-endpoints-per-slice``' default); with no endpoint
  at all, one empty placeholder slice per address type, as the reconciler writes;
* each endpoint (``podToEndpoint``): ``serving`` from the Ready condition, ``terminating``
  from ``deletionTimestamp``, ``ready = publishNotReadyAddresses || (serving && !terminating)``;
  ``nodeName``; ``zone`` from the Node's ``topology.kubernetes.io/zone`` label; ``hostname``
  when the Pod sets ``spec.hostname`` and its ``spec.subdomain`` is the Service's name
  (``ShouldSetHostname``, for a Service of any type; DNS publishes it for headless ones);
  ``targetRef`` to the Pod;
* labels (``setEndpointSliceLabels``): ``kubernetes.io/service-name``,
  ``endpointslice.kubernetes.io/managed-by`` = :data:`CONTROLLER_NAME`, and
  ``service.kubernetes.io/headless`` for a headless Service.

Differences, on purpose:

* a Pod whose Node no manifest declares is kept, without a zone. The controller skips it
  (unless ``publishNotReadyAddresses``) while it waits for the Pod garbage collector; in
  manifest mode nobody need write Node objects and no collector runs.
* slice names are ``<service>-<hash>``, a digest of the Service, the address type, the port
  mapping and the chunk's index, not ``generateName``'s random suffix: the same Pods make the same
  slices, across edits and restarts. Endpoints are ordered by Pod name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from kubeport.endpoints.types import EndpointInfo, EndpointPortInfo, NodeInfo, PodInfo, ServiceInfo, SliceInfo

#: The managed-by label value of the slices kubeport writes (the cluster's controller writes
#: ``endpointslice-controller.k8s.io``; slices of any other value are left alone).
CONTROLLER_NAME = "endpointslice-controller.kubeport.io"
#: kube-controller-manager's ``--max-endpoints-per-slice`` default.
MAX_ENDPOINTS_PER_SLICE = 100
#: ``generateName`` keeps this much of the Service's name before the suffix (names.go maxGeneratedNameLength).
_NAME_PREFIX_MAX = 58

_FAMILY_TYPES = {"IPv4": "IPv4", "IPv6": "IPv6"}


def selects(service: ServiceInfo, pod: PodInfo) -> bool:
    """Does the Service's selector match the Pod (same namespace, every pair in its labels)?"""
    selector = service.selector_labels
    if selector is None or pod.namespace != service.name.namespace:
        return False
    labels = pod.labels
    return all(labels.get(key) == value for key, value in selector)


def controls(service: ServiceInfo) -> bool:
    """Does the controller write slices for this Service (a selector, not ExternalName)?"""
    return service.selector_labels is not None and service.type != "ExternalName"


def address_types(service: ServiceInfo) -> tuple[str, ...]:
    """``getAddressTypesForService``, IPv4 first."""
    families = {_FAMILY_TYPES[f] for f in service.ip_families if f in _FAMILY_TYPES}
    if not families:
        if service.cluster_ips and not service.headless:
            families = {"IPv6" if ":" in service.cluster_ips[0] else "IPv4"}
        else:
            families = {"IPv4", "IPv6"}
    return tuple(sorted(families))


def endpoint_ports(service: ServiceInfo, pod: PodInfo) -> tuple[EndpointPortInfo, ...]:
    """``getEndpointPorts``: the Service's ports as this Pod serves them."""
    found = []
    for port in service.ports:
        number = pod.find_port(port.target_port, port.protocol)
        if number is not None:
            found.append(EndpointPortInfo(port.name, port.protocol, number))
    return tuple(found)


def _addresses(pod: PodInfo, address_type: str) -> list[str]:
    v6 = address_type == "IPv6"
    return [ip for ip in pod.ips if (":" in ip) == v6]  # canonical IPs: only IPv6 has a colon


def pod_endpoint(service: ServiceInfo, pod: PodInfo, address: str, nodes: Mapping[str, NodeInfo]) -> EndpointInfo:
    """``podToEndpoint`` for one address of the Pod."""
    node = nodes.get(pod.node_name) if pod.node_name else None
    serving = pod.ready
    hostname = pod.hostname if pod.hostname and pod.subdomain == service.name.name else None
    return EndpointInfo(
        address=address,
        ready=service.publish_not_ready_addresses or (serving and not pod.terminating),
        serving=serving,
        terminating=pod.terminating,
        hostname=hostname,
        node_name=pod.node_name,
        zone=node.zone if node is not None else None,
        pod_name=pod.name,
    )


def _slice_name(service: ServiceInfo, address_type: str, ports: tuple[EndpointPortInfo, ...], index: int) -> str:
    key = (f"{service.name}|{address_type}|{'|'.join(f'{p.name}/{p.protocol}/{p.port}' for p in ports)}"
           f"|{index}")
    digest = hashlib.sha256(key.encode()).hexdigest()[:5]
    return f"{service.name.name[:_NAME_PREFIX_MAX]}-{digest}"


def slices_for(service: ServiceInfo, pods: Iterable[PodInfo], nodes: Mapping[str, NodeInfo]) -> tuple[SliceInfo, ...]:
    """The slices the controller would write for ``service``, sorted by name; () when it writes none.

    ``pods`` may hold any Pods: those the selector does not match are passed over.
    """
    if not controls(service):
        return ()
    chosen = sorted((pod for pod in pods if selects(service, pod) and not pod.terminal and pod.ips),
                    key=lambda pod: pod.name)
    proxied = not service.headless and service.proxy_name is None
    headless_ports = not service.ports and service.headless
    slices: list[SliceInfo] = []
    for address_type in address_types(service):
        groups: dict[tuple[EndpointPortInfo, ...], list[tuple[EndpointInfo, tuple[str, ...]]]] = {}
        for pod in chosen:
            addresses = _addresses(pod, address_type)
            if not addresses:
                continue
            ports = () if headless_ports else endpoint_ports(service, pod)
            endpoint = pod_endpoint(service, pod, addresses[0], nodes)
            groups.setdefault(ports, []).append((endpoint, tuple(addresses[1:])))
        if not groups:
            slices.append(SliceInfo(_slice_name(service, address_type, (), 0), address_type, (), (),
                                    proxied=proxied, managed_by=CONTROLLER_NAME))
            continue
        for ports in sorted(groups, key=lambda key: [(p.name, p.protocol, p.port) for p in key]):
            members = groups[ports]
            for index, start in enumerate(range(0, len(members), MAX_ENDPOINTS_PER_SLICE)):
                chunk = members[start:start + MAX_ENDPOINTS_PER_SLICE]
                more = tuple(extra for _, extra in chunk)
                slices.append(SliceInfo(
                    name=_slice_name(service, address_type, ports, index),
                    address_type=address_type,
                    ports=ports,
                    endpoints=tuple(endpoint for endpoint, _ in chunk),
                    proxied=proxied,
                    more_addresses=more if any(more) else None,
                    managed_by=CONTROLLER_NAME,
                ))
    return tuple(sorted(slices, key=lambda s: s.name))

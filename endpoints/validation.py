"""API-server validation for the kinds kubeport reads, with the API server's messages.

Pure functions: an object in, the list of :class:`FieldError` out (empty when valid).
Sources: ``pkg/apis/core/validation/validation.go`` (ValidateService,
ValidateServiceClusterIPsRelatedFields, validateServiceExternalTrafficPolicy,
ValidateNonSpecialIP, ValidateNode, ValidateNamespace, the parts of ValidatePod and
ValidatePodStatusUpdate the EndpointSlice controller relies on) and
``pkg/apis/discovery/validation/validation.go`` (ValidateEndpointSlice).

Checks that need the allocators (nodePort inside the node-port range, clusterIP inside
the service range, already allocated) live in :mod:`kubeport.endpoints.registry.registry`.
Enum fields (type, protocol, sessionAffinity, ...) are checked by the pydantic model.

Service and EndpointSlice port names are DNS-1123 labels, as the API server checks
them; the IANA service-name rule (at most 15 characters, at least one letter, no
'--') applies to named targetPorts, which name container ports. Where kubeport is
stricter than the API server, it says so: endpoint addresses may not be multicast
or a ClusterIP.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping, Sequence

from kubeport.endpoints import model, names
from kubeport.endpoints.fielderrors import (
    FieldError,
    Invalid,
    duplicate,
    forbidden,
    invalid,
    not_supported,
    required,
    too_many,
)

__all__ = [
    "FieldError",
    "Invalid",
    "TRAFFIC_DISTRIBUTIONS",
    "validate",
    "validate_endpoint_slice",
    "validate_namespace",
    "validate_node",
    "validate_service",
    "validate_service_cidr",
]

TRAFFIC_DISTRIBUTIONS = ("PreferClose", "PreferSameZone", "PreferSameNode")
MAX_AFFINITY_TIMEOUT = model.MAX_AFFINITY_TIMEOUT_SECONDS
MAX_SLICE_ENDPOINTS = 1000
MAX_SLICE_PORTS = 100
MAX_ENDPOINT_ADDRESSES = 100

NameCheck = Callable[[str], list[str]]


def validate(obj: model.KubeObject, cluster_ip_owners: Mapping[str, str] | None = None) -> list[FieldError]:
    """Every problem of ``obj``; ``cluster_ip_owners`` maps allocated ClusterIPs to "ns/name"."""
    if isinstance(obj, model.Service):
        return validate_service(obj)
    if isinstance(obj, model.EndpointSlice):
        return validate_endpoint_slice(obj, cluster_ip_owners)
    if isinstance(obj, model.Node):
        return validate_node(obj)
    if isinstance(obj, model.Pod):
        return validate_pod(obj)
    if isinstance(obj, model.ServiceCIDR):
        return validate_service_cidr(obj)
    return validate_namespace(obj)


def _validate_meta(meta: model.ObjectMeta, name_check: NameCheck, namespaced: bool) -> list[FieldError]:
    errors = []
    if not meta.name:
        errors.append(required("metadata.name", "name or generateName is required"))
    else:
        errors += [invalid("metadata.name", meta.name, msg) for msg in name_check(meta.name)]
    if namespaced:
        errors += [invalid("metadata.namespace", meta.namespace, msg) for msg in names.is_dns1123_label(meta.namespace)]
    return errors


# --- Service ------------------------------------------------------------------------


def _is_headless(spec: model.ServiceSpec) -> bool:
    return spec.cluster_ips == ["None"] or (not spec.cluster_ips and spec.cluster_ip == "None")


def validate_service(svc: model.Service) -> list[FieldError]:
    spec = svc.spec
    errors = _validate_meta(svc.metadata, names.is_dns1035_label, namespaced=True)
    if not spec.ports and not _is_headless(spec) and spec.type != "ExternalName":
        errors.append(required("spec.ports"))
    errors += _validate_type_specific(spec)
    errors += _validate_ports(spec)
    errors += _validate_session_affinity(spec)
    if spec.type != "ExternalName":
        errors += validate_cluster_ip_fields(spec)
    for i, ip in enumerate(spec.external_ips):
        path = f"spec.externalIPs[{i}]"
        problems = names.is_valid_ip(ip) or names.non_special_ip_problems(ip)
        errors += [invalid(path, ip, msg) for msg in problems]
    errors += _validate_node_ports(spec)
    errors += _validate_load_balancer_fields(spec)
    errors += _validate_external_traffic(spec)
    if spec.traffic_distribution is not None and spec.traffic_distribution not in TRAFFIC_DISTRIBUTIONS:
        errors.append(not_supported("spec.trafficDistribution", spec.traffic_distribution, TRAFFIC_DISTRIBUTIONS))
    return errors


def _validate_type_specific(spec: model.ServiceSpec) -> list[FieldError]:
    errors = []
    if spec.type in ("LoadBalancer", "NodePort") and _is_headless(spec):
        errors.append(invalid("spec.clusterIPs[0]", "None", f"may not be set to 'None' for {spec.type} services"))
    if spec.type != "ExternalName":
        return errors
    if spec.cluster_ips or spec.cluster_ip:
        errors.append(forbidden("spec.clusterIPs", "may not be set for ExternalName services"))
    if spec.ip_families:
        errors.append(forbidden("spec.ipFamilies", "may not be set for ExternalName services"))
    if spec.ip_family_policy is not None:
        errors.append(forbidden("spec.ipFamilyPolicy", "may not be set for ExternalName services"))
    # The value (a CNAME) may end with a dot to mark it fully qualified.
    cname = (spec.external_name or "").removesuffix(".")
    if cname:
        errors += [invalid("spec.externalName", cname, msg) for msg in names.is_dns1123_subdomain(cname)]
    else:
        errors.append(required("spec.externalName"))
    return errors


def _validate_ports(spec: model.ServiceSpec) -> list[FieldError]:
    errors = []
    require_name = len(spec.ports) > 1
    seen_names: set[str] = set()
    seen_ports: set[tuple[int, str]] = set()
    for i, port in enumerate(spec.ports):
        path = f"spec.ports[{i}]"
        if not port.name:
            if require_name:
                errors.append(required(f"{path}.name"))
        else:
            errors += [invalid(f"{path}.name", port.name, msg) for msg in names.is_dns1123_label(port.name)]
            if port.name in seen_names:
                errors.append(duplicate(f"{path}.name", port.name))
            seen_names.add(port.name)
        errors += [invalid(f"{path}.port", port.port, msg) for msg in names.is_valid_port_num(port.port)]
        errors += _validate_target_port(port.target_port, f"{path}.targetPort")
        key = (port.port, port.protocol)
        if key in seen_ports:
            errors.append(duplicate(path, f"{port.port}/{port.protocol}"))
        seen_ports.add(key)
    return errors


def _validate_target_port(target: int | str | None, path: str) -> list[FieldError]:
    """ValidatePortNumOrName."""
    if isinstance(target, int):
        return [invalid(path, target, msg) for msg in names.is_valid_port_num(target)]
    if isinstance(target, str):
        return [invalid(path, target, msg) for msg in names.is_valid_port_name(target)]
    return []


def _validate_session_affinity(spec: model.ServiceSpec) -> list[FieldError]:
    path = "spec.sessionAffinityConfig"
    config = spec.session_affinity_config
    if spec.session_affinity == "None":
        return []  # the model drops a config given with None, as the API server's defaulting does
    # The model defaults a missing config/timeout for ClientIP, as the API server does.
    timeout = config.client_ip.timeout_seconds if config and config.client_ip else None
    if timeout is None:
        return [required(f"{path}.clientIP.timeoutSeconds", "when session affinity type is ClientIP")]
    if not 0 < timeout <= MAX_AFFINITY_TIMEOUT:
        # The API's text says "less than 86400", yet 86400 itself is accepted.
        detail = f"must be greater than 0 and less than {MAX_AFFINITY_TIMEOUT}"
        return [invalid(f"{path}.clientIP.timeoutSeconds", timeout, detail)]
    return []


def validate_cluster_ip_fields(spec: model.ServiceSpec) -> list[FieldError]:
    """ValidateServiceClusterIPsRelatedFields (the parts the model leaves to validation)."""
    errors: list[FieldError] = []
    cluster_ips = list(spec.cluster_ips or [])
    if spec.cluster_ip and cluster_ips and cluster_ips[0] != spec.cluster_ip:
        errors.append(invalid("spec.clusterIPs", cluster_ips, "first value must match `clusterIP`"))
    seen: set[str] = set()
    for i, family in enumerate(spec.ip_families or []):
        if family in seen:
            errors.append(duplicate(f"spec.ipFamilies[{i}]", family))
        seen.add(family)
    bad_ips = False
    for i, ip in enumerate(cluster_ips):
        if i == 0 and ip == "None":
            if len(cluster_ips) > 1:
                bad_ips = True
                errors.append(invalid("spec.clusterIPs", cluster_ips, "'None' must be the first and only value"))
            continue
        problems = names.is_valid_ip(ip)
        bad_ips = bad_ips or bool(problems)
        errors += [invalid(f"spec.clusterIPs[{i}]", ip, msg) for msg in problems]
    if len(cluster_ips) > 2:
        errors.append(invalid("spec.clusterIPs", cluster_ips, "may only hold up to 2 values"))
    if bad_ips:
        return errors  # family checks on bad IPs would only add noise
    if len(cluster_ips) > 1 and len({names.ip_family(ip) for ip in cluster_ips}) != len(cluster_ips):
        errors.append(invalid("spec.clusterIPs", cluster_ips, "may specify no more than one IP for each IP family"))
    if not _is_headless(spec):
        for i, (ip, family) in enumerate(zip(cluster_ips, spec.ip_families or [])):
            if names.ip_family(ip) != family:
                detail = f"expected an {family} value as indicated by `ipFamilies[{i}]`"
                errors.append(invalid(f"spec.clusterIPs[{i}]", ip, detail))
    return errors


def _validate_node_ports(spec: model.ServiceSpec) -> list[FieldError]:
    errors = []
    seen: set[tuple[str, int]] = set()
    for i, port in enumerate(spec.ports):
        if not port.node_port:
            continue
        path = f"spec.ports[{i}].nodePort"
        if spec.type == "ClusterIP":
            errors.append(forbidden(path, "may not be used when `type` is 'ClusterIP'"))
        key = (port.protocol, port.node_port)
        if key in seen:
            errors.append(duplicate(path, port.node_port))
        seen.add(key)
    return errors


def _validate_load_balancer_fields(spec: model.ServiceSpec) -> list[FieldError]:
    errors = []
    only_lb = "may only be used when `type` is 'LoadBalancer'"
    is_lb = spec.type == "LoadBalancer"
    if spec.load_balancer_source_ranges:
        # "LoadBalancerSourceRanges" (capital L) is the API server's own field path.
        path = "spec.LoadBalancerSourceRanges"
        if not is_lb:
            errors.append(forbidden(path, only_lb))
        for i, value in enumerate(spec.load_balancer_source_ranges):
            value = value.strip()  # space padding is tolerated, for historical reasons
            errors += [invalid(f"{path}[{i}]", value, msg) for msg in names.is_valid_cidr(value)]
    if spec.allocate_load_balancer_node_ports is not None and not is_lb:
        errors.append(forbidden("spec.allocateLoadBalancerNodePorts", only_lb))
    if spec.load_balancer_class is not None and not is_lb:
        errors.append(forbidden("spec.loadBalancerClass", only_lb))
    return errors


def externally_accessible(spec: model.ServiceSpec) -> bool:
    """apiservice.ExternallyAccessible."""
    return spec.type in ("LoadBalancer", "NodePort") or (spec.type == "ClusterIP" and bool(spec.external_ips))


def needs_health_check(spec: model.ServiceSpec) -> bool:
    """apiservice.NeedsHealthCheck: LoadBalancer with externalTrafficPolicy Local."""
    return spec.type == "LoadBalancer" and spec.external_traffic_policy == "Local"


def _validate_external_traffic(spec: model.ServiceSpec) -> list[FieldError]:
    errors = []
    if not externally_accessible(spec) and spec.external_traffic_policy is not None:
        errors.append(
            invalid(
                "spec.externalTrafficPolicy",
                spec.external_traffic_policy,
                "may only be set for externally-accessible services",
            )
        )
    port = spec.health_check_node_port
    if not needs_health_check(spec):
        if port:
            detail = "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'"
            errors.append(invalid("spec.healthCheckNodePort", port, detail))
    elif port:
        errors += [invalid("spec.healthCheckNodePort", port, msg) for msg in names.is_valid_port_num(port)]
    return errors


# --- EndpointSlice ---------------------------------------------------------------------


def validate_endpoint_slice(
    eps: model.EndpointSlice, cluster_ip_owners: Mapping[str, str] | None = None
) -> list[FieldError]:
    errors = _validate_meta(eps.metadata, names.is_dns1123_subdomain, namespaced=True)
    errors += _validate_endpoints(eps, cluster_ip_owners or {})
    errors += _validate_slice_ports(eps.ports or [])
    return errors


def _validate_endpoints(eps: model.EndpointSlice, cluster_ip_owners: Mapping[str, str]) -> list[FieldError]:
    if len(eps.endpoints) > MAX_SLICE_ENDPOINTS:
        return [too_many("endpoints", len(eps.endpoints), MAX_SLICE_ENDPOINTS)]
    errors = []
    address_type = eps.address_type
    for i, endpoint in enumerate(eps.endpoints):
        addresses = endpoint.addresses
        if not addresses:
            errors.append(required(f"endpoints[{i}].addresses", "must contain at least 1 address"))
        elif len(addresses) > MAX_ENDPOINT_ADDRESSES:
            errors.append(too_many(f"endpoints[{i}].addresses", len(addresses), MAX_ENDPOINT_ADDRESSES))
        for j, address in enumerate(addresses):
            problems = _address_problems(address, address_type, cluster_ip_owners)
            if problems:  # paths are built only for errors: 100,000 endpoints mostly have none
                errors += [invalid(f"endpoints[{i}].addresses[{j}]", address, msg) for msg in problems]
        if endpoint.hostname is not None:
            hostname = endpoint.hostname
            errors += [invalid(f"endpoints[{i}].hostname", hostname, msg) for msg in names.is_dns1123_label(hostname)]
        if endpoint.node_name is not None:
            node = endpoint.node_name
            errors += [invalid(f"endpoints[{i}].nodeName", node, msg) for msg in names.is_dns1123_subdomain(node)]
    return errors


def _address_problems(address: str, address_type: str, cluster_ip_owners: Mapping[str, str]) -> Sequence[str]:
    if address_type == "FQDN":
        return names.is_fully_qualified_domain_name(address)
    facts = names.ip_facts(address)
    if facts is None or facts.family != address_type:
        return [f"must be a valid {address_type} address"]
    owner = cluster_ip_owners.get(facts.canonical)
    if owner is None:
        return facts.problems
    return [*facts.problems, f"may not be a ClusterIP of a Service ({owner})"]


def _validate_slice_ports(ports: list[model.EndpointPort]) -> list[FieldError]:
    if len(ports) > MAX_SLICE_PORTS:
        return [too_many("ports", len(ports), MAX_SLICE_PORTS)]
    errors = []
    seen: set[str] = set()
    for i, port in enumerate(ports):
        path = f"ports[{i}]"
        name = port.name or ""
        if name:
            errors += [invalid(f"{path}.name", name, msg) for msg in names.is_dns1123_label(name)]
        if name in seen:
            errors.append(duplicate(f"{path}.name", name))
        seen.add(name)
        if port.protocol is None:
            errors.append(required(f"{path}.protocol"))
        if port.port is not None:
            errors += [invalid(f"{path}.port", port.port, msg) for msg in names.is_valid_port_num(port.port)]
    return errors


# --- Node and Namespace ------------------------------------------------------------------


def validate_node(node: model.Node) -> list[FieldError]:
    errors = _validate_meta(node.metadata, names.is_dns1123_subdomain, namespaced=False)
    for i, cidr in enumerate(node.spec.pod_cidrs):
        errors += [invalid(f"spec.podCIDRs[{i}]", cidr, msg) for msg in names.is_valid_cidr(cidr)]
    return errors


def validate_namespace(namespace: model.Namespace) -> list[FieldError]:
    return _validate_meta(namespace.metadata, names.is_dns1123_label, namespaced=False)



# --- ServiceCIDR ----------------------------------------------------------------------------


def validate_service_cidr(cidr: model.ServiceCIDR) -> list[FieldError]:
    """``pkg/apis/networking/validation/validation.go`` ValidateServiceCIDR: one or two CIDRs,
    one per family, each valid and canonical (``IsValidCIDR`` of k8s.io/apimachinery
    ``pkg/util/validation/ip.go``). Overlapping ServiceCIDRs are valid there (KEP-1880: a
    range can be grown by adding a larger one that contains it), and so they are here."""
    errors = _validate_meta(cidr.metadata, names.is_dns1123_subdomain, namespaced=False)
    cidrs = cidr.spec.cidrs
    path = "spec.cidrs"
    if not cidrs:
        return errors + [required(path, "at least one CIDR required")]
    if len(cidrs) > 2:
        return errors + [invalid(path, cidrs, "may only hold up to 2 values")]
    if len(cidrs) == 2 and not _dual_stack_cidrs(cidrs):
        return errors + [invalid(path, cidrs,
                                 "may specify no more than one IP for each IP family, i.e 192.168.0.0/24 and 2001:db8::/64")]
    for i, value in enumerate(cidrs):
        errors += [invalid(f"{path}[{i}]", value, msg) for msg in names.is_canonical_cidr(value)]
    return errors


def _dual_stack_cidrs(cidrs: Sequence[str]) -> bool:
    """netutils.IsDualStackCIDRStrings: both parse, and their families differ."""
    families = []
    for value in cidrs:
        try:
            families.append(ipaddress.ip_network(value.strip(), strict=False).version)
        except ValueError:
            return False
    return len(set(families)) == len(families)


# --- Pod: what the EndpointSlice controller reads ------------------------------------------


def validate_pod(pod: model.Pod) -> list[FieldError]:
    errors = _validate_meta(pod.metadata, names.is_dns1123_subdomain, namespaced=True)
    for group, containers in (("containers", pod.spec.containers), ("initContainers", pod.spec.init_containers)):
        for i, container in enumerate(containers):
            for j, port in enumerate(container.ports):
                path = f"spec.{group}[{i}].ports[{j}]"
                if port.name:
                    errors += [invalid(f"{path}.name", port.name, msg) for msg in names.is_valid_port_name(port.name)]
                errors += [invalid(f"{path}.containerPort", port.container_port, msg)
                           for msg in names.is_valid_port_num(port.container_port)]
    if pod.spec.hostname:
        errors += [invalid("spec.hostname", pod.spec.hostname, msg) for msg in names.is_dns1123_label(pod.spec.hostname)]
    if pod.spec.subdomain:
        errors += [invalid("spec.subdomain", pod.spec.subdomain, msg)
                   for msg in names.is_dns1123_label(pod.spec.subdomain)]
    families = []
    status = pod.status
    if status.pod_ip:
        errors += [invalid("status.podIP", status.pod_ip, msg) for msg in names.is_valid_ip(status.pod_ip)]
    for i, entry in enumerate(status.pod_ips):
        problems = names.is_valid_ip(entry.ip)
        if not (i == 0 and entry.ip == status.pod_ip):  # reported as status.podIP
            errors += [invalid(f"status.podIPs[{i}].ip", entry.ip, msg) for msg in problems]
        if not problems:
            families.append(names.ip_family(entry.ip))
    if len(families) != len(set(families)):
        errors.append(invalid("status.podIPs", [e.ip for e in pod.status.pod_ips],
                              "may specify no more than one IP for each IP family"))
    if pod.status.pod_ip and pod.status.pod_ips and pod.status.pod_ip != pod.status.pod_ips[0].ip:
        errors.append(invalid("status.podIP", pod.status.pod_ip, "must match status.podIPs[0].ip"))
    return errors

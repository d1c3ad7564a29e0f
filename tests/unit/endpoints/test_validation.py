"""API-server validation: one valid and one invalid case per rule, with the exact message.

Sources: pkg/apis/core/validation/validation.go (ValidateService and helpers),
pkg/apis/discovery/validation/validation.go (ValidateEndpointSlice),
k8s.io/apimachinery/pkg/util/validation (name and port checks).
"""

from __future__ import annotations

from typing import Any

import pytest

from kubeport.endpoints import model
from kubeport.endpoints.fielderrors import Invalid, invalid, required
from kubeport.endpoints.validation import (
    validate,
    validate_endpoint_slice,
    validate_namespace,
    validate_node,
    validate_service,
)

from support import api

DNS1035 = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
    "character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for "
    "validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
DNS1123_LABEL = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
    "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
DNS1123_SUBDOMAIN = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
PORT_RANGE = "must be between 1 and 65535, inclusive"
ONLY_LB = "may only be used when `type` is 'LoadBalancer'"


def service(spec: dict[str, Any] | None = None, name: str = "web", namespace: str = "default") -> model.Service:
    return api.to_model(api.service(name, namespace, **(spec if spec is not None else {"ports": [{"port": 80}]})))


def messages(errors) -> list[str]:
    return [str(e) for e in errors]


def ports(*numbers: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"name": f"p{i}", "port": n, **extra} for i, n in enumerate(numbers)]


SERVICE_CASES = [
    # metadata (ValidateObjectMeta with NameIsDNS1035Label; namespace a DNS-1123 label)
    ("name_dns1035__valid", service(name="web-1"), []),
    ("name_dns1035__leading_digit", service(name="1web"), [f'metadata.name: Invalid value: "1web": {DNS1035}']),
    ("name_dns1035__too_long", service(name="a" * 64), [f'metadata.name: Invalid value: "{"a" * 64}": must be no more than 63 characters']),
    ("name_required", service(name=""), ["metadata.name: Required value: name or generateName is required"]),
    ("namespace_dns1123_label__valid", service(namespace="team-a"), []),
    ("namespace_dns1123_label__invalid", service(namespace="Team_A"), [f'metadata.namespace: Invalid value: "Team_A": {DNS1123_LABEL}']),
    # ports
    ("ports_required", service({}), ["spec.ports: Required value"]),
    ("ports_not_required_when_headless", service({"clusterIP": "None"}), []),
    ("ports_not_required_for_external_name", service({"type": "ExternalName", "externalName": "example.com"}), []),
    ("port_name_optional_for_single_port", service({"ports": [{"port": 80}]}), []),
    ("port_name_required_when_multiple", service({"ports": [{"name": "http", "port": 80}, {"port": 443}]}), ["spec.ports[1].name: Required value"]),
    ("port_name__valid_iana", service({"ports": [{"name": "http-alt-8080", "port": 80}]}), []),
    # Service port names are DNS-1123 labels (ValidateDNS1123Label), not IANA_SVC_NAME.
    ("port_name__longer_than_15_is_fine__dns1123_label", service({"ports": [{"name": "http-metrics-endpoint", "port": 80}]}), []),
    ("port_name__digits_only_is_fine__dns1123_label", service({"ports": [{"name": "8080", "port": 80}]}), []),
    ("port_name__too_long", service({"ports": [{"name": "a" * 64, "port": 80}]}), [f'spec.ports[0].name: Invalid value: "{"a" * 64}": must be no more than 63 characters']),
    ("port_name__uppercase", service({"ports": [{"name": "Http", "port": 80}]}), ['spec.ports[0].name: Invalid value: "Http": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or \'-\', and must start and end with an alphanumeric character (e.g. \'my-name\',  or \'123-abc\', regex used for validation is \'[a-z0-9]([-a-z0-9]*[a-z0-9])?\')']),
    ("port_name__leading_hyphen", service({"ports": [{"name": "-web", "port": 80}]}), ['spec.ports[0].name: Invalid value: "-web": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or \'-\', and must start and end with an alphanumeric character (e.g. \'my-name\',  or \'123-abc\', regex used for validation is \'[a-z0-9]([-a-z0-9]*[a-z0-9])?\')']),
    ("port_name__duplicate", service({"ports": [{"name": "web", "port": 80}, {"name": "web", "port": 81}]}), ['spec.ports[1].name: Duplicate value: "web"']),
    ("port_number__valid_bounds", service({"ports": ports(1, 65535)}), []),
    ("port_number__zero", service({"ports": [{"port": 0, "targetPort": 80}]}), [f"spec.ports[0].port: Invalid value: 0: {PORT_RANGE}"]),
    ("port_number__too_big", service({"ports": [{"port": 65536, "targetPort": 80}]}), [f"spec.ports[0].port: Invalid value: 65536: {PORT_RANGE}"]),
    ("target_port_number__invalid", service({"ports": [{"port": 80, "targetPort": 70000}]}), [f"spec.ports[0].targetPort: Invalid value: 70000: {PORT_RANGE}"]),
    ("target_port_name__valid", service({"ports": [{"port": 80, "targetPort": "http"}]}), []),
    ("target_port_name__invalid", service({"ports": [{"port": 80, "targetPort": "http_web"}]}), ['spec.ports[0].targetPort: Invalid value: "http_web": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)']),
    ("port_protocol_pair__tcp_and_udp_may_share", service({"ports": [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53}]}), []),
    ("port_protocol_pair__duplicate", service({"ports": ports(80, 80)}), ['spec.ports[1]: Duplicate value: "80/TCP"']),
    # node ports
    ("node_port__allowed_on_node_port_type", service({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}), []),
    ("node_port__forbidden_on_cluster_ip", service({"ports": [{"port": 80, "nodePort": 30080}]}), ["spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'"]),
    ("node_port__same_value_other_protocol", service({"type": "NodePort", "ports": [{"name": "a", "port": 53, "nodePort": 30053}, {"name": "b", "port": 53, "protocol": "UDP", "nodePort": 30053}]}), []),
    ("node_port__duplicate", service({"type": "NodePort", "ports": [{"name": "a", "port": 80, "nodePort": 30080}, {"name": "b", "port": 81, "nodePort": 30080}]}), ["spec.ports[1].nodePort: Duplicate value: 30080"]),
    # session affinity (pkg/apis/core/validation/validation.go validateClientIPAffinityConfig)
    ("affinity_timeout__max_86400_accepted", service({"ports": [{"port": 80}], "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 86400}}}), []),
    ("affinity_timeout__zero", service({"ports": [{"port": 80}], "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 0}}}), ["spec.sessionAffinityConfig.clientIP.timeoutSeconds: Invalid value: 0: must be greater than 0 and less than 86400"]),
    ("affinity_timeout__above_max", service({"ports": [{"port": 80}], "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 86401}}}), ["spec.sessionAffinityConfig.clientIP.timeoutSeconds: Invalid value: 86401: must be greater than 0 and less than 86400"]),
    # SetDefaults_Service clears sessionAffinityConfig when affinity is None, before validation.
    ("affinity_config__dropped_when_none__api_defaults", service({"ports": [{"port": 80}], "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}), []),
    ("affinity_config__dropped_when_none_explicit__api_defaults", service({"ports": [{"port": 80}], "sessionAffinity": "None", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 0}}}), []),
    # traffic policies
    ("external_traffic_policy__cluster_ip_with_external_ips", service({"ports": [{"port": 80}], "externalIPs": ["192.0.2.10"], "externalTrafficPolicy": "Local"}), []),
    ("external_traffic_policy__not_externally_accessible", service({"ports": [{"port": 80}], "externalTrafficPolicy": "Local"}), ['spec.externalTrafficPolicy: Invalid value: "Local": may only be set for externally-accessible services']),
    ("health_check_node_port__lb_local", service({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "healthCheckNodePort": 30999, "ports": [{"port": 80}]}), []),
    ("health_check_node_port__only_lb_local", service({"type": "NodePort", "healthCheckNodePort": 30999, "ports": [{"port": 80}]}), ["spec.healthCheckNodePort: Invalid value: 30999: may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'"]),
    ("traffic_distribution__prefer_close", service({"ports": [{"port": 80}], "trafficDistribution": "PreferClose"}), []),
    ("traffic_distribution__prefer_same_zone", service({"ports": [{"port": 80}], "trafficDistribution": "PreferSameZone"}), []),
    ("traffic_distribution__prefer_same_node", service({"ports": [{"port": 80}], "trafficDistribution": "PreferSameNode"}), []),
    ("traffic_distribution__unsupported", service({"ports": [{"port": 80}], "trafficDistribution": "Nearest"}), ['spec.trafficDistribution: Unsupported value: "Nearest": supported values: "PreferClose", "PreferSameZone", "PreferSameNode"']),
    # ExternalName
    ("external_name__trailing_dot_allowed", service({"type": "ExternalName", "externalName": "www.example.com."}), []),
    ("external_name__required", service({"type": "ExternalName"}), ["spec.externalName: Required value"]),
    ("external_name__dns1123_subdomain", service({"type": "ExternalName", "externalName": "www_example.com"}), [f'spec.externalName: Invalid value: "www_example.com": {DNS1123_SUBDOMAIN}']),
    ("external_name__no_cluster_ip", service({"type": "ExternalName", "externalName": "example.com", "clusterIP": "10.96.0.20"}), ["spec.clusterIPs: Forbidden: may not be set for ExternalName services"]),
    # externalIPs (ValidateNonSpecialIP)
    ("external_ips__valid", service({"ports": [{"port": 80}], "externalIPs": ["192.0.2.10", "2001:db8::10"]}), []),
    ("external_ips__not_an_ip", service({"ports": [{"port": 80}], "externalIPs": ["example.com"]}), ['spec.externalIPs[0]: Invalid value: "example.com": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)']),
    ("external_ips__loopback", service({"ports": [{"port": 80}], "externalIPs": ["127.0.0.1"]}), ['spec.externalIPs[0]: Invalid value: "127.0.0.1": may not be in the loopback range (127.0.0.0/8, ::1/128)']),
    # load balancer fields
    ("lb_source_ranges__valid", service({"type": "LoadBalancer", "ports": [{"port": 80}], "loadBalancerSourceRanges": ["10.0.0.0/8", " 192.0.2.0/24 "]}), []),
    ("lb_source_ranges__invalid_cidr", service({"type": "LoadBalancer", "ports": [{"port": 80}], "loadBalancerSourceRanges": ["10.0.0.0/33"]}), ['spec.LoadBalancerSourceRanges[0]: Invalid value: "10.0.0.0/33": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)']),
    ("lb_source_ranges__only_lb", service({"ports": [{"port": 80}], "loadBalancerSourceRanges": ["10.0.0.0/8"]}), [f"spec.LoadBalancerSourceRanges: Forbidden: {ONLY_LB}"]),
    ("allocate_lb_node_ports__only_lb", service({"type": "NodePort", "ports": [{"port": 80}], "allocateLoadBalancerNodePorts": False}), [f"spec.allocateLoadBalancerNodePorts: Forbidden: {ONLY_LB}"]),
    ("load_balancer_class__only_lb", service({"ports": [{"port": 80}], "loadBalancerClass": "example.com/lb"}), [f"spec.loadBalancerClass: Forbidden: {ONLY_LB}"]),
    # clusterIP / clusterIPs / ipFamilies (ValidateServiceClusterIPsRelatedFields)
    ("cluster_ip__none_on_cluster_ip_type", service({"clusterIP": "None", "ports": [{"port": 80}]}), []),
    ("cluster_ip__none_on_node_port", service({"type": "NodePort", "clusterIP": "None", "ports": [{"port": 80}]}), ["spec.clusterIPs[0]: Invalid value: \"None\": may not be set to 'None' for NodePort services"]),
    ("cluster_ip__none_on_load_balancer", service({"type": "LoadBalancer", "clusterIP": "None", "ports": [{"port": 80}]}), ["spec.clusterIPs[0]: Invalid value: \"None\": may not be set to 'None' for LoadBalancer services"]),
    ("cluster_ips__not_an_ip", service({"clusterIP": "10.96.0.300", "ports": [{"port": 80}]}), ['spec.clusterIPs[0]: Invalid value: "10.96.0.300": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)']),
    ("cluster_ips__first_must_match_cluster_ip", service({"clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.21"], "ports": [{"port": 80}]}), ['spec.clusterIPs: Invalid value: []string{"10.96.0.21"}: first value must match `clusterIP`']),
    ("cluster_ips__none_first_and_only", service({"clusterIPs": ["None", "fd00::1"], "ports": [{"port": 80}]}), ['spec.clusterIPs: Invalid value: []string{"None", "fd00::1"}: \'None\' must be the first and only value']),
    ("cluster_ips__at_most_two", service({"clusterIPs": ["10.96.0.20", "fd00::20", "10.96.0.21"], "ipFamilyPolicy": "RequireDualStack", "ports": [{"port": 80}]}), ['spec.clusterIPs: Invalid value: []string{"10.96.0.20", "fd00::20", "10.96.0.21"}: may only hold up to 2 values', 'spec.clusterIPs: Invalid value: []string{"10.96.0.20", "fd00::20", "10.96.0.21"}: may specify no more than one IP for each IP family']),
    ("cluster_ips__dual_stack_pair", service({"clusterIPs": ["10.96.0.20", "fd00::20"], "ipFamilyPolicy": "RequireDualStack", "ports": [{"port": 80}]}), []),
    ("cluster_ips__one_per_family", service({"clusterIPs": ["10.96.0.20", "10.96.0.21"], "ipFamilyPolicy": "RequireDualStack", "ports": [{"port": 80}]}), ['spec.clusterIPs: Invalid value: []string{"10.96.0.20", "10.96.0.21"}: may specify no more than one IP for each IP family']),
    ("cluster_ips__match_ip_families", service({"clusterIP": "10.96.0.20", "ipFamilies": ["IPv6"], "ports": [{"port": 80}]}), ['spec.clusterIPs[0]: Invalid value: "10.96.0.20": expected an IPv6 value as indicated by `ipFamilies[0]`']),
    ("ip_families__duplicate", service({"ipFamilies": ["IPv4", "IPv4"], "ipFamilyPolicy": "PreferDualStack", "ports": [{"port": 80}]}), ['spec.ipFamilies[1]: Duplicate value: "IPv4"']),
]


@pytest.mark.parametrize("svc, expected", [c[1:] for c in SERVICE_CASES], ids=[c[0] for c in SERVICE_CASES])
def test_service_validation(svc: model.Service, expected: list[str]) -> None:
    assert messages(validate_service(svc)) == expected


def endpoint_slice(
    addresses: list[str] | None = None,
    address_type: str = "IPv4",
    name: str = "web-abc",
    ports: list[dict[str, Any]] | None = None,
    **endpoint: Any,
) -> model.EndpointSlice:
    return api.to_model(api.endpoint_slice(
        name=name, address_type=address_type,
        endpoints=[{"addresses": addresses if addresses is not None else ["10.244.1.11"], **endpoint}],
        ports=ports if ports is not None else [{"name": "http", "port": 8080}],
    ))


def too_many_endpoints() -> model.EndpointSlice:
    eps = endpoint_slice()
    eps.endpoints = eps.endpoints * 1001
    return eps


def address_error(address: str, detail: str) -> str:
    return f'endpoints[0].addresses[0]: Invalid value: "{address}": {detail}'


SLICE_CASES = [
    ("slice_name_dns1123_subdomain__valid", endpoint_slice(name="web-abc.v1"), []),
    ("slice_name_dns1123_subdomain__invalid", endpoint_slice(name="Web_1"), [f'metadata.name: Invalid value: "Web_1": {DNS1123_SUBDOMAIN}']),
    ("address_ipv4__valid", endpoint_slice(["10.244.1.11"]), []),
    ("address_ipv4__is_ipv6", endpoint_slice(["fd00::1"]), [address_error("fd00::1", "must be a valid IPv4 address")]),
    ("address_ipv6__valid", endpoint_slice(["fd00:10:244:1::11"], "IPv6"), []),
    ("address_ipv6__is_ipv4", endpoint_slice(["10.244.1.11"], "IPv6"), [address_error("10.244.1.11", "must be a valid IPv6 address")]),
    ("address__loopback_ipv4", endpoint_slice(["127.0.0.2"]), [address_error("127.0.0.2", "may not be in the loopback range (127.0.0.0/8, ::1/128)")]),
    ("address__loopback_ipv6", endpoint_slice(["::1"], "IPv6"), [address_error("::1", "may not be in the loopback range (127.0.0.0/8, ::1/128)")]),
    ("address__link_local_ipv4", endpoint_slice(["169.254.169.254"]), [address_error("169.254.169.254", "may not be in the link-local range (169.254.0.0/16, fe80::/10)")]),
    ("address__link_local_ipv6", endpoint_slice(["fe80::1"], "IPv6"), [address_error("fe80::1", "may not be in the link-local range (169.254.0.0/16, fe80::/10)")]),
    ("address__link_local_multicast", endpoint_slice(["224.0.0.5"]), [address_error("224.0.0.5", "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)")]),
    ("address__multicast__kubeport_stricter", endpoint_slice(["239.1.2.3"]), [address_error("239.1.2.3", "may not be in the multicast range (224.0.0.0/4, ff00::/8)")]),
    ("address__multicast_ipv6__kubeport_stricter", endpoint_slice(["ff05::1"], "IPv6"), [address_error("ff05::1", "may not be in the multicast range (224.0.0.0/4, ff00::/8)")]),
    ("address__unspecified", endpoint_slice(["0.0.0.0"]), [address_error("0.0.0.0", "may not be unspecified (0.0.0.0)")]),
    ("address_fqdn__valid", endpoint_slice(["db.example.com"], "FQDN"), []),
    ("address_fqdn__invalid", endpoint_slice(["db_1.example.com"], "FQDN"), [address_error("db_1.example.com", DNS1123_SUBDOMAIN)]),
    ("addresses__required", endpoint_slice([]), ["endpoints[0].addresses: Required value: must contain at least 1 address"]),
    ("endpoints__at_most_1000", too_many_endpoints(), ["endpoints: Too many: 1001: must have at most 1000 items"]),
    ("hostname__valid", endpoint_slice(hostname="db-0"), []),
    ("hostname__dns1123_label", endpoint_slice(hostname="db.0"), ['endpoints[0].hostname: Invalid value: "db.0": must not contain dots']),
    ("node_name__valid", endpoint_slice(nodeName="node-a.example"), []),
    ("node_name__dns1123_subdomain", endpoint_slice(nodeName="Node_A"), [f'endpoints[0].nodeName: Invalid value: "Node_A": {DNS1123_SUBDOMAIN}']),
    ("slice_ports__at_most_100", endpoint_slice(ports=[{"name": f"p{i}", "port": 1000 + i} for i in range(101)]), ["ports: Too many: 101: must have at most 100 items"]),
    ("slice_port_name__empty_allowed", endpoint_slice(ports=[{"port": 8080}]), []),
    ("slice_port_name__invalid", endpoint_slice(ports=[{"name": "Http", "port": 8080}]), ['ports[0].name: Invalid value: "Http": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or \'-\', and must start and end with an alphanumeric character (e.g. \'my-name\',  or \'123-abc\', regex used for validation is \'[a-z0-9]([-a-z0-9]*[a-z0-9])?\')']),
    ("slice_port_name__duplicate", endpoint_slice(ports=[{"name": "http", "port": 8080}, {"name": "http", "port": 8081}]), ['ports[1].name: Duplicate value: "http"']),
    ("slice_port_number__unset_allowed", endpoint_slice(ports=[{"name": "http"}]), []),
    ("slice_port_number__range", endpoint_slice(ports=[{"name": "http", "port": 0}]), [f"ports[0].port: Invalid value: 0: {PORT_RANGE}"]),
    ("slice_port_protocol__required", endpoint_slice(ports=[{"name": "http", "port": 8080, "protocol": None}]), ["ports[0].protocol: Required value"]),
]


@pytest.mark.parametrize("eps, expected", [c[1:] for c in SLICE_CASES], ids=[c[0] for c in SLICE_CASES])
def test_endpoint_slice_validation(eps: model.EndpointSlice, expected: list[str]) -> None:
    assert messages(validate_endpoint_slice(eps)) == expected


@pytest.mark.parametrize(
    "address, owners, expected",
    [
        ("10.244.1.11", {"10.96.0.20": "default/web"}, []),
        ("10.96.0.20", {"10.96.0.20": "default/web"}, [address_error("10.96.0.20", "may not be a ClusterIP of a Service (default/web)")]),
    ],
    ids=["address__not_a_cluster_ip__valid", "address__cluster_ip_of_a_service"],
)
def test_endpoint_address_is_not_a_cluster_ip(address: str, owners: dict[str, str], expected: list[str]) -> None:
    assert messages(validate(endpoint_slice([address]), owners)) == expected


@pytest.mark.parametrize(
    "obj, expected",
    [
        (model.Node.model_validate({"metadata": {"name": "node-a.example"}}), []),
        (model.Node.model_validate({"metadata": {"name": "Node_A"}}), [f'metadata.name: Invalid value: "Node_A": {DNS1123_SUBDOMAIN}']),
        (model.Node.model_validate({"metadata": {"name": "node-a"}, "spec": {"podCIDRs": ["10.244.1.0/33"]}}), ['spec.podCIDRs[0]: Invalid value: "10.244.1.0/33": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)']),
        (model.Namespace.model_validate({"metadata": {"name": "demo"}}), []),
        (model.Namespace.model_validate({"metadata": {"name": "demo.v1"}}), ['metadata.name: Invalid value: "demo.v1": must not contain dots']),
    ],
    ids=[
        "node_name_dns1123_subdomain__valid",
        "node_name_dns1123_subdomain__invalid",
        "node_pod_cidr__invalid",
        "namespace_name_dns1123_label__valid",
        "namespace_name_dns1123_label__invalid",
    ],
)
def test_node_and_namespace_validation(obj: model.KubeObject, expected: list[str]) -> None:
    check = validate_node if isinstance(obj, model.Node) else validate_namespace
    assert messages(check(obj)) == expected
    assert messages(validate(obj)) == expected


def test_invalid_prints_one_api_style_line_per_problem() -> None:
    exc = Invalid("Service", "web", [required("spec.ports[1].name"), invalid("spec.ports[0].port", 0, PORT_RANGE)])
    assert str(exc) == (
        'Service "web" is invalid: spec.ports[1].name: Required value\n'
        f'Service "web" is invalid: spec.ports[0].port: Invalid value: 0: {PORT_RANGE}'
    )
    assert exc.lines() == str(exc).splitlines()


def test_invalid_endpoint_slice_uses_the_qualified_kind() -> None:
    exc = Invalid("EndpointSlice", "web-abc", [required("endpoints[0].addresses", "must contain at least 1 address")])
    assert str(exc) == (
        'EndpointSlice.discovery.k8s.io "web-abc" is invalid: endpoints[0].addresses: Required value: must contain at least 1 address'
    )

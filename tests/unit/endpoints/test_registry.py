"""The embedded API server: admission, allocation, persistence, release.

Behaviour follows pkg/registry/core/service/storage/alloc.go (initIPFamilyFields,
allocClusterIPs, initNodePorts, allocHealthCheckNodePort) and the band allocators
(portallocator/allocator.go and ipallocator/bitmap.go calculateRangeOffset; KEP-3668, KEP-3070).
"""

from __future__ import annotations

import ipaddress

import pytest

from kubeport.endpoints import model

from support import api
from support.registry import T0, V4, V6, make_registry, node_port_service, refused, service, snapshot  # noqa: F401


# --- the DNS address ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "cidrs, dns_ip",
    [((V4,), "10.96.0.10"), (("10.0.0.0/24",), "10.0.0.10"), ((V6, V4), "fd00:10:96::a")],
    ids=["kubeadm_default__10.96.0.10", "small_range", "ipv6_primary"],
)
def test_dns_ip_is_the_tenth_address_of_the_first_range(cidrs: tuple[str, ...], dns_ip: str) -> None:
    assert make_registry(cidrs=cidrs).dns_ip == dns_ip


def test_dns_ip_never_dynamic_but_kube_dns_gets_it_explicitly() -> None:
    registry = make_registry(cidrs=("10.96.0.0/28",))  # 13 usable besides .10
    handed_out = {registry.admit(service(f"s{i}")).spec.cluster_ip for i in range(13)}
    assert "10.96.0.10" not in handed_out
    assert refused(registry, service("s13")) == [
        'Service "s13" is invalid: spec.clusterIPs: Internal error: failed to allocate a serviceIP: range is full'
    ]
    kube_dns = service("kube-dns", "kube-system", clusterIP="10.96.0.10", ports=[
        {"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53}])
    assert registry.admit(kube_dns).spec.cluster_ips == ["10.96.0.10"]


def test_kube_dns_gets_its_address_in_the_default_range() -> None:
    out = make_registry().admit(service("kube-dns", "kube-system", clusterIP="10.96.0.10"))
    assert (out.spec.cluster_ip, out.spec.cluster_ips) == ("10.96.0.10", ["10.96.0.10"])


# --- what a Service gets -------------------------------------------------------------------


def test_cluster_ip_service_gets_uid_timestamp_ip_and_families() -> None:
    svc = service()
    out = make_registry().admit(svc)
    assert out is not svc and svc.spec.cluster_ip is None and svc.metadata.uid is None
    assert out.metadata.uid and out.metadata.creation_timestamp == T0
    assert ipaddress.ip_address(out.spec.cluster_ip) in ipaddress.ip_network(V4)
    assert out.spec.cluster_ips == [out.spec.cluster_ip]
    assert (out.spec.ip_families, out.spec.ip_family_policy) == (["IPv4"], "SingleStack")
    assert out.spec.ports[0].node_port is None and out.spec.health_check_node_port is None


def test_readmission_returns_the_same_allocations() -> None:
    registry = make_registry()
    first = registry.admit(node_port_service())
    assert registry.admit(node_port_service()).to_api() == first.to_api()


def test_client_sent_uid_and_timestamp_are_ignored_as_the_api_server_does() -> None:
    svc = model.Service.model_validate(
        {"metadata": {"name": "web", "uid": "abc", "creationTimestamp": "2020-01-01T00:00:00Z"},
         "spec": {"ports": [{"port": 80}]}}
    )
    out = make_registry().admit(svc)
    assert out.metadata.uid != "abc" and out.metadata.creation_timestamp == T0


def test_node_port_service_gets_node_ports_in_the_dynamic_band__kep3668() -> None:
    out = make_registry().admit(node_port_service("web", 0, 0))
    node_ports = [p.node_port for p in out.spec.ports]
    assert all(30086 <= np <= 32767 for np in node_ports) and len(set(node_ports)) == 2


def test_tcp_and_udp_of_one_port_number_share_a_node_port() -> None:
    registry = make_registry()
    dns = service("dns", type="NodePort", ports=[
        {"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}])
    out = registry.admit(dns)
    udp, tcp = (p.node_port for p in out.spec.ports)
    assert udp == tcp and registry.usage()["nodePorts"] == 1


def test_explicit_node_port_is_shared_with_the_other_protocol() -> None:
    dns = service("dns", type="NodePort", ports=[
        {"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "nodePort": 30053}])
    assert [p.node_port for p in make_registry().admit(dns).spec.ports] == [30053, 30053]


def test_load_balancer_local_gets_a_health_check_node_port() -> None:
    registry = make_registry()
    out = registry.admit(service(type="LoadBalancer", externalTrafficPolicy="Local"))
    hc = out.spec.health_check_node_port
    assert hc and 30086 <= hc <= 32767 and hc != out.spec.ports[0].node_port
    assert registry.usage()["nodePorts"] == 2


def test_load_balancer_cluster_policy_gets_no_health_check_node_port() -> None:
    out = make_registry().admit(service(type="LoadBalancer"))
    assert out.spec.health_check_node_port is None and out.spec.ports[0].node_port


def test_explicit_health_check_node_port_is_honoured() -> None:
    out = make_registry().admit(service(type="LoadBalancer", externalTrafficPolicy="Local", healthCheckNodePort=30999))
    assert out.spec.health_check_node_port == 30999


def test_allocate_load_balancer_node_ports_false_gets_none_but_explicit_is_kept() -> None:
    registry = make_registry()
    out = registry.admit(service(type="LoadBalancer", allocateLoadBalancerNodePorts=False, ports=[
        {"name": "http", "port": 80}, {"name": "https", "port": 443, "nodePort": 30443}]))
    assert [p.node_port for p in out.spec.ports] == [None, 30443]
    assert registry.usage()["nodePorts"] == 1


@pytest.mark.parametrize(
    "spec, families, policy, ips",
    [
        ({"clusterIP": "None"}, ["IPv4"], "SingleStack", ["None"]),
        ({"clusterIP": "None", "selector": None}, ["IPv4", "IPv6"], "RequireDualStack", ["None"]),
    ],
    ids=["headless_with_selector", "headless_selectorless_defaults_to_dual_stack__alloc_go"],
)
def test_headless_gets_families_but_no_cluster_ip(spec, families, policy, ips) -> None:
    spec = {"selector": {"app": "db"}, **spec}
    registry = make_registry()
    out = registry.admit(service("db", **spec))
    assert (out.spec.ip_families, out.spec.ip_family_policy, out.spec.cluster_ips) == (families, policy, ips)
    assert registry.service_cluster_ips() == set()


def test_external_name_gets_no_cluster_ip() -> None:
    registry = make_registry()
    out = registry.admit(service("search", type="ExternalName", externalName="www.example.com", ports=[]))
    assert out.spec.cluster_ip is None and out.spec.ip_families is None
    assert registry.service_cluster_ips() == set()


# --- dual-stack ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cidrs, spec, families, policy",
    [
        ((V4, V6), {}, ["IPv4"], "SingleStack"),
        ((V4, V6), {"ipFamilies": ["IPv6"]}, ["IPv6"], "SingleStack"),
        ((V4, V6), {"ipFamilyPolicy": "PreferDualStack"}, ["IPv4", "IPv6"], "PreferDualStack"),
        ((V4, V6), {"ipFamilyPolicy": "RequireDualStack"}, ["IPv4", "IPv6"], "RequireDualStack"),
        ((V4, V6), {"ipFamilyPolicy": "PreferDualStack", "ipFamilies": ["IPv6"]}, ["IPv6", "IPv4"], "PreferDualStack"),
        ((V6, V4), {}, ["IPv6"], "SingleStack"),
        ((V4,), {"ipFamilyPolicy": "PreferDualStack"}, ["IPv4"], "PreferDualStack"),
        ((V4, V6), {"clusterIP": "fd00:10:96::50"}, ["IPv6"], "SingleStack"),
    ],
    ids=[
        "single_stack_default_primary_family",
        "single_stack_requested_family",
        "prefer_dual_stack_on_dual_cluster",
        "require_dual_stack_on_dual_cluster",
        "prefer_dual_stack_ipv6_first",
        "ipv6_primary_cluster",
        "prefer_dual_stack_on_single_cluster",
        "family_inferred_from_cluster_ip",
    ],
)
def test_ip_family_policies(cidrs, spec, families, policy) -> None:
    out = make_registry(cidrs=cidrs).admit(service(**spec))
    assert (out.spec.ip_families, out.spec.ip_family_policy) == (families, policy)
    assert [("IPv4" if ipaddress.ip_address(ip).version == 4 else "IPv6") for ip in out.spec.cluster_ips] == families


def test_explicit_cluster_ips_honoured_per_family() -> None:
    out = make_registry(cidrs=(V4, V6)).admit(
        service(clusterIPs=["10.96.0.50", "fd00:10:96::50"], ipFamilyPolicy="RequireDualStack"))
    assert out.spec.cluster_ips == ["10.96.0.50", "fd00:10:96::50"] and out.spec.cluster_ip == "10.96.0.50"


@pytest.mark.parametrize(
    "spec, expected",
    [
        ({"ipFamilyPolicy": "RequireDualStack"},
         'spec.ipFamilyPolicy: Invalid value: "RequireDualStack": this cluster is not configured for dual-stack services'),
        ({"ipFamilies": ["IPv6"]}, 'spec.ipFamilies[0]: Invalid value: "IPv6": not configured on this cluster'),
        ({"clusterIP": "fd00:10:96::50"},
         'spec.clusterIPs[0]: Invalid value: []string{"fd00:10:96::50"}: IPv6 is not configured on this cluster'),
        ({"clusterIPs": ["10.96.0.50", "fd00:10:96::50"]},
         'spec.ipFamilyPolicy: Invalid value: "SingleStack": must be \'RequireDualStack\' or \'PreferDualStack\' when multiple cluster IPs are specified\n'
         'spec.clusterIPs[1]: Invalid value: []string{"10.96.0.50", "fd00:10:96::50"}: IPv6 is not configured on this cluster'),
    ],
    ids=["require_dual_stack_on_single_cluster", "family_not_configured", "cluster_ip_family_not_configured",
         "single_stack_with_two_ips"],
)
def test_ip_family_errors__alloc_go(spec, expected) -> None:
    registry = make_registry()
    assert refused(registry, service(**spec)) == [f'Service "web" is invalid: {line}' for line in expected.splitlines()]
    assert snapshot(registry) == snapshot(make_registry())


def test_dual_to_single_stack_releases_the_secondary_ip() -> None:
    registry = make_registry(cidrs=(V4, V6))
    dual = registry.admit(service(ipFamilyPolicy="PreferDualStack"))
    single = registry.admit(service(ipFamilyPolicy="SingleStack"))
    assert single.spec.cluster_ips == dual.spec.cluster_ips[:1]
    assert registry.usage() == {"nodePorts": 0, "IPv4": 1, "IPv6": 0}


# --- other kinds --------------------------------------------------------------------------------------


def endpoint_slice(address: str) -> model.EndpointSlice:
    return api.to_model(api.endpoint_slice(name="web-abc", endpoints=[address], ports=[{"name": "http", "port": 8080}]))


def test_endpoint_slice_admitted_unchanged() -> None:
    eps = endpoint_slice("10.244.1.11")
    assert make_registry().admit(eps) is eps


def test_endpoint_address_may_not_be_a_cluster_ip() -> None:
    registry = make_registry()
    registry.admit(service("web", clusterIP="10.96.0.20"))
    assert refused(registry, endpoint_slice("10.96.0.20")) == [
        'EndpointSlice.discovery.k8s.io "web-abc" is invalid: endpoints[0].addresses[0]: '
        'Invalid value: "10.96.0.20": may not be a ClusterIP of a Service (default/web)'
    ]


def test_endpoint_slice_without_service_label_is_accepted_as_the_api_does() -> None:
    eps = model.EndpointSlice.model_validate(
        {"metadata": {"name": "orphan"}, "addressType": "IPv4", "endpoints": [{"addresses": ["10.244.1.11"]}]})
    assert make_registry().admit(eps) is eps


@pytest.mark.parametrize(
    "obj, expected",
    [
        (model.Node.model_validate({"metadata": {"name": "node-a"}}), None),
        (model.Namespace.model_validate({"metadata": {"name": "demo"}}), None),
        (model.Namespace.model_validate({"metadata": {"name": "Demo"}}), 'Namespace "Demo" is invalid: metadata.name'),
    ],
    ids=["node", "namespace", "namespace_invalid"],
)
def test_nodes_and_namespaces(obj: model.KubeObject, expected: str | None) -> None:
    registry = make_registry()
    if expected is None:
        assert registry.admit(obj) is obj
    else:
        assert refused(registry, obj)[0].startswith(expected)

"""The forwarding table: which frontends a snapshot asks for, and what each one does, as kube-proxy
programs them (kubernetes/kubernetes pkg/proxy/iptables/proxier.go syncProxyRules; the paths in
the comments are in that repository)."""

from __future__ import annotations

import dataclasses

import pytest

from kubeport.endpoints import convert, model
from kubeport.endpoints.types import NodeInfo, ServiceName, ServiceState
from kubeport.proxy.table import (
    Action,
    ForwardingTable,
    Frontend,
    FrontendKind,
    TableContext,
    build_table,
    service_rules,
)

from support.proxy_table import (  # the node, two slices, the rule summary
    BOTH,
    CIP,
    CTX,
    DROP,
    EIP,
    FWD,
    LB,
    LOCAL,
    NP,
    REFUSE,
    REMOTE,
    REMOTE_SLICE,
    WEB_SLICE,
    summarize,
)
from support.slim import endpoint, endpoint_slice, port, service, snapshot

CASES = [
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080)]), (WEB_SLICE,),
        {"10.96.0.20:80/TCP": (FWD, CIP, BOTH, None)},
        id="cluster_ip__one_frontend_per_port",
    ),
    pytest.param(
        service("web", ["10.96.0.20", "fd00:96::20"], [port(80, target=8080)]),
        (WEB_SLICE, endpoint_slice("web-v6", [endpoint("fd00:244::5")], [("", "TCP", 8080)], "IPv6")),
        {
            "10.96.0.20:80/TCP": (FWD, CIP, BOTH, None),
            "[fd00:96::20]:80/TCP": (FWD, CIP, ["[fd00:244::5]:8080"], None),
        },
        id="dual_stack_cluster_ips__each_family_uses_its_own_endpoints__kube_proxy_per_family",
    ),
    # pkg/proxy/serviceport.go: externalIPs filtered to the proxier's family
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080)], external_ips=("203.0.113.7", "2001:db8::7")),
        (WEB_SLICE,),
        {"10.96.0.20:80/TCP": (FWD, CIP, BOTH, None), "203.0.113.7:80/TCP": (FWD, EIP, BOTH, None)},
        id="external_ips__served_in_the_service_families_only",
    ),
    # pkg/proxy/util/utils.go IsVIPMode
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080)], type="LoadBalancer",
                load_balancer_ips=("198.51.100.9",)),
        (WEB_SLICE,),
        {"10.96.0.20:80/TCP": (FWD, CIP, BOTH, None), "198.51.100.9:80/TCP": (FWD, LB, BOTH, None)},
        id="load_balancer_vip__frontend_on_ingress_ip",
    ),
    # pkg/proxy/util/nodeport_addresses.go NewNodePortAddresses
    pytest.param(
        service("web", ["10.96.0.20", "fd00:96::20"], [port(80, target=8080, node_port=30080)], type="NodePort"),
        (WEB_SLICE,),
        {
            "10.96.0.20:80/TCP": (FWD, CIP, BOTH, None),
            "192.168.1.10:30080/TCP": (FWD, NP, BOTH, None),
            "[fd00:96::20]:80/TCP": (REFUSE, CIP, [], None),
            "[fd00:1::10]:30080/TCP": (REFUSE, NP, [], None),
        },
        id="node_port__on_the_chosen_node_addresses_per_family",
    ),
    # pkg/proxy/util/utils.go ShouldSkipService
    pytest.param(
        service("web", [], [port(80)], headless=True), (WEB_SLICE,), {},
        id="headless__never_proxied",
    ),
    # pkg/proxy/util/utils.go ShouldSkipService
    pytest.param(
        service("web", ["10.96.0.20"], [port(80)], type="ExternalName", external_name="example.com"),
        (WEB_SLICE,), {},
        id="external_name__never_proxied_even_with_a_cluster_ip",
    ),
    # cmd/kube-proxy/app/server.go: the informers' label selector
    pytest.param(
        service("web", ["10.96.0.20"], [port(80)], proxy_name="other-proxy"), (WEB_SLICE,), {},
        id="service_proxy_name_label__never_proxied",
    ),
    # cmd/kube-proxy/app/server.go: the informers' label selector
    pytest.param(
        service("web", ["10.96.0.20"], [port(80)], headless_label=True), (WEB_SLICE,), {},
        id="headless_label__never_proxied_even_with_a_cluster_ip",
    ),
    # cmd/kube-proxy/app/server.go: the informers' label selector
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080)]),
        (dataclasses.replace(WEB_SLICE, proxied=False), REMOTE_SLICE),
        {"10.96.0.20:80/TCP": (FWD, CIP, REMOTE, None)},
        id="slice_labelled_away_from_the_proxy__its_endpoints_unused",
    ),
    # pkg/proxy/util/utils.go ShouldSkipService
    pytest.param(
        service("web", [], [port(80)]), (WEB_SLICE,), {},
        id="no_cluster_ip_yet__nothing",
    ),
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, name="http", target="http")]),
        (
            endpoint_slice("web-a", [endpoint("10.244.1.5")], [("http", "TCP", 8080)]),
            endpoint_slice("web-b", [endpoint("10.244.1.6")], [("http", "TCP", 9090)]),
        ),
        {"10.96.0.20:80/TCP": (FWD, CIP, ["10.244.1.5:8080", "10.244.1.6:9090"], None)},
        id="named_target_port__resolved_per_slice",
    ),
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, name="http"), port(443, name="https")]),
        (endpoint_slice("web-a", [endpoint("10.244.1.5")], [("http", "TCP", 8080), ("https", "TCP", 8443)]),),
        {
            "10.96.0.20:80/TCP": (FWD, CIP, ["10.244.1.5:8080"], None),
            "10.96.0.20:443/TCP": (FWD, CIP, ["10.244.1.5:8443"], None),
        },
        id="multi_port__each_port_its_own_endpoint_port",
    ),
    pytest.param(
        service("dns", ["10.96.0.30"], [port(53, name="dns", protocol="UDP"), port(53, name="dns-tcp")]),
        (endpoint_slice("dns-a", [endpoint("10.244.1.7")], [("dns", "UDP", 5353), ("dns-tcp", "TCP", 5354)]),),
        {
            "10.96.0.30:53/UDP": (FWD, CIP, ["10.244.1.7:5353"], None),
            "10.96.0.30:53/TCP": (FWD, CIP, ["10.244.1.7:5354"], None),
        },
        id="udp_and_tcp_on_one_port_number__separate_frontends",
    ),
    # proxier.go syncProxyRules: REJECT
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080, node_port=30080)], type="NodePort"), (),
        {"10.96.0.20:80/TCP": (REFUSE, CIP, [], None), "192.168.1.10:30080/TCP": (REFUSE, NP, [], None)},
        id="no_endpoints__refuse_everywhere",
    ),
    # proxier.go syncProxyRules: REJECT
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080)]),
        (endpoint_slice("web-a", [endpoint("10.244.1.5", ready=False)], [("", "TCP", 8080)]),),
        {"10.96.0.20:80/TCP": (REFUSE, CIP, [], None)},
        id="only_unready_endpoints__refuse",
    ),
    # proxier.go syncProxyRules: DROP
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080)], internal_policy_local=True), (REMOTE_SLICE,),
        {"10.96.0.20:80/TCP": (DROP, CIP, [], None)},
        id="itp_local_without_local_endpoints__drop",
    ),
    # pkg/proxy/topology.go CategorizeEndpoints
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080)], internal_policy_local=True), (WEB_SLICE,),
        {"10.96.0.20:80/TCP": (FWD, CIP, LOCAL, None)},
        id="itp_local__local_endpoints_only",
    ),
    # proxier.go syncProxyRules: DROP from outside, local sources to the cluster set
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080, node_port=30080)], type="NodePort",
                external_policy_local=True),
        (REMOTE_SLICE,),
        {"10.96.0.20:80/TCP": (FWD, CIP, REMOTE, None), "192.168.1.10:30080/TCP": (DROP, NP, [], REMOTE)},
        id="etp_local_without_local_endpoints__drop_external_short_circuit_local_clients",
    ),
    # proxier.go syncProxyRules: local sources to the cluster set
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080, node_port=30080)], type="NodePort",
                external_policy_local=True),
        (WEB_SLICE,),
        {"10.96.0.20:80/TCP": (FWD, CIP, BOTH, None), "192.168.1.10:30080/TCP": (FWD, NP, LOCAL, BOTH)},
        id="etp_local__external_clients_local_set_local_clients_cluster_set",
    ),
    # pkg/proxy/serviceport.go ExternallyAccessible, UsesLocalEndpoints
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080)], external_ips=("203.0.113.7",),
                external_policy_local=True),
        (WEB_SLICE,),
        {"10.96.0.20:80/TCP": (FWD, CIP, BOTH, None), "203.0.113.7:80/TCP": (FWD, EIP, LOCAL, BOTH)},
        id="etp_local_applies_to_external_ips",
    ),
    # pkg/proxy/serviceport.go ExternallyAccessible
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080)], external_policy_local=True), (REMOTE_SLICE,),
        {"10.96.0.20:80/TCP": (FWD, CIP, REMOTE, None)},
        id="etp_local_on_port_not_externally_accessible__ignored",
    ),
    pytest.param(
        service("kube-dns", ["10.96.0.10"], [port(53, name="dns", protocol="UDP"), port(9153, name="metrics")],
                namespace="kube-system"),
        (endpoint_slice("dns-a", [endpoint("10.244.1.8")], [("dns", "UDP", 53), ("metrics", "TCP", 9153)]),),
        {"10.96.0.10:9153/TCP": (FWD, CIP, ["10.244.1.8:9153"], None)},
        id="reserved_dns_frontend__never_proxied",
    ),
]


@pytest.mark.parametrize(("info", "slices", "expected"), CASES)
def test_service_rules(info, slices, expected):
    """Frontends and actions per Service: proxier.go syncProxyRules over topology.go CategorizeEndpoints."""
    ctx = TableContext(
        node_name=CTX.node_name, zone=CTX.zone, nodeport_addresses=CTX.nodeport_addresses,
        reserved=frozenset({Frontend("10.96.0.10", 53, "UDP"), Frontend("10.96.0.10", 53, "TCP")}),
    )
    assert summarize(service_rules(ServiceState(info, slices), ctx)) == expected


def test_affinity_timeout_is_carried_to_every_frontend():
    info = service("web", ["10.96.0.20"], [port(80, target=8080, node_port=30080)], type="NodePort",
                   affinity_timeout=10800)
    rules = service_rules(ServiceState(info, (WEB_SLICE,)), CTX)
    assert {r.affinity_timeout for r in rules.values()} == {10800}


def _lb_service(ingress: list[dict]) -> model.Service:
    return model.Service.model_validate({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.20", "ports": [{"port": 80, "nodePort": 30080}]},
        "status": {"loadBalancer": {"ingress": ingress}},
    })


@pytest.mark.parametrize(
    ("ingress", "expected_lb"),
    [
        pytest.param([{"ip": "198.51.100.9"}], ["198.51.100.9:80/TCP"], id="ip_mode_unset__vip"),
        pytest.param([{"ip": "198.51.100.9", "ipMode": "VIP"}], ["198.51.100.9:80/TCP"], id="ip_mode_vip"),
        pytest.param([{"ip": "198.51.100.9", "ipMode": "Proxy"}], [], id="ip_mode_proxy__not_captured"),
        pytest.param([{"hostname": "lb.example.com"}], [], id="hostname_only__ignored"),
    ],
)
def test_load_balancer_ingress_modes(ingress, expected_lb):
    """Only VIP-mode ingress IPs are captured: pkg/proxy/util/utils.go IsVIPMode (KEP-1860)."""
    info = convert.service_info(_lb_service(ingress))
    slices = (endpoint_slice("web-a", [endpoint("10.244.1.5")], [("", "TCP", 80)]),)
    rules = service_rules(ServiceState(info, slices), CTX)
    assert sorted(str(f) for f, r in rules.items() if r.kind is FrontendKind.LOAD_BALANCER) == expected_lb


def test_needs_listener_and_drop_scope():
    info = service("web", ["10.96.0.20"], [port(80, target=8080, node_port=30080)], type="NodePort",
                   external_policy_local=True, internal_policy_local=True)
    rules = service_rules(ServiceState(info, (REMOTE_SLICE,)), CTX)
    cluster_ip = rules[Frontend("10.96.0.20", 80, "TCP")]
    node_port = rules[Frontend("192.168.1.10", 30080, "TCP")]
    assert (cluster_ip.action, cluster_ip.needs_listener, cluster_ip.drops_only_external) == (Action.DROP, False, False)
    assert (node_port.action, node_port.needs_listener, node_port.drops_only_external) == (Action.DROP, True, True)


A = ServiceName("default", "a")
B = ServiceName("default", "b")


def _claim(name: ServiceName, endpoint_ip: str):
    info = service(name.name, [f"10.96.0.{1 if name == A else 2}"], [port(80)], external_ips=("203.0.113.7",))
    slices = (endpoint_slice(f"{name.name}-1", [endpoint(endpoint_ip)], [("", "TCP", 80)]),)
    return service_rules(ServiceState(info, slices), CTX)


def test_conflicting_claims__smallest_service_name_wins_and_hands_over():
    table = ForwardingTable()
    shared = Frontend("203.0.113.7", 80, "TCP")
    table.update(B, _claim(B, "10.244.0.2"))
    assert table.rules[shared].port_name.service == B
    changes = table.update(A, _claim(A, "10.244.0.1"))
    assert table.rules[shared].port_name.service == A
    assert [c.frontend for c in changes if c.frontend == shared] == [shared]
    assert [str(c) for c in table.conflicts()] == [
        "203.0.113.7:80/TCP is claimed by default/a and default/b; default/a keeps it"
    ]
    changes = table.update(A, {})
    assert table.rules[shared].port_name.service == B
    assert {c.frontend for c in changes} == {shared, Frontend("10.96.0.1", 80, "TCP")}
    assert table.conflicts() == []


def test_unchanged_service__update_reports_nothing():
    table = ForwardingTable()
    table.update(A, _claim(A, "10.244.0.1"))
    assert table.update(A, _claim(A, "10.244.0.1")) == []


def test_endpoint_change__reports_only_the_changed_frontends():
    table = ForwardingTable()
    table.update(A, _claim(A, "10.244.0.1"))
    changes = table.update(A, _claim(A, "10.244.0.9"))
    assert {str(c.frontend) for c in changes} == {"10.96.0.1:80/TCP", "203.0.113.7:80/TCP"}
    assert all(c.old is not None and c.new is not None for c in changes)


def test_build_table__whole_snapshot():
    web = ServiceState(service("web", ["10.96.0.20"], [port(80, target=8080)]), (WEB_SLICE,))
    headless = ServiceState(service("db", [], [port(5432)], headless=True))
    snap = snapshot([web, headless], node=NodeInfo(name="node-a"))
    assert [str(f) for f in build_table(snap, CTX)] == ["10.96.0.20:80/TCP"]

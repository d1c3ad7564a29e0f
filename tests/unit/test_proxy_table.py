"""The forwarding table: which frontends a snapshot asks for, and what each one does (reference A.6, E)."""

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
from kubeport.proxy.testing import endpoint, endpoint_slice, port, service, snapshot

CTX = TableContext(node_name="node-a", zone="zone-a", nodeport_addresses=("192.168.1.10", "fd00:1::10"))

WEB_SLICE = endpoint_slice(
    "web-a", [endpoint("10.244.1.5", node="node-a"), endpoint("10.244.2.5", node="node-b")], [("", "TCP", 8080)]
)
REMOTE_SLICE = endpoint_slice("web-b", [endpoint("10.244.2.5", node="node-b")], [("", "TCP", 8080)])


def summarize(rules) -> dict[str, tuple]:
    """frontend -> (action, kind, endpoint keys, local-client endpoint keys or None)."""
    out = {}
    for frontend, rule in rules.items():
        local = rule.local_client_endpoints
        out[str(frontend)] = (
            rule.action.value,
            rule.kind.value,
            [e.key for e in rule.endpoints],
            None if local is None else [e.key for e in local],
        )
    return out


FWD, DROP, REFUSE = "forward", "drop", "refuse"
CIP, EIP, LB, NP = "ClusterIP", "ExternalIP", "LoadBalancer", "NodePort"
BOTH = ["10.244.1.5:8080", "10.244.2.5:8080"]
LOCAL = ["10.244.1.5:8080"]
REMOTE = ["10.244.2.5:8080"]

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
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080)], external_ips=("203.0.113.7", "2001:db8::7")),
        (WEB_SLICE,),
        {"10.96.0.20:80/TCP": (FWD, CIP, BOTH, None), "203.0.113.7:80/TCP": (FWD, EIP, BOTH, None)},
        id="external_ips__served_in_the_service_families_only__e2",
    ),
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080)], type="LoadBalancer",
                load_balancer_ips=("198.51.100.9",)),
        (WEB_SLICE,),
        {"10.96.0.20:80/TCP": (FWD, CIP, BOTH, None), "198.51.100.9:80/TCP": (FWD, LB, BOTH, None)},
        id="load_balancer_vip__frontend_on_ingress_ip__e3",
    ),
    pytest.param(
        service("web", ["10.96.0.20", "fd00:96::20"], [port(80, target=8080, node_port=30080)], type="NodePort"),
        (WEB_SLICE,),
        {
            "10.96.0.20:80/TCP": (FWD, CIP, BOTH, None),
            "192.168.1.10:30080/TCP": (FWD, NP, BOTH, None),
            "[fd00:96::20]:80/TCP": (REFUSE, CIP, [], None),
            "[fd00:1::10]:30080/TCP": (REFUSE, NP, [], None),
        },
        id="node_port__on_the_chosen_node_addresses_per_family__e1",
    ),
    pytest.param(
        service("web", [], [port(80)], headless=True), (WEB_SLICE,), {},
        id="headless__never_proxied__e4",
    ),
    pytest.param(
        service("web", ["10.96.0.20"], [port(80)], type="ExternalName", external_name="example.com"),
        (WEB_SLICE,), {},
        id="external_name__never_proxied_even_with_a_cluster_ip__e4",
    ),
    pytest.param(
        service("web", ["10.96.0.20"], [port(80)], proxy_name="other-proxy"), (WEB_SLICE,), {},
        id="service_proxy_name_label__never_proxied__e4",
    ),
    pytest.param(
        service("web", ["10.96.0.20"], [port(80)], headless_label=True), (WEB_SLICE,), {},
        id="headless_label__never_proxied_even_with_a_cluster_ip__e4",
    ),
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080)]),
        (dataclasses.replace(WEB_SLICE, proxied=False), REMOTE_SLICE),
        {"10.96.0.20:80/TCP": (FWD, CIP, REMOTE, None)},
        id="slice_labelled_away_from_the_proxy__its_endpoints_unused__e4",
    ),
    pytest.param(
        service("web", [], [port(80)]), (WEB_SLICE,), {},
        id="no_cluster_ip_yet__nothing__e4",
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
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080, node_port=30080)], type="NodePort"), (),
        {"10.96.0.20:80/TCP": (REFUSE, CIP, [], None), "192.168.1.10:30080/TCP": (REFUSE, NP, [], None)},
        id="no_endpoints__refuse_everywhere__a6_reject",
    ),
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080)]),
        (endpoint_slice("web-a", [endpoint("10.244.1.5", ready=False)], [("", "TCP", 8080)]),),
        {"10.96.0.20:80/TCP": (REFUSE, CIP, [], None)},
        id="only_unready_endpoints__refuse__a6_reject",
    ),
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080)], internal_policy_local=True), (REMOTE_SLICE,),
        {"10.96.0.20:80/TCP": (DROP, CIP, [], None)},
        id="itp_local_without_local_endpoints__drop__a6",
    ),
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080)], internal_policy_local=True), (WEB_SLICE,),
        {"10.96.0.20:80/TCP": (FWD, CIP, LOCAL, None)},
        id="itp_local__local_endpoints_only__a6",
    ),
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080, node_port=30080)], type="NodePort",
                external_policy_local=True),
        (REMOTE_SLICE,),
        {"10.96.0.20:80/TCP": (FWD, CIP, REMOTE, None), "192.168.1.10:30080/TCP": (DROP, NP, [], REMOTE)},
        id="etp_local_without_local_endpoints__drop_external_short_circuit_local_clients__a6",
    ),
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080, node_port=30080)], type="NodePort",
                external_policy_local=True),
        (WEB_SLICE,),
        {"10.96.0.20:80/TCP": (FWD, CIP, BOTH, None), "192.168.1.10:30080/TCP": (FWD, NP, LOCAL, BOTH)},
        id="etp_local__external_clients_local_set_local_clients_cluster_set__a6",
    ),
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080)], external_ips=("203.0.113.7",),
                external_policy_local=True),
        (WEB_SLICE,),
        {"10.96.0.20:80/TCP": (FWD, CIP, BOTH, None), "203.0.113.7:80/TCP": (FWD, EIP, LOCAL, BOTH)},
        id="etp_local_applies_to_external_ips__a2",
    ),
    pytest.param(
        service("web", ["10.96.0.20"], [port(80, target=8080)], external_policy_local=True), (REMOTE_SLICE,),
        {"10.96.0.20:80/TCP": (FWD, CIP, REMOTE, None)},
        id="etp_local_on_port_not_externally_accessible__ignored__k4",
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
        pytest.param([{"ip": "198.51.100.9"}], ["198.51.100.9:80/TCP"], id="ip_mode_unset__vip__e3"),
        pytest.param([{"ip": "198.51.100.9", "ipMode": "VIP"}], ["198.51.100.9:80/TCP"], id="ip_mode_vip__e3"),
        pytest.param([{"ip": "198.51.100.9", "ipMode": "Proxy"}], [], id="ip_mode_proxy__not_captured__e3"),
        pytest.param([{"hostname": "lb.example.com"}], [], id="hostname_only__ignored__e3"),
    ],
)
def test_load_balancer_ingress_modes(ingress, expected_lb):
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


LB_CTX = TableContext(node_name="node-a", nodeport_addresses=("192.168.1.10", "fd00:1::10"),
                      node_ips=("192.168.1.10", "fd00:1::10"))


def _lb(ranges, **fields):
    return service("web", ["10.96.0.20", "fd00:96::20"], [port(80, target=8080, node_port=30080)],
                   type="LoadBalancer", load_balancer_ips=("198.51.100.9", "2001:db8::9"),
                   load_balancer_source_ranges=tuple(ranges), **fields)


@pytest.mark.parametrize(
    ("ranges", "expected"),
    [
        pytest.param((), {}, id="no_ranges__every_source__a6"),
        pytest.param(("203.0.113.0/24",), {"198.51.100.9:80/TCP": ("203.0.113.0/24",)},
                     id="v4_range__only_the_v4_lb_vip_restricted__per_family_proxier"),
        pytest.param(("203.0.113.0/24", "2001:db8:1::/48"),
                     {"198.51.100.9:80/TCP": ("203.0.113.0/24",), "[2001:db8::9]:80/TCP": ("2001:db8:1::/48",)},
                     id="both_families__each_vip_its_own_ranges"),
        pytest.param((" 203.0.113.0/24 ", "203.0.113.128/25", "203.0.112.0/24"),
                     {"198.51.100.9:80/TCP": ("203.0.112.0/23",)},
                     id="padding_tolerated_overlaps_and_neighbours_merged"),
        pytest.param(("192.168.0.0/16",), {"198.51.100.9:80/TCP": ("192.168.0.0/16", "198.51.100.9/32")},
                     id="range_holds_the_node_ip__the_vip_itself_allowed__allow_from_node"),
    ],
)
def test_load_balancer_source_ranges__only_lb_vips__a6_e3(ranges, expected):
    v6_slice = endpoint_slice("web-v6", [endpoint("fd00:244::5")], [("", "TCP", 8080)], "IPv6")
    rules = service_rules(ServiceState(_lb(ranges), (WEB_SLICE, v6_slice)), LB_CTX)
    restricted = {str(f): r.source_ranges for f, r in rules.items() if r.source_ranges is not None}
    assert restricted == expected
    # NodePorts, ClusterIPs (and externalIPs) are never subject to source ranges.
    assert all(r.source_ranges is None for r in rules.values() if r.kind is not FrontendKind.LOAD_BALANCER)


def test_load_balancer_source_ranges__change_is_a_rule_change():
    table = ForwardingTable()
    name = ServiceName("default", "web")
    table.update(name, service_rules(ServiceState(_lb(["203.0.113.0/24"]), (WEB_SLICE,)), LB_CTX))
    changes = table.update(name, service_rules(ServiceState(_lb(["203.0.114.0/24"]), (WEB_SLICE,)), LB_CTX))
    assert [str(c.frontend) for c in changes] == ["198.51.100.9:80/TCP"]


@pytest.mark.parametrize(
    ("slices", "expected"),
    [
        pytest.param((WEB_SLICE,), {"198.51.100.9:80/TCP": (FWD, ("203.0.113.0/24",))},
                     id="endpoints__vip_restricted__a6"),
        pytest.param((), {"198.51.100.9:80/TCP": (REFUSE, None)},
                     id="no_endpoints__refused_for_every_client__no_fw_chain_without_endpoints__a6"),
        pytest.param((endpoint_slice("web-a", [endpoint("10.244.1.5", ready=False)], [("", "TCP", 8080)]),),
                     {"198.51.100.9:80/TCP": (REFUSE, None)},
                     id="only_unready_endpoints__refused_for_every_client__a6"),
        pytest.param((REMOTE_SLICE,), {"198.51.100.9:80/TCP": (DROP, ("203.0.113.0/24",))},
                     id="etp_local_no_local_endpoint__endpoints_elsewhere__still_restricted__a6"),
    ],
)
def test_load_balancer_source_ranges__only_while_the_service_has_endpoints(slices, expected):
    info = service("web", ["10.96.0.20"], [port(80, target=8080, node_port=30080)], type="LoadBalancer",
                   load_balancer_ips=("198.51.100.9",), load_balancer_source_ranges=("203.0.113.0/24",),
                   external_policy_local=True)
    rules = service_rules(ServiceState(info, slices), LB_CTX)
    lb = {str(f): (r.action.value, r.source_ranges) for f, r in rules.items() if r.kind is FrontendKind.LOAD_BALANCER}
    assert lb == expected


def _labelled_service(labels: dict[str, str]) -> model.Service:
    return model.Service.model_validate({
        "metadata": {"name": "web", "namespace": "default", "labels": labels},
        "spec": {"clusterIP": "10.96.0.20", "ports": [{"port": 80, "targetPort": 8080}]},
    })


def _labelled_slice(labels: dict[str, str]) -> model.EndpointSlice:
    return model.EndpointSlice.model_validate({
        "metadata": {"name": "web-a", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "web", **labels}},
        "addressType": "IPv4", "ports": [{"name": "", "port": 8080}],
        "endpoints": [{"addresses": ["10.244.1.5"], "nodeName": "node-a"}],
    })


HEADLESS_LABEL = {"service.kubernetes.io/headless": ""}
PROXY_NAME_LABEL = {"service.kubernetes.io/service-proxy-name": "other-proxy"}


@pytest.mark.parametrize(
    ("service_labels", "slice_labels", "expected"),
    [
        pytest.param({}, {}, {"10.96.0.20:80/TCP": (FWD, CIP, LOCAL, None)}, id="unlabelled__proxied"),
        pytest.param(HEADLESS_LABEL, {}, {}, id="service_labelled_headless__skipped__e4"),
        pytest.param(PROXY_NAME_LABEL, {}, {}, id="service_labelled_service_proxy_name__skipped__e4"),
        pytest.param({}, HEADLESS_LABEL, {"10.96.0.20:80/TCP": (REFUSE, CIP, [], None)},
                     id="slice_labelled_headless__not_watched__e4"),
        pytest.param({}, PROXY_NAME_LABEL, {"10.96.0.20:80/TCP": (REFUSE, CIP, [], None)},
                     id="slice_labelled_service_proxy_name__not_watched__e4"),
    ],
)
def test_kube_proxy_label_selector__from_the_api_objects(service_labels, slice_labels, expected):
    slice_ = convert.slice_info(_labelled_slice(slice_labels))
    state = ServiceState(convert.service_info(_labelled_service(service_labels)), (slice_,))
    assert summarize(service_rules(state, CTX)) == expected
    # DNS reads the same objects and still sees the endpoints (CoreDNS has no such selector).
    assert [e.address for e in slice_.endpoints] == ["10.244.1.5"]


def test_an_endpoint_with_two_addresses__the_proxy_uses_the_first__dns_gets_both():
    """kube-proxy reads addresses[0] (the API lets consumers take only the first); CoreDNS
    publishes each address."""
    two = _labelled_slice({}).model_copy(deep=True)
    two.endpoints[0].addresses = ["10.244.1.5", "10.244.1.6"]
    slice_ = convert.slice_info(two)
    state = ServiceState(convert.service_info(_labelled_service({})), (slice_,))
    assert summarize(service_rules(state, CTX)) == {"10.96.0.20:80/TCP": (FWD, CIP, LOCAL, None)}
    assert [e.address for e in slice_.endpoints] == ["10.244.1.5"] and slice_.more_addresses == (("10.244.1.6",),)

"""The forwarding table, continued: loadBalancerSourceRanges (kube-proxy's firewall chains in
pkg/proxy/iptables/proxier.go syncProxyRules, for VIP-mode LB IPs only), kube-proxy's
label selector on Services and EndpointSlices, and endpoints with two addresses. The frontends
a snapshot asks for are in test_proxy_table.py."""

from __future__ import annotations

import pytest

from kubeport.endpoints import convert, model
from kubeport.endpoints.types import ServiceName, ServiceState
from kubeport.proxy.table import (
    ForwardingTable,
    FrontendKind,
    TableContext,
    service_rules,
)

from support.proxy_table import CIP, CTX, DROP, FWD, LOCAL, REFUSE, REMOTE_SLICE, WEB_SLICE, summarize
from support.slim import endpoint, endpoint_slice, port, service

LB_CTX = TableContext(node_name="node-a", nodeport_addresses=("192.168.1.10", "fd00:1::10"),
                      node_ips=("192.168.1.10", "fd00:1::10"))


def _lb(ranges, **fields):
    return service("web", ["10.96.0.20", "fd00:96::20"], [port(80, target=8080, node_port=30080)],
                   type="LoadBalancer", load_balancer_ips=("198.51.100.9", "2001:db8::9"),
                   load_balancer_source_ranges=tuple(ranges), **fields)


@pytest.mark.parametrize(
    ("ranges", "expected"),
    [
        pytest.param((), {}, id="no_ranges__every_source"),
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
def test_load_balancer_source_ranges__only_lb_vips(ranges, expected):
    """pkg/proxy/iptables/proxier.go syncProxyRules: source ranges guard LB VIPs, per family."""
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
                     id="endpoints__vip_restricted"),
        pytest.param((), {"198.51.100.9:80/TCP": (REFUSE, None)},
                     id="no_endpoints__refused_for_every_client__no_fw_chain_without_endpoints"),
        pytest.param((endpoint_slice("web-a", [endpoint("10.244.1.5", ready=False)], [("", "TCP", 8080)]),),
                     {"198.51.100.9:80/TCP": (REFUSE, None)},
                     id="only_unready_endpoints__refused_for_every_client"),
        pytest.param((REMOTE_SLICE,), {"198.51.100.9:80/TCP": (DROP, ("203.0.113.0/24",))},
                     id="etp_local_no_local_endpoint__endpoints_elsewhere__still_restricted"),
    ],
)
def test_load_balancer_source_ranges__only_while_the_service_has_endpoints(slices, expected):
    """pkg/proxy/iptables/proxier.go syncProxyRules: no firewall chain for a service without endpoints."""
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
        pytest.param(HEADLESS_LABEL, {}, {}, id="service_labelled_headless__skipped"),
        pytest.param(PROXY_NAME_LABEL, {}, {}, id="service_labelled_service_proxy_name__skipped"),
        pytest.param({}, HEADLESS_LABEL, {"10.96.0.20:80/TCP": (REFUSE, CIP, [], None)},
                     id="slice_labelled_headless__not_watched"),
        pytest.param({}, PROXY_NAME_LABEL, {"10.96.0.20:80/TCP": (REFUSE, CIP, [], None)},
                     id="slice_labelled_service_proxy_name__not_watched"),
    ],
)
def test_kube_proxy_label_selector__from_the_api_objects(service_labels, slice_labels, expected):
    """cmd/kube-proxy/app/server.go: the informers skip objects with these labels."""
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

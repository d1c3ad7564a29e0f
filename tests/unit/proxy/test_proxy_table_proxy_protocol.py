"""The forwarding table, continued: the PROXY protocol v2 header (annotation
kubeport.io/proxy-protocol: "v2") is asked for on a service's TCP frontends only, every kind of
them, and switching it is a rule change (the listener's route is swapped)."""

from __future__ import annotations

import dataclasses

import pytest

from kubeport.endpoints.types import ServiceName, ServiceState
from kubeport.proxy.table import ForwardingTable, FrontendKind, TableContext, service_rules

from support.slim import endpoint, endpoint_slice, port, service

CTX = TableContext(node_name="node-a", nodeport_addresses=("192.168.1.10",))
SLICE = endpoint_slice("web-a", [endpoint("10.244.1.5")],
                       [("http", "TCP", 8080), ("dns", "UDP", 5353), ("assoc", "SCTP", 9000)])
PORTS = [port(80, name="http", target=8080, node_port=30080), port(53, name="dns", protocol="UDP", node_port=30053),
         port(90, name="assoc", protocol="SCTP", target=9000)]


def _web(**fields):
    return service("web", ["10.96.0.20"], PORTS, type="LoadBalancer", external_ips=("203.0.113.7",),
                   load_balancer_ips=("198.51.100.9",), **fields)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param({}, set(), id="no_annotation__no_header"),
        pytest.param({"proxy_protocol": True}, {
            "10.96.0.20:80/TCP", "203.0.113.7:80/TCP", "198.51.100.9:80/TCP", "192.168.1.10:30080/TCP",
        }, id="v2__every_tcp_frontend__udp_and_sctp_never"),
        pytest.param({"proxy_protocol": False, "problems": ("bad value",)}, set(), id="bad_value__served_without"),
    ],
)
def test_proxy_protocol_frontends(fields, expected):
    rules = service_rules(ServiceState(_web(**fields), (SLICE,)), CTX)
    assert {kind for kind in FrontendKind} == {r.kind for r in rules.values()}  # every kind is served
    assert len(rules) == 11  # TCP and UDP: 4 each; SCTP: no node port
    assert {str(f) for f, r in rules.items() if r.proxy_protocol} == expected


def test_proxy_protocol_on_a_refused_frontend_changes_nothing_else():
    rules = service_rules(ServiceState(_web(proxy_protocol=True), ()), CTX)
    plain = service_rules(ServiceState(_web(), ()), CTX)
    assert {f: dataclasses.replace(r, proxy_protocol=False) for f, r in rules.items()} == plain


def test_switching_the_annotation_alone_is_a_rule_change():
    table = ForwardingTable()
    name = ServiceName("default", "web")
    table.update(name, service_rules(ServiceState(_web(), (SLICE,)), CTX))
    changes = table.update(name, service_rules(ServiceState(_web(proxy_protocol=True), (SLICE,)), CTX))
    assert sorted(str(c.frontend) for c in changes) == [
        "10.96.0.20:80/TCP", "192.168.1.10:30080/TCP", "198.51.100.9:80/TCP", "203.0.113.7:80/TCP",
    ]
    assert all(c.old is not None and c.new is not None and c.new.proxy_protocol for c in changes)
    assert table.update(name, service_rules(ServiceState(_web(proxy_protocol=True), (SLICE,)), CTX)) == []

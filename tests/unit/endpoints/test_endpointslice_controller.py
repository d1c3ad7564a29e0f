"""Manifest mode's EndpointSlice controller: Pods -> slices, by the rules of
pkg/controller/endpointslice and staging/src/k8s.io/endpointslice (reconciler.go
reconcileByAddressType, utils.go podToEndpoint / getEndpointPorts / getAddressTypesForService,
util/controller_utils.go ShouldPodBeInEndpoints, podutil.FindPort)."""

from __future__ import annotations

from typing import Any

import pytest

from kubeport.endpoints.controllers.endpointslice import CONTROLLER_NAME, MAX_ENDPOINTS_PER_SLICE, slices_for
from kubeport.endpoints.hints import as_the_controller_writes
from kubeport.endpoints.state import ClusterState
from kubeport.endpoints.types import ServiceName
from tests.support import api

WEB = ServiceName("default", "web")
SELECTOR = {"app": "web"}


def _web(**spec: Any) -> dict[str, Any]:
    body = {"clusterIP": "10.96.0.20", "selector": SELECTOR,
            "ports": [{"name": "http", "port": 80, "targetPort": "http-web-svc"}]}
    body.update(spec)
    return api.service("web", **body)


def _state(objects: list[dict[str, Any]]) -> ClusterState:
    state = ClusterState("node-a", implicit_namespaces=True, pod_slices=slices_for,
                         slice_transform=as_the_controller_writes)
    for obj in objects:
        state.upsert(api.to_model(obj))
    state.commit()
    return state


def _view(state: ClusterState, name: ServiceName = WEB) -> list[tuple[Any, ...]]:
    """Per slice: address type, ports, and per endpoint (address, ready, serving, terminating,
    node, zone, hostname, pod)."""
    held = state.snapshot.services.get(name)
    assert held is not None
    return [(s.address_type, None if s.ports is None else tuple((p.name, p.protocol, p.port) for p in s.ports),
             tuple((e.address, e.ready, e.serving, e.terminating, e.node_name, e.zone, e.hostname, e.pod_name)
                   for e in s.endpoints))
            for s in held.slices]


def _ep(address: str, pod: str, *, ready: bool = True, serving: bool = True, terminating: bool = False,
        node: str | None = None, zone: str | None = None, hostname: str | None = None) -> tuple[Any, ...]:
    return (address, ready, serving, terminating, node, zone, hostname, pod)


HTTP = (("http", "TCP", 80),)
WEB_PORT = (("http", "TCP", 8080),)

CASES = [
    pytest.param(
        # The Service documentation's first example: targetPort names the container port.
        [_web(), api.pod("nginx", ips=["10.244.1.11"], ports=[("http-web-svc", 8080)])],
        [("IPv4", WEB_PORT, (_ep("10.244.1.11", "nginx"),))],
        id="named_target_port_resolved_from_the_pod"),
    pytest.param(
        [_web(ports=[{"name": "http", "port": 80, "targetPort": 9376}]), api.pod("a", ips=["10.244.1.11"])],
        [("IPv4", (("http", "TCP", 9376),), (_ep("10.244.1.11", "a"),))],
        id="numeric_target_port_as_is"),
    pytest.param(
        [_web(), api.pod("a", ips=["10.244.1.11"], ports=[("http-web-svc", 8080)]),
         api.pod("b", ips=["10.244.1.12"], ports=[("http-web-svc", 8081)])],
        [("IPv4", WEB_PORT, (_ep("10.244.1.11", "a"),)),
         ("IPv4", (("http", "TCP", 8081),), (_ep("10.244.1.12", "b"),))],
        id="a_name_mapped_to_different_numbers_makes_different_slices"),
    pytest.param(
        [_web(), api.pod("a", ips=["10.244.1.11"], ports=[("http-web-svc", 8080, "UDP")])],
        [("IPv4", (), (_ep("10.244.1.11", "a"),))],
        id="a_name_of_another_protocol_does_not_resolve"),
    pytest.param(
        [_web(), api.pod("a", ips=["10.244.1.11"], ports=[("http-web-svc", 8080)], labels={"app": "db"}),
         api.pod("b", "other", ips=["10.244.1.12"], ports=[("http-web-svc", 8080)])],
        [("IPv4", (), ())],
        id="other_labels_and_other_namespaces_leave_a_placeholder"),
    pytest.param(
        [_web(selector={"app": "web", "tier": "front"}),
         api.pod("a", ips=["10.244.1.11"], ports=[("http-web-svc", 8080)], labels={"app": "web", "tier": "front"}),
         api.pod("b", ips=["10.244.1.12"], ports=[("http-web-svc", 8080)], labels={"app": "web"}),
         api.pod("c", ips=["10.244.1.13"], ports=[("http-web-svc", 8080)],
                 labels={"app": "web", "tier": "front", "extra": "yes"})],
        [("IPv4", WEB_PORT, (_ep("10.244.1.11", "a"), _ep("10.244.1.13", "c")))],
        id="every_selector_pair_must_match_extra_labels_do_not_matter"),
    pytest.param(
        [_web(), api.pod("a", ips=["10.244.1.11"], ports=[("http-web-svc", 8080)], ready=False),
         api.pod("b", ips=["10.244.1.12"], ports=[("http-web-svc", 8080)], deleting=True),
         api.pod("c", ips=["10.244.1.13"], ports=[("http-web-svc", 8080)], phase="Succeeded"),
         api.pod("d", ips=["10.244.1.14"], ports=[("http-web-svc", 8080)], phase="Failed"),
         api.pod("e", ips=[], ports=[("http-web-svc", 8080)], phase="Pending")],
        [("IPv4", WEB_PORT, (_ep("10.244.1.11", "a", ready=False, serving=False),
                             _ep("10.244.1.12", "b", ready=False, serving=True, terminating=True)))],
        id="not_ready_listed_terminating_from_deletion_terminal_and_ipless_left_out"),
    pytest.param(
        [_web(publishNotReadyAddresses=True),
         api.pod("a", ips=["10.244.1.11"], ports=[("http-web-svc", 8080)], ready=False),
         api.pod("b", ips=["10.244.1.12"], ports=[("http-web-svc", 8080)], deleting=True)],
        [("IPv4", WEB_PORT, (_ep("10.244.1.11", "a", ready=True, serving=False),
                             _ep("10.244.1.12", "b", ready=True, serving=True, terminating=True)))],
        id="publish_not_ready_addresses_makes_every_endpoint_ready"),
    pytest.param(
        [_web(ipFamilies=["IPv4", "IPv6"], clusterIPs=["10.96.0.20", "fd00:96::20"]),
         api.pod("a", ips=["10.244.1.11", "fd00:244:1::11"], ports=[("http-web-svc", 8080)]),
         api.pod("b", ips=["10.244.1.12"], ports=[("http-web-svc", 8080)])],
        [("IPv4", WEB_PORT, (_ep("10.244.1.11", "a"), _ep("10.244.1.12", "b"))),
         ("IPv6", WEB_PORT, (_ep("fd00:244:1::11", "a"),))],
        id="one_slice_per_address_family"),
    pytest.param(
        [_web(), api.pod("a", ips=["fd00:244:1::11"], ports=[("http-web-svc", 8080)])],
        [("IPv4", (), ())],
        id="family_from_the_cluster_ip_without_ip_families"),
    pytest.param(
        [_web(), api.node("node-a", zone="zone-a"),
         api.pod("a", ips=["10.244.1.11"], ports=[("http-web-svc", 8080)], node="node-a"),
         api.pod("b", ips=["10.244.1.12"], ports=[("http-web-svc", 8080)], node="node-x")],
        [("IPv4", WEB_PORT, (_ep("10.244.1.11", "a", node="node-a", zone="zone-a"),
                             _ep("10.244.1.12", "b", node="node-x")))],
        id="node_name_and_zone_from_the_node"),
    pytest.param(
        [_web(clusterIP="None", ipFamilies=["IPv4"]),
         api.pod("a", ips=["10.244.1.11"], ports=[("http-web-svc", 8080)], hostname="a", subdomain="web"),
         api.pod("b", ips=["10.244.1.12"], ports=[("http-web-svc", 8080)], hostname="b", subdomain="other")],
        [("IPv4", WEB_PORT, (_ep("10.244.1.11", "a", hostname="a"), _ep("10.244.1.12", "b")))],
        id="hostname_when_the_subdomain_is_the_service"),
    pytest.param(
        [_web(), api.pod("a", ips=["10.244.1.11"], ports=[("http-web-svc", 8080)], hostname="a", subdomain="web")],
        [("IPv4", WEB_PORT, (_ep("10.244.1.11", "a", hostname="a"),))],
        id="hostname_whatever_the_service_type_as_should_set_hostname"),
    pytest.param(
        [_web(clusterIP="None", ports=[]), api.pod("a", ips=["10.244.1.11", "fd00:244:1::11"])],
        [("IPv4", (), (_ep("10.244.1.11", "a"),)), ("IPv6", (), (_ep("fd00:244:1::11", "a"),))],
        id="headless_without_ports_or_families_gets_both_families"),
    pytest.param(
        [_web(ports=[{"name": "http", "port": 80, "targetPort": "http-web-svc"},
                     {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "dns"}]),
         api.pod("a", ips=["10.244.1.11"], ports=[("http-web-svc", 8080), ("dns", 5353, "UDP")])],
        [("IPv4", (("http", "TCP", 8080), ("dns", "UDP", 5353)), (_ep("10.244.1.11", "a"),))],
        id="slice_ports_take_the_service_port_name_and_protocol"),
    pytest.param(
        [_web(), api.pod("a", ips=["10.244.1.11"],
                         initContainers=[{"name": "proxy", "restartPolicy": "Always",
                                          "ports": [{"name": "http-web-svc", "containerPort": 15001}]},
                                         {"name": "setup", "ports": [{"name": "http-web-svc", "containerPort": 1}]}])],
        [("IPv4", (("http", "TCP", 15001),), (_ep("10.244.1.11", "a"),))],
        id="a_sidecar_port_resolves_a_plain_init_container_does_not"),
]


@pytest.mark.parametrize("objects, expected", CASES)
def test_slices_from_pods(objects: list[dict[str, Any]], expected: list[tuple[Any, ...]]) -> None:
    assert sorted(_view(_state(objects))) == sorted(expected)


@pytest.mark.parametrize("spec", [
    pytest.param({"selector": None}, id="no_selector"),
    pytest.param({"selector": {}}, id="empty_selector"),
    pytest.param({"type": "ExternalName", "externalName": "example.com", "clusterIP": None}, id="external_name"),
])
def test_services_the_controller_leaves_alone(spec: dict[str, Any]) -> None:
    state = _state([_web(**spec), api.pod("a", ips=["10.244.1.11"], ports=[("http-web-svc", 8080)])])
    assert _view(state) == []


def test_at_most_100_endpoints_a_slice() -> None:
    pods = [api.pod(f"p{i:03}", ips=[f"10.244.{i // 200}.{i % 200 + 1}"], ports=[("http-web-svc", 8080)])
            for i in range(250)]
    sizes = sorted(len(s[2]) for s in _view(_state([_web(), *pods])))
    assert sizes == [50, MAX_ENDPOINTS_PER_SLICE, MAX_ENDPOINTS_PER_SLICE]


def test_generated_slices_carry_the_controller_name_and_hand_written_ones_stay() -> None:
    hand = api.endpoint_slice("web", name="web-external", endpoints=["192.0.2.10"],
                              ports=[{"name": "http", "port": 8080}])
    hand["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] = "staff.example.com"
    state = _state([_web(), hand, api.pod("a", ips=["10.244.1.11"], ports=[("http-web-svc", 8080)])])
    slices = state.snapshot.services[WEB].slices
    assert {(s.name == "web-external", s.managed_by) for s in slices} == {
        (True, "staff.example.com"), (False, CONTROLLER_NAME)}
    web = state.snapshot.services[WEB]
    assert {e.key for e in web.endpoints_for_port(web.service.ports[0])} == {"192.0.2.10:8080", "10.244.1.11:8080"}


def test_names_are_stable_and_follow_the_service() -> None:
    objects = [_web(), api.pod("a", ips=["10.244.1.11"], ports=[("http-web-svc", 8080)])]
    first = [s.name for s in _state(objects).snapshot.services[WEB].slices]
    assert first == [s.name for s in _state(objects).snapshot.services[WEB].slices]
    assert all(name.startswith("web-") and len(name) == len("web-") + 5 for name in first)


def test_pod_changes_rebuild_the_selecting_services_only() -> None:
    other = api.service("db", clusterIP="10.96.0.30", selector={"app": "db"}, ports=[{"port": 5432}])
    state = _state([_web(), other, api.pod("a", ips=["10.244.1.11"], ports=[("http-web-svc", 8080)])])
    db_state = state.snapshot.services[ServiceName("default", "db")]
    state.upsert(api.to_model(api.pod("b", ips=["10.244.1.12"], ports=[("http-web-svc", 8080)])))
    snapshot = state.commit()
    assert snapshot is not None and snapshot.changed == {WEB} and snapshot.pods_changed
    assert snapshot.services[ServiceName("default", "db")] is db_state
    # Relabelled away: the old labels' service loses it.
    state.upsert(api.to_model(api.pod("b", ips=["10.244.1.12"], labels={"app": "db"})))
    snapshot = state.commit()
    assert snapshot is not None and snapshot.changed == {WEB, ServiceName("default", "db")}
    state.delete("Pod", "default", "a")
    snapshot = state.commit()
    assert snapshot is not None and snapshot.changed == {WEB}
    assert _view(state) == [("IPv4", (), ())]
    assert set(snapshot.pods) == {("default", "b")}


def test_a_node_zone_change_reaches_the_endpoints() -> None:
    state = _state([_web(), api.node("node-a", zone="zone-a"),
                    api.pod("a", ips=["10.244.1.11"], ports=[("http-web-svc", 8080)], node="node-a")])
    state.upsert(api.to_model(api.node("node-a", zone="zone-b")))
    state.commit()
    assert _view(state)[0][2][0][5] == "zone-b"


def test_hints_for_generated_slices() -> None:
    state = _state([_web(trafficDistribution="PreferClose"), api.node("node-a", zone="zone-a"),
                    api.pod("a", ips=["10.244.1.11"], ports=[("http-web-svc", 8080)], node="node-a")])
    (endpoint,) = state.snapshot.services[WEB].slices[0].endpoints
    assert endpoint.zone_hints == frozenset({"zone-a"})


def test_a_hand_written_pod_is_created_when_first_read() -> None:
    now = [1_800_000_000.0]
    state = ClusterState("node-a", pod_slices=slices_for, clock=lambda: now[0])
    state.upsert(api.to_model(api.pod("a", ips=["10.244.1.11"])))
    state.commit()
    created = state.snapshot.pods[("default", "a")].created
    assert created == "2027-01-15T08:00:00Z"
    now[0] += 100
    state.upsert(api.to_model(api.pod("a", ips=["10.244.1.11"], ready=False)))  # an edit keeps it
    state.commit()
    assert state.snapshot.pods[("default", "a")].created == created

"""Manifest-mode topology hints, as the EndpointSlice controller writes them (reference B).

B.3's worked examples, the controller's own TestAddHints / TestSetNodes /
Test_getGivingAndReceivingZones cases, and the B.2 trafficDistribution rules.
"""

from __future__ import annotations

from collections import Counter

import pytest

from kubeport.endpoints import model
from kubeport.endpoints.hints import (
    INSUFFICIENT_NODE_INFO, INSUFFICIENT_NUMBER_OF_ENDPOINTS, MIN_ALLOCATION_EXCEEDS_OVERLOAD_THRESHOLD,
    NO_ZONE_SPECIFIED, Allocation, HintsDisabled, allocations, as_the_controller_writes, auto_hints, fill_hints,
    giving_and_receiving_zones, zone_cpu_ratios,
)
from kubeport.endpoints.state import ClusterState
from kubeport.endpoints.topology import categorize_endpoints
from kubeport.endpoints.types import (
    EndpointInfo, EndpointPortInfo, NodeInfo, PortSpec, ServiceInfo, ServiceName, SliceInfo, endpoints_for_port,
)

PORTS = (EndpointPortInfo("", "TCP", 8080),)


def node(name: str, zone: str | None, cpu: int = 1000, *, ready: bool = True, control_plane: bool = False) -> NodeInfo:
    return NodeInfo(name=name, zone=zone, allocatable_cpu_millis=cpu, ready=ready, control_plane=control_plane)


def nodes_by_cpu(**cpu_by_zone: int) -> dict[str, NodeInfo]:
    """One node per zone with that much allocatable CPU (millicores)."""
    return {f"n-{zone}": node(f"n-{zone}", zone, cpu) for zone, cpu in cpu_by_zone.items()}


def endpoint(address: str, zone: str | None, *, ready: bool = True, node_name: str | None = None,
             zones: tuple[str, ...] = (), nodes: tuple[str, ...] = ()) -> EndpointInfo:
    return EndpointInfo(
        address=address, ready=ready, serving=ready, zone=zone,
        node_name=node_name if node_name is not None else (f"n-{zone}" if zone else None),
        zone_hints=frozenset(zones) or None, node_hints=frozenset(nodes) or None,
    )


def slice_of(name: str, *endpoints: EndpointInfo, family: str = "IPv4") -> SliceInfo:
    return SliceInfo(name=name, address_type=family, ports=PORTS, endpoints=tuple(endpoints))


def zone_endpoints(**count_by_zone: int) -> SliceInfo:
    """One slice with N ready endpoints per zone, addresses numbered in zone order."""
    endpoints = []
    for zone, count in count_by_zone.items():
        for _ in range(count):
            endpoints.append(endpoint(f"10.0.0.{len(endpoints) + 1}", zone))
    return slice_of("svc-1", *endpoints)


def hint_counts(slices: tuple[SliceInfo, ...]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for slice_ in slices:
        for e in slice_.endpoints:
            if e.ready:
                assert e.zone_hints is not None and len(e.zone_hints) == 1, e
                counts.update(e.zone_hints)
    return dict(counts)


def no_hints(slices: tuple[SliceInfo, ...]) -> bool:
    return all(e.zone_hints is None and e.node_hints is None for s in slices for e in s.endpoints)


def service(*, topology_mode: str | None = None, traffic_distribution: str | None = None) -> ServiceInfo:
    return ServiceInfo(
        name=ServiceName("default", "web"), uid="u", type="ClusterIP", cluster_ips=("10.96.0.20",),
        headless=False, external_name=None, ports=(PortSpec("", "TCP", 80, 8080),),
        topology_mode=topology_mode, traffic_distribution=traffic_distribution,
    )


AUTO = service(topology_mode="Auto")

# --- B.3 worked examples ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "endpoints", "expected"),
    [
        pytest.param(nodes_by_cpu(a=1000, b=1000, c=1000), zone_endpoints(a=4, b=1, c=1), {"a": 2, "b": 2, "c": 2},
                     id="equal_thirds_a4_b1_c1__a_gives_one_to_b_and_one_to_c"),
        pytest.param(nodes_by_cpu(a=4000, b=3200, c=2800), zone_endpoints(a=5, b=3, c=2), {"a": 4, "b": 3, "c": 3},
                     id="40_32_28_a5_b3_c2__a_gives_one_to_c_b_small_deficit_ignored"),
        pytest.param(nodes_by_cpu(a=4000, b=3200, c=2800), zone_endpoints(a=10), {"a": 4, "b": 3, "c": 3},
                     id="40_32_28_a10__a_gives_three_to_b_three_to_c"),
        pytest.param(nodes_by_cpu(a=1000, b=1000), zone_endpoints(a=5, b=1), {"a": 3, "b": 3},
                     id="halves_a5_b1__a_gives_two_to_b"),
        pytest.param(nodes_by_cpu(a=4500, b=5500), zone_endpoints(a=1, b=1), {"a": 1, "b": 1},
                     id="controller_case_two_endpoints_two_zones_own_zone_hints"),
    ],
)
def test_auto_worked_examples_hint_counts(nodes, endpoints, expected) -> None:
    result = auto_hints((endpoints,), nodes.values())
    assert result.disabled == ()
    assert hint_counts(result.slices) == expected


@pytest.mark.parametrize(
    ("nodes", "endpoints", "message"),
    [
        pytest.param(nodes_by_cpu(a=1000, b=1000, c=1000), zone_endpoints(a=2, b=1, c=1),
                     f"{MIN_ALLOCATION_EXCEEDS_OVERLOAD_THRESHOLD} (4 endpoints, 3 zones)",
                     id="equal_thirds_four_endpoints__minimums_exceed_total"),
        pytest.param(nodes_by_cpu(a=1000, b=1000, c=1000), zone_endpoints(a=1, b=1),
                     f"{INSUFFICIENT_NUMBER_OF_ENDPOINTS} (2 endpoints, 3 zones)",
                     id="equal_thirds_two_endpoints__more_zones_than_endpoints"),
        pytest.param(nodes_by_cpu(a=1000, b=1000), zone_endpoints(a=2, b=1),
                     f"{MIN_ALLOCATION_EXCEEDS_OVERLOAD_THRESHOLD} (3 endpoints, 2 zones)",
                     id="halves_three_endpoints__minimum_two_each_exceeds_three"),
        pytest.param(nodes_by_cpu(a=3000, b=4000, c=3000), zone_endpoints(a=1, b=1),
                     f"{INSUFFICIENT_NUMBER_OF_ENDPOINTS} (2 endpoints, 3 zones)",
                     id="controller_case_two_endpoints_zone_ratios_require_three"),
        pytest.param({"n1": node("n1", "a")}, zone_endpoints(a=2), INSUFFICIENT_NODE_INFO,
                     id="single_zone_cluster__insufficient_node_info"),
        pytest.param(nodes_by_cpu(a=1000, b=1000), slice_of("s", endpoint("10.0.0.1", "a"), endpoint("10.0.0.2", None),
                                                            endpoint("10.0.0.3", "b"), endpoint("10.0.0.4", "b")),
                     NO_ZONE_SPECIFIED, id="endpoint_without_zone_disables_hints"),
    ],
)
def test_auto_disabled_cases_remove_no_slices_and_write_no_hints(nodes, endpoints, message) -> None:
    result = auto_hints((endpoints,), nodes.values())
    assert no_hints(result.slices)
    assert result.slices == (endpoints,)
    assert result.disabled == (f"{message}, addressType: IPv4",)


def test_auto_equal_thirds_moves_first_a_endpoints_to_b_then_c() -> None:
    result = auto_hints((zone_endpoints(a=4, b=1, c=1),), nodes_by_cpu(a=1000, b=1000, c=1000).values())
    hints = [next(iter(e.zone_hints)) for e in result.slices[0].endpoints]
    # Ties between receiving zones go to the first name in sorted order (stable, documented).
    assert hints == ["b", "c", "a", "a", "b", "c"]


def test_auto_controller_case_slices_across_3_zone_threshold() -> None:
    """TestAddHints 'slices to create and update within 3 zone threshold': 10.1.2.3 moves to zone-b."""
    slices = (
        slice_of("s1", endpoint("10.1.2.3", "zone-a"), endpoint("10.1.2.4", "zone-b")),
        slice_of("s2", endpoint("10.1.3.3", "zone-c"), endpoint("10.1.3.4", "zone-c"), endpoint("10.1.3.4", "zone-a")),
        slice_of("s3", endpoint("10.2.2.3", "zone-a"), endpoint("10.2.2.4", "zone-a")),
        slice_of("s4", endpoint("10.2.3.3", "zone-b"), endpoint("10.2.3.4", "zone-c"), endpoint("10.2.3.4", "zone-a")),
    )
    nodes = {"a": node("a", "zone-a", 3500), "b": node("b", "zone-b", 3500), "c": node("c", "zone-c", 3000)}
    result = auto_hints(slices, nodes.values())
    hints = [[next(iter(e.zone_hints)) for e in s.endpoints] for s in result.slices]
    assert hints == [
        ["zone-b", "zone-b"],
        ["zone-c", "zone-c", "zone-a"],
        ["zone-a", "zone-a"],
        ["zone-b", "zone-c", "zone-a"],
    ]


def test_auto_unready_endpoints_get_no_hint_and_do_not_count() -> None:
    """TestAddHints '2 ready, 1 unready': N counts ready endpoints only."""
    slices = (slice_of("s", endpoint("10.1.2.3", "zone-a"), endpoint("10.1.2.4", "zone-b"),
                       endpoint("10.1.2.5", "zone-b", ready=False)),)
    result = auto_hints(slices, [node("a", "zone-a", 4500), node("b", "zone-b", 5500)])
    assert [e.zone_hints for e in result.slices[0].endpoints] == [
        frozenset({"zone-a"}), frozenset({"zone-b"}), None,
    ]


def test_auto_is_per_address_family() -> None:
    v4 = slice_of("v4", endpoint("10.0.0.1", "a"), endpoint("10.0.0.2", "b"))
    v6 = slice_of("v6", endpoint("fd00::1", "a"), family="IPv6")
    result = auto_hints((v4, v6), nodes_by_cpu(a=1000, b=1000).values())
    assert hint_counts(result.slices[:1]) == {"a": 1, "b": 1}
    assert no_hints(result.slices[1:])
    assert result.disabled == (f"{INSUFFICIENT_NUMBER_OF_ENDPOINTS} (1 endpoints, 2 zones), addressType: IPv6",)


def test_auto_counts_hints_kept_in_already_hinted_slices() -> None:
    kept = slice_of("a-kept", endpoint("10.0.0.1", "a", zones=("a",)), endpoint("10.0.0.2", "a", zones=("a",)))
    fresh = slice_of("b-fresh", endpoint("10.0.0.3", "a"), endpoint("10.0.0.4", "b"))
    result = auto_hints((kept, fresh), nodes_by_cpu(a=1000, b=1000).values())
    assert result.slices[0] is kept
    # a already holds 2 of its 2 desired: the fresh a-endpoint is given to b.
    assert [e.zone_hints for e in result.slices[1].endpoints] == [frozenset({"b"}), frozenset({"b"})]


# --- TopologyCache.SetNodes -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "ratios"),
    [
        pytest.param([], None, id="empty"),
        pytest.param([node("1", "zone-a")], None, id="single_node"),
        pytest.param([node("1", "zone-a"), node("2", "zone-a")], None, id="single_zone"),
        pytest.param([node("1", "zone-a"), node("2", "zone-b")], {"zone-a": 0.5, "zone-b": 0.5}, id="two_zones"),
        pytest.param([node("1", "zone-a", ready=False), node("2", "zone-b")], None,
                     id="unready_node_in_one_of_two_zones"),
        pytest.param([node("1", "zone-a"), node("2", "zone-b", control_plane=True)], None,
                     id="control_plane_node_excluded"),
        pytest.param([node("1", "zone-a"), node("2", "zone-b"), node("3", "zone-b", ready=False)],
                     {"zone-a": 0.5, "zone-b": 0.5}, id="unready_node_skipped"),
        pytest.param([node("1", "zone-a"), node("2", "zone-b"), node("3", "zone-b", control_plane=True)],
                     {"zone-a": 0.5, "zone-b": 0.5}, id="control_plane_node_skipped"),
        pytest.param([node("1", "zone-a"), node("2", "zone-a"), node("3", "zone-a"), node("4", "zone-a", 2000),
                      node("5", "zone-b", 3000), node("6", "zone-b", 1500), node("7", "zone-c", 500)],
                     {"zone-a": 0.5, "zone-b": 0.45, "zone-c": 0.05}, id="three_zones_cpu_weighted"),
        pytest.param([node("1", "zone-a"), node("2", "zone-b"), node("3", None)], None,
                     id="any_node_without_zone_disables_all"),
        pytest.param([node("1", "zone-a"), node("2", "zone-b"), node("3", "zone-b", 0)], None,
                     id="any_node_without_cpu_disables_all"),
        pytest.param([node("1", "zone-a"), node("2", "zone-b"), node("3", None, control_plane=True)],
                     {"zone-a": 0.5, "zone-b": 0.5}, id="excluded_node_without_zone_does_not_matter"),
    ],
)
def test_zone_cpu_ratios(nodes, ratios) -> None:
    assert zone_cpu_ratios(nodes) == ratios


def test_allocations_40_32_28() -> None:
    assert allocations({"a": 0.4, "b": 0.32, "c": 0.28}, 10) == {
        "a": Allocation(4, 4, 4.0), "b": Allocation(3, 3, 3.2), "c": Allocation(3, 3, 3.0),
    }


def test_allocations_maximum_is_minimum_plus_spare() -> None:
    assert allocations({"a": 0.5, "b": 0.5}, 10) == {"a": Allocation(5, 5, 5.0), "b": Allocation(5, 5, 5.0)}
    assert allocations({"a": 0.9, "b": 0.1}, 10) == {"a": Allocation(8, 9, 9.0), "b": Allocation(1, 2, 1.0)}


def test_allocations_without_ratios_is_insufficient_node_info() -> None:
    with pytest.raises(HintsDisabled, match="Insufficient Node information"):
        allocations(None, 5)


# --- getGivingAndReceivingZones (controller test cases) --------------------------------------


@pytest.mark.parametrize(
    ("desired", "hinted", "giving", "receiving"),
    [
        pytest.param({}, {}, {}, {}, id="empty"),
        pytest.param({"a": 1.2, "b": 1.1, "c": 1.0}, {"a": 1, "b": 1, "c": 1}, {}, {}, id="no_rebalancing_needed"),
        pytest.param({"a": 5.1, "b": 5.1, "c": 5.8}, {"a": 16}, {"a": 10}, {"b": 5, "c": 5},
                     id="prefer_same_zone_over_slightly_better_distribution"),
        pytest.param({"a": 5.0, "b": 5.6, "c": 5.4}, {"a": 16}, {"a": 11}, {"b": 6, "c": 5},
                     id="two_zones_need_less_than_one_give_to_neediest"),
        pytest.param({"a": 5.0, "b": 5.6, "c": 5.4}, {"b": 8, "c": 8}, {"b": 2, "c": 3}, {"a": 5},
                     id="give_from_zone_with_most_extra"),
        pytest.param({"a": 5.0, "b": 5.0, "c": 5.0}, {"a": 6, "b": 6, "c": 6}, {}, {}, id="more_hinted_than_desired"),
        pytest.param({"a": -5.0, "b": -5.0, "c": -5.0}, {"a": 6, "b": 6, "c": 6}, {}, {}, id="negative_desired"),
        pytest.param({"a": 5.0, "b": 5.0, "c": 5.0}, {"a": -4, "b": -3, "c": -2}, {}, {}, id="negative_allocated"),
        pytest.param({"a": 5.0, "b": 5.0, "c": 5.0}, {"a": -40, "b": 20, "c": 20}, {"b": 15, "c": 15}, {"a": 30},
                     id="negative_for_one_zone"),
    ],
)
def test_giving_and_receiving_zones(desired, hinted, giving, receiving) -> None:
    assert giving_and_receiving_zones(desired, hinted) == (giving, receiving)


# --- trafficDistribution (B.2) --------------------------------------------------------------

THREE = slice_of(
    "svc-1",
    endpoint("10.0.0.1", "zone-a", node_name="node-a"),
    endpoint("10.0.0.2", "zone-b", node_name="node-b"),
    endpoint("10.0.0.3", "zone-b", node_name="node-c", ready=False),
)


@pytest.mark.parametrize(
    ("value", "zone_hints", "node_hints"),
    [
        pytest.param("PreferClose", [{"zone-a"}, {"zone-b"}, None], [None, None, None],
                     id="prefer_close_own_zone_hint_on_ready_endpoints__kep4444"),
        pytest.param("PreferSameZone", [{"zone-a"}, {"zone-b"}, None], [None, None, None],
                     id="prefer_same_zone_is_prefer_close__kep3015"),
        pytest.param("PreferSameNode", [{"zone-a"}, {"zone-b"}, None], [{"node-a"}, {"node-b"}, None],
                     id="prefer_same_node_adds_own_node_hint__kep3015"),
    ],
)
def test_traffic_distribution_hints(value, zone_hints, node_hints) -> None:
    (filled,) = fill_hints(service(traffic_distribution=value), (THREE,), {})
    assert [e.zone_hints and set(e.zone_hints) for e in filled.endpoints] == zone_hints
    assert [e.node_hints and set(e.node_hints) for e in filled.endpoints] == node_hints


def test_traffic_distribution_endpoint_without_zone_gets_no_zone_hint() -> None:
    zoneless = slice_of("s", endpoint("10.0.0.1", "zone-a"), endpoint("10.0.0.2", None, node_name="node-z"))
    (filled,) = fill_hints(service(traffic_distribution="PreferSameNode"), (zoneless,), {})
    assert filled.endpoints[1].zone_hints is None
    assert filled.endpoints[1].node_hints == frozenset({"node-z"})
    (close,) = fill_hints(service(traffic_distribution="PreferClose"), (zoneless,), {})
    assert close.endpoints[1].zone_hints is None and close.endpoints[1].node_hints is None


def test_one_zoneless_endpoint_makes_kube_proxy_ignore_zone_hints_for_whole_service() -> None:
    """B.2 consequence: a ready endpoint without forZones switches zone filtering off (A.4)."""
    zoneless = slice_of("s", endpoint("10.0.0.1", "zone-a"), endpoint("10.0.0.2", "zone-b"),
                        endpoint("10.0.0.3", None, node_name="node-z"))
    filled = fill_hints(service(traffic_distribution="PreferClose"), (zoneless,), {})
    sets = categorize_endpoints(endpoints_for_port(filled, "", "TCP"), node_name="node-a", zone="zone-a",
                                internal_local=False, external_local=False, externally_accessible=False)
    assert len(sets.cluster) == 3


def test_prefer_close_hints_filter_to_own_zone_end_to_end() -> None:
    filled = fill_hints(service(traffic_distribution="PreferClose"), (THREE,), {})
    sets = categorize_endpoints(endpoints_for_port(filled, "", "TCP"), node_name="node-x", zone="zone-b",
                                internal_local=False, external_local=False, externally_accessible=False)
    assert [e.ip for e in sets.cluster] == ["10.0.0.2"]


@pytest.mark.parametrize(
    "svc",
    [
        pytest.param(service(), id="no_traffic_distribution_no_annotation"),
        pytest.param(service(traffic_distribution="PreferRegion"), id="unknown_traffic_distribution_is_unset"),
        pytest.param(service(topology_mode="aUto"), id="annotation_wrong_case_is_not_auto"),
        pytest.param(service(topology_mode="Disabled"), id="annotation_disabled"),
    ],
)
def test_services_without_hint_request_are_untouched(svc) -> None:
    slices = (THREE,)
    assert fill_hints(svc, slices, nodes_by_cpu(a=1000, b=1000)) is slices


def test_annotation_disabled_value_lets_traffic_distribution_apply() -> None:
    (filled,) = fill_hints(service(topology_mode="Disabled", traffic_distribution="PreferClose"), (THREE,), {})
    assert filled.endpoints[0].zone_hints == frozenset({"zone-a"})


def test_auto_annotation_wins_over_traffic_distribution__kep4444() -> None:
    svc = service(topology_mode="auto", traffic_distribution="PreferClose")
    # Not enough node information: Auto disables hints, and trafficDistribution is not a fallback.
    assert no_hints(fill_hints(svc, (THREE,), {}))


def test_existing_hints_are_kept_as_they_are_other_slices_filled() -> None:
    hinted = slice_of("a", endpoint("10.0.0.9", "zone-a", zones=("zone-x", "zone-y")))
    filled = fill_hints(service(traffic_distribution="PreferClose"), (hinted, THREE), {})
    assert filled[0] is hinted
    assert filled[1].endpoints[0].zone_hints == frozenset({"zone-a"})


def test_no_change_returns_the_same_tuple_and_fqdn_slices_are_never_touched() -> None:
    hinted = (slice_of("a", endpoint("10.0.0.1", "zone-a", zones=("zone-a",))),)
    fqdn = (SliceInfo("f", "FQDN", PORTS, (EndpointInfo("db.example.com", zone="zone-a"),)),)
    for slices in (hinted, fqdn):
        assert fill_hints(service(traffic_distribution="PreferClose"), slices, {}) is slices
        assert fill_hints(AUTO, slices, nodes_by_cpu(a=1000, b=1000)) is slices


# --- through ClusterState -------------------------------------------------------------------


def _objects(zone_of_node: dict[str, str], annotations: dict[str, str] | None = None) -> list[model.KubeObject]:
    svc = model.Service.model_validate({
        "metadata": {"name": "web", "namespace": "default", "annotations": annotations or {}},
        "spec": {"clusterIP": "10.96.0.20", "ports": [{"port": 80, "targetPort": 8080}],
                 "trafficDistribution": "PreferSameNode"},
    })
    eps = model.EndpointSlice.model_validate({
        "metadata": {"name": "web-1", "namespace": "default", "labels": {model.LABEL_SERVICE_NAME: "web"}},
        "addressType": "IPv4", "ports": [{"port": 8080}],
        "endpoints": [{"addresses": [f"10.244.{i}.5"], "nodeName": n, "zone": z}
                      for i, (n, z) in enumerate(zone_of_node.items())],
    })
    return [svc, eps]


def test_cluster_state_slice_transform_publishes_hints() -> None:
    state = ClusterState("node-a", slice_transform=fill_hints)
    for obj in _objects({"node-a": "zone-a", "node-b": "zone-b"}):
        state.upsert(obj)
    snapshot = state.commit()
    (slice_,) = snapshot.services[ServiceName("default", "web")].slices
    assert [(set(e.zone_hints), set(e.node_hints)) for e in slice_.endpoints] == [
        ({"zone-a"}, {"node-a"}), ({"zone-b"}, {"node-b"}),
    ]


def test_cluster_state_recomputes_auto_hints_when_nodes_change() -> None:
    state = ClusterState("node-a", slice_transform=fill_hints)
    for obj in _objects({"node-a": "zone-a", "node-b": "zone-b"}, {model.ANNOTATION_TOPOLOGY_MODE: "Auto"}):
        state.upsert(obj)
    first = state.commit()
    assert no_hints(first.services[ServiceName("default", "web")].slices)
    for name, zone in (("node-a", "zone-a"), ("node-b", "zone-b")):
        state.upsert(model.Node.model_validate({
            "metadata": {"name": name, "labels": {model.LABEL_ZONE: zone}},
            "status": {"allocatable": {"cpu": "2"}},
        }))
    second = state.commit()
    (slice_,) = second.services[ServiceName("default", "web")].slices
    assert [e.zone_hints for e in slice_.endpoints] == [frozenset({"zone-a"}), frozenset({"zone-b"})]


# --- publishNotReadyAddresses: ready as podToEndpoint writes it ------------------------------


@pytest.mark.parametrize(("publish", "ready", "terminating", "expected"), [
    pytest.param(True, False, False, True, id="publish__not_ready_pod_is_ready"),
    pytest.param(True, False, True, True, id="publish__terminating_pod_is_ready_too"),
    pytest.param(False, False, False, False, id="no_publish__kept_as_written"),
    pytest.param(False, True, False, True, id="no_publish__ready_kept"),
])
def test_publish_not_ready_addresses_makes_every_endpoint_ready(publish, ready, terminating, expected) -> None:
    """The controller writes ready = publishNotReadyAddresses || (podReady && !terminating);
    serving and terminating stay as they are (kube-proxy and DNS then read ``ready``)."""
    service = ServiceInfo(ServiceName("ns", "s"), "", "ClusterIP", ("10.96.0.9",), False, None, (),
                          publish_not_ready_addresses=publish)
    written = EndpointInfo("10.0.0.1", ready=ready, serving=ready, terminating=terminating)
    slices = (SliceInfo("s-1", "IPv4", PORTS, (written,)),)
    (result,) = as_the_controller_writes(service, slices, {})[0].endpoints
    assert (result.ready, result.serving, result.terminating) == (expected, ready, terminating)
    if expected == ready:
        assert as_the_controller_writes(service, slices, {}) is slices  # nothing to write: nothing copied

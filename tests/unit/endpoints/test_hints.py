"""Manifest-mode topology hints, as the EndpointSlice controller writes them
(kubernetes/kubernetes staging/src/k8s.io/endpointslice): the topology-aware-hints Auto mode
(KEP-2433; topologycache/topologycache.go AddHints, SetNodes, getAllocations, and
topologycache/utils.go getGivingAndReceivingZones, redistributeHints).

Worked examples of that arithmetic and the controller's own TestAddHints / TestSetNodes /
Test_getGivingAndReceivingZones cases. The trafficDistribution rules (trafficdist/trafficdist.go)
are in test_hints_distribution.py; the builders in support/hints.py.
"""

from __future__ import annotations

import pytest

from kubeport.endpoints.hints import (
    INSUFFICIENT_NODE_INFO, INSUFFICIENT_NUMBER_OF_ENDPOINTS, MIN_ALLOCATION_EXCEEDS_OVERLOAD_THRESHOLD,
    NO_ZONE_SPECIFIED, Allocation, HintsDisabled, allocations, auto_hints, giving_and_receiving_zones,
    zone_cpu_ratios,
)

from support.hints import hint_counts, no_hints, nodes_by_cpu, slice_of, zone_endpoints
from support.slim import endpoint, node

# --- worked examples (topologycache.go getAllocations, utils.go redistributeHints) -------


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

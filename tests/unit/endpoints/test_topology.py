"""kube-proxy's CategorizeEndpoints, one named case per rule.

Cases mirror ``pkg/proxy/topology_test.go`` (TestCategorizeEndpoints) plus the rules of
``pkg/proxy/topology.go`` (CategorizeEndpoints, topologyModeFromHints), KEP-1669's terminating
fallback and KEP-4444's hints without annotation. Expected sets are written the way the
Go test writes them: ``None`` = "the port never uses this set", ``set()`` = "uses it,
nothing usable". ``all`` defaults to the one non-None set when only one is used, and
``has_any`` defaults to "all is non-empty" (``only_remote`` flips it for Local policies
whose endpoints are all elsewhere: kube-proxy's DROP rather than REJECT).
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

from kubeport.endpoints.topology import (
    NO_TOPOLOGY,
    PREFER_SAME_NODE,
    PREFER_SAME_ZONE,
    categorize_endpoints,
    topology_mode_from_hints,
)
from kubeport.endpoints.types import PortEndpoint

from support.slim import endpoint

THIS_NODE = "node-a"
OTHER_NODE = "node-b"


def ep(
    address: str,
    *,
    ready: bool = True,
    serving: bool | None = None,
    terminating: bool = False,
    local: bool = False,
    zones: tuple[str, ...] = (),
    nodes: tuple[str, ...] = (),
    port: int = 80,
) -> PortEndpoint:
    info = endpoint(address, node=THIS_NODE if local else OTHER_NODE, ready=ready, serving=serving,
                    terminating=terminating, zones=zones, nodes=nodes)
    return PortEndpoint(info, port)


class Case(NamedTuple):
    endpoints: tuple[PortEndpoint, ...]
    cluster: set[str] | None
    local: set[str] | None
    all: set[str] | None = None
    only_remote: bool = False
    zone: str | None = "zone-a"
    internal_local: bool = False
    external_local: bool = False
    externally_accessible: bool = False
    prefer_same_node: bool = True
    node_name: str = THIS_NODE


# Four endpoints hinted a, b, c, a: the Go test's standard topology fixture.
HINTED = (
    ep("10.1.2.3", zones=("zone-a",)),
    ep("10.1.2.4", zones=("zone-b",)),
    ep("10.1.2.5", zones=("zone-c",)),
    ep("10.1.2.6", zones=("zone-a",)),
)
HINTED_SOME_LOCAL = (
    ep("10.1.2.3", zones=("zone-a",), local=True),
    ep("10.1.2.4", zones=("zone-b",), local=True),
    ep("10.1.2.5", zones=("zone-c",)),
    ep("10.1.2.6", zones=("zone-a",)),
)
ONE_LOCAL_ONE_REMOTE = (ep("10.0.0.0", local=True), ep("10.0.0.1"))
TWO_REMOTE = (ep("10.0.0.0"), ep("10.0.0.1"))
# PreferSameNode-shaped hints (trafficdist.go ReconcileHints): forNodes = own node, forZones = own zone.
SAME_NODE_HINTED = (
    ep("10.2.0.1", zones=("zone-a",), nodes=(THIS_NODE,), local=True),
    ep("10.2.0.2", zones=("zone-a",), nodes=("node-c",)),
    ep("10.2.0.3", zones=("zone-b",), nodes=(OTHER_NODE,)),
)
SAME_NODE_HINTED_ELSEWHERE = (
    ep("10.2.0.2", zones=("zone-a",), nodes=("node-c",)),
    ep("10.2.0.3", zones=("zone-b",), nodes=(OTHER_NODE,)),
)


def keys(*addresses: str) -> set[str]:
    return {f"{a}:80" for a in addresses}


CASES = [
    # --- topology hints (KEP-2433 / KEP-4444 / KEP-3015) --------------------------------
    pytest.param(
        Case(HINTED, cluster=keys("10.1.2.3", "10.1.2.6"), local=None),
        id="zone_hints_used_when_every_ready_endpoint_hinted_and_one_matches__kep2433",
    ),
    pytest.param(
        Case(HINTED, cluster=keys("10.1.2.3", "10.1.2.6"), local=None),
        # Appendix X: old kube-proxies ignored hints unless the annotation said auto; since
        # KEP-4444 the proxy uses hints whenever present (it is never told the annotation).
        id="hints_used_without_topology_annotation__kep4444_flipped_old_case",
    ),
    pytest.param(
        Case(HINTED_SOME_LOCAL, cluster=keys("10.1.2.3", "10.1.2.6"), local=keys("10.1.2.3", "10.1.2.4"),
             all=keys("10.1.2.3", "10.1.2.4", "10.1.2.6"), external_local=True, externally_accessible=True),
        id="etp_local_topology_ignored_for_local_set",
    ),
    pytest.param(
        Case(HINTED_SOME_LOCAL, cluster=keys("10.1.2.3", "10.1.2.6"), local=keys("10.1.2.3", "10.1.2.4"),
             all=keys("10.1.2.3", "10.1.2.4", "10.1.2.6"), internal_local=True, externally_accessible=True),
        id="itp_local_topology_ignored_for_local_set",
    ),
    pytest.param(
        Case((ep("10.1.2.3", zones=("zone-a",)),), cluster=keys("10.1.2.3"), local=None, zone=None),
        id="node_without_zone_label_no_filtering",
    ),
    pytest.param(
        Case((ep("10.1.2.3", zones=("zone-a",)),), cluster=keys("10.1.2.3"), local=None, zone=""),
        id="node_with_empty_zone_label_no_filtering",
    ),
    pytest.param(
        Case((ep("10.1.2.3", zones=("zone-a",)),), cluster=keys("10.1.2.3"), local=None, zone="zone-b"),
        id="no_endpoint_hinted_for_own_zone_no_filtering",
    ),
    pytest.param(
        Case(HINTED[:3] + (ep("10.1.2.6", zones=("zone-a",), ready=False),), cluster=keys("10.1.2.3"), local=None),
        id="unready_endpoint_not_used_in_zone_filter",
    ),
    pytest.param(
        Case((ep("10.1.2.3", zones=("zone-a",), ready=False), ep("10.1.2.4", zones=("zone-b",)),
              ep("10.1.2.5", zones=("zone-c",)), ep("10.1.2.6", zones=("zone-a",), ready=False)),
             cluster=keys("10.1.2.4", "10.1.2.5"), local=None),
        id="only_unready_endpoints_in_own_zone_no_filtering",
    ),
    pytest.param(
        Case(HINTED[:2] + (ep("10.1.2.5"),) + HINTED[3:], cluster=keys("10.1.2.3", "10.1.2.4", "10.1.2.5", "10.1.2.6"),
             local=None),
        id="one_ready_endpoint_missing_hint_disables_hints",
    ),
    pytest.param(
        Case((ep("10.1.2.3", zones=("zone-a",)), ep("10.1.2.4"), ep("10.1.2.5", ready=False, zones=("zone-b",))),
             cluster=keys("10.1.2.3", "10.1.2.4"), local=None),
        id="unhinted_ready_endpoint_disables_hints_unready_ones_do_not_matter",
    ),
    pytest.param(
        Case((ep("10.1.2.3", zones=("zone-a",)), ep("10.1.2.4", zones=("zone-b",)),
              ep("10.1.2.5", ready=False)),
             cluster=keys("10.1.2.3"), local=None),
        id="unhinted_unready_endpoint_does_not_disable_hints",
    ),
    pytest.param(
        Case((ep("10.1.2.3", zones=("zone-a", "zone-b", "zone-c")), ep("10.1.2.4", zones=("zone-b", "zone-c")),
              ep("10.1.2.5", zones=("zone-b", "zone-d")), ep("10.1.2.6", zones=("zone-c",))),
             cluster=keys("10.1.2.3", "10.1.2.4", "10.1.2.6"), local=None, zone="zone-c"),
        id="multiple_zone_hints_any_match_counts",
    ),
    pytest.param(
        Case((ep("10.0.0.0", zones=("zone-a",), local=True), ep("10.0.0.1", zones=("zone-b",), local=True),
              ep("10.0.0.2", zones=("zone-a",)), ep("10.0.0.3", zones=("zone-b",))),
             cluster=keys("10.0.0.0", "10.0.0.2"), local=keys("10.0.0.0", "10.0.0.1"),
             all=keys("10.0.0.0", "10.0.0.1", "10.0.0.2"), external_local=True, externally_accessible=True),
        id="conflicting_topology_and_locality_merge_all_reachable",
    ),
    pytest.param(
        Case(SAME_NODE_HINTED, cluster=keys("10.2.0.1"), local=None),
        id="node_hints_before_zone_hints__kep3015_prefer_same_node",
    ),
    pytest.param(
        Case(SAME_NODE_HINTED_ELSEWHERE, cluster=keys("10.2.0.2"), local=None),
        id="no_endpoint_hinted_for_this_node_falls_back_to_zone__kep3015",
    ),
    pytest.param(
        Case(SAME_NODE_HINTED, cluster=keys("10.2.0.1", "10.2.0.2"), local=None, prefer_same_node=False),
        id="node_hints_ignored_without_prefer_same_traffic_distribution_gate",
    ),
    pytest.param(
        Case(SAME_NODE_HINTED + (ep("10.2.0.4", zones=("zone-a",)),), cluster=keys("10.2.0.1", "10.2.0.2", "10.2.0.4"),
             local=None),
        id="one_ready_endpoint_missing_node_hint_falls_back_to_zone",
    ),
    pytest.param(
        Case(SAME_NODE_HINTED + (ep("10.2.0.4", ready=False),), cluster=keys("10.2.0.1"), local=None),
        id="unready_endpoint_without_node_hint_does_not_block_same_node",
    ),
    pytest.param(
        Case(SAME_NODE_HINTED_ELSEWHERE, cluster=keys("10.2.0.2", "10.2.0.3"), local=None, zone=None),
        id="prefer_same_node_without_local_endpoint_and_no_zone_label_no_filtering",
    ),
    pytest.param(
        Case((ep("10.2.0.1", zones=("zone-a",), nodes=(THIS_NODE,), local=True), ep("10.2.0.2", zones=("zone-a",),
             nodes=("node-c",))),
             cluster=keys("10.2.0.1"), local=keys("10.2.0.1", ), all=keys("10.2.0.1"),
             internal_local=True, externally_accessible=True),
        id="same_node_topology_with_local_policy_merges_sets",
    ),
    # --- internalTrafficPolicy: Local (KEP-2086) ----------------------------------------
    pytest.param(
        Case((), cluster=None, local=set(), internal_local=True),
        id="itp_local_with_no_endpoints_refuses",
    ),
    pytest.param(
        Case(TWO_REMOTE, cluster=None, local=set(), only_remote=True, internal_local=True),
        id="itp_local_all_endpoints_remote_drops_not_refuses",
    ),
    pytest.param(
        Case((ep("10.0.0.0", local=True), ep("10.0.0.1", local=True)), cluster=None, local=keys("10.0.0.0", "10.0.0.1"),
             internal_local=True),
        id="itp_local_all_endpoints_local",
    ),
    pytest.param(
        Case(ONE_LOCAL_ONE_REMOTE, cluster=None, local=keys("10.0.0.0"), internal_local=True),
        id="itp_local_some_endpoints_local",
    ),
    pytest.param(
        Case((ep("10.0.0.0"), ep("10.0.0.1", local=True)), cluster=None, local=keys("10.0.0.1"), internal_local=True),
        id="no_cluster_set_for_itp_local_internal_only_port",
    ),
    pytest.param(
        Case(ONE_LOCAL_ONE_REMOTE, cluster=keys("10.0.0.0", "10.0.0.1"), local=keys("10.0.0.0"),
             all=keys("10.0.0.0", "10.0.0.1"), internal_local=True, externally_accessible=True),
        id="itp_local_etp_cluster_some_local",
    ),
    pytest.param(
        Case((ep("10.0.0.0", local=True, ready=False, serving=True, terminating=True), ep("10.0.0.1")),
             cluster=None, local=keys("10.0.0.0"), internal_local=True),
        id="itp_local_falls_back_to_local_serving_terminating__kep1669",
    ),
    pytest.param(
        Case(ONE_LOCAL_ONE_REMOTE, cluster=None, local=set(), only_remote=True, internal_local=True, node_name=""),
        id="empty_own_node_name_never_local",
    ),
    # --- externalTrafficPolicy: Local ---------------------------------------------------
    pytest.param(
        Case(ONE_LOCAL_ONE_REMOTE, cluster=keys("10.0.0.0", "10.0.0.1"), local=keys("10.0.0.0"),
             all=keys("10.0.0.0", "10.0.0.1"), external_local=True, externally_accessible=True),
        id="itp_cluster_etp_local_some_local",
    ),
    pytest.param(
        Case(ONE_LOCAL_ONE_REMOTE, cluster=keys("10.0.0.0", "10.0.0.1"), local=keys("10.0.0.0"),
             all=keys("10.0.0.0", "10.0.0.1"), internal_local=True, external_local=True, externally_accessible=True),
        id="itp_local_etp_local_some_local",
    ),
    pytest.param(
        Case(TWO_REMOTE, cluster=keys("10.0.0.0", "10.0.0.1"), local=set(), all=keys("10.0.0.0", "10.0.0.1"),
             internal_local=True, external_local=True, externally_accessible=True),
        id="itp_local_etp_local_all_remote",
    ),
    pytest.param(
        Case(TWO_REMOTE, cluster=keys("10.0.0.0", "10.0.0.1"), local=set(), all=keys("10.0.0.0", "10.0.0.1"),
             external_local=True, externally_accessible=True),
        id="etp_local_no_local_endpoint_keeps_cluster_set_for_pod_and_host_short_circuit",
    ),
    pytest.param(
        Case((ep("10.0.0.0", ready=False, serving=True, terminating=True),
              ep("10.0.0.1", ready=False, serving=True, terminating=True)),
             cluster=keys("10.0.0.0", "10.0.0.1"), local=set(), all=keys("10.0.0.0", "10.0.0.1"), only_remote=True,
             internal_local=True, external_local=True, externally_accessible=True),
        id="itp_local_etp_local_all_remote_terminating__kep1669",
    ),
    pytest.param(
        Case((ep("10.0.0.0"), ep("10.0.0.1", ready=False, serving=False, local=True),
              ep("10.0.0.2", ready=False, serving=True, terminating=True, local=True),
              ep("10.0.0.3", ready=False, serving=True, terminating=True)),
             cluster=keys("10.0.0.0"), local=keys("10.0.0.2"), all=keys("10.0.0.0", "10.0.0.2"),
             external_local=True, externally_accessible=True),
        id="etp_local_local_set_falls_back_independently_of_cluster_set__kep1669",
    ),
    pytest.param(
        Case((ep("10.0.0.0"), ep("10.0.0.1", local=True)), cluster=keys("10.0.0.0", "10.0.0.1"), local=None,
             external_local=True),
        id="etp_ignored_when_port_not_externally_accessible",
    ),
    pytest.param(
        Case((ep("10.0.0.0"), ep("10.0.0.1", local=True, ready=False, serving=False, terminating=True)),
             cluster=keys("10.0.0.0"), local=set(), all=keys("10.0.0.0"), external_local=True,
             externally_accessible=True),
        id="local_terminating_not_serving_never_used__kep1669",
    ),
    # --- Cluster policy, readiness and terminating fallback (KEP-1669) --------------------
    pytest.param(
        Case((), cluster=set(), local=None),
        id="no_endpoints_at_all_refuses",
    ),
    pytest.param(
        Case((ep("10.0.0.0", ready=False), ep("10.0.0.1", ready=False)), cluster=set(), local=None),
        id="cluster_policy_no_ready_endpoints_refuses",
    ),
    pytest.param(
        Case((ep("10.0.0.0", ready=False), ep("10.0.0.1")), cluster=keys("10.0.0.1"), local=None),
        id="cluster_policy_only_ready_endpoints_used",
    ),
    pytest.param(
        Case((ep("10.0.0.0", ready=False, serving=True, terminating=True, local=True),
              ep("10.0.0.1", ready=False, serving=True, terminating=True)),
             cluster=keys("10.0.0.0", "10.0.0.1"), local=None),
        id="cluster_falls_back_to_serving_terminating_when_none_ready__kep1669",
    ),
    pytest.param(
        Case((ep("10.0.0.0"), ep("10.0.0.1", ready=False, serving=True, terminating=True)),
             cluster=keys("10.0.0.0"), local=None),
        id="cluster_fallback_all_or_nothing_one_ready_wins__kep1669",
    ),
    pytest.param(
        Case((ep("10.0.0.0", ready=False, serving=False, terminating=True),
              ep("10.0.0.1", ready=False, serving=False, terminating=True)), cluster=set(), local=None),
        id="terminating_not_serving_never_used_even_as_last_resort__kep1669",
    ),
    pytest.param(
        Case((ep("10.0.0.0", ready=False, serving=True, terminating=True, zones=("zone-b",)),
              ep("10.0.0.1", ready=False, serving=True, terminating=True, zones=("zone-c",))),
             cluster=keys("10.0.0.0", "10.0.0.1"), local=None),
        id="terminating_fallback_ignores_topology__kep1669",
    ),
    pytest.param(
        Case((ep("10.0.0.0", zones=("zone-a",)), ep("10.0.0.1", ready=False, serving=True, terminating=True,
              zones=("zone-a",)), ep("10.0.0.2", zones=("zone-b",))),
             cluster=keys("10.0.0.0"), local=None),
        id="zone_filter_uses_ready_endpoints_only_not_terminating",
    ),
    pytest.param(
        Case((ep("10.0.0.0", ready=True, serving=True, terminating=True),), cluster=keys("10.0.0.0"), local=None),
        id="ready_and_terminating_counts_as_ready",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_categorize_endpoints(case: Case) -> None:
    sets = categorize_endpoints(
        case.endpoints,
        node_name=case.node_name,
        zone=case.zone,
        internal_local=case.internal_local,
        external_local=case.external_local,
        externally_accessible=case.externally_accessible,
        prefer_same_node=case.prefer_same_node,
    )
    assert _keys(sets.cluster) == case.cluster
    assert _keys(sets.local) == case.local
    expected_all = case.all
    if expected_all is None:
        expected_all = case.cluster if case.local is None else case.local
    assert {e.key for e in sets.all_reachable} == expected_all
    assert sets.has_any == (bool(expected_all) or case.only_remote)


def _keys(found: tuple[PortEndpoint, ...] | None) -> set[str] | None:
    return None if found is None else {e.key for e in found}


@pytest.mark.parametrize(
    ("endpoints", "zone", "prefer_same_node", "mode"),
    [
        pytest.param(HINTED, "zone-a", True, PREFER_SAME_ZONE, id="zone"),
        pytest.param(SAME_NODE_HINTED, "zone-a", True, PREFER_SAME_NODE, id="node"),
        pytest.param(SAME_NODE_HINTED, "zone-a", False, PREFER_SAME_ZONE, id="node_gate_off"),
        pytest.param(SAME_NODE_HINTED_ELSEWHERE, "zone-x", True, NO_TOPOLOGY, id="no_match"),
        pytest.param((ep("10.0.0.1", ready=False, zones=("zone-a",)),), "zone-a", True, NO_TOPOLOGY,
                     id="no_ready_endpoint"),
    ],
)
def test_topology_mode_from_hints(endpoints, zone, prefer_same_node, mode) -> None:
    assert topology_mode_from_hints(endpoints, THIS_NODE, zone, prefer_same_node=prefer_same_node) == mode


def test_sets_keep_input_order_and_merge_without_duplicates() -> None:
    endpoints = (
        ep("10.0.0.1", zones=("zone-a",), local=True),
        ep("10.0.0.2", zones=("zone-b",), local=True),
        ep("10.0.0.3", zones=("zone-a",)),
    )
    sets = categorize_endpoints(
        endpoints, node_name=THIS_NODE, zone="zone-a", internal_local=False, external_local=True,
        externally_accessible=True,
    )
    assert [e.key for e in sets.all_reachable] == ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]
    assert [e.key for e in sets.cluster] == ["10.0.0.1:80", "10.0.0.3:80"]


def test_cluster_set_is_reused_as_all_reachable_when_superset() -> None:
    sets = categorize_endpoints(
        ONE_LOCAL_ONE_REMOTE, node_name=THIS_NODE, zone=None, internal_local=False, external_local=True,
        externally_accessible=True,
    )
    assert sets.all_reachable is sets.cluster

"""trafficDistribution and topology-aware routing through the daemons of both nodes: the hints
the EndpointSlice controller writes (staging/src/k8s.io/endpointslice trafficdist/trafficdist.go
ReconcileHints, topologycache/topologycache.go AddHints) and kube-proxy's filter on them
(pkg/proxy/topology.go topologyModeFromHints).

Manifest mode: no EndpointSlice controller runs, so the daemons fill the hints the controller
would write (endpoints/hints.py) and kube-proxy's rule uses them: hints count only when every
ready endpoint has them and one matches this node (forNodes) or zone (forZones), node before
zone before none. node-a is zone-a with pods a1, a2; node-b is zone-b with b1, b2.

To tell PreferSameNode from PreferSameZone with one node per zone, the PreferSameNode slices
declare b1's address on a third node, node-c (no kubeport runs there; its "pod" is reachable
like any pod IP): a zone-a endpoint that is not on node-a.
"""

from __future__ import annotations

import pytest

from support.netns.manifests import endpoint, endpoint_slice, node, service, with_annotations, write
from support.netns.policies import HTTP_PORT, SLICE_PORTS, daemons_on, settle_on

pytestmark = pytest.mark.integration

ZONAL, NODAL, AUTO = "10.96.0.70", "10.96.0.71", "10.96.0.72"
#: a fresh service per trafficDistribution value, so no case can pass on another case's state.
BY_DISTRIBUTION = {"PreferSameZone": ("same-zone", "10.96.0.73"), "PreferClose": ("close", "10.96.0.74")}


@pytest.fixture(scope="module")
def cluster(topology, pods, tmp_path_factory):
    # 3:1 allocatable CPU gives topology-mode Auto a zone-a share of 3/4.
    nodes = [node(topology, "a", cpu="3"), node(topology, "b", cpu="1")]
    with daemons_on(topology, tmp_path_factory, nodes, on=("a", "b")) as manifests:
        yield manifests


@pytest.fixture
def clients(topology):
    """A pod on each node, as the client of the services (a2 on node-a, b2 on node-b)."""
    return {"node-a": topology.pod("a", 2), "node-b": topology.pod("b", 2)}


def _zonal(cluster, pod_of, distribution: str, *pods: str, name: str = "zonal", ip: str = ZONAL) -> None:
    write(cluster, name,
          service(name, [ip], [HTTP_PORT], trafficDistribution=distribution),
          endpoint_slice(f"{name}-1", name, SLICE_PORTS, [endpoint(pod_of(p)) for p in pods]))


@pytest.mark.parametrize("distribution", sorted(BY_DISTRIBUTION))
def test_prefer_same_zone__each_node_reaches_only_its_zone(cluster, pod_of, clients, distribution):
    """Own-zone hints (trafficdist.go ReconcileHints), used by pkg/proxy/topology.go topologyModeFromHints."""
    name, ip = BY_DISTRIBUTION[distribution]
    _zonal(cluster, pod_of, distribution, "a1", "a2", "b1", "b2", name=name, ip=ip)
    assert set(settle_on(clients["node-a"], ip, 80, {"a1", "a2"})) == {"a1", "a2"}
    assert set(settle_on(clients["node-b"], ip, 80, {"b1", "b2"})) == {"b1", "b2"}


def test_prefer_same_zone__uses_own_zone_while_any_endpoint_is_left_there(cluster, pod_of, clients):
    """pkg/proxy/topology.go topologyModeFromHints: one ready endpoint hinted for this zone is enough."""
    _zonal(cluster, pod_of, "PreferSameZone", "a1", "b1", "b2")
    assert set(settle_on(clients["node-a"], ZONAL, 80, {"a1"})) == {"a1"}
    assert set(settle_on(clients["node-b"], ZONAL, 80, {"b1", "b2"})) == {"b1", "b2"}


def test_prefer_same_zone__no_endpoint_in_own_zone__falls_back_to_all(cluster, pod_of, clients):
    """pkg/proxy/topology.go topologyModeFromHints: no ready endpoint hinted for this zone, no topology."""
    _zonal(cluster, pod_of, "PreferSameZone", "a1", "a2", "b1", "b2")
    settle_on(clients["node-a"], ZONAL, 80, {"a1", "a2"})
    # zone-a's endpoints are removed from the manifest: no ready endpoint is hinted for zone-a.
    _zonal(cluster, pod_of, "PreferSameZone", "b1", "b2")
    assert set(settle_on(clients["node-a"], ZONAL, 80, {"b1", "b2"})) == {"b1", "b2"}
    assert set(settle_on(clients["node-b"], ZONAL, 80, {"b1", "b2"})) == {"b1", "b2"}


def _nodal(cluster, pod_of, endpoints: list[dict]) -> None:
    write(cluster, "nodal",
          service("nodal", [NODAL], [HTTP_PORT], trafficDistribution="PreferSameNode"),
          endpoint_slice("nodal-1", "nodal", SLICE_PORTS, endpoints))


def _b1_on_node_c(pod_of, zone: str) -> dict:
    return endpoint(pod_of("b1"), node="node-c", zone=zone)


def test_prefer_same_node__each_node_reaches_only_its_own_pods(cluster, pod_of, clients):
    """Own-node hints (trafficdist.go ReconcileHints) beat zone hints (topology.go topologyModeFromHints)."""
    _nodal(cluster, pod_of, [endpoint(pod_of("a1")), endpoint(pod_of("a2")),
                             _b1_on_node_c(pod_of, "zone-a"), endpoint(pod_of("b2"))])
    # PreferSameZone would add b1 (zone-a, node-c) for node-a: forNodes wins over forZones.
    assert set(settle_on(clients["node-a"], NODAL, 80, {"a1", "a2"})) == {"a1", "a2"}
    assert set(settle_on(clients["node-b"], NODAL, 80, {"b2"})) == {"b2"}


def test_prefer_same_node__falls_back_to_same_zone_then_to_all(cluster, pod_of, clients):
    """pkg/proxy/topology.go topologyModeFromHints: node hints, else zone hints, else every ready endpoint."""
    # node-a's pods are gone: no node hint names node-a, zone hints still name zone-a (b1 on node-c).
    _nodal(cluster, pod_of, [_b1_on_node_c(pod_of, "zone-a"), endpoint(pod_of("b2"))])
    assert set(settle_on(clients["node-a"], NODAL, 80, {"b1"})) == {"b1"}
    assert set(settle_on(clients["node-b"], NODAL, 80, {"b2"})) == {"b2"}
    # node-c moves to zone-c: nothing is hinted for node-a or zone-a any more, so every ready endpoint.
    _nodal(cluster, pod_of, [_b1_on_node_c(pod_of, "zone-c"), endpoint(pod_of("b2"))])
    assert set(settle_on(clients["node-a"], NODAL, 80, {"b1", "b2"})) == {"b1", "b2"}
    assert set(settle_on(clients["node-b"], NODAL, 80, {"b2"})) == {"b2"}


def _auto(cluster, pod_of, *pods: str) -> None:
    write(cluster, "auto",
          with_annotations(service("auto", [AUTO], [HTTP_PORT]), **{"service.kubernetes.io/topology-mode": "Auto"}),
          endpoint_slice("auto-1", "auto", SLICE_PORTS, [endpoint(pod_of(p)) for p in pods]))


def test_topology_mode_auto__zones_get_endpoints_in_proportion_to_cpu(cluster, pod_of, clients):
    """topology-mode Auto (KEP-2433): topologycache.go AddHints, utils.go getGivingAndReceivingZones."""
    # 4 endpoints, CPU 3:1: zone-a should have 3 and has 2, zone-b gives one away (the first of its
    # endpoints in slice order, b1), so node-a reaches a1, a2, b1 and node-b only b2.
    _auto(cluster, pod_of, "a1", "a2", "b1", "b2")
    assert set(settle_on(clients["node-a"], AUTO, 80, {"a1", "a2", "b1"})) == {"a1", "a2", "b1"}
    assert set(settle_on(clients["node-b"], AUTO, 80, {"b2"})) == {"b2"}


def test_topology_mode_auto__overload_safeguard_disables_hints(cluster, pod_of, clients):
    """topology-mode Auto (KEP-2433): topologycache.go getAllocations, over the overload threshold."""
    # 2 endpoints, CPU 3:1: zone-a needs ceil(1.5 / 1.2) = 2 and zone-b 1, more than there are:
    # "Unable to allocate minimum required endpoints ..." -> no hints -> every node uses both.
    _auto(cluster, pod_of, "a1", "b1")
    assert set(settle_on(clients["node-a"], AUTO, 80, {"a1", "b1"})) == {"a1", "b1"}
    assert set(settle_on(clients["node-b"], AUTO, 80, {"a1", "b1"})) == {"a1", "b1"}

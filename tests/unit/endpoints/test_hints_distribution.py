"""Manifest-mode topology hints, as the EndpointSlice controller writes them
(kubernetes/kubernetes staging/src/k8s.io/endpointslice): the trafficDistribution rules
(trafficdist/trafficdist.go ReconcileHints; KEP-4444, KEP-3015), which request wins over which
(utils.go hintsEnabled: the annotation first), hints through ClusterState, and the ready flag
as utils.go podToEndpoint writes it (publishNotReadyAddresses).

The Auto mode (KEP-2433) is in test_hints.py; the builders in support/hints.py.
"""

from __future__ import annotations

import pytest

from kubeport.endpoints import model
from kubeport.endpoints.hints import as_the_controller_writes, fill_hints
from kubeport.endpoints.state import ClusterState
from kubeport.endpoints.topology import categorize_endpoints
from kubeport.endpoints.types import EndpointInfo, ServiceInfo, ServiceName, SliceInfo, endpoints_for_port

from support.hints import PORTS, no_hints, nodes_by_cpu, slice_of
from support.slim import endpoint, service

AUTO = service(topology_mode="Auto")

# --- trafficDistribution (trafficdist.go ReconcileHints) ---------------------------------------

THREE = slice_of(
    "svc-1",
    endpoint("10.0.0.1", "zone-a", node="node-a"),
    endpoint("10.0.0.2", "zone-b", node="node-b"),
    endpoint("10.0.0.3", "zone-b", node="node-c", ready=False),
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
    zoneless = slice_of("s", endpoint("10.0.0.1", "zone-a"), endpoint("10.0.0.2", None, node="node-z"))
    (filled,) = fill_hints(service(traffic_distribution="PreferSameNode"), (zoneless,), {})
    assert filled.endpoints[1].zone_hints is None
    assert filled.endpoints[1].node_hints == frozenset({"node-z"})
    (close,) = fill_hints(service(traffic_distribution="PreferClose"), (zoneless,), {})
    assert close.endpoints[1].zone_hints is None and close.endpoints[1].node_hints is None


def test_one_zoneless_endpoint_makes_kube_proxy_ignore_zone_hints_for_whole_service() -> None:
    """trafficdist.go writes no forZones for a zoneless endpoint, and then kube-proxy's
    pkg/proxy/topology.go topologyModeFromHints switches zone filtering off for the service."""
    zoneless = slice_of("s", endpoint("10.0.0.1", "zone-a"), endpoint("10.0.0.2", "zone-b"),
                        endpoint("10.0.0.3", None, node="node-z"))
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

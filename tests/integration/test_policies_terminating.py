"""Terminating endpoints through the daemon on node-a, conditions edited live (KEP-1669;
kube-proxy's pkg/proxy/topology.go CategorizeEndpoints).

A pod being deleted has ready=false, terminating=true, and serving=its readiness. kube-proxy uses
serving-terminating endpoints only when no endpoint of the set is ready, never the ones that are
not serving, and refuses when nothing is left. The node-local fallback under a Local policy is in
test_policies_local.py.
"""

from __future__ import annotations

import pytest

from support.netns.manifests import endpoint, endpoint_slice, node, service, write
from support.netns.policies import (
    HTTP_PORT,
    HTTP_SLICE_PORT,
    daemons_on,
    serving_terminating,
    settle_curl_exit,
    settle_on,
    terminating_not_serving,
)

pytestmark = pytest.mark.integration

DRAIN = "10.96.0.60"
REFUSED = 7


@pytest.fixture(scope="module")
def cluster(topology, pods, tmp_path_factory):
    nodes = [node(topology, "a"), node(topology, "b")]
    with daemons_on(topology, tmp_path_factory, nodes, on=("a",)) as manifests:
        yield manifests


@pytest.fixture
def drain(cluster, topology):
    """Write the drain service's slice: {pod name: endpoint builder}."""
    def write_slice(**builders) -> None:
        endpoints = [build(topology.pod_info(name[0], int(name[1:]))) for name, build in builders.items()]
        write(cluster, "drain", service("drain", [DRAIN], [HTTP_PORT]),
              endpoint_slice("drain-1", "drain", [HTTP_SLICE_PORT], endpoints))
    return write_slice


@pytest.fixture
def client(topology):
    return topology.pod("a", 2)


def test_ready_endpoints_preferred__serving_terminating_unused_while_one_is_ready__kep1669(drain, client):
    drain(b1=endpoint)
    settle_on(client, DRAIN, 80, {"b1"})
    drain(a1=endpoint, b1=serving_terminating, b2=terminating_not_serving)
    assert set(settle_on(client, DRAIN, 80, {"a1"})) == {"a1"}


def test_serving_terminating_endpoints_take_traffic_when_none_is_ready__kep1669(drain, client):
    drain(a1=endpoint, b1=serving_terminating, b2=terminating_not_serving)
    settle_on(client, DRAIN, 80, {"a1"})
    # The last ready pod starts terminating (still serving): every serving-terminating pod is used,
    # b2 (terminating, not serving) never.
    drain(a1=serving_terminating, b1=serving_terminating, b2=terminating_not_serving)
    assert set(settle_on(client, DRAIN, 80, {"a1", "b1"})) == {"a1", "b1"}
    # A pod becomes ready again: the terminating ones are left at once.
    drain(a1=serving_terminating, b1=serving_terminating, b2=endpoint)
    assert set(settle_on(client, DRAIN, 80, {"b2"})) == {"b2"}


def test_terminating_endpoints_that_are_not_serving_are_never_used__refused__kep1669(drain, client):
    drain(a1=serving_terminating, b1=terminating_not_serving)
    settle_on(client, DRAIN, 80, {"a1"})
    drain(a1=terminating_not_serving, b1=terminating_not_serving)
    settle_curl_exit(client, DRAIN, 80, REFUSED)

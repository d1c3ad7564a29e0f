"""internalTrafficPolicy and externalTrafficPolicy Local, and the health-check node port, through
the daemons of both nodes (KEP-1669; kube-proxy's pkg/proxy/iptables/proxier.go syncProxyRules,
pkg/proxy/healthcheck/service_health.go).

What a client sees, kube-proxy's way: no usable endpoint anywhere -> refused (curl exits 7);
a Local policy with endpoints only on other nodes -> dropped (curl --connect-timeout 1 exits 28);
eTP=Local -> outside clients reach only this node's pods while pods and the node itself are
short-circuited to the cluster set. The client namespace is outside the cluster (192.168.50.100).
"""

from __future__ import annotations

import pytest

from support.netns import NoReply, udp_request
from support.netns.manifests import endpoint, endpoint_slice, node, service, write
from support.netns.policies import (
    HTTP_PORT,
    SLICE_PORTS,
    UDP_PORT,
    curl_exit_code,
    daemons_on,
    http_get,
    serving_terminating,
    settle_curl_exit,
    settle_health,
    settle_on,
    terminating_not_serving,
)

pytestmark = pytest.mark.integration

NODE_A, NODE_B = "192.168.50.11", "192.168.50.12"
ITP, ITP_GONE, ETP = "10.96.0.40", "10.96.0.41", "10.96.0.42"
LB_IP = "192.168.70.20"
NODE_PORT, HEALTH_PORT = 30180, 30181
REFUSED, TIMED_OUT = 7, 28


@pytest.fixture(scope="module")
def cluster(topology, pods, tmp_path_factory):
    nodes = [node(topology, "a"), node(topology, "b")]
    with daemons_on(topology, tmp_path_factory, nodes, on=("a", "b")) as manifests:
        yield manifests


# --- internalTrafficPolicy: Local -------------------------------------------------------------------


def _itp(cluster, endpoints: list[dict], name: str = "itp", ip: str = ITP) -> None:
    write(cluster, name,
          service(name, [ip], [HTTP_PORT, UDP_PORT], internalTrafficPolicy="Local"),
          endpoint_slice(f"{name}-1", name, SLICE_PORTS, endpoints))


def test_itp_local_without_local_endpoints__dropped_not_refused(cluster, topology, pod_of):
    """pkg/proxy/iptables/proxier.go syncProxyRules: iTP=Local with endpoints elsewhere only is DROP."""
    client = topology.pod("a", 1)
    _itp(cluster, [endpoint(pod_of(p)) for p in ("a2", "b1", "b2")])
    settle_on(client, ITP, 80, {"a2"})
    _itp(cluster, [endpoint(pod_of("b1")), endpoint(pod_of("b2"))])  # node-a's last local endpoint goes
    settle_curl_exit(client, ITP, 80, TIMED_OUT)
    assert curl_exit_code(client, ITP, 80) == TIMED_OUT
    with pytest.raises(NoReply):  # not ConnectionRefusedError: dropped, as kube-proxy's DROP
        udp_request(client, ITP, 90, "anyone?", timeout=1.0)
    # node-b has local endpoints: its pods are served, by them only.
    assert set(settle_on(topology.pod("b", 1), ITP, 80, {"b1", "b2"})) == {"b1", "b2"}


def test_itp_local_with_local_endpoints__only_local_ones_answer(cluster, topology, pod_of):
    """pkg/proxy/topology.go CategorizeEndpoints: iTP=Local uses this node's endpoints only."""
    _itp(cluster, [endpoint(pod_of(p)) for p in ("a1", "b1", "b2")])
    assert set(settle_on(topology.pod("a", 2), ITP, 80, {"a1"})) == {"a1"}
    assert udp_request(topology.pod("a", 2), ITP, 90, "local?").split()[0] == b"a1"
    assert set(settle_on(topology.pod("b", 2), ITP, 80, {"b1", "b2"})) == {"b1", "b2"}


def test_itp_local_without_any_usable_endpoint__refused(cluster, topology, pod_of):
    """pkg/proxy/iptables/proxier.go syncProxyRules: hasAnyEndpoints false is REJECT, not DROP."""
    client = topology.pod("a", 1)
    _itp(cluster, [endpoint(pod_of("b1"))], name="itp-gone", ip=ITP_GONE)
    settle_curl_exit(client, ITP_GONE, 80, TIMED_OUT)  # b1 serves elsewhere: dropped here
    # hasAnyEndpoints turns false (the only endpoint is terminating and not serving): REJECT, not DROP.
    _itp(cluster, [terminating_not_serving(pod_of("b1"))], name="itp-gone", ip=ITP_GONE)
    settle_curl_exit(client, ITP_GONE, 80, REFUSED)
    assert curl_exit_code(topology.pod("b", 1), ITP_GONE, 80) == REFUSED
    with pytest.raises(ConnectionRefusedError):
        udp_request(client, ITP_GONE, 90, "anyone?", timeout=1.0)


def test_itp_local__local_set_falls_back_to_local_serving_terminating__kep1669(cluster, topology, pod_of):
    _itp(cluster, [endpoint(pod_of("a2")), endpoint(pod_of("b1"))])
    settle_on(topology.pod("a", 2), ITP, 80, {"a2"})
    # node-a: no local ready endpoint, a1 terminating but serving -> a1, although b1 is ready
    # elsewhere; a2 is terminating and not serving -> never.
    _itp(cluster, [serving_terminating(pod_of("a1")), terminating_not_serving(pod_of("a2")),
                   endpoint(pod_of("b1"))])
    assert set(settle_on(topology.pod("a", 2), ITP, 80, {"a1"})) == {"a1"}
    assert set(settle_on(topology.pod("b", 2), ITP, 80, {"b1"})) == {"b1"}


# --- externalTrafficPolicy: Local and the health-check node port ---------------------------------------


def _etp(cluster, endpoints: list[dict]) -> None:
    port = dict(HTTP_PORT, nodePort=NODE_PORT)
    write(cluster, "etp",
          service("etp", [ETP], [port], type="LoadBalancer", externalTrafficPolicy="Local",
                  healthCheckNodePort=HEALTH_PORT, status={"loadBalancer": {"ingress": [{"ip": LB_IP}]}}),
          endpoint_slice("etp-1", "etp", [{"name": "http", "protocol": "TCP", "port": 8080}], endpoints))


def _health_body(local_endpoints: int) -> dict:
    return {"service": {"namespace": "demo", "name": "etp"}, "localEndpoints": local_endpoints,
            "serviceProxyHealthy": True}


def test_etp_local_node_port_and_lb_ip_from_outside__only_local_pods(cluster, topology, pod_of):
    """pkg/proxy/iptables/proxier.go syncProxyRules: eTP=Local sends outside clients to local endpoints."""
    _etp(cluster, [endpoint(pod_of(p)) for p in ("a1", "a2", "b1", "b2")])
    client = topology.client
    assert set(settle_on(client, NODE_A, NODE_PORT, {"a1", "a2"})) == {"a1", "a2"}
    assert set(settle_on(client, NODE_B, NODE_PORT, {"b1", "b2"})) == {"b1", "b2"}
    assert set(settle_on(client, LB_IP, 80, {"a1", "a2"})) == {"a1", "a2"}  # the client routes LB IPs to node-a


def test_health_check_node_port__200_with_local_endpoints__kube_proxy_body_and_headers(
        cluster, topology, pod_of):
    """pkg/proxy/healthcheck/service_health.go hcHandler.ServeHTTP: status, JSON body and headers."""
    _etp(cluster, [endpoint(pod_of(p)) for p in ("a1", "a2", "b1")])
    reply = settle_health(topology.client, NODE_A, HEALTH_PORT, 200, 2)
    assert reply.json() == _health_body(2)
    assert reply.headers["content-type"] == "application/json"
    assert reply.headers["x-content-type-options"] == "nosniff"
    assert reply.headers["x-load-balancing-endpoint-weight"] == "2"
    # Any path is served; each node counts its own ready endpoints.
    assert http_get(topology.client, NODE_A, HEALTH_PORT, "/").json() == _health_body(2)
    assert settle_health(topology.client, NODE_B, HEALTH_PORT, 200, 1).json() == _health_body(1)


def test_etp_local_without_local_endpoints__outside_dropped__pods_get_cluster_set__health_503(
        cluster, topology, pod_of):
    """proxier.go syncProxyRules (DROP, pods short-circuited to the cluster set); service_health.go (503)."""
    _etp(cluster, [endpoint(pod_of("b1")), endpoint(pod_of("b2"))])
    reply = settle_health(topology.client, NODE_A, HEALTH_PORT, 503, 0)
    assert reply.json() == _health_body(0)
    assert reply.headers["x-load-balancing-endpoint-weight"] == "0"
    assert reply.headers["x-content-type-options"] == "nosniff"
    assert curl_exit_code(topology.client, NODE_A, NODE_PORT) == TIMED_OUT
    assert curl_exit_code(topology.client, LB_IP, 80) == TIMED_OUT
    # A pod on node-a to the same NodePort and LB IP: short-circuited to the cluster set.
    assert set(settle_on(topology.pod("a", 1), NODE_A, NODE_PORT, {"b1", "b2"})) == {"b1", "b2"}
    assert set(settle_on(topology.pod("a", 1), LB_IP, 80, {"b1", "b2"})) == {"b1", "b2"}
    assert settle_health(topology.client, NODE_B, HEALTH_PORT, 200, 2).json() == _health_body(2)


def test_etp_local_only_terminating_local_endpoints__still_served__health_503__kep1669(cluster, topology, pod_of):
    # The load balancer is told to drain node-a (0 ready local endpoints), while the connections it
    # still sends are served by the local serving-terminating pods, not sent across the cluster.
    _etp(cluster, [endpoint(pod_of(p)) for p in ("a1", "a2", "b1", "b2")])
    settle_health(topology.client, NODE_A, HEALTH_PORT, 200, 2)
    _etp(cluster, [serving_terminating(pod_of("a1")), serving_terminating(pod_of("a2")),
                   endpoint(pod_of("b1")), endpoint(pod_of("b2"))])
    assert settle_health(topology.client, NODE_A, HEALTH_PORT, 503, 0).json() == _health_body(0)
    assert set(settle_on(topology.client, NODE_A, NODE_PORT, {"a1", "a2"})) == {"a1", "a2"}

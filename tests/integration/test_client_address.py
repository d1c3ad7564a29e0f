"""Endpoints see who called: the client's address kept through the relay where kube-proxy keeps it.

The "Using Source IP" tutorial's promises, through the real daemons of the two-node topology
(pods on a bridge per node, as a bridge CNI puts them): pod -> ClusterIP -> endpoint on the same
bridge or on the other node sees the pod; an outside client -> externalTrafficPolicy Local
NodePort sees the client; an outside client -> Cluster NodePort -> other node is answered from
the node's address (kube-proxy masquerades it). The same over UDP and IPv6, and a filter in an
endpoint's namespace (what a CNI programs for a NetworkPolicy) decides on the pod's address.
"""

from __future__ import annotations

import pytest

from support.netns import CommandFailed, curl_in, http_url, parse_pod_reply, run_in, udp_request, until_sync
from support.netns.daemon import status_api
from support.netns.manifests import endpoint, endpoint_slice, node, service, start_daemon, write
from support.netns.policies import FAST_STOP, HTTP_SLICE_PORT, UDP_SLICE_PORT

pytestmark = pytest.mark.integration

NODE_A = "192.168.50.11"
CLIENT = "192.168.50.100"
ONE_V4, ONE_V6, LOCAL, CLUSTER, GUARDED = "10.96.0.60", "fd00:10:96::60", "10.96.0.61", "10.96.0.62", "10.96.0.63"
PORTS = [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080},
         {"name": "udp", "protocol": "UDP", "port": 90, "targetPort": 9090}]
SLICE_PORTS = (HTTP_SLICE_PORT, UDP_SLICE_PORT)
LOCAL_NODE_PORT, LOCAL_UDP_NODE_PORT, CLUSTER_NODE_PORT, LOCAL_HEALTH_PORT = 30260, 30262, 30261, 30263
LB_IP = "192.168.70.60"


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-relay-workers"])
def cluster(request, topology, pods, tmp_path_factory):
    """Both nodes' daemons; node-a's with relay workers in the second run (the workers bind the
    client's address, their parent programs the replies' tables)."""
    manifests, state = tmp_path_factory.mktemp("manifests"), tmp_path_factory.mktemp("state")
    write(manifests, "nodes", node(topology, "a"), node(topology, "b"))
    daemons = [start_daemon(topology, "a", manifests, state, *FAST_STOP, "--workers", str(request.param)),
               start_daemon(topology, "b", manifests, state, *FAST_STOP)]
    try:
        yield manifests
    finally:
        for daemon in daemons:
            daemon.stop()


def _one_endpoint(cluster, pod, name: str = "one") -> None:
    """Service ``name`` (dual-stack ClusterIP) whose only endpoint is ``pod``."""
    write(cluster, name,
          service(name, [ONE_V4, ONE_V6], PORTS),
          endpoint_slice(f"{name}-v4", name, SLICE_PORTS, [endpoint(pod)]),
          endpoint_slice(f"{name}-v6", name, SLICE_PORTS, [endpoint(pod, family=6)], family=6))


def _seen_by(ns: str, host: str, port: int, pod: str) -> str:
    """The client address ``pod`` reports for one request from ``ns``, once ``pod`` answers."""
    seen: list[str] = []

    def answered() -> bool:
        name, client = parse_pod_reply(curl_in(ns, http_url(host, port), timeout=2))
        seen.append(client)
        return name == pod

    until_sync(answered, f"{pod} answering {host}:{port} from {ns}", 15, interval=0.2, ignore=(CommandFailed,))
    return seen[-1]


def _udp_seen_by(ns: str, host: str, port: int, pod: str) -> str:
    reply = udp_request(ns, host, port, "peer?").decode().split()
    assert reply[0] == pod, reply
    return reply[1].removeprefix("client=").rsplit(":", 1)[0]


def _bridge_handed_to_host(topology) -> bool:
    """Whether node-a's daemon could write its bridge table: in a user namespace the kernel
    refuses rewriting a frame's link-layer header, and an endpoint on the client's own bridge
    then sees the node (docs/behaviour-proxy.md, "Who the endpoint sees")."""
    address = status_api(topology.node("a"), "/api/v1/status")["proxy"]["clientAddress"]
    assert address.startswith("client"), address
    return address == "client"


@pytest.mark.parametrize("endpoint_pod", ["a2", "b1"], ids=["same-bridge", "other-node"])
def test_pod_to_cluster_ip__endpoint_sees_the_pod(cluster, topology, pod_of, endpoint_pod):
    client = pod_of("a1")
    _one_endpoint(cluster, pod_of(endpoint_pod))
    expected = {4: client.ip(4), 6: client.ip(6)}
    if endpoint_pod == "a2" and not _bridge_handed_to_host(topology):
        expected = {4: "10.244.1.1", 6: "fd00:10:244:1::1"}  # node-a's address on the pods' bridge
    assert _seen_by(client.ns, ONE_V4, 80, endpoint_pod) == expected[4]
    assert _udp_seen_by(client.ns, ONE_V4, 90, endpoint_pod) == expected[4]
    assert _seen_by(client.ns, ONE_V6, 80, endpoint_pod) == expected[6]
    assert _udp_seen_by(client.ns, ONE_V6, 90, endpoint_pod) == expected[6]


def test_direct_pod_traffic_on_the_bridge_still_works(cluster, topology, pod_of):
    """A same-node endpoint's replies are handed to the host (bridge kubeport): a pod reaching that
    endpoint directly, not through a Service, is routed back to it."""
    _one_endpoint(cluster, pod_of("a2"))
    _seen_by(pod_of("a1").ns, ONE_V4, 80, "a2")
    name, client = parse_pod_reply(curl_in(pod_of("a1").ns, http_url(pod_of("a2").ip(4), 8080)))
    assert (name, client) == ("a2", pod_of("a1").ip(4))
    reply = udp_request(pod_of("a1").ns, pod_of("a2").ip(4), 9090, "peer?").decode()
    assert reply.startswith(f"a2 client={pod_of('a1').ip(4)}:")


def test_outside_client_to_local_node_port_and_lb_ip__endpoint_sees_the_client(cluster, topology, pod_of):
    write(cluster, "local",
          service("local", [LOCAL],
                  [dict(PORTS[0], nodePort=LOCAL_NODE_PORT), dict(PORTS[1], nodePort=LOCAL_UDP_NODE_PORT)],
                  type="LoadBalancer", externalTrafficPolicy="Local", healthCheckNodePort=LOCAL_HEALTH_PORT,
                  status={"loadBalancer": {"ingress": [{"ip": LB_IP}]}}),
          endpoint_slice("local-1", "local", SLICE_PORTS, [endpoint(pod_of("a2")), endpoint(pod_of("b1"))]))
    assert _seen_by(topology.client, NODE_A, LOCAL_NODE_PORT, "a2") == CLIENT
    assert _udp_seen_by(topology.client, NODE_A, LOCAL_UDP_NODE_PORT, "a2") == CLIENT
    assert _seen_by(topology.client, LB_IP, 80, "a2") == CLIENT  # the client routes LB IPs to node-a
    assert _udp_seen_by(topology.client, LB_IP, 90, "a2") == CLIENT


def test_outside_client_to_cluster_node_port__other_node_answers_the_node(cluster, topology, pod_of):
    """kube-proxy masquerades external traffic under externalTrafficPolicy Cluster: the endpoint on
    node-b sees node-a, and its reply comes back through node-a."""
    write(cluster, "cluster",
          service("cluster", [CLUSTER], [dict(PORTS[0], nodePort=CLUSTER_NODE_PORT)], type="NodePort"),
          endpoint_slice("cluster-1", "cluster", SLICE_PORTS, [endpoint(pod_of("b1"))]))
    assert _seen_by(topology.client, NODE_A, CLUSTER_NODE_PORT, "b1") == NODE_A


def test_a_network_policy_in_the_endpoint_decides_on_the_pod(cluster, topology, pod_of):
    """A filter in b1 admitting port 8080 from a1 only (what a CNI programs for an ingress
    NetworkPolicy with a podSelector) admits a1 through the Service and keeps a2 out."""
    b1, a1, a2 = pod_of("b1"), pod_of("a1"), pod_of("a2")
    write(cluster, "guarded", service("guarded", [GUARDED], PORTS[:1]),
          endpoint_slice("guarded-1", "guarded", SLICE_PORTS, [endpoint(b1)]))
    run_in(b1.ns, "nft", "add table inet netpol; add chain inet netpol input "
           "{ type filter hook input priority 0; policy accept; }; "
           f"add rule inet netpol input tcp dport 8080 ip saddr != {a1.ip(4)} drop")
    try:
        assert _seen_by(a1.ns, GUARDED, 80, "b1") == a1.ip(4)
        with pytest.raises(CommandFailed) as refused:
            curl_in(a2.ns, http_url(GUARDED, 80), timeout=2)
        assert refused.value.returncode == 28  # dropped by the policy, so the relay's connect times out
    finally:
        run_in(b1.ns, "nft", "delete table inet netpol")


def test_the_status_says_the_client_address_is_kept(cluster, topology):
    _bridge_handed_to_host(topology)


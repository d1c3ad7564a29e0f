"""Which address an endpoint sees (proxy/clientaddress.py), case by case."""

import pytest

from kubeport.proxy.clientaddress import ClientAddresses, Keep, frontend_keep
from kubeport.proxy.table import FrontendKind

CLUSTER_IP, EXTERNAL_IP, LB, NODE_PORT = (FrontendKind.CLUSTER_IP, FrontendKind.EXTERNAL_IP,
                                          FrontendKind.LOAD_BALANCER, FrontendKind.NODE_PORT)


@pytest.mark.parametrize("kind, local, enabled, expected", [
    (CLUSTER_IP, False, True, Keep.PODS),
    (EXTERNAL_IP, False, True, Keep.PODS),
    (LB, False, True, Keep.PODS),
    (NODE_PORT, False, True, Keep.NEVER),   # kube-proxy: the external chain masquerades under Cluster
    (NODE_PORT, True, True, Keep.ANY),
    (EXTERNAL_IP, True, True, Keep.ANY),
    (LB, True, True, Keep.ANY),
    (CLUSTER_IP, False, False, Keep.NEVER),
    (NODE_PORT, True, False, Keep.NEVER),
])
def test_frontend_keep(kind, local, enabled, expected):
    assert frontend_keep(kind, local, enabled) is expected


def node_a() -> ClientAddresses:
    """Node a of the test topology: pods 10.244.1.0/24 on br0, LAN 192.168.50.11/24."""
    addresses = ClientAddresses(["10.244.0.0/16", "fd00:10:244::/48"])
    addresses.set_node(["10.244.1.1", "192.168.50.11", "127.0.0.1", "fd00:10:244:1::1", "fd00:50::11"],
                       ["10.244.1.1/24", "192.168.50.11/24", "127.0.0.1/8", "fd00:10:244:1::1/64",
                        "fd00:50::11/64"])
    return addresses


@pytest.mark.parametrize("keep, client, endpoint, expected, why", [
    (Keep.PODS, "10.244.1.11", "10.244.1.12", True, "pod -> same-node endpoint"),
    (Keep.PODS, "10.244.1.11", "10.244.2.11", True, "pod of this node -> other node: replies routed back here"),
    (Keep.PODS, "10.244.2.11", "10.244.1.12", True, "other node's pod -> endpoint here: its gateway is here"),
    (Keep.PODS, "10.244.2.11", "10.244.2.12", False, "other node's pod -> remote endpoint: replies bypass us"),
    (Keep.PODS, "192.168.50.100", "10.244.1.12", False, "external client -> ClusterIP: masqueraded"),
    (Keep.PODS, "10.244.1.1", "10.244.1.12", False, "the node itself"),
    (Keep.PODS, "127.0.0.1", "10.244.1.12", False, "loopback"),
    (Keep.ANY, "192.168.50.100", "10.244.1.12", True, "external client, eTP Local"),
    (Keep.ANY, "127.0.0.1", "10.244.1.12", False, "loopback, eTP Local"),
    (Keep.ANY, "192.168.50.11", "10.244.1.12", False, "node address, eTP Local"),
    (Keep.ANY, "10.244.2.11", "10.244.2.12", False, "short-circuited remote pod to a remote endpoint"),
    (Keep.NEVER, "10.244.1.11", "10.244.1.12", False, "NodePort under Cluster"),
    (Keep.PODS, "10.244.1.11", "192.168.50.11", False, "endpoint on the node's own address"),
    (Keep.PODS, "fd00:10:244:1::11", "fd00:10:244:1::12", True, "IPv6 pod -> same-node endpoint"),
    (Keep.PODS, "fd00:10:244:2::11", "fd00:10:244:2::12", False, "IPv6 remote pod -> remote endpoint"),
    (Keep.PODS, "::ffff:10.244.1.11", "10.244.1.12", True, "a mapped IPv4 pod"),
    (Keep.PODS, "10.244.1.11", "10.244.1.11", False, "hairpin: the pod is its own endpoint"),
    (Keep.PODS, "not-an-ip", "10.244.1.12", False, "garbage"),
])
def test_keeps(keep, client, endpoint, expected, why):
    assert node_a().keeps(keep, client, endpoint) is expected, why


def test_without_cluster_cidr_no_client_is_a_pod():
    addresses = ClientAddresses([])
    addresses.set_node(["10.244.1.1"], ["10.244.1.1/24"])
    assert not addresses.keeps(Keep.PODS, "10.244.1.11", "10.244.1.12")
    assert addresses.keeps(Keep.ANY, "192.168.50.100", "10.244.1.12")


def test_node_change_clears_the_cache():
    addresses = node_a()
    assert addresses.classify("10.244.3.5") == (True, False, -1)
    addresses.set_node(["10.244.3.1"], ["10.244.3.1/24"])
    assert addresses.classify("10.244.3.5") == (True, True, 0)


@pytest.mark.parametrize("client, endpoint, expected, why", [
    ("10.244.1.11", "10.244.1.12", False, "one bridge: the endpoint's reply would bypass the host"),
    ("10.244.1.11", "10.244.2.11", True, "other node: the reply is routed back through this node"),
    ("10.244.2.11", "10.244.1.12", True, "other node's pod -> endpoint here"),
    ("fd00:10:244:1::11", "fd00:10:244:1::12", False, "one bridge, IPv6"),
])
def test_without_the_bridge_table__same_segment_gets_the_node(client, endpoint, expected, why):
    addresses = node_a()
    addresses.on_bridge = False
    assert addresses.keeps(Keep.PODS, client, endpoint) is expected, why

"""NodePorts, externalIPs and LoadBalancer IPs from outside the cluster (the client namespace),
through the real daemon on node-a (kube-proxy's pkg/proxy/iptables/proxier.go syncProxyRules,
pkg/proxy/util/nodeport_addresses.go, LoadBalancer ipMode per KEP-1860).
"""

from __future__ import annotations

import re

import pytest

from support.netns import (
    EXT_IPS,
    CommandFailed,
    curl_in,
    http_url,
    pods_seen,
    run_in,
    start_podserver,
    udp_request,
    until_sync,
)
from support.netns.manifests import endpoint_slice, node, remove, service, start_daemon, write

pytestmark = pytest.mark.integration

NODE_A, NODE_A6, NODE_B = "192.168.50.11", "fd00:50::11", "192.168.50.12"
EXTERNAL_IP, LB_IP, LB_PROXY_IP = "192.168.60.10", "192.168.70.10", "192.168.70.11"
EXTERNAL_IP6 = "fd00:60::10"
GUARDED_LB_IP, WELCOME_LB_IP = "192.168.70.20", "192.168.70.21"
VACANT_IP = "192.168.60.12"  # an externalIP of a service without endpoints
HTTP = {"name": "http", "protocol": "TCP", "port": 8080}
UDP = {"name": "udp", "protocol": "UDP", "port": 9090}
ALL_PODS = {"a1", "a2", "b1", "b2"}


@pytest.fixture(scope="module")
def cluster(topology, pods, tmp_path_factory):
    manifests = tmp_path_factory.mktemp("manifests")
    state = tmp_path_factory.mktemp("state")
    everyone = topology.pods
    b_pods = [p for p in everyone if p.node.name == "node-b"]
    write(manifests, "nodes", node(topology, "a"), node(topology, "b"))
    write(manifests, "edge",
          service("edge", ["10.96.0.30", "fd00:10:96::30"], [
              {"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080},
              {"name": "udp", "protocol": "UDP", "port": 90, "targetPort": 9090, "nodePort": 30090},
          ], type="LoadBalancer", externalIPs=[EXTERNAL_IP, EXTERNAL_IP6],
              status={"loadBalancer": {"ingress": [{"ip": LB_IP}, {"ip": LB_PROXY_IP, "ipMode": "Proxy"}]}}),
          endpoint_slice("edge-v4", "edge", [HTTP, UDP], everyone),
          endpoint_slice("edge-v6", "edge", [HTTP, UDP], everyone, family=6))
    # eTP=Local with every endpoint on node-b: node-a has no local endpoint.
    write(manifests, "remote-only",
          service("remote-only", ["10.96.0.31"], [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30081}],
                  type="NodePort", externalTrafficPolicy="Local"),
          endpoint_slice("remote-only-1", "remote-only", [HTTP], b_pods))
    # loadBalancerSourceRanges: "guarded" lets only 203.0.113.0/24 in, "welcome" the LAN.
    for name, cluster_ip, lb_ip, node_port, ranges in (
        ("guarded", "10.96.0.32", GUARDED_LB_IP, 30082, ["203.0.113.0/24"]),
        ("welcome", "10.96.0.33", WELCOME_LB_IP, 30083, ["192.168.50.0/24"]),
    ):
        write(manifests, name,
              service(name, [cluster_ip], [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": node_port}],
                      type="LoadBalancer", loadBalancerSourceRanges=ranges,
                      status={"loadBalancer": {"ingress": [{"ip": lb_ip}]}}),
              endpoint_slice(f"{name}-1", name, [HTTP], everyone))
    daemon = start_daemon(topology, "a", manifests, state)
    yield manifests, state
    daemon.stop()


def test_node_port_from_outside_reaches_pods_on_both_nodes(topology, cluster):
    assert pods_seen(topology.client, NODE_A, 30080, ALL_PODS) == ALL_PODS
    assert udp_request(topology.client, NODE_A, 30090, "np").split()[0].decode() in ALL_PODS


def test_node_port_on_ipv6_node_address(topology, cluster):
    assert "pod=" in curl_in(topology.client, http_url(NODE_A6, 30080))


def test_external_ip_and_load_balancer_vip_from_outside(topology, cluster):
    """externalIPs and VIP-mode LB ingress IPs as frontends: pkg/proxy/iptables/proxier.go syncProxyRules."""
    assert pods_seen(topology.client, EXTERNAL_IP, 80, ALL_PODS) == ALL_PODS
    assert pods_seen(topology.client, EXTERNAL_IP6, 80, ALL_PODS) == ALL_PODS
    assert pods_seen(topology.client, LB_IP, 80, ALL_PODS) == ALL_PODS
    assert udp_request(topology.client, EXTERNAL_IP6, 90, "v6").split()[0].decode() in ALL_PODS


def test_load_balancer_ip_in_proxy_mode_is_not_captured(topology, cluster):
    """ipMode Proxy is left to the load balancer (KEP-1860; pkg/proxy/util/utils.go IsVIPMode)."""
    assert "pod=" in curl_in(topology.client, http_url(LB_IP, 80))
    with pytest.raises(CommandFailed):  # routed on by node-a, which has no route for it
        curl_in(topology.client, http_url(LB_PROXY_IP, 80), timeout=1.5)


def test_external_and_lb_ips_are_taken_by_port_not_as_node_addresses(topology, cluster):
    """kube-proxy's iptables and nftables modes take only IP:port (its IPVS mode, the whole address):
    pkg/proxy/iptables/proxier.go syncProxyRules."""
    listing = run_in(topology.node("a"), "ip", "-o", "addr", "show").stdout
    assert not {EXTERNAL_IP, EXTERNAL_IP6, LB_IP, LB_PROXY_IP, GUARDED_LB_IP} & set(
        re.findall(r"inet6? ([^/ ]+)/", listing))


def test_external_ip_that_is_a_real_hosts_address__its_other_ports_still_reach_it(topology, cluster):
    """The externalIP is the ext host's own LAN address: node-a and its pods reach the service
    on its port, and the host itself on every other port (the address is not node-a's), as
    kube-proxy's pkg/proxy/iptables/proxier.go syncProxyRules matches IP:port only."""
    manifests, _ = cluster
    host, node_a, pod = EXT_IPS[0], topology.node("a"), topology.pod("a", 1)
    write(manifests, "foreign",
          service("foreign", ["10.96.0.40"], [{"name": "http", "port": 80, "targetPort": 8080}], externalIPs=[host]),
          endpoint_slice("foreign-1", "foreign", [HTTP], topology.pods),
          service("vacant", ["10.96.0.41"], [{"name": "http", "port": 80, "targetPort": 8080}],
                  externalIPs=[VACANT_IP]))
    route_back = (topology.ext, "ip", "route", "add", "10.244.0.0/16", "via", NODE_A)
    run_in(*route_back)
    server = start_podserver(topology.ext, "beyond")
    try:
        for client in (node_a, pod):
            until_sync(lambda: "pod=" in curl_in(client, http_url(host, 80), timeout=1),  # noqa: B023
                       "the externalIP's service port taken", 15, ignore=(CommandFailed,))
            assert "pod=beyond" not in curl_in(client, http_url(host, 80))  # a pod of the service
            assert "pod=beyond" in curl_in(client, http_url(host, 8080))  # any other port: the host itself
        with pytest.raises(CommandFailed) as refused:  # no endpoint: REJECT, from outside too
            curl_in(topology.client, http_url(VACANT_IP, 80), timeout=2)
        assert refused.value.returncode == 7
    finally:
        server.kill()
        server.wait()
        run_in(*route_back[:3], "del", *route_back[4:], check=False)
        remove(manifests, "foreign")


def test_load_balancer_source_ranges__outside_the_ranges_dropped(topology, cluster):
    """pkg/proxy/iptables/proxier.go syncProxyRules: a source outside loadBalancerSourceRanges is dropped."""
    with pytest.raises(CommandFailed) as failure:
        curl_in(topology.client, http_url(GUARDED_LB_IP, 80), timeout=1.5)
    assert failure.value.returncode == 28  # timed out: DROP
    assert pods_seen(topology.client, WELCOME_LB_IP, 80, ALL_PODS) == ALL_PODS  # inside its ranges


def test_load_balancer_source_ranges__node_port_and_cluster_ip_unaffected(topology, cluster):
    """pkg/proxy/iptables/proxier.go syncProxyRules: source ranges guard LB VIPs only, not NodePorts."""
    assert "pod=" in curl_in(topology.client, http_url(NODE_A, 30082))
    assert "pod=" in curl_in(topology.pod("a", 1), http_url("10.96.0.32", 80))


def test_etp_local_without_local_endpoints__outside_clients_dropped(topology, cluster):
    """pkg/proxy/iptables/proxier.go syncProxyRules: eTP=Local without local endpoints is DROP."""
    with pytest.raises(CommandFailed) as failure:
        curl_in(topology.client, http_url(NODE_A, 30081), timeout=1.5)
    assert failure.value.returncode == 28  # timed out: DROP, not REJECT (7)


def test_etp_local_without_local_endpoints__pods_short_circuited_to_the_cluster_set(topology, cluster):
    """pkg/proxy/iptables/proxier.go syncProxyRules: pods to an eTP=Local frontend get the cluster set."""
    # A pod on node-a is a "local" source: it gets the cluster set (node-b's pods).
    seen = pods_seen(topology.pod("a", 1), NODE_A, 30081, {"b1", "b2"})
    assert seen == {"b1", "b2"}


def test_nodeport_addresses_limits_where_node_ports_listen(topology, cluster):
    """--nodeport-addresses CIDRs: pkg/proxy/util/nodeport_addresses.go NewNodePortAddresses."""
    manifests, state = cluster
    # node-b's daemon: NodePorts only on its pod bridge address, not on its LAN address.
    daemon = start_daemon(topology, "b", manifests, state, "--nodeport-addresses", "10.244.2.0/24")
    try:
        assert "pod=" in curl_in(topology.pod("b", 1), http_url("10.244.2.1", 30080))
        with pytest.raises(CommandFailed) as failure:
            curl_in(topology.client, http_url(NODE_B, 30080), timeout=2)
        assert failure.value.returncode == 7
    finally:
        daemon.stop()

"""autopath through the real daemon: a pod of node-a with the kubelet's resolv.conf (search
shop.svc.cluster.local svc.cluster.local cluster.local, ndots:5) resolves with glibc's
`getent ahosts`, one query per address family, where CoreDNS's `autopath @kubernetes` would
answer it (plugin/autopath/autopath.go ServeDNS). The querying pod is found by its source
address among the Pods of the manifests; a pod of the node that no Pod manifest declares walks
its search path itself. Queries are counted at the daemon's coredns_dns_requests_total.
"""

from __future__ import annotations

import pytest

from support.netns import EXT_IPS, SERVICE_CIDRS, KubeportDaemon, run_in
from support.netns.cluster_dns import NS, dig, host_resolv_conf, pod_resolv_conf, start_fake_upstream
from support.netns.manifests import node, service, write
from support.netns.operating import scrape, total

from support import api

pytestmark = pytest.mark.integration

HTTP = [{"name": "http", "protocol": "TCP", "port": 80}]
OTHER_NS = "payments"
WWW = {"203.0.113.7", "2001:db8::7"}  # www.example.test at the fake upstream


@pytest.fixture(scope="module")
def cluster(topology, tmp_path_factory):
    manifests = tmp_path_factory.mktemp("manifests")
    state = tmp_path_factory.mktemp("state")
    a1 = topology.pod_info("a", 1)
    write(manifests, "nodes", node(topology, "a"), node(topology, "b"))
    write(manifests, "pods", api.pod("a1", NS, ips=list(a1.ips), node=a1.node.name))
    write(manifests, "api", service("api", ["10.96.0.40", "fd00:10:96::40"], HTTP, namespace=OTHER_NS))
    start_fake_upstream(topology)
    with host_resolv_conf(topology.node("a"), EXT_IPS[0]):
        daemon = KubeportDaemon(topology.node("a"), manifests, state / "a", "--dns-autopath",
                                "--upstream", EXT_IPS[0], "--service-cluster-ip-range", ",".join(SERVICE_CIDRS))
        daemon.wait_ready(timeout=30)
    yield
    daemon.stop()


def _requests(topology) -> float:
    return total(scrape(topology.node("a")), "coredns_dns_requests_total")


def _ahosts(topology, pod: tuple[str, int], name: str) -> tuple[set[str], float]:
    """getent ahosts from a pod with the kubelet's resolv.conf: the addresses and the queries it took."""
    ns = topology.pod(*pod)
    with pod_resolv_conf(ns):
        before = _requests(topology)
        out = run_in(ns, "getent", "ahosts", name).stdout
        after = _requests(topology)
    return {line.split()[0] for line in out.splitlines()}, after - before


def test_autopath_resolves_an_external_name_with_one_query_per_family(topology, cluster) -> None:
    addresses, queries = _ahosts(topology, ("a", 1), "www.example.test")
    assert addresses == WWW
    assert queries == 2  # www.example.test.shop.svc.cluster.local A and AAAA


def test_autopath_resolves_a_service_of_another_namespace_with_one_query_per_family(topology, cluster) -> None:
    addresses, queries = _ahosts(topology, ("a", 1), f"api.{OTHER_NS}")
    assert addresses == {"10.96.0.40", "fd00:10:96::40"}
    assert queries == 2


def test_a_pod_no_manifest_declares_walks_its_search_path(topology, cluster) -> None:
    addresses, queries = _ahosts(topology, ("a", 2), "www.example.test")
    assert addresses == WWW
    assert queries == 8  # three search names and the bare name, A and AAAA each


@pytest.mark.parametrize("proto", [pytest.param((), id="udp"), pytest.param(("+tcp",), id="tcp")])
def test_the_answer_is_a_cname_from_the_name_asked(topology, cluster, proto) -> None:
    """cnamer: the question as asked, a CNAME to the name found, then its records."""
    name = f"www.example.test.{NS}.svc.cluster.local"
    result = dig(topology.pod("a", 1), *proto, name, "A")
    assert result.status == "NOERROR", result.output
    cname = result.answer[0].split()
    assert (cname[0], cname[2:]) == (f"{name}.", ["IN", "CNAME", "www.example.test."]), result.output
    assert result.answer[1].startswith("www.example.test. ") and result.answer[1].endswith("203.0.113.7")
    assert dig(topology.pod("a", 2), *proto, name, "A").status == "NXDOMAIN"

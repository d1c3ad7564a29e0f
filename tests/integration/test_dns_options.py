"""The kubernetes plugin's options through the real daemon, asked with `dig` from a pod.

One kubeport in node-a, configured as a CoreDNS operator would write
``kubernetes cluster.local in-addr.arpa ip6.arpa { namespaces shop; endpoint_pod_names;
ignore empty_service }`` (no ``fallthrough``): the namespaces, fallthrough and empty-service
options from the configuration file, the rest from flags.
"""

from __future__ import annotations

import re

import pytest

from support.netns import EXT_IPS, SERVICE_CIDRS, KubeportDaemon
from support.netns.cluster_dns import NS, dig, fqdn, start_fake_upstream
from support.netns.manifests import endpoint, endpoint_slice, node, service, write

pytestmark = pytest.mark.integration

HTTP = [{"name": "http", "protocol": "TCP", "port": 80}]
WEB, EMPTY, PETS = fqdn("web"), fqdn("empty"), fqdn("pets")
OTHER_NS = "elsewhere"
REVERSE_SOA = re.compile(r"in-addr\.arpa\. 5 IN SOA ns\.dns\.in-addr\.arpa\. hostmaster\.in-addr\.arpa\. "
                         r"\d+ 7200 1800 86400 5")
CLUSTER_SOA = re.compile(r"cluster\.local\. 5 IN SOA ns\.dns\.cluster\.local\. hostmaster\.cluster\.local\. "
                         r"\d+ 7200 1800 86400 5")


@pytest.fixture(scope="module")
def cluster(topology, tmp_path_factory):
    manifests = tmp_path_factory.mktemp("manifests")
    state = tmp_path_factory.mktemp("state")
    pod = topology.pod_info("a", 1)
    write(manifests, "nodes", node(topology, "a"), node(topology, "b"))
    write(manifests, "web", service("web", ["10.96.0.20"], HTTP, namespace=NS),
          endpoint_slice("web-1", "web", HTTP, ["10.244.1.11"], namespace=NS))
    write(manifests, "empty", service("empty", ["10.96.0.21"], HTTP, namespace=NS))
    write(manifests, "pets", service("pets", ports=HTTP, namespace=NS, clusterIP="None"),
          endpoint_slice("pets-1", "pets", HTTP, [endpoint(pod, namespace=NS)], namespace=NS))
    write(manifests, "elsewhere", service("hidden", ["10.96.0.30"], HTTP, namespace=OTHER_NS),
          endpoint_slice("hidden-1", "hidden", HTTP, ["10.244.1.30"], namespace=OTHER_NS))
    config = tmp_path_factory.mktemp("config") / "kubeport.yaml"
    config.write_text("apiVersion: kubeport.io/v1alpha1\nkind: KubeportConfiguration\n"
                      f"dns:\n  namespaces: [{NS}]\n  ignoreEmptyService: true\n  fallthrough: []\n")
    start_fake_upstream(topology)
    daemon = KubeportDaemon(topology.node("a"), manifests, state / "a", "--config", config,
                            "--upstream", EXT_IPS[0], "--service-cluster-ip-range", ",".join(SERVICE_CIDRS),
                            "--endpoint-pod-names", "--dns-reverse-zones", "in-addr.arpa,ip6.arpa")
    daemon.wait_ready(timeout=30)
    yield pod
    daemon.stop()


def test_namespaces_serves_only_the_listed_namespace(topology, cluster) -> None:
    """CoreDNS `namespaces`: kubernetes.go Records (errNsNotExposed), reverse.go serviceRecordForIP."""
    ns = topology.pod("a", 1)
    assert dig(ns, WEB, "A").answer == (f"{WEB}. 5 IN A 10.96.0.20",)
    hidden = dig(ns, f"hidden.{OTHER_NS}.svc.cluster.local", "A")
    assert hidden.status == "NXDOMAIN" and CLUSTER_SOA.fullmatch(hidden.authority[0]), hidden.output
    ptr = dig(ns, "-x", "10.96.0.30")
    assert ptr.status == "NXDOMAIN" and ptr.answer == (), ptr.output
    assert len(ptr.authority) == 1 and REVERSE_SOA.fullmatch(ptr.authority[0]), ptr.output


def test_unknown_ip_in_a_served_reverse_zone_is_nxdomain_with_its_soa(topology, cluster) -> None:
    """`kubernetes cluster.local in-addr.arpa ip6.arpa` without fallthrough: authoritative (handler.go ServeDNS)."""
    result = dig(topology.pod("a", 1), "-x", "10.99.99.99")
    assert result.status == "NXDOMAIN" and "aa" in result.flags, result.output
    assert len(result.authority) == 1 and REVERSE_SOA.fullmatch(result.authority[0]), result.output
    known = dig(topology.pod("a", 1), "-x", "10.96.0.20")
    assert known.answer == (f"20.0.96.10.in-addr.arpa. 5 IN PTR {WEB}.",), known.output


def test_ignore_empty_service_is_nxdomain_without_ready_endpoints(topology, cluster) -> None:
    """CoreDNS `ignore empty_service`: kubernetes.go findServices skips a ClusterIP service without endpoints."""
    result = dig(topology.pod("a", 1), EMPTY, "A")
    assert result.status == "NXDOMAIN" and CLUSTER_SOA.fullmatch(result.authority[0]), result.output


def test_endpoint_pod_names_names_the_endpoint_after_its_pod(topology, cluster) -> None:
    """CoreDNS `endpoint_pod_names`: kubernetes.go endpointHostname takes the targetRef's name."""
    pod = cluster
    ns = topology.pod("a", 1)
    srv = dig(ns, f"_http._tcp.{PETS}", "SRV")
    assert srv.answer == (f"_http._tcp.{PETS}. 5 IN SRV 0 100 80 {pod.name}.{PETS}.",), srv.output
    named = dig(ns, f"{pod.name}.{PETS}", "A")
    assert named.answer == (f"{pod.name}.{PETS}. 5 IN A {pod.ip(4)}",), named.output

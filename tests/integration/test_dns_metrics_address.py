"""The DNS metrics address (NodeLocal DNSCache's :9253) scraped from the node with curl after
a pod's queries, as a CoreDNS dashboard's Prometheus would: CoreDNS's series and the
process's, nothing of the proxy's."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.coredns_dashboard import NOT_EXPORTED, dashboard_series
from support.netns import EXT_IPS, SERVICE_CIDRS, KubeportDaemon, curl_in
from support.netns.cluster_dns import NS, dig, fqdn, start_fake_upstream
from support.netns.manifests import endpoint_slice, node, service, write
from support.wait import until_sync

pytestmark = pytest.mark.integration

HTTP = [{"name": "http", "protocol": "TCP", "port": 80}]


@pytest.fixture(scope="module")
def cluster(topology, tmp_path_factory):
    manifests = tmp_path_factory.mktemp("manifests")
    write(manifests, "nodes", node(topology, "a"), node(topology, "b"))
    write(manifests, "web", service("web", ["10.96.0.20"], HTTP, namespace=NS),
          endpoint_slice("web-1", "web", HTTP, ["10.244.1.11"], namespace=NS))
    start_fake_upstream(topology)
    daemon = KubeportDaemon(topology.node("a"), manifests, tmp_path_factory.mktemp("state") / "a",
                            "--upstream", EXT_IPS[0], "--service-cluster-ip-range", ",".join(SERVICE_CIDRS))
    daemon.wait_ready(timeout=30)
    yield manifests
    daemon.stop()


def scrape(ns: str, url: str) -> dict[str, set[str]]:
    """sample name -> the label names it has, from curl's body."""
    body = curl_in(ns, url, "-f")
    series: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return series


def test_every_series_a_coredns_dashboard_reads_is_on_the_dns_metrics_address(topology, cluster) -> None:
    pod = topology.pod("a", 1)
    for args in ((fqdn("web"), "A"), (fqdn("web"), "A"), ("www.example.test", "A"), ("www.example.test", "A"),
                 (fqdn("nope"), "A"), ("+tcp", fqdn("web"), "A")):
        assert dig(pod, *args).status in ("NOERROR", "NXDOMAIN")
    write(cluster, "db", service("db", ports=HTTP, namespace=NS, clusterIP="None"),
          endpoint_slice("db-1", "db", HTTP, ["10.244.1.21"], namespace=NS))  # a change to program
    until_sync(lambda: dig(pod, fqdn("db"), "A").answer, "the new headless service to be answered")
    scraped = scrape(topology.node("a"), "http://127.0.0.1:9253/metrics")
    wanted = dashboard_series()
    assert not {name for name in wanted if name not in scraped} - NOT_EXPORTED, sorted(scraped)
    for name, grouped in wanted.items():
        if name in scraped:
            assert grouped <= scraped[name], name
    assert not [name for name in scraped if name.startswith(("kubeproxy_", "kubeport_proxy_"))]
    # the daemon's own metrics address keeps the DNS series beside kube-proxy's
    assert "coredns_dns_requests_total" in scrape(topology.node("a"), "http://127.0.0.1:10249/metrics")

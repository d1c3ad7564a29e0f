"""Stub domains through the real daemon, asked with `dig` from a pod: a name under
``consul.local`` reaches the stub domain's server, every other name the default upstream,
as CoreDNS's ``consul.local:53 { forward . IP }`` beside ``.:53 { forward . IP }`` (and
NodeLocal DNSCache's block per kube-dns stubDomains entry). Both servers are
fake_upstream_dns.py in the test's ext namespace: the default one is authoritative for
example.test only, the stub one for consul.local only, each REFUSED elsewhere, so an answer
proves which one was asked."""

from __future__ import annotations

import pytest

from support.netns import EXT_IPS, SERVICE_CIDRS, KubeportDaemon
from support.netns.cluster_dns import dig, start_fake_upstream
from support.netns.manifests import node, write

pytestmark = pytest.mark.integration

STUB_PORT = "5353"
STUB_ANSWER = "198.51.100.53"


@pytest.fixture(scope="module")
def cluster(topology, tmp_path_factory):
    manifests = tmp_path_factory.mktemp("manifests")
    write(manifests, "nodes", node(topology, "a"), node(topology, "b"))
    start_fake_upstream(topology)
    start_fake_upstream(topology, "--port", STUB_PORT, "--zone", "consul.local", "--answer", STUB_ANSWER)
    daemon = KubeportDaemon(topology.node("a"), manifests, tmp_path_factory.mktemp("state") / "a",
                            "--upstream", EXT_IPS[0], "--service-cluster-ip-range", ",".join(SERVICE_CIDRS),
                            "--dns-stub-domain", f"consul.local={EXT_IPS[0]}:{STUB_PORT}")
    daemon.wait_ready(timeout=30)
    yield
    daemon.stop()


@pytest.mark.parametrize("name, answer", [
    ("web.service.consul.local", f"web.service.consul.local. 300 IN A {STUB_ANSWER}"),
    ("Consul.Local", f"Consul.Local. 300 IN A {STUB_ANSWER}"),  # the apex, any case
    ("www.example.test", "www.example.test. 300 IN A 203.0.113.7"),
])
def test_each_name_reaches_its_zones_server(topology, cluster, name, answer) -> None:
    result = dig(topology.pod("a", 1), name, "A")
    assert result.status == "NOERROR", result.output
    assert result.answer == (answer,), result.output


def test_a_name_outside_the_stub_zone_is_not_sent_there(topology, cluster) -> None:
    """consul.example.test is no name of consul.local: the default upstream answers it (NXDOMAIN
    with example.test's SOA), not the stub server (which would say REFUSED)."""
    result = dig(topology.pod("a", 1), "consul.example.test", "A")
    assert result.status == "NXDOMAIN", result.output

"""An ExternalName Service while no upstream answers: the daemon's upstream is the ext
namespace's address, where nothing listens (ICMP port unreachable, then the forward deadline)."""

from __future__ import annotations

import pytest

from support.netns import DNS_SERVICE_IP, EXT_IPS, SERVICE_CIDRS, KubeportDaemon, dig_in
from support.netns.cluster_dns import NS, fqdn, parse_dig
from support.netns.manifests import node, service, write

pytestmark = pytest.mark.integration

EXT = fqdn("ext")


@pytest.fixture(scope="module")
def cluster(topology, tmp_path_factory):
    manifests = tmp_path_factory.mktemp("manifests")
    write(manifests, "nodes", node(topology, "a"), node(topology, "b"))
    write(manifests, "ext", service("ext", namespace=NS, type="ExternalName", externalName="www.example.test"))
    daemon = KubeportDaemon(topology.node("a"), manifests, tmp_path_factory.mktemp("state") / "a",
                            "--upstream", EXT_IPS[0], "--service-cluster-ip-range", ",".join(SERVICE_CIDRS))
    daemon.wait_ready(timeout=30)
    yield
    daemon.stop()


def test_externalname_answers_its_cname_when_upstream_is_down(topology, cluster) -> None:
    """CoreDNS plugin/backend_lookup.go A(): the target is asked through CoreDNS's own server
    (plugin/pkg/upstream Lookup), which writes SERVFAIL when forward fails; its empty answer
    follows the CNAME: NOERROR, the CNAME alone."""
    output = dig_in(topology.pod("a", 1), "+noall", "+comments", "+answer", "+authority", EXT, "A",
                    server=DNS_SERVICE_IP, timeout=9)
    result = parse_dig(output)
    assert result.status == "NOERROR", output
    assert result.answer == (f"{EXT}. 5 IN CNAME www.example.test.",), output
    forwarded = parse_dig(dig_in(topology.pod("a", 1), "+noall", "+comments", "www.example.test", "A",
                                 server=DNS_SERVICE_IP, timeout=9))
    assert forwarded.status == "SERVFAIL"  # the plain forward, for contrast (CoreDNS forward: no healthy upstream)

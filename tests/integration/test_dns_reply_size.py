"""Reply sizes through the real daemon: a pod's resolver asks over UDP without EDNS (512
bytes), as glibc does by default, and gets what CoreDNS (through miekg/dns) would send."""

from __future__ import annotations

import pytest

from support.netns import DNS_SERVICE_IP, EXT_IPS, SERVICE_CIDRS, KubeportDaemon, dig_in
from support.netns.cluster_dns import NS, dig, fqdn, start_fake_upstream
from support.netns.manifests import endpoint_slice, node, service, write

pytestmark = pytest.mark.integration

HTTP = [{"name": "http", "protocol": "TCP", "port": 80}]
SIX = fqdn("six")
SIX_ADDRESSES = [f"10.244.1.{i}" for i in range(11, 17)]


@pytest.fixture(scope="module")
def cluster(topology, tmp_path_factory):
    manifests = tmp_path_factory.mktemp("manifests")
    write(manifests, "nodes", node(topology, "a"), node(topology, "b"))
    write(manifests, "six", service("six", ports=HTTP, namespace=NS, clusterIP="None"),
          endpoint_slice("six-1", "six", HTTP, SIX_ADDRESSES, namespace=NS))
    start_fake_upstream(topology)
    daemon = KubeportDaemon(topology.node("a"), manifests, tmp_path_factory.mktemp("state") / "a",
                            "--upstream", EXT_IPS[0], "--service-cluster-ip-range", ",".join(SERVICE_CIDRS))
    daemon.wait_ready(timeout=30)
    yield
    daemon.stop()


def test_six_endpoint_srv_with_glue_fits_udp_without_edns(topology, cluster) -> None:
    """Glue owners compressed against the SRV targets before them (miekg/dns packDomainName):
    the whole answer in 512 bytes, TC clear, nothing dropped."""
    ns = topology.pod("a", 1)
    result = dig(ns, "+noedns", "+ignore", f"_http._tcp.{SIX}", "SRV")
    assert "tc" not in result.flags and len(result.answer) == 6, result.output
    full = dig_in(ns, "+noedns", "+ignore", "+noall", "+additional", "+stats", f"_http._tcp.{SIX}", "SRV",
                  server=DNS_SERVICE_IP, timeout=3)
    glue = sorted(line.split()[-1] for line in full.splitlines() if line and not line.startswith(";"))
    assert glue == sorted(SIX_ADDRESSES), full
    size = int(next(line for line in full.splitlines() if "MSG SIZE" in line).split()[-1])
    assert size <= 512, full

"""CoreDNS cache `serve_stale` through the daemon: a pod keeps resolving an external name
while the upstream is stopped, with TTL 0, once the cached answer has expired."""

from __future__ import annotations

import pytest

from support.netns import EXT_IPS, SERVICE_CIDRS, KubeportDaemon, curl_in
from support.netns.cluster_dns import dig, start_fake_upstream
from support.netns.manifests import node, write
from support.wait import until_sync

pytestmark = pytest.mark.integration

BRIEF = "brief.example.test"  # TTL 1 at the fake upstream, kept the cache's minimum 5 s


@pytest.fixture(scope="module")
def cluster(topology, tmp_path_factory):
    manifests = tmp_path_factory.mktemp("manifests")
    write(manifests, "nodes", node(topology, "a"), node(topology, "b"))
    upstream = start_fake_upstream(topology)
    daemon = KubeportDaemon(topology.node("a"), manifests, tmp_path_factory.mktemp("state") / "a",
                            "--upstream", EXT_IPS[0], "--service-cluster-ip-range", ",".join(SERVICE_CIDRS),
                            "--dns-serve-stale", "1h")
    daemon.wait_ready(timeout=30)
    yield upstream
    daemon.stop()


def test_expired_answer_is_served_at_ttl_0_while_the_upstream_is_down(topology, cluster) -> None:
    pod = topology.pod("a", 1)
    first = dig(pod, BRIEF, "A")
    assert first.status == "NOERROR" and first.answer == (f"{BRIEF}. 1 IN A 203.0.113.9",), first.output
    cluster.terminate()
    cluster.wait(timeout=10)
    assert dig(pod, "www.example.test", "A").status == "SERVFAIL"  # never cached: the upstream is gone

    def stale():
        """The answer once it is served stale (counted so), not merely aged to 0 before it expired."""
        result = dig(pod, BRIEF, "A")
        return result if served_stale(topology.node("a")) >= 1 else None

    result = until_sync(stale, "the cached answer to expire and be served stale", timeout=20)
    assert result.status == "NOERROR" and result.answer == (f"{BRIEF}. 0 IN A 203.0.113.9",), result.output


def served_stale(node_ns: str) -> float:
    body = curl_in(node_ns, "http://127.0.0.1:9253/metrics", "-f")
    return sum(float(line.split()[-1]) for line in body.splitlines()
               if line.startswith("coredns_cache_served_stale_total{"))

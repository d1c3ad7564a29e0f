"""The Pods DNS reads from a kube-apiserver, through the daemon: `pods verified` answers for a
Pod of the watch that no Service selects (CoreDNS findPods over its pod informer), and
autopath finds the querying pod among them. kubeport runs on node-b with `--pods verified
--dns-autopath` against the fake API server in that namespace; b1 asks with dig.
"""

from __future__ import annotations

import pytest

from support.apiserver.tls import TlsFiles, make_tls
from support.netns import until_sync
from support.netns.apiserver import NetnsApiServer, dig_answer, k8s, resource_stats, seed, start_daemon

pytestmark = pytest.mark.integration

LONELY = "10.244.9.9"  # a Pod's address that is no endpoint of any Service
WEB = "web.default.svc.cluster.local"


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TlsFiles:
    return make_tls(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def api(topology, pods, tls, tmp_path_factory):
    b1 = topology.pod_info("b", 1)
    with NetnsApiServer(topology.node("b"), tls) as api:
        seed(api, topology, [b1])
        api.apply(k8s.pod("client-5d-b1", ip=b1.ips[0], node_name="node-b"))
        api.apply(k8s.pod("lonely-5d-x", ip=LONELY, node_name="node-a"))
        daemon = start_daemon(api, tmp_path_factory.mktemp("daemon"), "--pods", "verified", "--dns-autopath")
        try:
            daemon.wait_ready(timeout=30)
            assert resource_stats(daemon.ns, "Pod")["synced"]  # pods verified waits for the Pods' list
            yield api
        finally:
            daemon.stop()


def test_pods_verified_answers_a_pod_of_the_watch(topology, api) -> None:
    client = topology.pod("b", 1)
    name = f"{LONELY.replace('.', '-')}.default.pod.cluster.local"
    assert dig_answer(client, name) == ("NOERROR", [LONELY])
    assert dig_answer(client, "10-244-9-8.default.pod.cluster.local")[0] == "NXDOMAIN"
    api.delete("Pod", "default", "lonely-5d-x")
    until_sync(lambda: dig_answer(client, name)[0] == "NXDOMAIN", "the deleted Pod's name gone", 10)


def test_autopath_finds_the_querying_pod_among_the_watched_pods(topology, api) -> None:
    """A pod of default asks web.default.default.svc.cluster.local: autopath answers with
    web.default.svc.cluster.local behind a CNAME (plugin/autopath/autopath.go ServeDNS)."""
    rcode, answers = dig_answer(topology.pod("b", 1), "web.default.default.svc.cluster.local")
    assert (rcode, answers) == ("NOERROR", ["10.96.0.20", f"{WEB}."]), answers
    assert dig_answer(topology.pod("b", 2), "web.default.default.svc.cluster.local")[0] == "NXDOMAIN"

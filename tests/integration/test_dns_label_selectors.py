"""CoreDNS's `labels` and `namespace_labels` through the daemon, asked with dig from a pod:
kubeport on node-a with `--dns-labels 'tier in (front)' --dns-namespace-labels team=a`, on
manifests whose Services and Namespaces carry labels; a relabelled manifest applies live."""

from __future__ import annotations

import pytest

from support.netns import SERVICE_CIDRS, KubeportDaemon, until_sync
from support.netns.cluster_dns import dig
from support.netns.manifests import node, service, write

from support import api

pytestmark = pytest.mark.integration

HTTP = [{"name": "http", "protocol": "TCP", "port": 80}]


def labelled(obj: dict, **labels: str) -> dict:
    obj["metadata"]["labels"] = labels
    return obj


@pytest.fixture(scope="module")
def manifests(topology, tmp_path_factory):
    directory = tmp_path_factory.mktemp("manifests")
    state = tmp_path_factory.mktemp("state")
    write(directory, "nodes", node(topology, "a"), node(topology, "b"))
    write(directory, "namespaces", labelled(api.namespace("shop"), team="a"), labelled(api.namespace("bank"), team="b"))
    write(directory, "shop", labelled(service("web", ["10.96.0.20"], HTTP, namespace="shop"), tier="front"),
          labelled(service("cache", ["10.96.0.21"], HTTP, namespace="shop"), tier="back"))
    write(directory, "bank", labelled(service("vault", ["10.96.0.30"], HTTP, namespace="bank"), tier="front"))
    daemon = KubeportDaemon(topology.node("a"), directory, state / "a", "--dns-labels", "tier in (front)",
                            "--dns-namespace-labels", "team=a", "--dns-fallthrough", "",
                            "--service-cluster-ip-range", ",".join(SERVICE_CIDRS))
    daemon.wait_ready(timeout=30)
    yield directory
    daemon.stop()


def test_labels_serves_only_the_services_it_matches(topology, manifests) -> None:
    ns = topology.pod("a", 1)
    assert dig(ns, "web.shop.svc.cluster.local", "A").answer == ("web.shop.svc.cluster.local. 5 IN A 10.96.0.20",)
    assert dig(ns, "cache.shop.svc.cluster.local", "A").status == "NXDOMAIN"


def test_namespace_labels_serves_only_the_namespaces_it_matches(topology, manifests) -> None:
    ns = topology.pod("a", 1)
    assert dig(ns, "vault.bank.svc.cluster.local", "A").status == "NXDOMAIN"
    write(manifests, "namespaces", labelled(api.namespace("shop"), team="a"), labelled(api.namespace("bank"), team="a"))
    until_sync(lambda: dig(ns, "vault.bank.svc.cluster.local", "A").status == "NOERROR", "bank relabelled team=a", 10)

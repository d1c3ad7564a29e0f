"""Pods from the API server, only for the DNS options that need them: `pods verified` watches
every Pod as CoreDNS's pod informer does (plugin/kubernetes/controller.go, object/pod.go ToPod:
name, namespace, phase, podIP, deleting), autopath alone this node's (spec.nodeName), both
read slim. Against the in-process fake API server, as test_apiserver_source.py."""

from __future__ import annotations

import json

import pytest

from kubeport import config as cfg
from kubeport.components import build_state, pod_scope
from kubeport.endpoints import convert, model
from kubeport.endpoints.apiserver.resources import watched_resources
from kubeport.endpoints.apiserver.wire import WireParser
from kubeport.endpoints.types import PodInfo

from support.apiserver import objects as k8s
from support.apiserver.harness import running, synced, tls  # noqa: F401  (fixtures)
from support.wait import until


@pytest.mark.parametrize("scope, selector", [
    pytest.param("none", None, id="no_pod_watch_by_default"),
    pytest.param("node", "spec.nodeName=node-a", id="autopath_watches_this_nodes_pods"),
    pytest.param("all", "", id="pods_verified_watches_every_pod"),
])
def test_which_pods_are_watched(scope, selector) -> None:
    pods = [r for r in watched_resources("node-a", scope) if r.kind == "Pod"]
    if selector is None:
        assert pods == []
    else:
        assert [(r.path, r.field_selector or "", r.model) for r in pods] == [
            ("/api/v1/pods", selector, model.PodAddresses)]
        assert 'resources: ["pods"], verbs: ["get", "list", "watch"]' in pods[0].rbac_rule()


@pytest.mark.parametrize("dns, scope, waits", [
    pytest.param({}, "none", False, id="nothing_needs_pods"),
    pytest.param({"autopath": True}, "node", False, id="autopath_does_not_wait_for_pods"),
    pytest.param({"pods": "verified"}, "all", True, id="pods_verified_waits_as_coredns"),
    pytest.param({"pods": "verified", "autopath": True}, "all", True, id="both"),
])
def test_pod_scope_of_the_configuration(tmp_path, dns, scope, waits) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("")
    config = cfg.KubeportConfiguration.model_validate(
        {"clientConnection": {"kubeconfig": str(kubeconfig)}, "hostnameOverride": "node-a", "dns": dns})
    assert pod_scope(config) == scope
    assert ("Pod" in build_state(config)._required_kinds) == waits


def test_a_pod_is_read_slim() -> None:
    body = (b'{"metadata":{"resourceVersion":"7"},"items":[' + _json(k8s.pod("web-5d9f7c8b6d-x2x9q", "shop",
                                                                             ip="10.244.1.23")) + b"]}")
    page = WireParser("Pod", model.PodAddresses).list_page(body)
    (obj,) = page.items
    assert isinstance(obj, model.PodAddresses) and obj.metadata.resource_version == "1"
    assert convert.pod_addresses(obj) == PodInfo("shop", "web-5d9f7c8b6d-x2x9q", ips=("10.244.1.23",),
                                                 phase="Running", node_name="node-a", created="")
    deleting = WireParser("Pod", model.PodAddresses).list_page(
        b'{"items":[' + _json(k8s.pod("old-1-a", deleting=True)) + b"]}").items[0]
    assert convert.pod_addresses(deleting).terminating


async def test_autopath_lists_and_watches_the_pods_of_this_node(running) -> None:  # noqa: F811
    server, source, state = await running(pods="node")
    server.apply(k8s.pod("here-1-a", "shop", ip="10.244.1.30", node_name="node-a"))
    server.apply(k8s.pod("there-1-a", "shop", ip="10.244.2.30", node_name="node-b"))
    await synced(state, source)
    await until(lambda: ("shop", "here-1-a") in state.snapshot.pods, "this node's pod")
    assert set(state.snapshot.pods) == {("shop", "here-1-a")}
    server.apply(k8s.pod("here-2-b", "shop", ip="10.244.1.31", node_name="node-a"))
    await until(lambda: ("shop", "here-2-b") in state.snapshot.pods, "a pod added")
    server.delete("Pod", "shop", "here-1-a")
    await until(lambda: ("shop", "here-1-a") not in state.snapshot.pods, "a pod deleted")
    requests = [r for r in server.requests if r.plural == "pods"]
    assert requests and all(r.params["fieldSelector"] == "spec.nodeName=node-a" for r in requests)
    assert state.snapshot.pods[("shop", "here-2-b")].labels == {}  # nothing kept but what DNS reads


def _json(obj) -> bytes:
    return json.dumps(obj).encode()

"""The kube-dns ConfigMap followed by the API source (kube-dns's NewConfigMapSync: list and
watch the ConfigMaps of kube-system, here restricted to the one name so RBAC can grant it
by resourceNames), its data handed on at each change, None when absent or deleted. Against
the in-process fake API server, as test_apiserver_source.py."""

from __future__ import annotations

import pytest

from kubeport.endpoints.apiserver.configmaps import ConfigMap, ConfigMapSink, config_map_resource

from support.apiserver.harness import running, tls  # noqa: F401  (fixtures)
from support.wait import until


def config_map(data: dict[str, str] | None, name: str = "kube-dns", namespace: str = "kube-system") -> dict:
    obj = {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": name, "namespace": namespace}}
    if data is not None:
        obj["data"] = data
    return obj


def test_the_resource_is_one_name_in_one_namespace() -> None:
    resource = config_map_resource("kube-system", "kube-dns")
    assert resource.path == "/api/v1/namespaces/kube-system/configmaps"
    assert resource.field_selector == "metadata.name=kube-dns"


@pytest.mark.parametrize("steps, calls", [
    pytest.param([("sync",)], [None], id="absent_at_the_first_list"),
    pytest.param([("upsert", {"a": "1"}), ("sync",)], [{"a": "1"}], id="present_at_the_first_list"),
    pytest.param([("upsert", {"a": "1"}), ("sync",), ("upsert", {"a": "1"}), ("commit",)], [{"a": "1"}],
                 id="same_data_again_is_no_news"),
    pytest.param([("upsert", {"a": "1"}), ("sync",), ("upsert", {"a": "2"}), ("commit",)],
                 [{"a": "1"}, {"a": "2"}], id="changed"),
    pytest.param([("upsert", {"a": "1"}), ("sync",), ("delete",), ("commit",)], [{"a": "1"}, None], id="deleted"),
    pytest.param([("upsert", None), ("sync",)], [{}], id="no_data_is_empty"),
])
def test_sink(steps, calls) -> None:
    seen: list = []
    sink = ConfigMapSink("kube-dns", seen.append)
    for step in steps:
        if step[0] == "upsert":
            sink.upsert(ConfigMap.model_validate(config_map(step[1])))
        elif step[0] == "delete":
            sink.delete("ConfigMap", "kube-system", "kube-dns")
        elif step[0] == "sync":
            sink.mark_synced("ConfigMap")
            sink.commit()
        else:
            sink.commit()
    assert seen == calls


async def test_followed_live_only_in_kube_system(running) -> None:
    seen: list = []
    server, source, state = await running(config_maps=[("kube-system", "kube-dns", seen.append)])
    server.apply(config_map({"stubDomains": "{}"}, namespace="default"))  # another namespace's: not ours
    await until(lambda: seen == [None], "absent at the first list")
    server.apply(config_map({"stubDomains": '{"consul.local": ["10.150.0.1"]}'}))
    await until(lambda: seen[-1] == {"stubDomains": '{"consul.local": ["10.150.0.1"]}'}, "the watched change")
    server.delete("ConfigMap", "kube-system", "kube-dns")
    await until(lambda: seen[-1] is None, "the deletion")
    requests = [r for r in server.requests if r.plural == "configmaps"]
    assert requests and all(r.params.get("fieldSelector") == "metadata.name=kube-dns" for r in requests)
    assert not [problem for problem in source.problems if problem.startswith("ConfigMap")]


def test_forbidden_names_the_role() -> None:
    from kubeport.endpoints.apiserver.client import ApiStatusError

    problem = config_map_resource("kube-system", "kube-dns").forbidden_problem(
        ApiStatusError(403, None, verb="list", path="/api/v1/namespaces/kube-system/configmaps"))
    assert 'cannot list resource "configmaps" in API group "" in the namespace "kube-system"' in problem
    assert "to kubeport's Role in kube-system (deploy/rbac.yaml)" in problem

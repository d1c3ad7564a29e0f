"""Pods in manifests: parsed, validated with the API server's messages, and a kubectl dump
(tests/fixtures/kubectl-dump, `kubectl get svc,pods,nodes,namespaces -A -o yaml`) read whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeport.endpoints import model
from kubeport.endpoints.convert import pod_info
from kubeport.endpoints.manifests.check import check_manifests
from kubeport.endpoints.validation import validate

from support import api

DUMP = Path(__file__).resolve().parents[2] / "fixtures" / "kubectl-dump"


def test_the_kubectl_dump_has_no_problem_and_skips_nothing() -> None:
    result = check_manifests(DUMP)
    assert result.problems == [] and result.skipped == []


def _pod(**fields) -> model.Pod:
    body = api.pod("web-1", ips=["10.244.1.11"], ports=[("http", 8080)])
    for path, value in fields.items():
        *parents, leaf = path.split(".")
        node = body
        for part in parents:
            node = node[part] if not part.isdigit() else node[int(part)]
        node[leaf] = value
    return model.Pod.model_validate(body)


@pytest.mark.parametrize("fields, message", [
    pytest.param({"metadata.name": "Web_1"}, "metadata.name: Invalid value: \"Web_1\"", id="name"),
    pytest.param({"spec.containers.0.ports.0.containerPort": 70000},
                 "spec.containers[0].ports[0].containerPort: Invalid value: 70000", id="container_port"),
    pytest.param({"spec.containers.0.ports.0.name": "http_web"},
                 "spec.containers[0].ports[0].name: Invalid value: \"http_web\"", id="port_name"),
    pytest.param({"status.podIPs": [{"ip": "10.244.1.11"}, {"ip": "fd00::zz"}]}, "status.podIPs[1].ip: Invalid value",
                 id="pod_ips"),
    pytest.param({"status.podIPs": [], "status.podIP": "10.244.1.300"}, "status.podIP: Invalid value: \"10.244.1.300\"",
                 id="pod_ip"),
    pytest.param({"status.podIPs": [{"ip": "10.244.1.11"}, {"ip": "10.244.1.12"}]},
                 "status.podIPs: Invalid value", id="two_ips_of_a_family"),
])
def test_invalid_pods(fields: dict, message: str) -> None:
    assert any(message in str(error) for error in validate(_pod(**fields))), validate(_pod(**fields))


def test_pod_ip_alone_is_pod_ips() -> None:
    body = api.pod("web-1")
    body["status"] = {"phase": "Running", "podIP": "10.244.1.11"}
    assert pod_info(model.Pod.model_validate(body)).ips == ("10.244.1.11",)
    assert validate(model.Pod.model_validate(body)) == []

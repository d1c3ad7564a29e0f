"""`kubeport get` output: kubectl's columns and formats."""

from __future__ import annotations

from datetime import datetime

import pytest

from kubeport import printers
from kubeport.endpoints import model
from kubeport.endpoints import convert
from kubeport.endpoints.convert import service_info


def svc(**spec):
    return printers.service_to_api(service_info(model.Service.model_validate(
        {"metadata": {"name": "web", "namespace": "demo", "creationTimestamp": "2026-11-30T12:00:00Z"},
         "spec": spec, "status": spec.pop("status", {})})))


@pytest.mark.parametrize(
    "spec, columns",
    [
        pytest.param({"clusterIP": "10.96.0.20", "ports": [{"port": 80}]},
                     ["ClusterIP", "10.96.0.20", "<none>", "80/TCP"], id="cluster_ip"),
        pytest.param({"type": "NodePort", "clusterIP": "10.96.0.21",
                      "ports": [{"name": "http", "port": 80, "nodePort": 30007},
                                {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}]},
                     ["NodePort", "10.96.0.21", "<none>", "80:30007/TCP,53:30053/UDP"], id="node_port_kubectl_style"),
        pytest.param({"type": "LoadBalancer", "clusterIP": "10.96.0.22", "ports": [{"port": 443}]},
                     ["LoadBalancer", "10.96.0.22", "<pending>", "443/TCP"], id="load_balancer_pending"),
        pytest.param({"type": "LoadBalancer", "clusterIP": "10.96.0.22", "ports": [{"port": 443}],
                      "status": {"loadBalancer": {"ingress": [{"ip": "192.168.70.1"}]}}},
                     ["LoadBalancer", "10.96.0.22", "192.168.70.1", "443/TCP"], id="load_balancer_ingress"),
        pytest.param({"clusterIP": "None", "ports": [{"port": 5432}]},
                     ["ClusterIP", "None", "<none>", "5432/TCP"], id="headless"),
        pytest.param({"type": "ExternalName", "externalName": "www.example.com"},
                     ["ExternalName", "<none>", "www.example.com", "<none>"], id="external_name"),
    ],
)
def test_service_columns(spec, columns):
    row = printers.service_rows([svc(**spec)], wide=False)[0]
    assert row[2:6] == columns


@pytest.mark.parametrize(
    "created, now, expected",
    [
        ("2026-11-30T12:00:00Z", "2026-11-30T12:00:42Z", "42s"),
        ("2026-11-30T12:00:00Z", "2026-11-30T12:05:30Z", "5m30s"),
        ("2026-11-30T12:00:00Z", "2026-11-30T15:10:00Z", "3h10m"),
        ("2026-11-30T12:00:00Z", "2026-12-03T12:00:00Z", "3d"),
        (None, "2026-11-30T12:00:00Z", "<unknown>"),
    ],
)
def test_age(created, now, expected):
    assert printers.age(created, datetime.fromisoformat(now.replace("Z", "+00:00"))) == expected


def test_table_without_namespace_column_unless_all_namespaces():
    listing = {"items": [svc(clusterIP="10.96.0.20", ports=[{"port": 80}])]}
    text = printers.render("services", listing, None, all_namespaces=False)
    assert text.splitlines()[0].split() == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"]
    text = printers.render("services", listing, None, all_namespaces=True)
    assert text.splitlines()[0].split()[0] == "NAMESPACE"


def test_empty_listing():
    assert printers.render("services", {"items": []}, None, False) == "No resources found."


def test_service_round_trips_through_the_model():
    obj = svc(type="NodePort", clusterIP="10.96.0.21", ports=[{"name": "http", "port": 80, "nodePort": 30007}],
              sessionAffinity="ClientIP")
    again = service_info(model.Service.model_validate(obj))
    assert printers.service_to_api(again) == obj


def pod(status: dict, *, deleting: bool = False, containers: int = 1) -> dict:
    metadata = {"name": "web-1", "namespace": "demo", "creationTimestamp": "2026-11-30T12:00:00Z"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-30T12:01:00Z"
    return printers.pod_to_api(convert.pod_info(model.Pod.model_validate(
        {"metadata": metadata, "spec": {"nodeName": "node-a",
                                        "containers": [{"name": f"c{i}"} for i in range(containers)]},
         "status": status})))


@pytest.mark.parametrize(
    "obj, columns",
    [
        pytest.param(pod({"phase": "Running", "podIP": "10.244.1.11",
                          "containerStatuses": [{"name": "c0", "ready": True, "restartCount": 2,
                                                 "state": {"running": {}}}]}),
                     ["1/1", "Running", "2", "10.244.1.11", "node-a"], id="running"),
        pytest.param(pod({"phase": "Pending"}, containers=2), ["0/2", "Pending", "0", "<none>", "node-a"],
                     id="pending_without_ip"),
        pytest.param(pod({"phase": "Running", "podIP": "10.244.1.11",
                          "containerStatuses": [{"name": "c0", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}),
                     ["0/1", "CrashLoopBackOff", "0", "10.244.1.11", "node-a"], id="waiting_reason"),
        pytest.param(pod({"phase": "Succeeded", "podIP": "10.244.1.11",
                          "containerStatuses": [{"name": "c0", "state": {"terminated": {"reason": "Completed"}}}]}),
                     ["0/1", "Completed", "0", "10.244.1.11", "node-a"], id="completed"),
        pytest.param(pod({"phase": "Running", "podIP": "10.244.1.11"}, deleting=True),
                     ["0/1", "Terminating", "0", "10.244.1.11", "node-a"], id="terminating"),
        pytest.param(pod({"phase": "Failed", "reason": "Evicted"}), ["0/1", "Evicted", "0", "<none>", "node-a"],
                     id="status_reason"),
    ],
)
def test_pod_columns(obj, columns):
    (row,) = printers.pod_rows([obj], wide=False)
    assert row[:2] == ["demo", "web-1"]
    assert row[2:5] + row[6:] == columns
    table = printers.render("pods", {"items": [obj]}, None, all_namespaces=True)
    assert table.splitlines()[0].split() == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"]

"""The API model: camelCase names, unknown fields ignored, the API server's defaulting
(pkg/apis/core/v1/defaults.go), and the nil semantics of EndpointSlice conditions."""

from __future__ import annotations

import pytest

from kubeport.endpoints import model

from support import api


def service(spec: dict) -> model.Service:
    return api.to_model(api.service("web", **spec))


@pytest.mark.parametrize(
    "spec, attribute, expected",
    [
        pytest.param({}, "type", "ClusterIP", id="type_defaults_to_cluster_ip"),
        pytest.param({"ports": [{"port": 80}]}, "ports[0].protocol", "TCP", id="protocol_defaults_to_tcp"),
        pytest.param({"ports": [{"port": 80}]}, "ports[0].target_port", 80, id="target_port_defaults_to_port"),
        pytest.param({"ports": [{"port": 80, "targetPort": "8080"}]}, "ports[0].target_port", 8080,
                     id="quoted_number_target_port_is_a_number"),
        pytest.param({"ports": [{"port": 80, "targetPort": "http"}]}, "ports[0].target_port", "http",
                     id="named_target_port_kept"),
        pytest.param({}, "session_affinity", "None", id="session_affinity_defaults_to_none"),
        pytest.param({"sessionAffinity": "ClientIP"}, "affinity_timeout_seconds", 10800,
                     id="client_ip_timeout_defaults_to_10800"),
        pytest.param({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}},
                     "affinity_timeout_seconds", 60, id="client_ip_timeout_given"),
        pytest.param({}, "affinity_timeout_seconds", 0, id="no_affinity_no_timeout"),
        pytest.param({"type": "NodePort"}, "external_traffic_policy", "Cluster",
                     id="etp_defaults_to_cluster_for_node_port"),
        pytest.param({}, "external_traffic_policy", None, id="etp_unset_for_cluster_ip"),
        pytest.param({}, "internal_traffic_policy", "Cluster", id="itp_defaults_to_cluster"),
        pytest.param({"type": "ExternalName", "externalName": "x.example"}, "internal_traffic_policy", None,
                     id="itp_unset_for_external_name"),
        pytest.param({"type": "LoadBalancer"}, "allocate_load_balancer_node_ports", True,
                     id="lb_allocates_node_ports_by_default"),
        pytest.param({"clusterIP": "10.96.0.20"}, "cluster_ips", ["10.96.0.20"], id="cluster_ips_mirror_cluster_ip"),
        pytest.param({"clusterIPs": ["10.96.0.20", "fd00::20"]}, "cluster_ip", "10.96.0.20",
                     id="cluster_ip_mirrors_cluster_ips"),
        pytest.param({"clusterIP": "None"}, "headless", True, id="headless"),
        pytest.param({"ports": None, "externalIPs": None}, "external_ips", [], id="null_lists_are_empty"),
    ],
)
def test_service_defaults(spec, attribute, expected):
    value = service(spec).spec
    for part in attribute.replace("]", "").split("."):
        name, _, index = part.partition("[")
        value = getattr(value, name)
        if index:
            value = value[int(index)]
    assert value == expected


def test_namespace_defaults_to_default_and_unknown_fields_are_ignored():
    svc = model.Service.model_validate({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "managedFields": [{"manager": "kubectl"}], "labels": None},
        "spec": {"ports": [{"port": 80}], "someFutureField": {"x": 1}},
        "status": {"loadBalancer": {}},
    })
    assert svc.metadata.namespace == "default"
    assert svc.metadata.labels == {}


def test_camel_case_round_trip():
    svc = service({"type": "NodePort", "ports": [{"name": "http", "port": 80, "nodePort": 30080}],
                   "externalIPs": ["192.168.60.1"]})
    api = svc.to_api()
    assert api["spec"]["ports"][0]["nodePort"] == 30080
    assert api["spec"]["externalIPs"] == ["192.168.60.1"]
    assert model.Service.model_validate(api) == svc


@pytest.mark.parametrize(
    "conditions, expected",
    [
        pytest.param({}, (None, None, None), id="all_nil_kept_as_nil"),
        pytest.param({"ready": False, "serving": True, "terminating": True}, (False, True, True), id="explicit"),
        pytest.param(None, (None, None, None), id="null_conditions"),
    ],
)
def test_endpoint_conditions_keep_nil(conditions, expected):
    eps = model.EndpointSlice.model_validate({
        "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.0.0.1"], "conditions": conditions}],
    })
    c = eps.endpoints[0].conditions
    assert (c.ready, c.serving, c.terminating) == expected
    assert eps.service_name == "web"


def test_slice_ports_default_like_the_api():
    eps = model.EndpointSlice.model_validate({
        "metadata": {"name": "s"}, "addressType": "IPv4", "endpoints": None, "ports": [{"port": 8080}]})
    assert eps.endpoints == []
    assert (eps.ports[0].name, eps.ports[0].protocol) == ("", "TCP")


@pytest.mark.parametrize(
    "obj, key",
    [
        ({"kind": "Service", "metadata": {"name": "a", "namespace": "x"}}, ("Service", "x", "a")),
        ({"kind": "Node", "metadata": {"name": "n1"}}, ("Node", "", "n1")),
        ({"kind": "Namespace", "metadata": {"name": "x"}}, ("Namespace", "", "x")),
    ],
)
def test_object_key_cluster_scoped_has_no_namespace(obj, key):
    assert model.object_key(model.KIND_MODELS[obj["kind"]].model_validate(obj)) == key

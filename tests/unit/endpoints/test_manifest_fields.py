"""Fields the Kubernetes type does not have: warnings, as kubectl's server-side field
validation gives them (``Warning: unknown field "spec.sessionAfinity"``); the object loads."""

from __future__ import annotations

import importlib
import re

import pytest

from kubeport.endpoints.manifests.unknown_fields import SCHEMAS, ListOf, Schema, unknown_fields
from kubeport.endpoints.manifests.parse import parse_manifest

SLICE = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "s"},
         "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}]}


@pytest.mark.parametrize(
    "kind, value, fields",
    [
        pytest.param("Service", {"spec": {"sessionAfinity": "ClientIP"}}, ["spec.sessionAfinity"],
                     id="service_spec_typo__affinity_silently_off"),
        pytest.param("Service", {"spec": {"ports": [{"port": 80}, {"port": 81, "nmae": "x"}]}}, ["spec.ports[1].nmae"],
                     id="service_port"),
        pytest.param("Service", {"metadata": {"name": "web", "lables": {}}}, ["metadata.lables"], id="object_meta"),
        pytest.param("Service", {"spec": {"sessionAffinityConfig": {"clientIP": {"timeout": 5}}}},
                     ["spec.sessionAffinityConfig.clientIP.timeout"], id="nested_config"),
        pytest.param("Service", {"sepc": {}}, ["sepc"], id="top_level"),
        pytest.param("EndpointSlice", {**SLICE, "endpoints": [{"addresses": ["10.0.0.1"], "condition": {"ready": False}}]},
                     ["endpoints[0].condition"], id="endpoint_conditions_typo__not_ready_gets_traffic"),
        pytest.param("EndpointSlice", {**SLICE, "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"redy": False}}]},
                     ["endpoints[0].conditions.redy"], id="endpoint_condition"),
        pytest.param("EndpointSlice", {**SLICE, "endpoints": [{"addresses": ["a"], "hints": {"forZones": [{"zone": "a"}]}}]},
                     ["endpoints[0].hints.forZones[0].zone"], id="hints"),
        pytest.param("EndpointSlice", {**SLICE, "endpoints": [{"addresses": ["a"], "targetRef": {"kind": "Pod", "nmae": "p"}}]},
                     ["endpoints[0].targetRef.nmae"], id="target_ref"),
        pytest.param("EndpointSlice", {**SLICE, "ports": [{"port": 1, "protocl": "TCP"}]}, ["ports[0].protocl"],
                     id="endpoint_port"),
        pytest.param("Node", {"status": {"adresses": []}, "spec": {"taints": [{"key": "k", "efect": "NoSchedule"}]}},
                     ["status.adresses", "spec.taints[0].efect"], id="node"),
        pytest.param("Namespace", {"spec": {"finalizer": []}}, ["spec.finalizer"], id="namespace"),
        pytest.param("EndpointSlice", {"endpoints": "x", "ports": [1, {"nam": 1}], "metadata": []}, ["ports[1].nam"],
                     id="wrong_types_are_the_validations_to_report"),
        pytest.param("Service", {"metadata": {"labels": {"anything": "x"}}, "spec": {"selector": {"app": "x"}}}, [],
                     id="maps_are_not_checked"),
        pytest.param("Deployment", {"spek": {}}, [], id="kinds_not_read"),
    ],
)
def test_unknown_fields(kind, value, fields):
    assert sorted(unknown_fields(kind, value)) == sorted(fields)


def test_unknown_field_is_a_warning_and_the_object_loads():
    text = ("apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\n"
            "spec:\n  sessionAfinity: ClientIP\n  ports: [{port: 80}]\n")
    parsed = parse_manifest("web.yaml", text)
    assert parsed.problems == ('web.yaml: Service "demo/web": warning: unknown field "spec.sessionAfinity"',)
    [obj] = parsed.objects
    assert obj.obj is not None and obj.warned


def _schema_fields(schema: Schema, prefix: str = "") -> dict[str, set[str]]:
    found = {prefix: set(schema)}
    for name, sub in schema.items():
        if sub is not None:
            found.update(_schema_fields(sub.schema if isinstance(sub, ListOf) else sub, f"{prefix}.{name}"))
    return found


#: (kind, path) -> the k8s.io/api type of that mapping, as the generated client names it
API_TYPES = {
    ("Service", ""): "V1Service", ("Service", ".metadata"): "V1ObjectMeta", ("Service", ".spec"): "V1ServiceSpec",
    ("Service", ".spec.ports"): "V1ServicePort", ("Service", ".spec.sessionAffinityConfig"): "V1SessionAffinityConfig",
    ("Service", ".spec.sessionAffinityConfig.clientIP"): "V1ClientIPConfig", ("Service", ".status"): "V1ServiceStatus",
    ("Service", ".status.loadBalancer"): "V1LoadBalancerStatus",
    ("Service", ".status.loadBalancer.ingress"): "V1LoadBalancerIngress",
    ("EndpointSlice", ""): "V1EndpointSlice", ("EndpointSlice", ".endpoints"): "V1Endpoint",
    ("EndpointSlice", ".endpoints.conditions"): "V1EndpointConditions",
    ("EndpointSlice", ".endpoints.hints"): "V1EndpointHints", ("EndpointSlice", ".endpoints.hints.forZones"): "V1ForZone",
    ("EndpointSlice", ".endpoints.hints.forNodes"): "V1ForNode",
    ("EndpointSlice", ".endpoints.targetRef"): "V1ObjectReference", ("EndpointSlice", ".ports"): "DiscoveryV1EndpointPort",
    ("Node", ""): "V1Node", ("Node", ".spec"): "V1NodeSpec", ("Node", ".spec.taints"): "V1Taint",
    ("Node", ".status"): "V1NodeStatus", ("Node", ".status.addresses"): "V1NodeAddress",
    ("Namespace", ""): "V1Namespace", ("Namespace", ".spec"): "V1NamespaceSpec", ("Namespace", ".status"): "V1NamespaceStatus",
    ("ServiceCIDR", ""): "V1ServiceCIDR", ("ServiceCIDR", ".spec"): "V1ServiceCIDRSpec",
    ("ServiceCIDR", ".status"): "V1ServiceCIDRStatus", ("ServiceCIDR", ".status.conditions"): "V1Condition",
}


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_field_lists_are_those_of_k8s_io_api(kind):
    """Checked against the generated client of k8s.io/api (kubernetes_asyncio): a field of the
    API reported as unknown would be a false warning."""
    pytest.importorskip("kubernetes_asyncio")
    for path, fields in _schema_fields(SCHEMAS[kind]).items():
        api = _model(API_TYPES.get((kind, path), "V1ObjectMeta" if path.endswith("metadata") else ""))
        assert fields == set(api.attribute_map.values()), f"{kind}{path}"


def _model(name: str) -> type:
    """A generated model class, from its own module (the daemon may have imported the package
    without its models: see endpoints/apiserver/client.py)."""
    module = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()
    return getattr(importlib.import_module(f"kubernetes_asyncio.client.models.{module}"), name)

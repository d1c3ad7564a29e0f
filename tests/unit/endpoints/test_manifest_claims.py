"""What a broken or skipped document leaves behind, so that the object it was keeps its
last good version: an invalid key when the object is known, a claim when it is not."""

from __future__ import annotations

import pytest

from kubeport.endpoints.manifests.parse import Claim, parse_manifest

WEB = ("Service", "demo", "web")
SLICE = ("EndpointSlice", "demo", "web-a")
NODE = ("Node", "", "node-a")


@pytest.mark.parametrize(
    "text, key",
    [
        pytest.param("apiVersion: v2\nkind: Service\nmetadata: {name: web, namespace: demo}\n", WEB,
                     id="unsupported_version_of_a_known_object"),
        pytest.param("apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata: {name: web-a, namespace: demo}\n"
                     "addressType: IPv4\n", SLICE, id="unsupported_group_version__discovery_v1beta1"),
        pytest.param("apiVersion: 1\nkind: Service\nmetadata: {name: web, namespace: demo}\n", WEB,
                     id="api_version_not_a_string"),
        pytest.param("kind: Service\nmetadata: {name: web, namespace: demo}\nspec: {ports: [{port: x}]}\n", WEB,
                     id="failed_validation"),
    ],
)
def test_object_broken_before_validation_is_declared_invalid(text, key):
    """Invalid, not absent: the source keeps the last good version instead of deleting it."""
    parsed = parse_manifest("a.yaml", text)
    assert parsed.objects == ()
    assert parsed.invalid_keys == {key}
    assert len(parsed.problems) == 1 and parsed.problems[0].startswith("a.yaml: ")


@pytest.mark.parametrize(
    "text, matches, spares",
    [
        pytest.param("apiVersion: v1\nkind: Service\nmetadata: web\n", [WEB], [SLICE, NODE],
                     id="metadata_not_an_object__any_object_of_its_kind"),
        pytest.param("apiVersion: v1\nkind: Service\nmetadata: {namespace: demo}\n", [WEB], [SLICE],
                     id="missing_name__any_object_of_its_kind"),
        pytest.param("metadata: {name: web, namespace: demo}\n", [WEB, ("Namespace", "", "web")],
                     [SLICE, ("Service", "other", "web")], id="missing_kind__any_kind_of_that_name"),
        pytest.param("- kind: Service\n", [WEB, SLICE, NODE], [], id="not_an_object__anything"),
        pytest.param("apiVersion: v1\nkind: List\nitems: {a: 1}\n", [WEB, SLICE, NODE], [], id="list_items_broken__anything"),
        pytest.param("apiVersion: v1\nkind: Servce\nmetadata: {name: web, namespace: demo}\n",
                     [WEB], [SLICE, ("Service", "demo", "api")], id="kind_typo__core_kinds_of_that_name"),
        pytest.param("apiVersion: v1\nkind: Nde\nmetadata: {name: node-a}\n", [NODE], [WEB],
                     id="kind_typo__cluster_scoped_kind"),
        pytest.param("apiVersion: discovery.k8s.oi/v1\nkind: EndpointSlice\nmetadata: {name: web-a, namespace: demo}\n",
                     [SLICE], [WEB, ("EndpointSlice", "demo", "web-b")], id="group_typo__that_kind_and_name"),
        pytest.param("apiVersion: serving.knative.dev/v1\nkind: Service\nmetadata: {name: web, namespace: demo}\n",
                     [WEB], [("Service", "demo", "api")], id="namesake_kind_of_another_group"),
        pytest.param("kind: Servce\nmetadata: {name: web, namespace: demo}\n", [WEB], [SLICE],
                     id="unknown_kind_without_api_version"),
    ],
)
def test_claims_stand_for_what_a_document_may_have_been(text, matches, spares):
    parsed = parse_manifest("a.yaml", text)
    assert parsed.objects == () and parsed.invalid_keys == frozenset()
    assert all(any(c.matches(key) for c in parsed.claims) for key in matches), parsed.claims
    assert not any(c.matches(key) for c in parsed.claims for key in spares), parsed.claims


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: demo}\n",
                     id="another_groups_kind"),
        pytest.param("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web, namespace: demo}\n", id="core_kind_not_read"),
        pytest.param("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-a, namespace: demo}\n"
                     "addressType: IPv4\n", id="valid_object"),
    ],
)
def test_no_claim(text):
    """A Deployment named like a Service is no reason to keep that Service once the file drops it."""
    assert parse_manifest("a.yaml", text).claims == ()


@pytest.mark.parametrize(
    "text, problem",
    [
        pytest.param("apiVersion: v1\nkind: Servce\nmetadata: {name: web, namespace: demo}\n",
                     'a.yaml: Servce "demo/web": no matches for kind "Servce" in version "v1"', id="core_group__kubectl"),
        pytest.param("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlices\nmetadata: {name: s}\n",
                     'a.yaml: EndpointSlices "s": no matches for kind "EndpointSlices" in version "discovery.k8s.io/v1"',
                     id="discovery_group__kubectl"),
    ],
)
def test_unknown_kind_of_a_group_we_read_is_a_problem(text, problem):
    parsed = parse_manifest("a.yaml", text)
    assert parsed.problems == (problem,)
    assert parsed.skipped == ()


def test_claim_reasons_name_the_document():
    text = ("apiVersion: v1\nkind: Service\nmetadata: {name: api, namespace: demo}\n---\n"
            "apiVersion: discovery.k8s.oi/v1\nkind: EndpointSlice\nmetadata: {name: web-a, namespace: demo}\n")
    [claim] = parse_manifest("a.yaml", text).claims
    assert claim == Claim(frozenset({"EndpointSlice"}), "demo", "web-a",
                          'document 2 declares it with apiVersion "discovery.k8s.oi/v1", which kubeport does not read '
                          "(it reads EndpointSlice from discovery.k8s.io/v1)")

"""Manifest parsing: what loads (as `kubectl apply -f` loads it) and how problems read."""

from __future__ import annotations

import textwrap

import pytest

from kubeport.endpoints import model
from kubeport.endpoints.manifests.parse import ParsedFile, describe, field_path, parse_manifest
from kubeport.endpoints.manifests.read import list_manifest_files

SERVICE = """\
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: demo
spec:
  ports:
  - name: http
    port: 80
    targetPort: http
"""

SLICE = """\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-a
  namespace: demo
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints:
- addresses: [10.244.1.11]
ports:
- {name: http, port: 8080}
"""

# What `kubectl get svc,nodes -o yaml` prints: a v1 List, server-filled fields, empty metadata.
KUBECTL_LIST = """\
apiVersion: v1
items:
- apiVersion: v1
  kind: Service
  metadata:
    creationTimestamp: "2024-05-01T10:00:00Z"
    labels:
      component: apiserver
    name: kubernetes
    namespace: default
    resourceVersion: "192"
    uid: 0c1f1b9e-6f4e-4a43-9b1e-2a0c4b6b7f11
  spec:
    clusterIP: 10.96.0.1
    clusterIPs:
    - 10.96.0.1
    internalTrafficPolicy: Cluster
    ipFamilies:
    - IPv4
    ipFamilyPolicy: SingleStack
    ports:
    - name: https
      port: 443
      protocol: TCP
      targetPort: 6443
    sessionAffinity: None
    type: ClusterIP
  status:
    loadBalancer: {}
- apiVersion: v1
  kind: Node
  metadata:
    labels:
      topology.kubernetes.io/zone: zone-a
    name: node-a
  status:
    addresses:
    - address: 192.168.50.11
      type: InternalIP
kind: List
metadata:
  resourceVersion: ""
"""

# What `kubectl get --raw /api/v1/namespaces/demo/services` prints: a typed list, kind-less items.
RAW_SERVICE_LIST = """\
{"kind": "ServiceList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"},
 "items": [{"metadata": {"name": "a", "namespace": "demo"}, "spec": {"ports": [{"port": 80}]}},
           {"metadata": {"name": "b", "namespace": "demo"}, "spec": {"ports": [{"port": 81}]}}]}
"""


def keys(parsed: ParsedFile) -> list[tuple[str, str, str]]:
    return [o.key for o in parsed.objects]


@pytest.mark.parametrize(
    "path, text, expected",
    [
        pytest.param("a.yaml", SERVICE, [("Service", "demo", "web")], id="single_document"),
        pytest.param("a.yaml", SERVICE + "---\n" + SLICE,
                     [("Service", "demo", "web"), ("EndpointSlice", "demo", "web-a")], id="multi_document"),
        pytest.param("a.yml", "---\n---\n# only a comment\n---\n" + SERVICE + "---\n", [("Service", "demo", "web")],
                     id="empty_documents_ignored"),
        pytest.param("a.yaml", "", [], id="empty_file"),
        pytest.param("a.yaml", KUBECTL_LIST, [("Service", "default", "kubernetes"), ("Node", "", "node-a")],
                     id="kind_list__kubectl_get_o_yaml"),
        pytest.param("a.json", RAW_SERVICE_LIST, [("Service", "demo", "a"), ("Service", "demo", "b")],
                     id="typed_list_items_inherit_kind__api_list_response"),
        pytest.param("a.json", '{"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": "demo"}}',
                     [("Namespace", "", "demo")], id="json_object"),
        pytest.param("a.json", '{"kind": "Node", "metadata": {"name": "n1"}}\n{"kind": "Node", "metadata": {"name": "n2"}}',
                     [("Node", "", "n1"), ("Node", "", "n2")], id="json_stream__kubectl_decoder"),
        pytest.param("a.yaml", "kind: Service\nmetadata: {name: web}\n", [("Service", "default", "web")],
                     id="namespace_defaults_to_default_and_apiversion_optional"),
        pytest.param("a.yaml", "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: List\n  items:\n"
                               "  - {kind: Namespace, metadata: {name: x}}\n",
                     [("Namespace", "", "x")], id="nested_list"),
        pytest.param("a.yaml", "apiVersion: v1\nkind: List\nitems: null\n", [], id="list_with_null_items"),
    ],
)
def test_loads(path, text, expected):
    parsed = parse_manifest(path, text)
    assert parsed.problems == ()
    assert keys(parsed) == expected
    assert all(isinstance(o.obj, model.ApiModel) for o in parsed.objects)


def test_kubectl_list_objects_are_complete():
    parsed = parse_manifest("a.yaml", KUBECTL_LIST)
    svc, node = (o.obj for o in parsed.objects)
    assert isinstance(svc, model.Service) and svc.spec.ports[0].target_port == 6443
    assert isinstance(node, model.Node) and node.metadata.labels[model.LABEL_ZONE] == "zone-a"


@pytest.mark.parametrize(
    "text, skipped",
    [
        pytest.param("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n", ("apps/v1 Deployment web",),
                     id="other_kind"),
        pytest.param("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n", ("v1 ConfigMap c",), id="core_kind_not_read"),
        pytest.param("apiVersion: serving.knative.dev/v1\nkind: Service\nmetadata: {name: k}\n",
                     ("serving.knative.dev/v1 Service k",), id="namesake_kind_of_another_group"),
    ],
)
def test_other_kinds_are_skipped_not_problems(text, skipped):
    parsed = parse_manifest("a.yaml", text + "---\n" + SERVICE)
    assert parsed.problems == ()
    assert parsed.skipped == skipped
    assert keys(parsed) == [("Service", "demo", "web")]


@pytest.mark.parametrize(
    "path, text, problem",
    [
        pytest.param("web.yaml", "kind: Service\nmetadata:\n  name: web\n spec: {}\n",
                     # line numbers count from the top of the file, past the good first document
                     "web.yaml: YAML syntax error at line 15, column 2: ", id="yaml_syntax"),
        pytest.param("web.json", '{"kind": "Service",\n "metadata": {"name": "web"},}',
                     "web.json: JSON syntax error at line 2, column 30: Expecting property name enclosed in double quotes",
                     id="json_syntax"),
    ],
)
def test_syntax_error_fails_the_whole_file(path, text, problem):
    parsed = parse_manifest(path, SERVICE + "---\n" + text if path.endswith(".yaml") else text)
    assert parsed.failed
    assert parsed.objects == ()
    assert len(parsed.problems) == 1
    assert parsed.problems[0].startswith(problem)  # the YAML text differs between libyaml and pure Python


@pytest.mark.parametrize(
    "text, problem",
    [
        pytest.param("kind: Service\nmetadata: {name: web}\nspec:\n  ports: [{port: eighty}]\n",
                     'Service "web": spec.ports[0].port: Input should be a valid integer, '
                     'unable to parse string as an integer (got "eighty")', id="wrong_type"),
        pytest.param("kind: Service\nmetadata: {name: web}\nspec: {type: Headless}\n",
                     'Service "web": spec.type: Input should be \'ClusterIP\', \'NodePort\', \'LoadBalancer\' '
                     'or \'ExternalName\' (got "Headless")', id="unsupported_enum_value"),
        pytest.param("kind: EndpointSlice\nmetadata: {name: s, namespace: demo}\nendpoints: []\n",
                     'EndpointSlice "demo/s": addressType: Required value', id="missing_required_field"),
        pytest.param("kind: Service\nmetadata: {name: web}\nspec:\n  ports: [{port: 80, targetPort: [1]}]\n",
                     'Service "web": spec.ports[0].targetPort: Input should be a valid integer or Input should be a '
                     "valid string", id="int_or_string_union_merged"),
        pytest.param("kind: Service\nmetadata: {name: web}\nspec:\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: x}}\n",
                     'Service "web": spec.sessionAffinityConfig.clientIP.timeoutSeconds: Input should be a valid '
                     'integer, unable to parse string as an integer (got "x")', id="nested_camel_case_path"),
        pytest.param("kind: Service\nmetadata: {namespace: demo}\n", "document 1: Service: metadata.name: Required value",
                     id="missing_name"),
        pytest.param("kind: Service\nmetadata:\n", "document 1: Service: metadata.name: Required value",
                     id="null_metadata_is_empty"),
        pytest.param("apiVersion: v1\nkind: Service\nmetadata: web\n",
                     "document 1: Service: metadata: expected an object, got a string", id="metadata_not_an_object"),
        pytest.param("metadata: {name: web}\n", "document 1: Object 'Kind' is missing", id="missing_kind"),
        pytest.param("- kind: Service\n", "document 1: expected an object, got a list", id="document_not_an_object"),
        pytest.param("apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata: {name: s}\naddressType: IPv4\n",
                     'EndpointSlice "s": apiVersion "discovery.k8s.io/v1beta1" is not supported for EndpointSlice '
                     "(use discovery.k8s.io/v1)", id="unsupported_api_version"),
        pytest.param("apiVersion: v1\nkind: List\nitems: {a: 1}\n", "document 1: List: items: must be a list",
                     id="list_items_not_a_list"),
        pytest.param("apiVersion: 1\nkind: Service\nmetadata: {name: web}\n",
                     'Service "web": apiVersion: must be a string', id="api_version_not_a_string"),
    ],
)
def test_object_problem_names_file_object_and_field(text, problem):
    parsed = parse_manifest("dir/web.yaml", text + "---\n" + SERVICE)
    assert not parsed.failed
    assert parsed.problems == ("dir/web.yaml: " + problem,)
    assert keys(parsed) == [("Service", "demo", "web")]  # the good object still loads


def test_object_that_fails_validation_is_declared_invalid():
    parsed = parse_manifest("a.yaml", "kind: Service\nmetadata: {name: web}\nspec: {ports: [{port: x}]}\n")
    assert parsed.objects == ()
    assert parsed.invalid_keys == {("Service", "default", "web")}
    assert parsed.keys == {("Service", "default", "web")}


def test_list_item_problem_names_its_position():
    text = "apiVersion: v1\nkind: List\nitems:\n- {kind: Service, metadata: {}}\n"
    assert parse_manifest("a.yaml", text).problems == ("a.yaml: document 1, item 1: Service: metadata.name: Required value",)


def test_digest_is_the_objects_own_text():
    """Other documents, comments around it and its position do not change an object's digest."""
    web = "kind: Service\nmetadata: {name: web}\nspec: {ports: [{port: 80}]}\n"
    alone = parse_manifest("a.yaml", web).objects[0].digest
    moved = parse_manifest("a.yaml", "# comment\n" + SERVICE + "---\n" + web).objects[1].digest
    edited = parse_manifest("a.yaml", web.replace("80", "81")).objects[0].digest
    assert moved == alone != edited


def test_digest_of_a_typed_list_item_includes_the_inherited_kind():
    item = '{"metadata": {"name": "n"}}'
    as_node = parse_manifest("a.json", '{"kind": "NodeList", "apiVersion": "v1", "items": [%s]}' % item)
    as_namespace = parse_manifest("a.json", '{"kind": "NamespaceList", "apiVersion": "v1", "items": [%s]}' % item)
    assert as_node.objects[0].digest != as_namespace.objects[0].digest


@pytest.mark.parametrize(
    "path, text",
    [
        pytest.param("a.json", '{"kind": "Service", "spec": {"ports": [{"name": "x", "port": 80}]}, "metadata": {"name": "web"}}',
                     id="json"),
        pytest.param("a.yaml", "kind: Service\nspec: {ports: [{name: x, port: 80}]}\nmetadata: {name: web}\n", id="yaml"),
    ],
)
def test_json_and_yaml_build_the_same_object(path, text):
    reference = parse_manifest("r.yaml", "kind: Service\nmetadata: {name: web}\nspec: {ports: [{port: 80, name: x}]}\n")
    assert parse_manifest(path, text).objects[0].obj == reference.objects[0].obj


def test_unchanged_objects_skip_validation():
    first = parse_manifest("a.yaml", SERVICE + "---\n" + SLICE)
    applied = {o.key: o.digest for o in first.objects[:1]}
    again = parse_manifest("a.yaml", SERVICE + "---\n" + SLICE, unchanged=lambda key, digest: applied.get(key) == digest)
    assert [o.obj is None for o in again.objects] == [True, False]
    assert [o.digest for o in again.objects] == [o.digest for o in first.objects]


@pytest.mark.parametrize(
    "loc, path",
    [
        pytest.param(("spec", "ports", 1, "name"), "spec.ports[1].name", id="list_index"),
        pytest.param(("spec", "ports", 0, "targetPort", "int"), "spec.ports[0].targetPort", id="union_member_tag"),
        pytest.param(("metadata", "labels", "int"), "metadata.labels.int", id="label_key_named_like_a_tag"),
        pytest.param(("endpoints", 0, "conditions", "function-after[x()]", "ready"), "endpoints[0].conditions.ready",
                     id="validator_tag"),
        pytest.param((), "(object)", id="root"),
    ],
)
def test_field_path(loc, path):
    assert field_path(loc) == path


@pytest.mark.parametrize(
    "key, text",
    [
        pytest.param(("Service", "default", "web"), 'Service "web"', id="default_namespace"),
        pytest.param(("Service", "demo", "web"), 'Service "demo/web"', id="other_namespace"),
        pytest.param(("Node", "", "node-a"), 'Node "node-a"', id="cluster_scoped"),
    ],
)
def test_describe(key, text):
    assert describe(key) == text


def test_every_example_manifest_parses():
    from pathlib import Path

    examples = Path(__file__).resolve().parents[3] / "examples"
    files = list_manifest_files(examples)
    assert files, "examples/ holds the README demo manifests"
    for relative in files:
        parsed = parse_manifest(relative, (examples / relative).read_text())
        assert parsed.problems == (), parsed.problems
        assert parsed.objects


def test_yaml_multi_document_with_leading_separator_counts_documents():
    text = textwrap.dedent("""\
        ---
        kind: Service
        metadata: {name: a}
        ---
        kind: Service
        metadata: {}
    """)
    assert parse_manifest("a.yaml", text).problems == ("a.yaml: document 2: Service: metadata.name: Required value",)

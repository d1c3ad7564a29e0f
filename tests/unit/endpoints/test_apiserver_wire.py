"""The pure parts of the API-server source: wire parsing, backoff, operator messages."""

from __future__ import annotations

import json
import time

import pytest

from kubeport.endpoints import model
from kubeport.endpoints.apiserver.client import ApiStatusError
from kubeport.endpoints.apiserver.wire import (
    Applied,
    Bookmarked,
    Deleted,
    Rejected,
    WatchFailed,
    WireError,
    WireParser,
    parse_status,
)
from kubeport.endpoints.apiserver.resources import watched_resources

from support.apiserver import objects as k8s

SERVICES = WireParser("Service", model.Service)
SLICES = WireParser("EndpointSlice", model.EndpointSlice)
NODES = WireParser("Node", model.Node)


def event(event_type: str, obj: dict) -> bytes:
    return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode()


def with_rv(obj: dict, rv: str) -> dict:
    obj["metadata"]["resourceVersion"] = rv
    return obj


@pytest.mark.parametrize("parser, line, expected", [
    (SERVICES, event("ADDED", with_rv(k8s.service("web"), "11")), ("Applied", "ADDED", ("default", "web"), "11")),
    (SERVICES, event("MODIFIED", with_rv(k8s.service("web", "shop"), "12")),
     ("Applied", "MODIFIED", ("shop", "web"), "12")),
    (SLICES, event("DELETED", with_rv(k8s.endpoint_slice("web-x", "web"), "13")),
     ("Deleted", None, ("default", "web-x"), "13")),
    # Cluster-scoped objects are keyed with an empty namespace.
    (NODES, event("ADDED", with_rv(k8s.node("node-a"), "14")), ("Applied", "ADDED", ("", "node-a"), "14")),
    # A bookmark of an EndpointSlice has addressType "" (the zero value): still a bookmark.
    (SLICES, b'{"type":"BOOKMARK","object":{"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1",'
             b'"metadata":{"resourceVersion":"15","creationTimestamp":null},"addressType":"","endpoints":null}}',
     ("Bookmarked", False, None, "15")),
    (SERVICES, b'{"type":"BOOKMARK","object":{"kind":"Service","apiVersion":"v1","metadata":{"resourceVersion":'
               b'"16","creationTimestamp":null,"annotations":{"k8s.io/initial-events-end":"true"}},"spec":{},'
               b'"status":{"loadBalancer":{}}}}',
     ("Bookmarked", True, None, "16")),
], ids=["added", "modified", "deleted", "cluster_scoped_key", "bookmark_zero_value_object",
        "initial_events_end_bookmark__kep3157"])
def test_watch_events_parse_into_facts(parser, line, expected):
    fact = parser.event(line)
    kind, detail, key, rv = expected
    assert type(fact).__name__ == kind
    if isinstance(fact, Applied):
        assert (fact.type, fact.key, fact.resource_version) == (detail, key, rv)
        assert fact.obj.metadata.name == key[1]
    elif isinstance(fact, Deleted):
        assert (fact.key, fact.resource_version) == (key, rv)
    else:
        assert isinstance(fact, Bookmarked)
        assert (fact.initial_events_end, fact.resource_version) == (detail, rv)


def test_error_event_carries_the_status__410_expired():
    line = (b'{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
            b'"message":"too old resource version: 1000 (1042)","reason":"Expired","code":410}}')
    fact = SERVICES.event(line)
    assert isinstance(fact, WatchFailed)
    assert (fact.status.code, fact.status.reason) == (410, "Expired")


@pytest.mark.parametrize("event_type, expected", [("ADDED", Rejected), ("MODIFIED", Rejected), ("DELETED", Deleted)],
                         ids=["added_invalid_rejected", "modified_invalid_rejected", "deleted_invalid_still_deletes"])
def test_an_invalid_object_is_named_with_its_field(event_type, expected):
    bad = with_rv(k8s.service("web", ports=[{"name": "dns", "protocol": "DNS", "port": 53}]), "20")
    fact = SERVICES.event(event(event_type, bad))
    assert isinstance(fact, expected)
    assert fact.key == ("default", "web")
    if isinstance(fact, Rejected):
        assert fact.problem == "Service default/web: spec.ports[0].protocol: Input should be 'TCP', 'UDP' or 'SCTP'"


@pytest.mark.parametrize("line", [b'{"type":"ADDED","object":{"kind":"Serv', b"<html>", b'{"type":"WHATEVER","object":{}}'],
                         ids=["cut_json", "not_json", "unknown_type"])
def test_garbage_on_the_stream_is_a_wire_error(line):
    with pytest.raises(WireError):
        SERVICES.event(line)


def test_list_page_keeps_the_good_items_and_names_the_bad_one():
    good = k8s.service("web")
    bad = k8s.service("broken", ports=[{"port": "eighty"}])
    for item in (good, bad):
        del item["kind"], item["apiVersion"]  # list items carry neither
    body = json.dumps({"kind": "ServiceList", "apiVersion": "v1",
                       "metadata": {"resourceVersion": "77", "continue": "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ",
                                    "remainingItemCount": 3},
                       "items": [good, bad]}).encode()
    page = SERVICES.list_page(body)
    assert [item.metadata.name for item in page.items] == ["web"]
    assert [r.key for r in page.rejected] == [("default", "broken")]
    assert "spec.ports[0].port" in page.rejected[0].problem
    assert (page.resource_version, page.continue_token, page.remaining_item_count) == (
        "77", "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ", 3)


def test_status_body_parses_and_html_does_not():
    body = (b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Too many requests,'
            b' please try again later.","reason":"TooManyRequests","details":{"retryAfterSeconds":1},"code":429}')
    status = parse_status(body)
    assert status is not None and status.details.retry_after_seconds == 1
    assert parse_status(b"<html>bad gateway</html>") is None


# --- what an operator reads --------------------------------------------------------------------


@pytest.mark.parametrize("plural, code, message, expected", [
    ("endpointslices", 403,
     'endpointslices.discovery.k8s.io is forbidden: User "system:serviceaccount:kube-system:kubeport" cannot '
     'watch resource "endpointslices" in API group "discovery.k8s.io" at the cluster scope',
     'EndpointSlice: endpointslices.discovery.k8s.io is forbidden: User "system:serviceaccount:kube-system:kubeport"'
     ' cannot watch resource "endpointslices" in API group "discovery.k8s.io" at the cluster scope; add the rule '
     '{apiGroups: ["discovery.k8s.io"], resources: ["endpointslices"], verbs: ["get", "list", "watch"]} to '
     "kubeport's ClusterRole (deploy/rbac.yaml)"),
    ("services", 403, "",  # a proxy in between that drops the message: we say it ourselves
     'Service: services is forbidden: cannot watch resource "services" in API group "" at the cluster scope; '
     'add the rule {apiGroups: [""], resources: ["services"], verbs: ["get", "list", "watch"]} to '
     "kubeport's ClusterRole (deploy/rbac.yaml)"),
    ("nodes", 401, "Unauthorized",
     "Node: watch nodes: 401 Unauthorized: the API server rejects kubeport's credentials (Unauthorized); check "
     "the token or client certificate of the kubeconfig / service account"),
], ids=["forbidden_as_the_api_says_it__rbac", "forbidden_without_message", "unauthorized"])
def test_permission_problems_name_what_is_missing(plural, code, message, expected):
    resource = next(r for r in watched_resources("node-a") if r.plural == plural)
    status = parse_status(json.dumps({"kind": "Status", "message": message, "code": code}).encode())
    error = ApiStatusError(code, status, verb="watch", path=resource.path)
    assert resource.forbidden_problem(error) == expected


# --- speed ----------------------------------------------------------------------------------------


def _best_rate(count: int, work) -> float:
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        work()
        best = max(best, count / (time.perf_counter() - start))
    return best


def test_parse_rate_of_watch_events_and_lists(capsys):
    """Objects/s parsed from raw bytes into the models (printed; the floor only catches collapses)."""
    slices = [with_rv(k8s.endpoint_slice(f"web-{i:05d}", f"web-{i // 2}",
                                         addresses=[f"10.244.{i % 250}.{j}" for j in range(1, 11)]), str(1000 + i))
              for i in range(1000)]
    lines = [event("MODIFIED", obj) for obj in slices]
    def parse_events() -> None:
        for line in lines:  # each parsed object is handed on and dropped, as the informer does
            SLICES.event(line)

    events_rate = _best_rate(len(lines), parse_events)
    for obj in slices:
        del obj["kind"], obj["apiVersion"]
    body = json.dumps({"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                       "metadata": {"resourceVersion": "5000"}, "items": slices}).encode()
    list_rate = _best_rate(len(slices), lambda: SLICES.list_page(body))
    with capsys.disabled():
        print(f"\n  EndpointSlices (10 endpoints, managedFields) parsed: watch events {events_rate:,.0f}/s, "
              f"list items {list_rate:,.0f}/s ({len(lines[0])} bytes per event)")
    assert len(SLICES.list_page(body).items) == 1000
    assert events_rate > 1000 and list_rate > 1000

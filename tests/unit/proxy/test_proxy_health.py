"""kube-proxy's /healthz and /livez (pkg/proxy/healthcheck/proxy_health.go; KEP-3836), driven with `now`."""

from __future__ import annotations

import json

import pytest

from kubeport import components, config
from kubeport.endpoints.types import NodeInfo
from kubeport.proxy.healthcheck.proxier_health import GO_ZERO_TIME, IPV4, IPV6, ProxyHealth, go_time

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
NODE = NodeInfo(name="node-a")


def health(**kwargs) -> ProxyHealth:
    h = ProxyHealth(60.0, **kwargs)
    h.sync_node(NODE)
    return h


def body(response) -> dict:
    return json.loads(response.body)


def test_healthy_before_any_update_while_starting_up() -> None:
    h = health()
    response = h.livez(T0)
    assert response.status == 200
    assert body(response) == {"lastUpdated": "2023-11-14T22:13:20Z", "currentTime": "2023-11-14T22:13:20Z",
                              "healthy": True}


def test_pending_update_before_first_sync_is_not_judged__kube_proxy_quirk() -> None:
    h = health()
    h.queued_update(T0)
    assert h.healthy(T0 + 3600)


@pytest.mark.parametrize(
    ("pending_for", "healthy"),
    [
        pytest.param(59.9, True, id="pending_within_timeout_is_healthy"),
        pytest.param(60.0, False, id="pending_for_the_timeout_is_unhealthy"),
        pytest.param(600.0, False, id="pending_long_past_timeout_is_unhealthy"),
    ],
)
def test_pending_update_older_than_timeout_is_unhealthy(pending_for, healthy) -> None:
    h = health()
    h.updated(T0)
    h.queued_update(T0 + 10)
    assert h.healthy(T0 + 10 + pending_for) is healthy
    assert h.livez(T0 + 10 + pending_for).status == (200 if healthy else 503)


def test_only_the_oldest_pending_update_counts() -> None:
    h = health()
    h.updated(T0)
    h.queued_update(T0 + 1)
    h.queued_update(T0 + 50)
    assert not h.healthy(T0 + 61)


def test_update_applied_clears_pending() -> None:
    h = health()
    h.updated(T0)
    h.queued_update(T0 + 1)
    h.updated(T0 + 100)
    assert h.healthy(T0 + 500)


def test_one_stuck_family_makes_the_proxy_unhealthy() -> None:
    h = health(families=(IPV4, IPV6))
    h.updated(T0)
    h.queued_update(T0 + 1, IPV6)
    response = h.livez(T0 + 100)
    assert response.status == 503
    assert body(response) == {
        "lastUpdated": "2023-11-14T22:13:20Z",
        "currentTime": "2023-11-14T22:15:00Z",
        "healthy": False,
        "status": {
            "IPv4": {"lastUpdated": "2023-11-14T22:13:20Z", "healthy": True},
            "IPv6": {"lastUpdated": "2023-11-14T22:13:20Z", "healthy": False},
        },
    }


def test_healthy_body_reports_now_as_last_updated_for_compatibility() -> None:
    h = health()
    h.updated(T0)
    response = h.healthz(T0 + 5.25)
    assert response.status == 200
    assert response.body == (
        b'{"lastUpdated":"2023-11-14T22:13:25.25Z","currentTime":"2023-11-14T22:13:25.25Z",'
        b'"nodeEligible":true,"healthy":true,"status":{"IPv4":{"lastUpdated":"2023-11-14T22:13:20Z","healthy":true}}}'
    )


@pytest.mark.parametrize(
    ("node", "require_node", "healthz", "eligible"),
    [
        pytest.param(NODE, True, 200, True, id="eligible_node"),
        pytest.param(NodeInfo(name="node-a", eligible=False), True, 503, False,
                     id="node_being_deleted_or_tainted_to_be_deleted__kep3836"),
        pytest.param(None, True, 503, False, id="no_node_object_not_eligible"),
        pytest.param(None, False, 200, True, id="no_node_object_eligible_when_not_required"),
    ],
)
def test_healthz_needs_an_eligible_node_livez_does_not(node, require_node, healthz, eligible) -> None:
    h = ProxyHealth(require_node=require_node)
    h.sync_node(node)
    h.updated(T0)
    response = h.healthz(T0 + 1)
    assert response.status == healthz
    assert body(response)["nodeEligible"] is eligible
    assert body(response)["healthy"] is True
    assert h.livez(T0 + 1).status == 200
    assert "nodeEligible" not in body(h.livez(T0 + 1))


def test_unhealthy_healthz_reports_real_last_update() -> None:
    h = health()
    h.sync_node(NodeInfo(name="node-a", eligible=False))
    h.updated(T0)
    assert body(h.healthz(T0 + 30))["lastUpdated"] == "2023-11-14T22:13:20Z"


def test_never_updated_and_ineligible_reports_go_zero_time() -> None:
    h = health()
    h.sync_node(None)
    assert body(h.healthz(T0))["lastUpdated"] == GO_ZERO_TIME


def test_headers_and_counters() -> None:
    h = health()
    h.sync_node(None)
    response = h.healthz(T0)
    assert dict(response.headers) == {"Content-Type": "application/json", "X-Content-Type-Options": "nosniff"}
    h.livez(T0)
    h.livez(T0)
    assert h.healthz_total == {503: 1}
    assert h.livez_total == {200: 2}


@pytest.mark.parametrize(
    ("service_ranges", "families"),
    [
        pytest.param("10.96.0.0/12", ["IPv4"], id="ipv4_only"),
        pytest.param("fd00:96::/108", ["IPv6"], id="ipv6_only__no_ipv4_entry"),
        pytest.param("fd00:96::/108,10.96.0.0/12", ["IPv4", "IPv6"], id="dual_stack__one_entry_per_family"),
    ],
)
def test_daemon_reports_the_families_it_proxies(service_ranges, families) -> None:
    configuration = config.build(None, {"serviceClusterIPRange": service_ranges})
    h = health(families=components.proxier_families(configuration))
    h.updated(T0)
    assert sorted(body(h.healthz(T0))["status"]) == families
    assert sorted(body(h.livez(T0))["status"]) == families


@pytest.mark.parametrize(
    ("timestamp", "text"),
    [
        pytest.param(None, "0001-01-01T00:00:00Z", id="zero"),
        pytest.param(0.0, "1970-01-01T00:00:00Z", id="epoch"),
        pytest.param(T0 + 0.123456, "2023-11-14T22:13:20.123456Z", id="micros"),
        pytest.param(T0 + 0.5, "2023-11-14T22:13:20.5Z", id="trailing_zeros_trimmed"),
    ],
)
def test_go_time(timestamp, text) -> None:
    assert go_time(timestamp) == text

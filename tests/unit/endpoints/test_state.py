"""ClusterState: merging, no-op detection, snapshots (table-driven where it can be)."""

from __future__ import annotations

import asyncio

import pytest

from kubeport.endpoints import model
from kubeport.endpoints.state import ClusterState
from kubeport.endpoints.types import NodeInfo, ServiceName, endpoints_for_port

from support import api
from support.api import endpoint as ep  # the tables' short name

WEB = ServiceName("default", "web")


def service(name="web", namespace="default", **spec):
    spec.setdefault("clusterIP", "10.96.0.20")
    spec.setdefault("ports", [{"name": "http", "port": 80, "targetPort": "http"}])
    return api.to_model(api.service(name, namespace, **spec))


def slice_(name, service_name="web", namespace="default", endpoints=(), ports=(("http", 8080),), family="IPv4"):
    return api.to_model(api.endpoint_slice(service_name, namespace, name=name, address_type=family,
                                           endpoints=[dict(e) for e in endpoints],
                                           ports=[{"name": n, "port": p} for n, p in ports]))


def synced_state(**kwargs) -> ClusterState:
    state = ClusterState("node-a", **kwargs)
    state.mark_synced("Service")
    state.mark_synced("EndpointSlice")
    return state


def test_merges_all_slices_of_a_service():
    state = synced_state()
    state.upsert(service())
    state.upsert(slice_("web-a", endpoints=[ep("10.244.1.11")]))
    state.upsert(slice_("web-b", endpoints=[ep("10.244.2.11")]))
    snap = state.commit()
    assert [s.name for s in snap.services[WEB].slices] == ["web-a", "web-b"]


def test_noop_update_publishes_nothing():
    state = synced_state()
    state.upsert(service())
    state.upsert(slice_("web-a", endpoints=[ep("10.244.1.11")]))
    first = state.commit()
    state.upsert(service())
    state.upsert(slice_("web-a", endpoints=[ep("10.244.1.11")]))
    assert state.commit() is None
    assert state.snapshot is first


def test_unchanged_service_keeps_identity_across_snapshots():
    state = synced_state()
    state.upsert(service())
    state.upsert(service("other", clusterIP="10.96.0.21"))
    first = state.commit()
    state.upsert(slice_("web-a", endpoints=[ep("10.244.1.11")]))
    second = state.commit()
    other = ServiceName("default", "other")
    assert second.services[other] is first.services[other]
    assert second.changed == {WEB}
    assert second.changed_since(first) == {WEB}


def test_changed_since_covers_skipped_snapshots():
    state = synced_state()
    state.upsert(service())
    first = state.commit()
    state.upsert(service("a", clusterIP="10.96.0.30"))
    state.commit()
    state.delete("Service", "default", "web")
    third = state.commit()
    assert third.changed_since(first) == {ServiceName("default", "a"), WEB}
    assert WEB not in third.services


def test_slice_without_service_is_held_until_the_service_appears():
    state = synced_state()
    state.upsert(slice_("web-a", endpoints=[ep("10.244.1.11")]))
    state.commit()
    assert WEB not in state.snapshot.services
    state.upsert(service())
    snap = state.commit()
    assert len(snap.services[WEB].slices) == 1


def test_slice_relabelled_to_another_service_moves():
    state = synced_state()
    state.upsert(service())
    state.upsert(service("api", clusterIP="10.96.0.21"))
    state.upsert(slice_("s1", endpoints=[ep("10.244.1.11")]))
    state.commit()
    state.upsert(slice_("s1", service_name="api", endpoints=[ep("10.244.1.11")]))
    snap = state.commit()
    assert snap.services[WEB].slices == ()
    assert len(snap.services[ServiceName("default", "api")].slices) == 1
    assert snap.changed == {WEB, ServiceName("default", "api")}


def test_not_synced_until_services_and_slices_listed():
    state = ClusterState("node-a")
    state.upsert(service())
    assert state.commit().synced is False
    state.mark_synced("Service")
    assert state.commit() is None  # still not synced: nothing new to say
    state.mark_synced("EndpointSlice")
    assert state.commit().synced is True


@pytest.mark.parametrize(
    "implicit, objects, expected",
    [
        pytest.param(False, [service()], frozenset(), id="explicit_only__api_mode"),
        pytest.param(True, [service()], {"default"}, id="object_makes_namespace__manifest_mode"),
        pytest.param(True, [model.Namespace.model_validate({"metadata": {"name": "empty"}})], {"empty"},
                     id="namespace_object"),
    ],
)
def test_namespaces(implicit, objects, expected):
    state = synced_state(implicit_namespaces=implicit)
    for obj in objects:
        state.upsert(obj)
    snap = state.commit() or state.snapshot
    assert snap.namespaces == expected


def test_implicit_namespace_disappears_with_its_last_object():
    state = synced_state(implicit_namespaces=True)
    state.upsert(service(namespace="shop"))
    assert state.commit().namespaces == {"shop"}
    state.delete("Service", "shop", "web")
    assert state.commit().namespaces == frozenset()


def test_own_node_is_published_with_zone():
    state = synced_state()
    state.upsert(model.Node.model_validate({
        "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "zone-a"}},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.50.11"}]},
    }))
    snap = state.commit()
    assert snap.node.zone == "zone-a"
    assert snap.node.primary_ips() == ("192.168.50.11",)
    assert snap.node_changed


@pytest.mark.parametrize(("addresses", "expected"), [
    pytest.param([("InternalIP", "192.168.50.11"), ("InternalIP", "192.168.50.12")], ("192.168.50.11",),
                 id="first_internal_ip"),
    pytest.param([("ExternalIP", "203.0.113.5"), ("InternalIP", "192.168.50.11"), ("InternalIP", "fd00:50::11")],
                 ("192.168.50.11", "fd00:50::11"), id="internal_before_external__both_families"),
    pytest.param([("InternalIP", "192.168.50.11"), ("ExternalIP", "2001:db8::5")], ("192.168.50.11", "2001:db8::5"),
                 id="a_family_without_internal_ip_takes_the_external_one"),
    pytest.param([("Hostname", "node-a"), ("ExternalIP", "203.0.113.5")], ("203.0.113.5",), id="external_only"),
    pytest.param([("InternalIP", "127.0.0.1"), ("InternalIP", "192.168.50.11")], ("127.0.0.1",),
                 id="loopback_kept__primary_expansion_drops_it"),
])
def test_node_ips_as_kube_proxy_reads_them__get_node_host_ips(addresses, expected):
    assert NodeInfo(name="node-a", addresses=tuple(addresses)).primary_ips() == expected


async def test_wait_newer_wakes_on_commit():
    state = synced_state()
    waiter = asyncio.create_task(state.wait_newer(0))
    await asyncio.sleep(0)
    assert not waiter.done()
    state.upsert(service())
    state.commit()
    async with asyncio.timeout(1):
        snap = await waiter
    assert snap.generation == 1


# --- endpoints_for_port: kube-proxy's endpointslicecache rules -------------------------


def _slices(state):
    return state.commit().services[WEB].slices


@pytest.mark.parametrize(
    "slices, expected",
    [
        pytest.param([slice_("a", endpoints=[ep("10.0.0.2"), ep("10.0.0.1")])],
                     ["10.0.0.1:8080", "10.0.0.2:8080"], id="sorted_by_ip_port"),
        pytest.param([slice_("a", endpoints=[ep("10.0.0.1")], ports=[("http", 8080)]),
                      slice_("b", endpoints=[ep("10.0.0.2")], ports=[("http", 9090)])],
                     ["10.0.0.1:8080", "10.0.0.2:9090"], id="named_target_port_resolved_per_slice"),
        pytest.param([slice_("a", endpoints=[ep("10.0.0.1")], ports=[("other", 8080)])], [],
                     id="slice_without_matching_port_ignored"),
        pytest.param([slice_("a", endpoints=[ep("10.0.0.1")], ports=[("http", 0)])], [],
                     id="zero_port_ignored"),
        pytest.param([slice_("a", endpoints=[ep("10.0.0.1", conditions={"terminating": True, "ready": False})]),
                      slice_("b", endpoints=[ep("10.0.0.1")])],
                     [("10.0.0.1:8080", False)], id="duplicate_ip_port_non_terminating_wins"),
        pytest.param([slice_("a", family="IPv6", endpoints=[ep("fd00::0001")])], ["[fd00::1]:8080"],
                     id="ipv6_canonical_key"),
        pytest.param([slice_("a", endpoints=[{"addresses": []}])], [], id="endpoint_without_address_skipped"),
    ],
)
def test_endpoints_for_port(slices, expected):
    state = synced_state()
    state.upsert(service())
    for s in slices:
        state.upsert(s)
    result = endpoints_for_port(_slices(state), "http", "TCP")
    if expected and isinstance(expected[0], tuple):
        assert [(e.key, e.endpoint.terminating) for e in result] == expected
    else:
        assert [e.key for e in result] == expected


@pytest.mark.parametrize(
    "conditions, ready, serving, terminating",
    [
        pytest.param({}, True, True, False, id="nil_conditions_ready_serving_not_terminating"),
        pytest.param({"ready": False}, False, True, False, id="not_ready"),
        pytest.param({"ready": False, "serving": True, "terminating": True}, False, True, True,
                     id="serving_terminating__kep1669"),
        pytest.param({"ready": False, "serving": False, "terminating": True}, False, False, True,
                     id="terminating_not_serving"),
    ],
)
def test_endpoint_conditions_nil_semantics(conditions, ready, serving, terminating):
    state = synced_state()
    state.upsert(service())
    state.upsert(slice_("a", endpoints=[ep("10.0.0.1", conditions=conditions)]))
    endpoint = _slices(state)[0].endpoints[0]
    assert (endpoint.ready, endpoint.serving, endpoint.terminating) == (ready, serving, terminating)


def test_changed_at_is_when_the_oldest_change_of_the_batch_arrived():
    times = iter([100.0, 101.0, 102.0])
    state = ClusterState("node-a", clock=lambda: next(times))
    state.mark_synced("Service")
    state.mark_synced("EndpointSlice")
    state.upsert(service())  # arrives at 100
    state.upsert(service("api", clusterIP="10.96.0.21"))  # same batch
    assert state.commit().changed_at == 100.0
    state.upsert(service("api", clusterIP="10.96.0.22"))  # next batch: 101
    assert state.commit().changed_at == 101.0


# --- the service ranges: the flag's and the ServiceCIDRs' (KEP-1880) ---------------------------

def _ranges_after(steps, flag=("10.96.0.0/28",)):
    state = synced_state(service_cidrs=flag)
    state.commit()
    for step in steps:
        if isinstance(step, str):
            state.delete("ServiceCIDR", "", step)
        else:
            state.upsert(api.to_model(step))
    state.commit()
    return state.snapshot.service_cidrs


@pytest.mark.parametrize(("steps", "expected"), [
    pytest.param([], ("10.96.0.0/28",), id="flag_only"),
    pytest.param([api.service_cidr("extra", "10.97.0.0/24")], ("10.96.0.0/28", "10.97.0.0/24"), id="added"),
    pytest.param([api.service_cidr("b", "10.98.0.0/24"), api.service_cidr("a", "10.97.0.0/24", "fd00:97::/112")],
                 ("10.96.0.0/28", "10.97.0.0/24", "fd00:97::/112", "10.98.0.0/24"), id="by_name_dual_stack"),
    pytest.param([api.service_cidr("kubernetes", "10.96.0.0/28")], ("10.96.0.0/28",), id="default_once"),
    pytest.param([api.service_cidr("extra", "10.97.0.0/24"), "extra"], ("10.96.0.0/28",), id="deleted"),
    pytest.param([api.service_cidr("gone", "10.97.0.0/24", ready=False)], ("10.96.0.0/28", "10.97.0.0/24"),
                 id="terminating_still_a_service_range"),
])
def test_snapshot_carries_the_service_ranges(steps, expected):
    assert _ranges_after(steps) == expected


def test_a_service_cidr_alone_publishes_a_snapshot_and_is_journaled():
    state = synced_state(service_cidrs=["10.96.0.0/28"])
    first = state.commit()
    state.upsert(api.to_model(api.service_cidr("extra", "10.97.0.0/24")))
    second = state.commit()
    assert second is not None and second.generation == first.generation + 1
    assert second.changed == frozenset() and second.services is first.services
    assert ("ServiceCIDR", ("", "extra"), ("10.97.0.0/24",)) in list(state.entries())
    assert state.keys("ServiceCIDR") == {("", "extra")}
    assert state.commit() is None  # nothing more changed

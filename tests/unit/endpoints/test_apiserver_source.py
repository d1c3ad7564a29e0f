"""The kube-apiserver source against an in-process API server speaking the real protocol:
sync, events, recovery from 410, cuts, stalls, 429/500, sync gating, invalid objects, metrics.

Everything runs on 127.0.0.1 over HTTPS with a private CA. Backoff delays are made tiny
(or recorded) through the injectable policy and sleep; every wait is on a condition with
a deadline, never a bare sleep.
"""

from __future__ import annotations

import asyncio

from kubeport.endpoints.apiserver.source import BackoffPolicy
from kubeport.endpoints.types import ServiceName

from support.apiserver import objects as k8s
from support.apiserver.harness import (  # noqa: F401  (running, tls: fixtures)
    API,
    WEB,
    RecordingState,
    running,
    seed,
    snapshot_where,
    synced,
    tls,
)
from support.wait import until


# --- initial sync ------------------------------------------------------------------------


async def test_initial_sync_streams_every_resource__watch_list_kep3157(running):
    server, source, state = await running()
    snapshot = await synced(state, source)
    assert set(snapshot.services) == {WEB, API}
    assert {e.address for e in snapshot.services[WEB].slices[0].endpoints} == {"10.244.1.5", "10.244.2.7"}
    assert {"default", "kube-system"} <= snapshot.namespaces
    assert snapshot.node is not None and snapshot.node.zone == "zone-a"
    # One streaming list per resource, no plain list.
    for plural in ("services", "endpointslices", "nodes", "namespaces"):
        assert server.count(plural, "list") == 0
        first = next(r for r in server.requests if r.plural == plural)
        assert first.params["sendInitialEvents"] == "true"
        assert first.params["resourceVersionMatch"] == "NotOlderThan"
        assert first.params["allowWatchBookmarks"] == "true"
    assert all(s.watch_list for s in source.stats.values())
    assert source.problems == []


async def test_node_watch_is_limited_to_this_node_by_field_selector(running):
    server, source, state = await running()
    await synced(state, source)
    assert set(state.snapshot.nodes) == {"node-a"}
    node_requests = [r for r in server.requests if r.plural == "nodes"]
    assert node_requests and all(r.params["fieldSelector"] == "metadata.name=node-a" for r in node_requests)
    # DNS needs every Service, headless and other proxies' ones too: no label selector.
    assert all("labelSelector" not in r.params for r in server.requests)


async def test_falls_back_to_paged_list_and_watch_when_watch_list_is_rejected__kep3157(running):
    server, source, state = await running(server_options={"watch_list": False}, page_size=2)
    for i in range(5):
        server.apply(k8s.service(f"svc-{i}", cluster_ip=f"10.96.1.{i}"))
    await synced(state, source)
    await until(lambda: len(state.snapshot.services) == 7, "all services")
    await until(lambda: server.open_watches("services") == 1, "the watch")
    stats = source.stats["Service"]
    assert stats.watch_list is False and stats.lists == 1 and stats.relists == 0
    kinds = [(r.verb, "sendInitialEvents" in r.params, "continue" in r.params)
             for r in server.requests if r.plural == "services"]
    # 422 for the streaming list, then 4 pages of 2 (7 services), then a watch from the list's RV.
    assert kinds[:6] == [("watch", True, False), ("list", False, False)] + [("list", False, True)] * 3 \
        + [("watch", False, False)]
    pages = [r.params for r in server.requests if r.plural == "services" and r.verb == "list"]
    assert all(p["limit"] == "2" for p in pages)
    watch = [r.params for r in server.requests if r.plural == "services" and r.verb == "watch"][1]
    assert watch["resourceVersion"] == stats.resource_version
    assert source.problems == []


async def test_expired_continue_token_restarts_with_a_full_list__client_go_pager(running):
    server, source, state = await running(server_options={"watch_list": False}, page_size=2)
    server.apply(k8s.service("more", cluster_ip="10.96.0.60"))
    server.expire_continue = 1
    await synced(state, source)
    lists = [r.params for r in server.requests if r.plural == "services" and r.verb == "list"]
    assert [("continue" in p, p.get("limit")) for p in lists] == [(False, "2"), (True, "2"), (False, None)]
    assert set(state.snapshot.services) == {WEB, API, ServiceName("default", "more")}


# --- events --------------------------------------------------------------------------------


async def test_each_watch_event_type_reaches_the_state(running):
    server, source, state = await running()
    await synced(state, source)
    db = ServiceName("default", "db")

    server.apply(k8s.service("db", cluster_ip="10.96.0.30"))
    await snapshot_where(state, lambda s: db in s.services, "ADDED")

    server.apply(k8s.service("db", cluster_ip="10.96.0.30", ports=[
        {"name": "pg", "protocol": "TCP", "port": 5432, "targetPort": 5432}]))
    await snapshot_where(state, lambda s: s.services[db].service.ports[0].port == 5432, "MODIFIED")

    server.delete("EndpointSlice", "default", "web-abc12")
    await snapshot_where(state, lambda s: s.services[WEB].slices == (), "DELETED")

    server.bookmark("services")
    rv = str(server.rv)
    await until(lambda: source.stats["Service"].resource_version == rv, "the bookmark's RV")  # BOOKMARK
    events = source.stats["Service"].events
    assert events["ADDED"] >= 3 and events["MODIFIED"] == 1 and events["BOOKMARK"] >= 2
    assert source.stats["EndpointSlice"].events["DELETED"] == 1


async def test_events_arriving_together_are_committed_once(running):
    server, source, state = await running()
    await synced(state, source)
    generation = state.snapshot.generation
    hold = server.hold("services", "watch")
    server.cut_watches("services")
    server.apply(k8s.service("a", cluster_ip="10.96.0.41"))      # cut half-way: the watch reconnects
    await until(lambda: server.count("services", "watch") == 2, "the reconnect")
    for name, ip in (("b", "10.96.0.42"), ("c", "10.96.0.43")):
        server.apply(k8s.service(name, cluster_ip=ip))
    hold.set()                                                     # a, b, c are replayed in one write
    snap = await state.wait_newer(generation)
    await until(lambda: len(state.snapshot.services) == 5, "a, b and c")
    assert state.snapshot.generation == generation + 1 == snap.generation


# --- failures and recovery ------------------------------------------------------------------


async def test_relist_after_410_applies_only_real_changes__no_flap(running):
    server, source, state = await running()
    before = await synced(state, source)
    # While the client is cut off: one real change, then etcd compacts its history.
    server.cut_watches("services")
    server.apply(k8s.node("node-c", zone="zone-c"))     # not ours: bumps the RV only
    server.bookmark("services")                          # the client sees half a line: cut
    server.apply(k8s.service("web", cluster_ip="10.96.0.20", ports=[
        {"name": "http", "protocol": "TCP", "port": 81, "targetPort": 8080}]))
    server.compact()
    await until(lambda: source.stats["Service"].relists == 1, "the relist after 410")
    after = state.snapshot
    assert after.changed == frozenset({WEB})
    assert after.services[API] is before.services[API]   # unchanged objects: same object, no change
    assert after.services[WEB].service.ports[0].port == 81
    assert source.stats["Service"].restart_reasons["expired"] == 1
    # The relist published one snapshot, the same as the events would have.
    assert after.generation == before.generation + 1


async def test_http_410_on_reconnect_relists_and_deletes_what_vanished(running):
    server, source, state = await running()
    await synced(state, source)
    server.cut_watches("services")
    server.bookmark("services")                   # half a line, then the cut
    server.delete("Service", "default", "web")    # never seen as an event...
    server.fail("services", "watch", 410)         # ...because the reconnect gets 410 Gone
    snap = await snapshot_where(state, lambda s: WEB not in s.services, "the vanished service")
    assert snap.changed == frozenset({WEB}) and API in snap.services
    assert source.stats["Service"].relists == 1 and source.stats["Service"].failures["410"] == 1


async def test_cut_mid_line_loses_nothing_and_applies_nothing_twice(running):
    server, source, state = await running()
    await synced(state, source)
    state.log.clear()
    server.cut_watches("services")
    rv_a = server.apply(k8s.service("a", cluster_ip="10.96.0.41"))   # written half, then the cut
    rv_b = server.apply(k8s.service("b", cluster_ip="10.96.0.42"))
    await until(lambda: len(state.snapshot.services) == 4, "a and b")
    assert [entry for entry in state.log if entry[1] == "Service"] == [
        ("upsert", "Service", "a", str(rv_a)), ("upsert", "Service", "b", str(rv_b))]
    stats = source.stats["Service"]
    assert stats.restart_reasons["cut"] == 1 and stats.relists == 0
    resumed = [r.params for r in server.requests if r.plural == "services" and r.verb == "watch"][-1]
    assert int(resumed["resourceVersion"]) < rv_a


async def test_a_silent_watch_is_detected_and_reopened(running):
    server, source, state = await running(server_options={"bookmark_interval": 0.02}, stall_timeout=0.25)
    await synced(state, source)
    server.stall_watches("services")
    rv = server.apply(k8s.service("late", cluster_ip="10.96.0.50"))
    await until(lambda: ServiceName("default", "late") in state.snapshot.services, "the late service")
    stats = source.stats["Service"]
    assert stats.restart_reasons["stall"] == 1 and stats.relists == 0
    assert stats.resource_version >= str(rv)
    # Healthy watches, kept alive by bookmarks, were never restarted.
    assert source.stats["EndpointSlice"].watch_restarts == 0


async def test_a_clean_end_of_the_watch_resumes_without_relisting(running):
    server, source, state = await running(server_options={"watch_timeout": 0.05, "bookmark_interval": 0.01})
    await synced(state, source)
    await until(lambda: source.stats["Service"].restart_reasons["timeout"] >= 2, "two clean ends")
    server.apply(k8s.service("after", cluster_ip="10.96.0.51"))
    await until(lambda: ServiceName("default", "after") in state.snapshot.services, "the new service")
    assert source.stats["Service"].lists == 1


async def test_a_very_short_empty_watch_backs_off__client_go(running):
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        await asyncio.sleep(0)

    server, source, state = await running(server_options={"watch_timeout": 0.001}, sleep=sleep)
    await synced(state, source)
    await until(lambda: source.stats["Service"].restart_reasons["short"] >= 3, "short watches")
    assert delays and source.stats["Service"].lists == 1


async def test_429_waits_for_retry_after(running):
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)

    server, source, state = await running(seeded=True, sleep=sleep, server_options={})
    await synced(state, source)
    server.fail("services", "watch", 429, retry_after=3)
    server.cut_watches("services")
    server.bookmark("services")
    await until(lambda: source.stats["Service"].failures["429"] == 1, "the 429")
    await until(lambda: server.open_watches("services") == 1, "the watch again")
    assert 3.0 in delays


async def test_500_backs_off_exponentially_then_recovers(running):
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        await asyncio.sleep(0)

    policy = BackoffPolicy(initial=0.5, cap=1.5, jitter=0.0, young_cap=1.5)
    server, source, state = await running(server_options={"watch_list": False}, seeded=False, sleep=sleep,
                                          backoff=policy)
    server.fail("services", "list", 500, times=4)
    seed(server)
    await synced(state, source)
    assert delays == [0.5, 1.0, 1.5, 1.5]
    assert source.stats["Service"].failures["500"] == 4


# --- sync gating -------------------------------------------------------------------------------


async def test_not_synced_until_services_and_endpointslices_have_both_listed(running):
    server, source, state = await running()
    # The source task has not run yet: its first EndpointSlice request will wait.
    release = server.hold("endpointslices", "watch")
    await until(lambda: source.stats["Service"].synced, "the services' list")
    await until(lambda: state.snapshot.generation > 0, "a first snapshot")
    assert not state.snapshot.synced          # services alone: the proxy and DNS wait
    assert WEB in state.snapshot.services     # (the data is there, only not published as synced)
    release.set()
    snap = await snapshot_where(state, lambda s: s.synced, "synced")
    assert snap.services[WEB].slices


async def test_a_lost_connection_keeps_the_last_known_state(running):
    server, source, state = await running()
    before = await synced(state, source)
    await server.stop()                       # the API server goes away entirely
    await until(lambda: source.stats["Service"].failures, "a failed reconnect")
    assert state.snapshot.synced and set(state.snapshot.services) == set(before.services)


# --- invalid objects ------------------------------------------------------------------------------


async def test_an_invalid_object_keeps_its_last_good_version_and_is_reported(running):
    server, source, state = await running()
    await synced(state, source)
    bad = k8s.service("web", ports=[{"name": "http", "protocol": "QUIC", "port": 80, "targetPort": 8080}])
    server.apply(bad)
    await until(lambda: source.problems, "the problem")
    assert source.problems == ["Service default/web: spec.ports[0].protocol: "
                               "Input should be 'TCP', 'UDP' or 'SCTP'"]
    assert state.snapshot.services[WEB].service.ports[0].protocol == "TCP"
    server.apply(k8s.service("web", ports=[{"name": "http", "protocol": "UDP", "port": 80, "targetPort": 8080}]))
    await snapshot_where(state, lambda s: s.services[WEB].service.ports[0].protocol == "UDP", "the fix")
    assert source.problems == []


async def test_an_object_the_state_refuses_is_reported_and_the_rest_applies(running):
    class Picky(RecordingState):
        def upsert(self, obj) -> None:
            if obj.metadata.name == "explode":
                raise ValueError("cannot convert")
            super().upsert(obj)

    server, source, state = await running(state=Picky())
    server.apply(k8s.service("explode", cluster_ip="10.96.0.80"))   # before the first list
    await synced(state, source)
    assert source.problems == ["Service default/explode: not applied: ValueError: cannot convert"]
    assert set(state.snapshot.services) == {WEB, API}
    server.apply(k8s.service("fine", cluster_ip="10.96.0.81"))
    await snapshot_where(state, lambda s: ServiceName("default", "fine") in s.services, "later events")


# --- metrics ----------------------------------------------------------------------------------------


async def test_stats_are_exported_as_prometheus_metrics(running):
    from prometheus_client import CollectorRegistry, generate_latest

    server, source, state = await running()
    await synced(state, source)
    registry = CollectorRegistry()
    registry.register(source.collector())
    text = generate_latest(registry).decode()
    assert 'kubeport_apiserver_lists_total{kind="Service"} 1.0' in text
    assert 'kubeport_apiserver_synced{kind="EndpointSlice"} 1.0' in text
    assert 'kubeport_apiserver_watch_events_total{kind="Service",type="ADDED"} 2.0' in text
    assert 'kubeport_apiserver_last_sync_timestamp_seconds{kind="Node"}' in text
    assert "kubeport_apiserver_problems 0.0" in text
    assert source.stats_dict()["Service"]["lists"] == 1

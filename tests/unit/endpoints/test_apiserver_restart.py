"""The source against API servers that misbehave as real ones do, with kubeport's default
backoff and real time: an etcd without progress notifications (every streaming list is a
500 ERROR event), restarts (with and without compaction), and an API server that comes up
after the node. Each measures how long the node takes from the server being ready.

client-go's reflector (k8s.io/client-go/tools/cache/reflector.go) falls back to a plain
list on any error of a watch-list attempt; a 410 is a relist, not a failure. Every wait is
on a condition with a deadline; the deadlines are the promises (2 s).
"""

from __future__ import annotations

import asyncio
import socket

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from kubeport.endpoints.apiserver.source import ApiServerSource, BackoffPolicy
from kubeport.endpoints.types import ServiceName
from kubeport.printers import render_status

from support.apiserver import objects as k8s
from support.apiserver.harness import RecordingState, seed, snapshot_where, synced, tls  # noqa: F401 (fixtures)
from support.apiserver.server import FakeApiServer
from support.apiserver.shapes import status
from support.apiserver.tls import write_kubeconfig
from support.wait import until

#: A node follows the API server within this long of it being ready.
FOLLOW = 2.0
EXPIRED = status(410, "Expired", "too old resource version: 1000 (1010)")
PLURALS = ("services", "endpointslices", "nodes", "namespaces")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
async def node(tmp_path, tls):
    """``node(server)``: a source with kubeport's default backoff against ``server`` (started
    or not), feeding a RecordingState; stopped after the test, with every server made."""
    tasks: list[asyncio.Task] = []
    servers: list[FakeApiServer] = []

    def make_server(**options) -> FakeApiServer:
        server = FakeApiServer(tls=tls.server_context(), port=options.pop("port", 0) or free_port(), **options)
        servers.append(server)
        return server

    def start(server: FakeApiServer):
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{server.port}",
                                      ca=tls.ca_cert, token=server.token)
        state = RecordingState()
        source = ApiServerSource(state, node_name="node-a", kubeconfig=kubeconfig, backoff=BackoffPolicy())
        tasks.append(asyncio.create_task(source.run()))
        return source, state

    start.server = make_server
    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for server in servers:
        await server.stop()


def since(t0: float) -> float:
    return asyncio.get_running_loop().time() - t0


def now() -> float:
    return asyncio.get_running_loop().time()


def streaming_lists(server: FakeApiServer, plural: str) -> int:
    return sum(1 for r in server.requests if r.plural == plural and r.params.get("sendInitialEvents") == "true")


async def test_ready_within_2s_on_an_etcd_without_progress_notify__cacher_RequestWatchProgress(node):
    """etcd 3.4.23: the API server answers every streaming list with a 500 ERROR event
    (cacher.go); client-go falls back to list + watch ("making progress is better than
    deadlocking"), and so does kubeport, once per resource and connection."""
    server = node.server(progress_notify=False)
    await server.start()
    seed(server)
    t0 = now()
    source, state = node(server)
    await synced(state, source, timeout=FOLLOW)
    ready = since(t0)
    for kind, stats in source.stats.items():
        assert stats.watch_list is False, kind
        assert "RequestWatchProgress is disabled" in stats.watch_list_fallback
        assert stats.watch_list_fallback.startswith("500 InternalError")
    await until(lambda: server.open_watches("services") == 1, "the plain watch", FOLLOW)
    server.error_watches("services", EXPIRED)       # a relist: not a new streaming-list attempt
    await until(lambda: source.stats["Service"].relists == 1, "the relist", FOLLOW)
    assert all(streaming_lists(server, plural) == 1 for plural in PLURALS)
    assert server.count("services", "list") == 2
    # `kubeport get status` names the fallback and its reason, the relist and its cause.
    listed = render_status({"kind": "apiserver", **source.status(), "problems": 0})
    service = source.status()["resources"]["Service"]
    assert service["watchList"] is False and service["relistCause"] == "expired"
    assert service["lastRelist"] is not None and service["backoff"] == 0.0
    assert yaml.safe_load(listed)["resources"]["Service"]["watchListFallback"] == (
        "500 InternalError: a watch stream was requested by the client but the required storage feature "
        "RequestWatchProgress is disabled")
    registry = CollectorRegistry()
    registry.register(source.collector())
    assert 'kubeport_apiserver_watch_list{kind="Service"} 0.0' in generate_latest(registry).decode()
    print(f"\nready {ready:.3f}s after start on an etcd without progress notify")


@pytest.mark.parametrize("watch_list, compact", [(True, False), (False, False), (True, True), (False, True)],
                         ids=["watch_list", "paged", "watch_list_compacted", "paged_compacted"])
async def test_a_new_service_is_seen_within_2s_of_each_api_server_restart(node, watch_list, compact):
    """Two restarts in a row: after each, the watch from the held version gets 410 (a new
    watch cache), with compaction the list at it too; the relist is not backed off."""
    server = node.server(watch_list=watch_list)
    await server.start()
    seed(server)
    source, state = node(server)
    await synced(state, source, timeout=FOLLOW)
    stats = source.stats["Service"]
    followed = []
    for restart in range(2):
        await until(lambda: server.open_watches("services") == 1, "the watch before the restart", FOLLOW)
        failed = sum(stats.failures.values())
        await server.go_down()
        await until(lambda: sum(stats.failures.values()) > failed, "the node to see the outage", 5.0)
        await server.come_up(compact=compact)
        t0 = now()
        late = ServiceName("default", f"late-{restart}")
        server.apply(k8s.service(late.name, cluster_ip=f"10.96.0.{50 + restart}"))
        await snapshot_where(state, lambda s: late in s.services, f"{late} after restart {restart}", FOLLOW)
        followed.append(since(t0))
    assert stats.restart_reasons["expired"] >= 2                    # the 410 ERROR event, each time
    assert stats.watch_list is watch_list                            # a restart is no reason to give it up
    if compact and not watch_list:
        assert stats.failures["410"] >= 2                             # the list at the held version, too
    print(f"\nnew service seen {', '.join(f'{t:.3f}s' for t in followed)} after each restart "
          f"({'watch-list' if watch_list else 'paged list'}{', compacted' if compact else ''})")


async def test_started_before_the_api_server_synced_within_2s_of_it_coming_up(node):
    server = node.server()
    seed(server)
    source, state = node(server)                      # nothing listens yet
    await until(lambda: sum(source.stats["Service"].failures.values()) >= 5, "the node to fail a few times",
                     10.0)
    t0 = now()
    await server.start()
    await synced(state, source, timeout=FOLLOW)
    up = since(t0)
    stats = source.stats["Service"]
    assert stats.watch_list is True                   # a refused connection says nothing about the feature
    print(f"\nsynced {up:.3f}s after the API server came up ({sum(stats.failures.values())} failures before)")


async def test_graceful_stop_keeps_the_open_watches_then_the_node_follows_the_new_server__genericapiserver(node):
    """SIGTERM to the API server: its listener closes at once, its open watches go on (with
    events) until the shutdown timeout cuts them; the node follows the server that replaces it."""
    server = node.server()
    await server.start()
    seed(server)
    source, state = node(server)
    await synced(state, source, timeout=FOLLOW)
    await until(lambda: all(server.open_watches(p) == 1 for p in PLURALS), "the watches", FOLLOW)
    watches = source.stats["Service"].watches
    await server.graceful_stop(grace=1.5)
    during = ServiceName("default", "during-shutdown")
    server.apply(k8s.service(during.name, cluster_ip="10.96.0.60"))
    await snapshot_where(state, lambda s: during in s.services, "the change on the draining watch", FOLLOW)
    assert source.stats["Service"].watches == watches               # no new request was needed
    failed = sum(source.stats["Service"].failures.values())
    await until(lambda: server.open_watches("services") == 0, "the shutdown timeout to cut the watches", 5.0)
    await until(lambda: sum(source.stats["Service"].failures.values()) > failed, "a refused reconnect", 5.0)
    assert during in state.snapshot.services                        # the last state keeps serving
    await server.come_up()
    t0 = now()
    after = ServiceName("default", "after-restart")
    server.apply(k8s.service(after.name, cluster_ip="10.96.0.61"))
    await snapshot_where(state, lambda s: after in s.services, "a service on the new server", FOLLOW)
    print(f"\nnew service seen {since(t0):.3f}s after the replacing server came up")


async def test_the_fallback_is_kept_across_a_restart_and_dropped_after_an_upgrade__version(node):
    """The fallback to list + watch is remembered while the API server's /version stays the
    same; an upgraded server (here also on an etcd with progress notifications) gets the
    streaming list tried again, and served."""
    server = node.server(progress_notify=False, version="v1.32.0")
    await server.start()
    seed(server)
    source, state = node(server)
    await synced(state, source, timeout=FOLLOW)
    assert all(stats.watch_list is False for stats in source.stats.values())
    for compact in (False, True):                   # the same version: the fallback holds
        await until(lambda: server.open_watches("services") == 1, "the plain watch", FOLLOW)
        relists = source.stats["Service"].relists
        await server.go_down()
        await server.come_up(compact=compact)
        await until(lambda: source.stats["Service"].relists > relists, "the relist after the restart", 5.0)
        await until(lambda: server.open_watches("services") == 1, "the plain watch again", 5.0)
    assert all(streaming_lists(server, plural) == 1 for plural in PLURALS)
    await server.go_down()
    await server.come_up(version="v1.33.1", progress_notify=True)
    await until(lambda: all(stats.watch_list is True for stats in source.stats.values()),
                "the streaming list on the upgraded server", 5.0)
    assert source.status()["resources"]["Service"]["watchListFallback"] == ""
    late = ServiceName("default", "after-upgrade")
    server.apply(k8s.service(late.name, cluster_ip="10.96.0.62"))
    await snapshot_where(state, lambda s: late in s.services, "a service after the upgrade", FOLLOW)


async def test_a_7s_outage_then_a_compacting_restart_15s_later_is_followed_within_2s(node):
    """The sequence seen against a real API server: down for 7 s (the backoff grows), up for
    15 s, then stopped, its etcd compacted, and started again. The 410 relist after the
    second start must not wait on a backoff left over from the first outage."""
    server = node.server(watch_list=False)
    await server.start()
    seed(server)
    source, state = node(server)
    await synced(state, source, timeout=FOLLOW)
    await server.go_down()
    await asyncio.sleep(7.0)  # the outage's length is the scenario, not a wait for anything
    await server.come_up()
    await until(lambda: all(server.open_watches(p) == 1 for p in PLURALS), "the watches after the outage", 5.0)
    await asyncio.sleep(15.0)  # the server's uptime between the two restarts
    await server.go_down()
    server.compact()
    await server.come_up(compact=True)
    t0 = now()
    late = ServiceName("default", "after-compaction")
    server.apply(k8s.service(late.name, cluster_ip="10.96.0.63"))
    await snapshot_where(state, lambda s: late in s.services, "the service after the compacting restart", FOLLOW)
    print(f"\nnew service seen {since(t0):.3f}s after the compacting restart")

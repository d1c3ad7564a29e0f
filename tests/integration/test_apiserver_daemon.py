"""The daemon reading a kube-apiserver, end to end in network namespaces.

kubeport runs in a node's namespace with `--kubeconfig`, against the in-process fake API
server of tests/support/apiserver listening inside that namespace (https, bearer token). The node's pods
ask with real dig, curl and UDP; the daemon's own view comes from `kubeport get status -o
json`, /readyz and /metrics. Services have explicit clusterIPs (nothing is allocated with an
API server).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support.apiserver.tls import TlsFiles, make_tls
from support.netns import CommandFailed, KubeportDaemon, NoReply, Pod, Topology, udp_request, until_sync
from support.netns.apiserver import (
    NetnsApiServer,
    dig_answer,
    k8s,
    metric_samples,
    pod_slice,
    resource_stats,
    seed,
    start_daemon,
    status,
)
from support.netns.daemon import problems_of
from support.netns.operating import FirstAnswer
from support.netns.policies import curl_exit_code, pods_over, settle_curl_exit, settle_on

pytestmark = pytest.mark.integration

WEB_IP, API_IP = "10.96.0.20", "10.96.0.21"
WEB, API, DB = (f"{name}.default.svc.cluster.local" for name in ("web", "api", "db"))
# curl's exit code when nothing takes the connection: refused, or the VIP is not (yet) on the node.
CANNOT_CONNECT = 7


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TlsFiles:
    return make_tls(tmp_path_factory.mktemp("pki"))


@dataclass(frozen=True)
class Cluster:
    """An API server and a kubeport reading it, both in the namespace of node `letter`;
    web (10.96.0.20) starts on that node's two pods, and its pod 1 is the client."""

    api: NetnsApiServer
    daemon: KubeportDaemon
    topology: Topology
    letter: str

    @property
    def node(self) -> str:
        return self.daemon.ns

    @property
    def client(self) -> str:
        return self.topology.pod(self.letter, 1)

    @property
    def local_pods(self) -> set[str]:
        return {f"{self.letter}1", f"{self.letter}2"}

    def pods(self, *names: str) -> list[Pod]:
        return [pod for pod in self.topology.pods if pod.name in names]

    def set_web(self, *names: str) -> None:
        """web's TCP endpoints become these pods (MODIFIED); wait until only they answer."""
        self.api.apply(pod_slice("web-abc12", "web", self.pods(*names)))
        settle_on(self.client, WEB_IP, 80, set(names))


@contextlib.contextmanager
def serving(topology: Topology, tls: TlsFiles, directory: Path, letter: str,
            before_start: Callable[[NetnsApiServer], Any] = lambda api: None, **fake_options: Any,
            ) -> Iterator[Cluster]:
    """Start the API server in node `letter` (seeded; `before_start` may arrange faults), then
    kubeport against it (not waited for). Both stop when the block ends."""
    with NetnsApiServer(topology.node(letter), tls, **fake_options) as api:
        seed(api, topology, [topology.pod_info(letter, 1), topology.pod_info(letter, 2)])
        before_start(api)
        daemon = start_daemon(api, directory, "-v")  # -v: each applied change is logged
        try:
            yield Cluster(api, daemon, topology, letter)
        finally:
            daemon.stop()


@pytest.fixture(scope="module")
def cluster(topology, pods, tls, tmp_path_factory) -> Iterator[Cluster]:
    """Shared by the event tests, on node-a (the tests that need their own daemon use node-b:
    a second kubeport in a node's namespace would take the first one over)."""
    with serving(topology, tls, tmp_path_factory.mktemp("cluster"), "a") as running:
        running.daemon.wait_ready(timeout=30)
        yield running


def settle_dns(client: str, name: str, expected: tuple[str, list[str]]) -> None:
    """Wait until `dig name A` from `client` answers (rcode, sorted addresses) == expected."""
    until_sync(lambda: dig_answer(client, name) == expected, f"{name} A -> {expected}", 10)


def settled_status(node: str) -> dict:
    """`kubeport get status` once the proxy and DNS have both applied the latest snapshot."""
    def settled() -> dict | None:
        now = status(node)
        applied = (now["proxy"]["appliedGeneration"], now["dns"]["appliedGeneration"])
        return now if applied == (now["generation"], now["generation"]) else None

    return until_sync(settled, "proxy and DNS on the latest generation", 10)


def restarts_for(status_now: dict, kind: str, reason: str) -> int:
    return status_now["source"]["resources"][kind]["restartReasons"].get(reason, 0)


# --- initial sync -----------------------------------------------------------------------------


@pytest.mark.parametrize("watch_list", [False, True], ids=["paged_list", "watch_list__kep3157"])
def test_nothing_served_before_services_and_endpointslices_listed(
        topology, pods, tls, tmp_path, watch_list):
    """As kube-proxy's first sync waits for both informers (iptables/proxier.go OnEndpointSlicesSynced)."""
    # The first list of Services waits (with watch-list the list is the first watch).
    verb = "watch" if watch_list else "list"
    held: list[Callable[[], None]] = []
    with serving(topology, tls, tmp_path, "b", lambda api: held.append(api.hold("services", verb)),
                 watch_list=watch_list) as running:
        api, daemon, client = running.api, running.daemon, running.client
        until_sync(lambda: api.count("services", verb) and resource_stats(daemon.ns, "EndpointSlice")["synced"],
                   "Services held while EndpointSlices completed their first list", 20,
                   ignore=(CommandFailed, KeyError))

        ready = daemon.readyz()
        assert ready.status == 503 and "source: first list not complete" in ready.body
        assert status(daemon.ns)["synced"] is False
        assert dig_answer(client, WEB)[0] == "SERVFAIL"
        assert curl_exit_code(client, WEB_IP, 80) == CANNOT_CONNECT
        with pytest.raises((NoReply, ConnectionRefusedError)):  # (no VIP: "net unreachable" is soft for UDP)
            udp_request(client, WEB_IP, 90, "hi", timeout=1.0)

        held[0]()
        daemon.wait_ready()
        assert dig_answer(client, WEB) == ("NOERROR", [WEB_IP])
        assert set(pods_over(client, WEB_IP, 80, 10)) <= running.local_pods
        assert udp_request(client, WEB_IP, 90, "hi").split()[1] == b"hi"
        stats = status(daemon.ns)["source"]["resources"]
        assert stats["Service"]["watchList"] is watch_list and stats["Service"]["lists"] == 1


def test_ready_and_serving_on_an_etcd_without_progress_notify__cacher_RequestWatchProgress(
        topology, pods, tls, tmp_path):
    """etcd 3.4.23 under an API server with WatchList on: every streaming list gets the 500
    ERROR event; the daemon falls back to list + watch and is ready, DNS answers, the VIP
    forwards (client-go's reflector: "making progress is better than deadlocking")."""
    started = time.monotonic()
    with serving(topology, tls, tmp_path, "b", progress_notify=False) as running:
        daemon, client = running.daemon, running.client
        daemon.wait_ready(timeout=20)
        ready = time.monotonic() - started
        assert dig_answer(client, WEB) == ("NOERROR", [WEB_IP])
        assert set(pods_over(client, WEB_IP, 80, 4)) <= running.local_pods
        for kind, stats in status(daemon.ns)["source"]["resources"].items():
            assert stats["watchList"] is False, kind
            assert "RequestWatchProgress is disabled" in stats["watchListFallback"], kind
        print(f"\nready {ready:.2f}s after the daemon was started (process start included)")


@pytest.mark.parametrize("compact", [False, True], ids=["restart", "restart_compacted"])
def test_a_new_service_is_served_within_2s_of_each_api_server_restart(topology, pods, tls, tmp_path, compact):
    """Two API server restarts in a row: after each, the watch from the held version gets 410
    (a new watch cache; with compaction a list at it too); the daemon relists at once, so a
    Service created right after the server is back answers in DNS within 2 s."""
    with serving(topology, tls, tmp_path, "b") as running:
        api, daemon, client = running.api, running.daemon, running.client
        daemon.wait_ready(timeout=20)
        followed = []
        for restart in range(2):
            failed = sum(resource_stats(daemon.ns, "Service")["failures"].values())
            api.go_down()
            until_sync(lambda: sum(resource_stats(daemon.ns, "Service")["failures"].values()) > failed,
                       "the daemon to see the outage", 5)
            api.come_up(compact=compact)
            back = time.monotonic()
            name = f"late{restart}"
            api.apply(k8s.service(name, cluster_ip=f"10.96.0.{60 + restart}"))
            until_sync(lambda: dig_answer(client, f"{name}.default.svc.cluster.local")
                       == ("NOERROR", [f"10.96.0.{60 + restart}"]), f"{name} in DNS after restart {restart}", 2.0,
                       interval=0.05)
            followed.append(time.monotonic() - back)
        stats = resource_stats(daemon.ns, "Service")
        assert stats["restartReasons"].get("expired", 0) >= 2 and stats["watchList"] is True
        print(f"\nnew service in DNS {', '.join(f'{t:.2f}s' for t in followed)} after each restart"
              f"{' (compacted)' if compact else ''}")


# --- events ---------------------------------------------------------------------------------


def test_added_modified_deleted_reach_proxy_and_dns(cluster: Cluster):
    api, client = cluster.api, cluster.client
    # ADDED: a Service and its slice; a headless Service (DNS only).
    api.apply(k8s.service("api", cluster_ip=API_IP))
    api.apply(pod_slice("api-x7k2p", "api", cluster.pods("b1")))
    api.apply(k8s.service("db", cluster_ip="None"))
    api.apply(pod_slice("db-q9w8e", "db", cluster.pods("a2", "b2")))
    settle_on(client, API_IP, 80, {"b1"})
    settle_dns(client, API, ("NOERROR", [API_IP]))
    settle_dns(client, DB, ("NOERROR", ["10.244.1.12", "10.244.2.12"]))

    # MODIFIED: web's slice moves to node-b's pods, api's port moves, db loses a pod.
    cluster.set_web("b1", "b2")
    api.apply(k8s.service("api", cluster_ip=API_IP,
                          ports=[{"name": "http", "protocol": "TCP", "port": 81, "targetPort": 8080}]))
    settle_on(client, API_IP, 81, {"b1"})
    assert curl_exit_code(client, API_IP, 80) == CANNOT_CONNECT
    api.apply(pod_slice("db-q9w8e", "db", cluster.pods("b2")))
    settle_dns(client, DB, ("NOERROR", ["10.244.2.12"]))

    # DELETED: api disappears from the proxy and DNS; db loses its only slice.
    api.delete("EndpointSlice", "default", "api-x7k2p")
    api.delete("Service", "default", "api")
    api.delete("EndpointSlice", "default", "db-q9w8e")
    settle_curl_exit(client, API_IP, 81, CANNOT_CONNECT)
    settle_dns(client, API, ("NXDOMAIN", []))
    # A headless Service with no ready endpoint is NXDOMAIN (Kubernetes DNS spec 2.4.1).
    settle_dns(client, DB, ("NXDOMAIN", []))
    api.delete("Service", "default", "db")  # (leave the shared cluster as the other tests expect it)

    by_kind = status(cluster.node)["source"]["resources"]
    assert by_kind["Service"]["events"]["MODIFIED"] >= 1 and by_kind["Service"]["events"]["DELETED"] >= 1
    assert by_kind["EndpointSlice"]["events"]["MODIFIED"] >= 2 and by_kind["EndpointSlice"]["events"]["DELETED"] >= 2


def test_relist_after_410_changes_nothing__no_flap(cluster: Cluster):
    api, node = cluster.api, cluster.node
    cluster.set_web("a1", "a2")
    before = settled_status(node)
    log_mark = len(cluster.daemon.log_text())
    # The watches are cut; meanwhile etcd moves on and compacts: resuming gets "410 Gone".
    for plural in ("services", "endpointslices"):
        api.cut_watches(plural)
    api.apply(k8s.node("node-c", zone="zone-c"))  # not this node: moves the resourceVersion only
    api.compact()
    for plural in ("services", "endpointslices"):
        api.bookmark(plural)  # written half, then the connection is cut

    def relisted() -> bool:
        now = status(node)["source"]["resources"]
        return all(now[kind]["relists"] > before["source"]["resources"][kind]["relists"]
                   for kind in ("Service", "EndpointSlice"))

    until_sync(relisted, "Services and EndpointSlices relisted after 410", 20)
    after = status(node)
    assert after["generation"] == before["generation"]
    assert "applied generation" not in cluster.daemon.log_text()[log_mark:]
    for kind in ("Service", "EndpointSlice"):  # the resumed watch ended with the 410 ERROR event
        assert restarts_for(after, kind, "expired") > restarts_for(before, kind, "expired")
    assert set(pods_over(cluster.client, WEB_IP, 80, 10)) <= {"a1", "a2"}


def test_cut_watch_resumes_with_the_change_it_cut(cluster: Cluster):
    api, node = cluster.api, cluster.node
    cluster.set_web("a1")
    before = resource_stats(node, "EndpointSlice")
    api.cut_watches("endpointslices")
    api.apply(pod_slice("web-abc12", "web", cluster.pods("a2")))  # half of this event, then the cut
    settle_on(cluster.client, WEB_IP, 80, {"a2"})
    after = resource_stats(node, "EndpointSlice")
    assert after["restartReasons"].get("cut", 0) == before["restartReasons"].get("cut", 0) + 1
    # Replayed from the last resourceVersion seen: received once, not lost, not twice.
    assert after["events"]["MODIFIED"] == before["events"]["MODIFIED"] + 1
    cluster.set_web("a1", "b1")  # the resumed watch carries the next change too


#: services added then deleted in a burst; the RSS their freed heap gives back (measured: ~1.2 MiB)
CHANGES, FREED_KIB = 1000, 512


def rss_kib(pid: int) -> int:
    """The process's resident set (VmRSS of /proc/<pid>/status), KiB."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(line.split()[1] for line in lines if line.startswith("VmRSS:")))


def test_heap_freed_by_changes_goes_back_to_the_kernel_once_they_stop(cluster: Cluster):
    # kubeport/lib/heap.py: measured at 10,000 services, 200 changes left ~7 MiB free inside the heap.
    assert cluster.daemon.proc is not None
    pid = cluster.daemon.proc.pid  # `ip netns exec` execs the daemon: the same process
    settled_status(cluster.node)
    before = rss_kib(pid)
    names = [f"burst-{n}" for n in range(CHANGES)]
    for n, name in enumerate(names):  # a burst of services, each with a slice...
        cluster.api.apply(k8s.service(name, cluster_ip=f"10.97.{n // 250}.{n % 250 + 1}"))
        cluster.api.apply(k8s.endpoint_slice(f"{name}-x1", name, addresses=[f"10.244.9.{n % 250 + 1}"]))
    grown = settled_status(cluster.node)["services"]
    for name in names:  # ...and gone again: what the daemon built for them is freed
        cluster.api.delete("EndpointSlice", "default", f"{name}-x1")
        cluster.api.delete("Service", "default", name)
    assert settled_status(cluster.node)["services"] == grown - CHANGES
    right_after = rss_kib(pid)
    assert right_after > before + FREED_KIB  # the burst grew the heap
    # Once the changes stopped, what they freed goes back to the kernel: the RSS falls.
    until_sync(lambda: rss_kib(pid) <= right_after - FREED_KIB,
               f"kubeport's RSS down by {FREED_KIB} KiB from {right_after} KiB after the changes", 10)


# --- failures -------------------------------------------------------------------------------


def test_apiserver_gone_keeps_the_last_state_serving(topology, pods, tls, tmp_path):
    with serving(topology, tls, tmp_path, "b") as running:
        node, client = running.node, running.client
        running.daemon.wait_ready()
        running.api.stop()

        def restarts_seen() -> bool:
            stats = status(node)["source"]["resources"]
            return all(stats[kind]["watchRestarts"] >= 1 and stats[kind]["failures"]
                       for kind in ("Service", "EndpointSlice"))

        until_sync(restarts_seen, "watch restarts and failed reconnects in kubeport get status", 20)
        restarts = metric_samples(node, "kubeport_apiserver_watch_restarts_total")
        assert any('kind="EndpointSlice"' in labels and value >= 1 for labels, value in restarts.items()), restarts
        assert running.daemon.readyz().status == 200
        assert set(pods_over(client, WEB_IP, 80, 10)) <= running.local_pods
        assert dig_answer(client, WEB) == ("NOERROR", [WEB_IP])


FORBIDDEN_LINE = (
    'EndpointSlice: endpointslices.discovery.k8s.io is forbidden: User "system:serviceaccount:kube-system:kubeport" '
    'cannot {verb} resource "endpointslices" in API group "discovery.k8s.io" at the cluster scope; add the rule '
    '{{apiGroups: ["discovery.k8s.io"], resources: ["endpointslices"], verbs: ["get", "list", "watch"]}} '
    "to kubeport's ClusterRole (deploy/rbac.yaml)"
)


def _forbid_endpointslices(api: NetnsApiServer) -> None:
    for verb in ("list", "watch"):
        api.forbid("endpointslices", verb)


def test_forbidden_endpointslices_names_the_missing_rule__rbac(topology, pods, tls, tmp_path):
    with serving(topology, tls, tmp_path, "b", _forbid_endpointslices) as running:
        api, daemon = running.api, running.daemon
        # The first request is the streaming list: a watch.
        expected = FORBIDDEN_LINE.format(verb="watch")

        until_sync(lambda: expected in problems_of(daemon.ns),
                   "the RBAC problem among the daemon's problems", 20, ignore=(ValueError, CommandFailed))
        ready = daemon.readyz()
        assert ready.status == 503 and "source: first list not complete" in ready.body
        assert status(daemon.ns)["source"]["problems"] >= 1

        for verb in ("list", "watch"):
            api.permit("endpointslices", verb)
        daemon.wait_ready()
        assert problems_of(daemon.ns) == []


# --- a crash: the last applied state ---------------------------------------------------------

EXTRA, EXTRA_IP = "extra.default.svc.cluster.local", "10.96.0.40"


def test_a_killed_daemon_restarted_serves_its_last_state_while_the_api_server_is_down(topology, pods, tls, tmp_path):
    with serving(topology, tls, tmp_path, "b") as running:
        api, daemon, client = running.api, running.daemon, running.client
        daemon.wait_ready(timeout=30)
        api.apply(k8s.service("extra", cluster_ip=EXTRA_IP))
        until_sync(lambda: dig_answer(client, EXTRA) == ("NOERROR", [EXTRA_IP]), "extra in DNS", 10)
        generation = status(daemon.ns)["generation"]
        until_sync(lambda: (s := status(daemon.ns)["lastState"])["keptAt"] and status(daemon.ns)["generation"]
                   == generation and s, "the last applied state kept", 10)
        daemon.proc.kill()
        daemon.proc.wait(10)
        api.go_down()
        api.delete("Service", "default", "extra")   # the source changes while nobody watches
        probe = FirstAnswer.start(client, f"--dns={WEB}@10.96.0.10", f"--tcp={WEB_IP}:80")
        started = time.monotonic()
        daemon.start()
        first = probe.times()
        assert first["dns"] is not None and first["tcp"] is not None, first
        answered, forwarded = first["dns"] - started, first["tcp"] - started
        assert dig_answer(client, WEB) == ("NOERROR", [WEB_IP])
        assert set(pods_over(client, WEB_IP, 80, 4)) <= running.local_pods | {"b1", "b2"}
        readyz = daemon.readyz()
        assert readyz.status == 503 and "serving the last applied state from" in readyz.body
        assert status(daemon.ns)["lastState"]["servingIt"] is True
        api.come_up()
        daemon.wait_ready(timeout=10)
        # The source's first view replaces the kept one: extra was deleted meanwhile.
        until_sync(lambda: dig_answer(client, EXTRA)[0] == "NXDOMAIN", "extra gone after the sync", 10)
        assert dig_answer(client, WEB) == ("NOERROR", [WEB_IP])  # what the sync kept, still answered
        served = status(daemon.ns)
        assert served["lastState"]["servingIt"] is False
        assert served["zone"] == topology.node_spec("b").zone  # the Node, listed again, kept
        print(f"\nafter a restart with the API server down: DNS answered {answered:.2f}s, "
              f"connections forwarded {forwarded:.2f}s after the start")

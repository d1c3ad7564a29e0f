"""A daemon killed with SIGKILL under load (`--hold-sockets`): its supervisor holds the
listening sockets and starts it again at once, so connections and queries that arrive in
between wait in the kernel's queues and are served by the new process, which serves the last
applied state before its source has synced. And a whole container killed (its PID 1, the
supervisor, in a PID namespace of its own as a container runtime makes it) and started again
as the kubelet would: the `kubeport fd-store` sidecar kept the sockets meanwhile. Driven in
network namespaces with a client loop and dig from a pod."""

from __future__ import annotations

import json
import os
import signal

import pytest

from support.netns import (
    CommandFailed,
    KubeportDaemon,
    curl_in,
    dig_in,
    http_url,
    kubeport,
    parse_pod_reply,
    spawn_in,
    stop_process,
    until_sync,
)
from support.netns.apiserver import status
from support.netns.daemon import kubeport_bin, problems_of
from support.netns.manifests import DAEMON_ARGS
from support.netns.operating import ECHO_IP, WEB_IP, ClientLoop, manifests  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration

DNS_IP = "10.96.0.10"


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def the_daemon(supervisor: int) -> int | None:
    found = children(supervisor)
    return found[0] if len(found) == 1 else None


def test_a_killed_daemon_refuses_no_connection_and_loses_no_query(topology, pods, manifests, tmp_path):
    daemon = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS, "--hold-sockets")
    daemon.wait_ready()
    # A connection waits in the held listener's queue until the new daemon accepts it: under
    # a loaded machine that start may take longer than a client's usual 2 s, which is slow, not refused.
    client = ClientLoop.start(topology.pod("a", 1), tmp_path / "client.json", "--tcp", f"{WEB_IP}:80",
                              "--udp", f"{ECHO_IP}:9090", "--tcp-timeout", "10")
    # Queries on their own, every 5 ms: not behind a connection the restart holds up.
    resolver = ClientLoop.start(topology.pod("a", 2), tmp_path / "dns.json",
                                "--dns", f"web.demo.svc.cluster.local@{DNS_IP}")
    client.wait_for("the client loop running", tcp_ok=30, udp_ok=30)
    resolver.wait_for("the DNS loop running", dns_ok=30)
    first = until_sync(lambda: the_daemon(daemon.proc.pid), "the supervised daemon", 5)
    key = "web.demo.svc.cluster.local"
    assert dig_in(topology.pod("a", 2), "+short", key, server=DNS_IP).split() == [WEB_IP]
    before = client.progress()
    os.kill(first, signal.SIGKILL)
    # Sent while no daemon runs: the query waits in the held socket for the next one.
    answer = dig_in(topology.pod("a", 2), "+short", key, server=DNS_IP, timeout=5).split()
    second = until_sync(lambda: (pid := the_daemon(daemon.proc.pid)) not in (None, first) and pid,
                        "the daemon started again", 10)
    client.wait_for("connections through the new daemon", tcp_ok=before["tcp_ok"] + 100)
    resolver.wait_for("queries through the new daemon", dns_ok=resolver.count("dns_ok") + 50)
    counts, queries = client.stop(), resolver.stop()
    assert answer == [WEB_IP]
    # Refused: none. The one connection or datagram the killed process was relaying may end
    # with it (established connections and UDP flows outlive the daemon only in relay workers:
    # test_worker_adoption): the client loop has one request in flight at a time.
    tcp_errors = [e for e in counts["errors"] if e.startswith("tcp:")]
    assert not [e for e in tcp_errors if "Refused" in e or "timed out" in e], counts["errors"]
    assert counts["tcp_fail"] + counts["udp_lost"] - before.get("udp_lost", 0) <= 1, counts["errors"]
    assert queries["dns_lost"] == 0, queries["errors"]       # each answered within DNS_TIMEOUT (3 s)
    assert daemon.running and second != first
    assert "was killed by SIGKILL; starting it again" in daemon.log_text()
    # The flows crossed the restart with the client's address kept: the endpoints see pod a1.
    assert status(topology.node("a"))["proxy"]["clientAddress"].startswith("client")

    def seen_on_node_b() -> str | None:  # node-a's own pods may see the node (hairpin; a user namespace)
        name, client = parse_pod_reply(curl_in(topology.pod("a", 1), http_url(WEB_IP, 80, "/")))
        return client if name.startswith("b") else None

    assert until_sync(seen_on_node_b, "an endpoint on node-b", 10) == topology.pod_info("a", 1).ip(4)
    # SIGTERM to the supervisor stops the daemon as without it.
    assert daemon.stop() == 0
    print(f"\nacross the kill: {counts['tcp_ok'] - before['tcp_ok']} connections, none refused "
          f"({counts['tcp_fail']} cut in flight); "
          f"UDP lost {counts['udp_lost'] - before.get('udp_lost', 0)} of {counts['udp_ok'] - before['udp_ok']}; "
          f"{queries['dns_ok']} DNS queries answered, the longest after {queries['dns_longest_ms']} ms")


def test_a_restart_without_its_manifests_serves_the_kept_state_until_they_come(topology, pods, manifests, tmp_path):
    """The directory of a volume not mounted yet when the daemon is restarted: without a kept
    state that ends the start (`--manifests ...: not a directory`); with one, the kept state is
    what worked, so it is served and the source is tried again until the directory is there."""
    daemon = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS)
    daemon.wait_ready()
    until_sync(lambda: status(daemon.ns)["lastState"]["keptAt"], "the last applied state kept", 10)
    daemon.proc.kill()
    daemon.proc.wait(10)
    unmounted = manifests.with_name("not-mounted-yet")
    manifests.rename(unmounted)
    daemon.start()
    key = "web.demo.svc.cluster.local"
    until_sync(lambda: dig_in(topology.pod("a", 2), "+short", key, server=DNS_IP).split() == [WEB_IP],
               "DNS from the kept state", 10, ignore=(CommandFailed,))  # refused until DNS listens
    missing = until_sync(lambda: next((p for p in problems_of(daemon.ns) if "not a directory" in p), None),
                         "the missing directory among the problems", 10)
    assert str(manifests) in missing
    readyz = daemon.readyz()
    assert readyz.status == 503 and "serving the last applied state from" in readyz.body
    assert daemon.running
    unmounted.rename(manifests)
    daemon.wait_ready(timeout=20)
    assert "serving the last applied state meanwhile, trying again" in daemon.log_text()
    assert dig_in(topology.pod("a", 2), "+short", key, server=DNS_IP).split() == [WEB_IP]


#: a container's processes as a runtime starts them: a PID namespace of their own, whose first
#: process ends them all when it dies (pid_namespaces(7)), and a /proc that shows it
CONTAINER = ("unshare", "--pid", "--fork", "--mount", "--mount-proc")


def test_a_killed_container_started_again_refuses_nothing_with_the_fd_store_sidecar(
        topology, pods, manifests, tmp_path):
    node = topology.node("a")
    store = tmp_path / "fd-store"
    with open(tmp_path / "fd-store.log", "wb") as log:
        sidecar = spawn_in(node, *CONTAINER, kubeport_bin(), "fd-store", str(store), stdout=log, stderr=log)
    until_sync(lambda: (store / "fetch").exists(), "the fd store listening", 10)
    daemon = KubeportDaemon(node, manifests, tmp_path / "state", *DAEMON_ARGS, "--hold-sockets",
                            "--fd-store", str(store), program=(*CONTAINER, kubeport_bin()))
    daemon.wait_ready()
    client = ClientLoop.start(topology.pod("a", 1), tmp_path / "client.json", "--tcp", f"{WEB_IP}:80",
                              "--tcp-timeout", "10")
    resolver = ClientLoop.start(topology.pod("a", 2), tmp_path / "dns.json",
                                "--dns", f"web.demo.svc.cluster.local@{DNS_IP}")
    client.wait_for("the client loop running", tcp_ok=30)
    resolver.wait_for("the DNS loop running", dns_ok=30)
    first = until_sync(lambda: the_daemon(daemon.proc.pid), "the container's first process", 5)
    os.kill(first, signal.SIGKILL)  # the supervisor: every process of the container ends with it
    daemon.proc.wait(10)
    # The kubelet starts the container again, at once after a first crash (its restart backoff,
    # 10 s doubling to 5 min, applies to the ones after: the pod lifecycle's restart policy).
    daemon.start()
    until_sync(lambda: "from the fd store in" in daemon.log_text(), "the new supervisor took the stored sockets", 20)
    client.wait_for("connections through the new container", tcp_ok=client.count("tcp_ok") + 100)
    resolver.wait_for("queries through the new container", dns_ok=resolver.count("dns_ok") + 50)
    counts, queries = client.stop(), resolver.stop()
    tcp_errors = [e for e in counts["errors"] if e.startswith("tcp:")]
    assert not [e for e in tcp_errors if "Refused" in e or "timed out" in e], counts["errors"]
    assert counts["tcp_fail"] <= 1, counts["errors"]  # the one the killed container was relaying
    assert queries["dns_lost"] == 0, queries["errors"]
    held = json.loads(kubeport(node, "get", "status", "-o", "json"))["socketHold"]
    assert held["store"] == f"the fd store in {store}" and held["adopted"] == held["heldAtStart"] >= 3, held
    assert daemon.stop() == 0
    assert stop_process(sidecar, 5) == 0
    print(f"\nacross the container's restart: {counts['tcp_ok']} connections, none refused "
          f"({counts['tcp_fail']} cut in flight); {queries['dns_ok']} queries answered, the longest after "
          f"{queries['dns_longest_ms']} ms")

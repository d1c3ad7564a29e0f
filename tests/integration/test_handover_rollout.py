"""Handover during a DaemonSet rollout and the restarts around it: the new pod starts beside the
old one, is ready (its own file) only once it holds the node, and whatever stops or dies when,
the node keeps its addresses, rules, DNS and flows with the instance that serves it."""

from __future__ import annotations

import json
import signal

import pytest

from kubeport.status import STATUS_SOCKET

from support.netns import KubeportDaemon, curl_in, dig_in, http_url, kubeport, spawn_in, until_sync
from support.netns.manifests import DAEMON_ARGS
from support.netns.operating import (  # noqa: F401  (manifests: a fixture)
    ECHO_IP,
    WEB_IP,
    ClientLoop,
    manifests,
    scrape,
    total,
    unreachable_kubeconfig,
    vip_present,
)

pytestmark = pytest.mark.integration


def test_pod_handover_waits_for_its_sigterm_and_leaves_the_node_to_the_new_pod(topology, pods, manifests, tmp_path):
    """A DaemonSet rollout with maxSurge: the new pod starts beside the old one, is ready (its own
    file) only once it holds the node; the old one must not exit (the kubelet would restart it),
    and the SIGTERM deleting it neither cuts its drain nor removes what the new one holds."""
    state = tmp_path / "state"
    old_ready, new_ready = tmp_path / "old-pod" / "ready", tmp_path / "new-pod" / "ready"
    old_ready.parent.mkdir()
    new_ready.parent.mkdir()
    old = KubeportDaemon(topology.node("a"), manifests, state, *DAEMON_ARGS, "--shutdown-grace-period", "20s",
                         "--after-handover", "wait", "--ready-file", str(old_ready))
    old.wait_ready()
    until_sync(old_ready.exists, "the old pod's readiness file", 5)
    client = ClientLoop.start(topology.pod("a", 1), tmp_path / "client.json", "--tcp", f"{WEB_IP}:80",
                              "--udp", f"{ECHO_IP}:9090")
    client.wait_for("client running", tcp_ok=30, udp_ok=30)
    slow = spawn_in(topology.pod("a", 2), "curl", "-s", "--max-time", "30", http_url(WEB_IP, 80, "/sleep/6"),
                    stdout=__import__("subprocess").PIPE, text=True)
    until_sync(lambda: total(scrape(topology.node("a")), "kubeport_proxy_connections_active") >= 1,
               "the slow request is relayed by the old pod", 5)
    new = KubeportDaemon(topology.node("a"), manifests, state, *DAEMON_ARGS,
                         "--healthz-bind-address", "0.0.0.0:10356", "--metrics-bind-address", "127.0.0.1:10349",
                         "--after-handover", "wait", "--ready-file", str(new_ready), log_path=tmp_path / "new.log")
    until_sync(new_ready.exists, "the new pod ready", 30)
    assert "now serves node" in new.log_text(), "ready only once it holds the node"
    assert not old_ready.exists(), "the old pod is no longer ready"
    old.proc.send_signal(signal.SIGTERM)  # what deleting the old pod does, once the new one is ready
    out, _ = slow.communicate(timeout=30)
    assert slow.returncode == 0 and out.startswith("pod="), "the pod's SIGTERM did not cut the drain short"
    assert old.proc.wait(timeout=30) == 0, old.log_tail()
    assert "waiting for SIGTERM" in old.log_text() or "exiting" in old.log_text()
    client.wait_for("client keeps working after the old pod left", tcp_ok=client.count("tcp_ok") + 50)
    assert vip_present(topology, WEB_IP), "the old pod's exit left the new pod's service address"
    counts = client.stop()
    assert counts["tcp_fail"] == 0 and counts["udp_lost"] == 0, counts
    assert new.stop() == 0
    assert not new_ready.exists() and not vip_present(topology, WEB_IP)


def test_old_pod_after_handover_stays_until_its_sigterm(topology, manifests, tmp_path):
    state = tmp_path / "state"
    old = KubeportDaemon(topology.node("a"), manifests, state, *DAEMON_ARGS, "--after-handover", "wait")
    old.wait_ready()
    new = KubeportDaemon(topology.node("a"), manifests, state, *DAEMON_ARGS,
                         "--healthz-bind-address", "0.0.0.0:10356", "--metrics-bind-address", "127.0.0.1:10349",
                         log_path=tmp_path / "new.log")
    new.wait_ready()  # its /readyz (a port of its own here) is 200 only once it holds the node
    assert "now serves node" in new.log_text()
    until_sync(lambda: "waiting for SIGTERM" in old.log_text(), "the old instance idles", 15)
    assert old.proc.poll() is None, "a pod's process that exits is restarted and takes the node back"
    assert dig_in(topology.pod("a", 1), "+short", "web.demo.svc.cluster.local", server="10.96.0.10").split() == [WEB_IP]
    old.proc.send_signal(signal.SIGTERM)
    assert old.proc.wait(timeout=10) == 0
    assert vip_present(topology, WEB_IP)
    assert new.stop() == 0


def test_each_pod_vouches_for_its_own_liveness_a_hung_one_stops(topology, manifests, tmp_path):
    """/livez on the shared port may be answered by the other pod during a rollout; each pod's
    live file is renewed by its own process only: the handed-over one waiting for its SIGTERM
    still renews it, a stopped (hung) one does not, and the probe then fails for it alone."""
    old_live, new_live = tmp_path / "old-pod" / "live", tmp_path / "new-pod" / "live"
    old_live.parent.mkdir()
    new_live.parent.mkdir()
    state = tmp_path / "state"
    old = KubeportDaemon(topology.node("a"), manifests, state, *DAEMON_ARGS, "--after-handover", "wait",
                         "--live-file", str(old_live))
    old.wait_ready()
    new = KubeportDaemon(topology.node("a"), manifests, state, *DAEMON_ARGS, *NEW_PORTS,
                         "--after-handover", "wait", "--live-file", str(new_live), log_path=tmp_path / "new.log")
    new.wait_ready()
    until_sync(lambda: "waiting for SIGTERM" in old.log_text(), "the old instance idles", 15)

    def vouched(path) -> int:
        try:
            return int(path.read_text())
        except (OSError, ValueError):
            return 0

    first = vouched(old_live)
    until_sync(lambda: vouched(old_live) > first, "the idle handed-over pod still renews its file", 15)
    old.proc.send_signal(signal.SIGSTOP)
    try:
        hung = vouched(old_live)
        until_sync(lambda: vouched(new_live) > hung + 1, "the live pod renews past the hung one", 15)
        assert vouched(old_live) == hung, "a stopped process renewed its liveness"
    finally:
        old.proc.send_signal(signal.SIGCONT)
    old.proc.send_signal(signal.SIGTERM)
    assert old.proc.wait(timeout=15) == 0, old.log_tail()
    assert not old_live.exists()
    assert new.stop() == 0
    assert not new_live.exists()


NEW_PORTS = ("--healthz-bind-address", "0.0.0.0:10356", "--metrics-bind-address", "127.0.0.1:10349")


def cluster_name_answers(topology, count: int) -> list[list[str]]:
    return [dig_in(topology.pod("a", 1), "+short", "web.demo.svc.cluster.local", server="10.96.0.10").split()
            for _ in range(count)]


def test_old_pod_stopped_before_the_new_one_is_ready_leaves_it_the_node(topology, manifests, tmp_path):
    """An old pod deleted while the new one starts (by hand, a rollout undone): until the old
    one's lame duck ends, it alone answers DNS (the new one, unsynced, does not listen); then
    the new one takes the node at once, and keeps the addresses the old one must not remove."""
    old = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS, "--dns-lame-duck", "3s")
    old.wait_ready()
    new = KubeportDaemon(topology.node("a"), None, tmp_path / "new-state", *DAEMON_ARGS, *NEW_PORTS,
                         kubeconfig=unreachable_kubeconfig(tmp_path), log_path=tmp_path / "new.log")
    until_sync(lambda: "a new instance is starting" in old.log_text(), "the new instance announced", 15)
    until_sync(lambda: "kubeport started" in new.log_text(), "the new instance started", 15)
    # With both sockets bound, the kernel would send about half the queries to the unsynced one.
    assert cluster_name_answers(topology, 12) == [[WEB_IP]] * 12
    old.proc.send_signal(signal.SIGTERM)
    assert cluster_name_answers(topology, 4) == [[WEB_IP]] * 4, "the old instance's lame duck"
    until_sync(lambda: "now serves node" in new.log_text(), "the new instance took the node", 10)
    reply = dig_in(topology.pod("a", 1), "web.demo.svc.cluster.local", server="10.96.0.10")
    assert "status: SERVFAIL" in reply, reply  # answering, unsynced: not silence
    assert old.proc.wait(timeout=20) == 0
    assert vip_present(topology, WEB_IP), "kept for the instance that serves the node"
    assert "leaving it the addresses and rules" in old.log_text()
    assert "Traceback" not in old.log_text() + new.log_text()
    assert new.stop() == 0


def test_instance_started_while_the_old_one_stops_is_its_successor(topology, pods, manifests, tmp_path):
    """The old instance holds the node's name until its DNS has stopped: one started meanwhile
    is its successor, takes the node over, and keeps the addresses the old one then leaves."""
    old = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS, "--dns-lame-duck", "6s")
    old.wait_ready()
    old.proc.send_signal(signal.SIGTERM)
    until_sync(lambda: "stopping" in old.log_text(), "the old instance stopping", 5)
    new = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS, *NEW_PORTS,
                         log_path=tmp_path / "new.log")
    new.wait_ready()  # its own /readyz: 200 once it holds the node
    assert old.proc.wait(timeout=20) == 0
    assert vip_present(topology, WEB_IP), "the old instance removed the address the new one serves"
    assert curl_in(topology.pod("a", 1), http_url(WEB_IP, 80, "/")).startswith("pod=")
    assert new.stop() == 0
    assert not vip_present(topology, WEB_IP)


def test_udp_flows_drain_on_the_old_instance_beside_an_unsynced_successor(topology, pods, manifests, tmp_path):
    """Leaving the addresses to a successor is not a handover: the old instance keeps serving
    its UDP flows through the drain (the successor, unsynced, has no sockets for them)."""
    old = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS,
                         "--shutdown-grace-period", "20s")
    old.wait_ready()
    KubeportDaemon(topology.node("a"), None, tmp_path / "new-state", *DAEMON_ARGS, *NEW_PORTS,
                   kubeconfig=unreachable_kubeconfig(tmp_path), log_path=tmp_path / "new.log")
    until_sync(lambda: "a new instance is starting" in old.log_text(), "the new instance announced", 15)
    client = ClientLoop.start(topology.pod("a", 1), tmp_path / "client.json", "--udp", f"{ECHO_IP}:9090")
    client.wait_for("the UDP flow running", udp_ok=20)
    old.proc.send_signal(signal.SIGTERM)
    until_sync(lambda: "a new instance serves this node" in old.log_text() or "stopped" in old.log_text()
               or "now serves node" in (tmp_path / "new.log").read_text(), "the new instance took the node", 15)
    client.wait_for("the flow still answered during the drain", udp_ok=client.count("udp_ok") + 20)
    counts = client.stop()
    assert counts["udp_lost"] == 0, counts


def test_an_old_pods_restarted_container_does_not_take_the_node_back(topology, manifests, tmp_path):
    """The old pod's container restarts (crash, OOM) while the new pod holds the node: with a
    lower --handover-generation it serves beside it, never asks it to leave, and takes the
    node only if the new one goes."""
    new = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS,
                         "--handover-generation", "2")
    new.wait_ready()
    restarted = KubeportDaemon(topology.node("a"), manifests, tmp_path / "old-state", *DAEMON_ARGS, *NEW_PORTS,
                               "--handover-generation", "1", log_path=tmp_path / "restarted.log")
    until_sync(lambda: "of a later generation" in restarted.log_text(), "the restarted one refused", 15)
    until_sync(lambda: "proxy: first snapshot applied" in restarted.log_text(), "it synced", 15)
    readyz = restarted.readyz()
    assert readyz.status == 503 and "still serves this node" in readyz.body, readyz
    status = json.loads(kubeport(topology.node("a"), "get", "status", "-o", "json",
                                 "--socket", restarted.state_dir / STATUS_SOCKET))  # the restarted one's
    assert status["handover"] == {"generation": 1, "holdsNode": False, "predecessor": True, "refused": True,
                                  "successors": 0, "squatter": None}
    assert "taking over" not in new.log_text()
    assert new.stop() == 0  # the new pod goes after all (its rollout undone): the old one takes the node
    until_sync(lambda: "now serves node" in restarted.log_text(), "the restarted one took the node", 10)
    assert vip_present(topology, WEB_IP)
    restarted.wait_ready()
    assert restarted.stop() == 0


def test_a_handed_over_pod_exits_when_nothing_serves_the_node_any_more(topology, manifests, tmp_path):
    """Waiting for its SIGTERM after a handover, the old pod's process sees the instance that
    took over vanish (killed): it exits non-zero, so the kubelet restarts it and it serves."""
    old = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS, "--after-handover", "wait")
    old.wait_ready()
    new = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS, *NEW_PORTS,
                         log_path=tmp_path / "new.log")
    new.wait_ready()
    until_sync(lambda: "waiting for SIGTERM" in old.log_text(), "the old instance idles", 15)
    new.proc.kill()
    assert old.proc.wait(timeout=15) != 0
    assert "none serves it" in old.log_text()

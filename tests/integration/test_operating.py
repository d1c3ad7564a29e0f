"""Operating kubeport (issue #8): SIGTERM drain, seamless restart, SIGHUP, metrics after real traffic."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
from netns import (
    KubeportDaemon,
    curl_in,
    dig_in,
    http_url,
    run_in,
    spawn_in,
    udp_request,
    wait_until,
)
from test_proxy_support import DAEMON_ARGS, endpoint_slice, node, service, write

pytestmark = pytest.mark.integration

WEB_IP = "10.96.0.50"
ECHO_IP = "10.96.0.51"
WEB_EXTERNAL_IP = "192.168.60.50"  # taken by port (proxy/capture.py): the handover must keep it too
CLIENT_LOOP = Path(__file__).resolve().parent / "client_loop.py"


@pytest.fixture
def manifests(topology, tmp_path) -> Path:
    directory = tmp_path / "manifests"
    directory.mkdir()
    pods = [topology.pod_info(n, i) for n in "ab" for i in (1, 2)]
    http = [{"name": "http", "port": 8080}]
    udp = [{"name": "echo", "protocol": "UDP", "port": 9090}]
    write(directory, "node", node(topology, "a"))
    write(directory, "web", service("web", [WEB_IP], [{"name": "http", "port": 80, "targetPort": 8080}],
                                    externalIPs=[WEB_EXTERNAL_IP]),
          endpoint_slice("web-1", "web", http, pods))
    write(directory, "echo",
          service("echo", [ECHO_IP], [{"name": "echo", "protocol": "UDP", "port": 9090}]),
          endpoint_slice("echo-1", "echo", udp, pods))
    return directory


def vip_present(topology, ip: str) -> bool:
    out = run_in(topology.node("a"), "ip", "-o", "addr", "show", "dev", "lo").stdout
    return f" {ip}/" in out


def scrape(ns: str, address: str = "127.0.0.1:10249") -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = curl_in(ns, f"http://{address}/metrics")
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}"] = values.get(f"{sample.name}{{{labels}}}", 0) + sample.value
    return values


def total(values: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in values.items() if k.startswith(prefix))


def test_sigterm_drains_an_open_stream_then_removes_addresses(topology, pods, manifests, tmp_path):
    daemon = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS,
                            "--shutdown-grace-period", "20s")
    daemon.wait_ready()
    client = topology.pod("a", 1)
    slow = spawn_in(client, "curl", "-s", "--max-time", "15", http_url(WEB_IP, 80, "/sleep/3"),
                    stdout=__import__("subprocess").PIPE, text=True)
    wait_until(lambda: total(scrape(topology.node("a")), "kubeport_proxy_connections_active") >= 1, 5,
               message="the slow request is being relayed")
    daemon.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: daemon.readyz().status in (503, 0), 5, message="readiness off after SIGTERM")
    out, _ = slow.communicate(timeout=15)
    assert slow.returncode == 0 and out.startswith("pod="), out
    assert daemon.proc.wait(timeout=15) == 0
    assert "shutdown" in daemon.log_text() or "stopped" in daemon.log_text()
    assert not vip_present(topology, WEB_IP)


def test_restart_hands_over_with_zero_failures(topology, pods, manifests, tmp_path):
    state = tmp_path / "state"
    # A grace period above zero: with 0 s the old instance would reset requests in flight.
    old = KubeportDaemon(topology.node("a"), manifests, state, *DAEMON_ARGS, "--shutdown-grace-period", "5s")
    old.wait_ready()
    status, external_status = tmp_path / "client.json", tmp_path / "client-external.json"
    client = spawn_in(topology.pod("a", 1), sys.executable, str(CLIENT_LOOP), "--tcp", f"{WEB_IP}:80",
                      "--udp", f"{ECHO_IP}:9090", "--status", str(status),
                      stdout=__import__("subprocess").PIPE, text=True)
    external = spawn_in(topology.pod("a", 2), sys.executable, str(CLIENT_LOOP), "--tcp", f"{WEB_EXTERNAL_IP}:80",
                        "--status", str(external_status), stdout=__import__("subprocess").PIPE, text=True)

    def progress(path: Path = status) -> dict:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return {"tcp_ok": 0, "udp_ok": 0}

    wait_until(lambda: progress()["tcp_ok"] >= 30 and progress()["udp_ok"] >= 30, 20, message="client running")
    wait_until(lambda: progress(external_status)["tcp_ok"] >= 30, 20, message="externalIP client running")
    new = KubeportDaemon(topology.node("a"), manifests, state, *DAEMON_ARGS,
                         "--healthz-bind-address", "0.0.0.0:10356", "--metrics-bind-address", "127.0.0.1:10349",
                         log_path=tmp_path / "new.log")
    new.wait_ready()
    assert old.proc.wait(timeout=30) == 0, old.log_tail()
    assert "handing over" in old.log_text()
    after, after_external = progress()["tcp_ok"], progress(external_status)["tcp_ok"]
    wait_until(lambda: progress()["tcp_ok"] >= after + 50, 20, message="client keeps working after the handover")
    wait_until(lambda: progress(external_status)["tcp_ok"] >= after_external + 50, 20,
               message="externalIP client keeps working after the handover")
    assert vip_present(topology, WEB_IP), "the new instance kept the service address"
    client.send_signal(signal.SIGTERM)
    out, _ = client.communicate(timeout=10)
    counts = json.loads(out.strip().splitlines()[-1])
    assert counts["tcp_fail"] == 0 and counts["udp_lost"] == 0, counts
    assert counts["tcp_ok"] > 80 and counts["udp_ok"] > 80, counts
    external.send_signal(signal.SIGTERM)
    out, _ = external.communicate(timeout=10)
    counts = json.loads(out.strip().splitlines()[-1])
    assert counts["tcp_fail"] == 0 and counts["tcp_ok"] > 80, counts
    assert new.stop() == 0
    assert not vip_present(topology, WEB_IP), "the last instance removes the addresses"


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
    wait_until(old_ready.exists, 5, message="the old pod's readiness file")
    status = tmp_path / "client.json"
    client = spawn_in(topology.pod("a", 1), sys.executable, str(CLIENT_LOOP), "--tcp", f"{WEB_IP}:80",
                      "--udp", f"{ECHO_IP}:9090", "--status", str(status),
                      stdout=__import__("subprocess").PIPE, text=True)

    def progress() -> dict:
        try:
            return json.loads(status.read_text())
        except (OSError, ValueError):
            return {"tcp_ok": 0, "udp_ok": 0}

    wait_until(lambda: progress()["tcp_ok"] >= 30 and progress()["udp_ok"] >= 30, 20, message="client running")
    slow = spawn_in(topology.pod("a", 2), "curl", "-s", "--max-time", "30", http_url(WEB_IP, 80, "/sleep/6"),
                    stdout=__import__("subprocess").PIPE, text=True)
    wait_until(lambda: total(scrape(topology.node("a")), "kubeport_proxy_connections_active") >= 1, 5,
               message="the slow request is relayed by the old pod")
    new = KubeportDaemon(topology.node("a"), manifests, state, *DAEMON_ARGS,
                         "--healthz-bind-address", "0.0.0.0:10356", "--metrics-bind-address", "127.0.0.1:10349",
                         "--after-handover", "wait", "--ready-file", str(new_ready), log_path=tmp_path / "new.log")
    wait_until(new_ready.exists, 30, message="the new pod ready")
    assert "now serves node" in new.log_text(), "ready only once it holds the node"
    assert not old_ready.exists(), "the old pod is no longer ready"
    old.proc.send_signal(signal.SIGTERM)  # what deleting the old pod does, once the new one is ready
    out, _ = slow.communicate(timeout=30)
    assert slow.returncode == 0 and out.startswith("pod="), "the pod's SIGTERM did not cut the drain short"
    assert old.proc.wait(timeout=30) == 0, old.log_tail()
    assert "waiting for SIGTERM" in old.log_text() or "exiting" in old.log_text()
    after = progress()["tcp_ok"]
    wait_until(lambda: progress()["tcp_ok"] >= after + 50, 20, message="client keeps working after the old pod left")
    assert vip_present(topology, WEB_IP), "the old pod's exit left the new pod's service address"
    client.send_signal(signal.SIGTERM)
    out, _ = client.communicate(timeout=10)
    counts = json.loads(out.strip().splitlines()[-1])
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
    wait_until(lambda: "waiting for SIGTERM" in old.log_text(), 15, message="the old instance idles")
    assert old.proc.poll() is None, "a pod's process that exits is restarted and takes the node back"
    assert dig_in(topology.pod("a", 1), "+short", "web.demo.svc.cluster.local", server="10.96.0.10").split() == [WEB_IP]
    old.proc.send_signal(signal.SIGTERM)
    assert old.proc.wait(timeout=10) == 0
    assert vip_present(topology, WEB_IP)
    assert new.stop() == 0


def test_old_pod_stopped_before_the_new_one_is_ready_leaves_it_the_node(topology, manifests, tmp_path):
    """An old pod deleted by hand mid-rollout: the new pod, starting beside it, has adopted the
    service addresses, so the old one must not remove them (the new one would not add them back)."""
    old = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS)
    old.wait_ready()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(  # nothing listens there: the new instance never syncs
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n")
    new = KubeportDaemon(topology.node("a"), None, tmp_path / "new-state", *DAEMON_ARGS,
                         "--healthz-bind-address", "0.0.0.0:10356", "--metrics-bind-address", "127.0.0.1:10349",
                         kubeconfig=kubeconfig, log_path=tmp_path / "new.log")
    wait_until(lambda: "a new instance is starting" in old.log_text(), 15, message="the new instance announced")
    wait_until(lambda: "kubeport started" in new.log_text(), 15, message="the new instance started")
    # Not synced, the new instance does not listen for DNS yet: every query reaches the old one
    # (with both sockets bound, the kernel would send about half of them to an unsynced server).
    answers = [dig_in(topology.pod("a", 1), "+short", "web.demo.svc.cluster.local", server="10.96.0.10").split()
               for _ in range(16)]
    assert answers == [[WEB_IP]] * 16, answers
    assert old.stop() == 0
    assert "leaving the service addresses and rules to it" in old.log_text()
    assert "Traceback" not in old.log_text()
    assert vip_present(topology, WEB_IP), "kept for the instance that is coming"
    assert new.proc.poll() is None, new.log_tail()
    # Its predecessor gone, the new instance holds the node before its sync: DNS answers
    # (external names forwarded; cluster names SERVFAIL until synced), nothing is refused.
    wait_until(lambda: "now serves node" in new.log_text(), 10, message="the new instance took the node")
    reply = dig_in(topology.pod("a", 1), "web.demo.svc.cluster.local", server="10.96.0.10")
    assert "status: SERVFAIL" in reply, reply
    new.stop()


def test_instance_started_during_the_old_ones_drain_keeps_the_node(topology, pods, manifests, tmp_path):
    """The old instance releases the node's name when it starts stopping; one started during its
    lame duck or drain claims it and adopts the addresses, which the old one must then leave."""
    old = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS, "--dns-lame-duck", "6s")
    old.wait_ready()
    old.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "stopping" in old.log_text(), 5, message="the old instance stopping")
    new = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS,
                         "--healthz-bind-address", "0.0.0.0:10356", "--metrics-bind-address", "127.0.0.1:10349",
                         log_path=tmp_path / "new.log")
    new.wait_ready()
    assert old.proc.poll() is None, "the lame duck was long enough for this test"
    assert old.proc.wait(timeout=20) == 0
    assert vip_present(topology, WEB_IP), "the old instance removed the address the new one serves"
    assert curl_in(topology.pod("a", 1), http_url(WEB_IP, 80, "/")).startswith("pod=")
    assert "a new instance started during the drain" in old.log_text()
    assert new.stop() == 0
    assert not vip_present(topology, WEB_IP)


def test_sighup_changes_the_dns_ttl_live(topology, manifests, tmp_path):
    config_file = tmp_path / "kubeport.yaml"

    def write_config(ttl: int) -> None:
        scratch = tmp_path / "kubeport.yaml.tmp"
        scratch.write_text(f"apiVersion: kubeport.io/v1alpha1\nkind: KubeportConfiguration\ndns:\n  ttl: {ttl}\n")
        scratch.rename(config_file)

    write_config(5)
    daemon = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS,
                            "--upstream", "192.168.50.200", "--config", str(config_file))
    daemon.wait_ready()

    def ttl() -> int:
        answer = dig_in(topology.pod("a", 1), "+noall", "+answer", "web.demo.svc.cluster.local", "A",
                        server="10.96.0.10")
        return int(answer.split()[1])

    assert ttl() == 5
    write_config(30)
    daemon.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: ttl() == 30, 5, message="TTL 30 after SIGHUP")
    write_config("lots")  # a broken file: the running configuration stays
    daemon.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "keeping the running configuration" in daemon.log_text(), 5, message="bad reload logged")
    assert ttl() == 30


def test_metrics_count_the_traffic_sent(topology, pods, manifests, tmp_path):
    daemon = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS,
                            "--upstream", "192.168.50.200")
    daemon.wait_ready()
    ns, client = topology.node("a"), topology.pod("a", 1)
    before = scrape(ns)
    for _ in range(10):
        curl_in(client, http_url(WEB_IP, 80))
    for i in range(4):
        udp_request(client, ECHO_IP, 9090, f"m{i}")
    for _ in range(7):
        dig_in(client, "+short", "web.demo.svc.cluster.local", server="10.96.0.10")
    after = scrape(ns)

    def delta(prefix: str) -> float:
        return total(after, prefix) - total(before, prefix)

    assert delta("kubeport_proxy_connections_total{service_port=demo/web:http/TCP}") == 10
    assert delta("kubeport_proxy_udp_flows_total{service_port=demo/echo:echo/UDP}") == 4
    assert delta("kubeport_proxy_bytes_total{direction=to_client,service_port=demo/web:http/TCP}") > 0
    assert delta("coredns_dns_requests_total") == 7
    assert delta("coredns_dns_responses_total{plugin=,rcode=NOERROR") == 7
    assert after["kubeproxy_sync_proxy_rules_last_timestamp_seconds{}"] > 0
    assert total(after, "kubeproxy_sync_proxy_rules_duration_seconds_count") >= 1

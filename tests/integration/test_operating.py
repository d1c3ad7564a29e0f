"""Operating kubeport: SIGTERM drain, seamless restart, SIGHUP, metrics after real traffic."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from support.netns import KubeportDaemon, curl_in, dig_in, http_url, run_in, spawn_in, udp_request, until_sync
from support.netns.daemon import problems_of
from support.netns.manifests import DAEMON_ARGS, endpoint_slice, node, service, write
from support.netns.operating import (  # noqa: F401  (manifests: a fixture)
    CLIENT_LOOP,
    ECHO_IP,
    WEB_EXTERNAL_IP,
    WEB_IP,
    manifests,
    scrape,
    total,
    vip_present,
)

pytestmark = pytest.mark.integration


def test_sigterm_drains_an_open_stream_then_removes_addresses(topology, pods, manifests, tmp_path):
    daemon = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS,
                            "--shutdown-grace-period", "20s")
    daemon.wait_ready()
    client = topology.pod("a", 1)
    slow = spawn_in(client, "curl", "-s", "--max-time", "15", http_url(WEB_IP, 80, "/sleep/3"),
                    stdout=__import__("subprocess").PIPE, text=True)
    until_sync(lambda: total(scrape(topology.node("a")), "kubeport_proxy_connections_active") >= 1,
               "the slow request is being relayed", 5)
    daemon.proc.send_signal(signal.SIGTERM)
    until_sync(lambda: daemon.readyz().status in (503, 0), "readiness off after SIGTERM", 5)
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

    until_sync(lambda: progress()["tcp_ok"] >= 30 and progress()["udp_ok"] >= 30, "client running", 20)
    until_sync(lambda: progress(external_status)["tcp_ok"] >= 30, "externalIP client running", 20)
    new = KubeportDaemon(topology.node("a"), manifests, state, *DAEMON_ARGS,
                         "--healthz-bind-address", "0.0.0.0:10356", "--metrics-bind-address", "127.0.0.1:10349",
                         log_path=tmp_path / "new.log")
    new.wait_ready()
    assert old.proc.wait(timeout=30) == 0, old.log_tail()
    assert "handing over" in old.log_text()
    after, after_external = progress()["tcp_ok"], progress(external_status)["tcp_ok"]
    until_sync(lambda: progress()["tcp_ok"] >= after + 50, "client keeps working after the handover", 20)
    until_sync(lambda: progress(external_status)["tcp_ok"] >= after_external + 50,
               "externalIP client keeps working after the handover", 20)
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


def test_what_is_removed_behind_its_back_comes_back__full_sync(topology, pods, manifests, tmp_path):
    """kube-proxy rewrites its rules in full at least hourly; kubeport too, and at once on SIGHUP:
    a VIP deleted from the link and the nftables table deleted by hand are restored."""
    daemon = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS)
    daemon.wait_ready()
    node_ns = topology.node("a")
    run_in(node_ns, "ip", "route", "del", "local", f"{WEB_IP}/32", "dev", "lo", "table", "local")
    run_in(node_ns, "nft", "delete", "table", "inet", "kubeport")
    assert not vip_present(topology, WEB_IP)
    daemon.proc.send_signal(signal.SIGHUP)
    until_sync(lambda: vip_present(topology, WEB_IP), "the VIP added back", 10)
    until_sync(lambda: "table inet kubeport" in run_in(node_ns, "nft", "list", "tables").stdout,
               "the nftables table written again", 10)
    assert curl_in(topology.pod("a", 1), http_url(WEB_IP, 80, "/")).startswith("pod=")
    assert "added back" in daemon.log_text()
    assert daemon.stop() == 0


def test_sighup_to_every_process_leaves_the_relay_workers_running(topology, pods, manifests, tmp_path):
    """`systemctl kill -s HUP` (or pkill) signals every process of the unit: a worker must not die."""
    daemon = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS, "--workers", "2")
    daemon.wait_ready()
    children = Path(f"/proc/{daemon.proc.pid}/task/{daemon.proc.pid}/children").read_text().split()
    assert children, "a relay worker process"
    for pid in [daemon.proc.pid, *map(int, children)]:
        os.kill(int(pid), signal.SIGHUP)
    until_sync(lambda: "added back" in daemon.log_text() or daemon.readyz().status == 200, "after HUP", 5)
    assert daemon.proc.poll() is None, daemon.log_tail()
    for _ in range(8):  # both processes serve
        assert curl_in(topology.pod("a", 1), http_url(WEB_IP, 80, "/")).startswith("pod=")
    assert "exited" not in daemon.log_text()
    assert daemon.stop() == 0


#: Run in the node's namespace: add the address, then connect to each port until it accepts;
#: prints the seconds from the address being added to each port accepting.
_ADD_AND_CONNECT = """
import socket, subprocess, sys, time, json
ip, ports = sys.argv[1], [int(p) for p in sys.argv[2:]]
subprocess.run(["ip", "addr", "add", ip + "/24", "dev", "late0"], check=True)
added, took = time.monotonic(), {}
while len(took) < len(ports) and time.monotonic() - added < 10:
    for port in ports:
        if port in took:
            continue
        try:
            socket.create_connection((ip, port), timeout=0.2).close()
            took[port] = time.monotonic() - added
        except OSError:
            pass
print(json.dumps(took))
"""


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_node_ip_that_appears_after_start_gets_its_node_ports_at_once(topology, pods, tmp_path, workers,
                                                                        request):
    """The node's IP comes up late (DHCP at boot): kube-proxy reads the node's addresses at every
    sync, so NodePorts and the health-check node port open on it; kubeport follows the address
    events (RTM_NEWADDR), and opens them within 100 ms."""
    late_ip, node_ns = "10.77.0.5", topology.node("a")
    directory = tmp_path / "manifests"
    directory.mkdir()
    late_node = node(topology, "a")
    late_node["status"]["addresses"] = [{"type": "InternalIP", "address": late_ip}]
    http = [{"name": "http", "port": 8080}]
    write(directory, "node", late_node)
    write(directory, "lb", service("lb", ["10.96.0.60"], [{"name": "http", "port": 80, "targetPort": 8080,
                                                          "nodePort": 30191}],
                                   type="LoadBalancer", externalTrafficPolicy="Local", healthCheckNodePort=30190),
          endpoint_slice("lb-1", "lb", http, [topology.pod_info("a", 1)]))
    daemon = KubeportDaemon(node_ns, directory, tmp_path / "state", *DAEMON_ARGS, "--nodeport-addresses", "primary",
                            "--workers", workers)
    daemon.wait_ready()

    def listening() -> set[str]:
        return {line.split()[3] for line in run_in(node_ns, "ss", "-ltnH").stdout.splitlines()}

    assert not {f"{late_ip}:30191", f"{late_ip}:30190"} & listening()
    until_sync(lambda: [p for p in problems_of(daemon.ns) if late_ip in p], "the nodePortAddresses problem", 10)
    run_in(node_ns, "ip", "link", "add", "late0", "type", "veth", "peer", "name", "late0p")
    request.addfinalizer(lambda: run_in(node_ns, "ip", "link", "del", "late0", check=False))
    run_in(node_ns, "ip", "link", "set", "late0", "up")
    took = json.loads(run_in(node_ns, sys.executable, "-c", _ADD_AND_CONNECT, late_ip, "30191", "30190").stdout)
    assert set(took) == {"30191", "30190"}, f"the NodePort and health-check port on the late IP: {took}"
    print("seconds from the address added to the port accepting:", took)
    assert max(took.values()) < 0.1, took
    until_sync(lambda: not [p for p in problems_of(daemon.ns) if late_ip in p], "the nodePortAddresses problem cleared",
               10)

    run_in(node_ns, "ip", "addr", "del", f"{late_ip}/24", "dev", "late0")  # RTM_DELADDR
    until_sync(lambda: not {f"{late_ip}:30191", f"{late_ip}:30190"} & listening(),
               "the ports on the address that went away closed", 5)
    assert daemon.stop() == 0


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
    assert until_sync(lambda: ttl() == 30, "TTL 30 after SIGHUP", 5)
    write_config("lots")  # a broken file: the running configuration stays
    daemon.proc.send_signal(signal.SIGHUP)
    until_sync(lambda: "keeping the running configuration" in daemon.log_text(), "bad reload logged", 5)
    assert ttl() == 30


def test_metrics_count_the_traffic_sent(topology, pods, manifests, tmp_path):
    daemon = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS,
                            "--upstream", "192.168.50.200")
    daemon.wait_ready()
    ns, client = topology.node("a"), topology.pod("a", 1)
    before = scrape(ns)
    for _ in range(10):
        curl_in(client, http_url(WEB_IP, 80))
    for i in range(4):  # a flow per client address and port: four ports, never one reused by chance
        udp_request(client, ECHO_IP, 9090, f"m{i}", source_port=41000 + i)
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
    assert total(after, "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=IPv4}") > 0
    assert total(after, "kubeproxy_sync_proxy_rules_duration_seconds_count") >= 1

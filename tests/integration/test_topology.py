"""The netns test topology and the pod workload work as netns-scripts/README.md promises."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.netns import (
    POD_ECHO_PORT,
    POD_HTTP_PORT,
    POD_UDP_PORT,
    TOPOLOGY_SH,
    CommandFailed,
    DaemonExited,
    KubeportDaemon,
    NoReply,
    Topology,
    curl_in,
    current_scope,
    http_url,
    namespaces_with_prefix,
    parse_pod_reply,
    pattern_bytes,
    pattern_sha256,
    probe_address,
    process_scope,
    python_in,
    require_netns,
    run_in,
    spawn_in,
    start_podserver,
    topology_script,
    udp_request,
    unique_prefix,
    until_sync,
)

pytestmark = pytest.mark.integration


# --- reachability inside one topology -----------------------------------------------------------


@pytest.mark.parametrize("family", [4, 6], ids=["ipv4", "ipv6"])
@pytest.mark.parametrize(("src", "dst"), [(("a", 1), ("b", 1)), (("b", 2), ("a", 1)), (("a", 1), ("a", 2))],
                         ids=["pod_to_pod__other_node", "pod_to_pod__back", "pod_to_pod__same_node"])
def test_pod_reaches_pod_and_sees_its_address(topology, pods, src, dst, family):
    client, server = topology.pod_info(*src), topology.pod_info(*dst)
    reply = curl_in(client.ns, http_url(server.ip(family), POD_HTTP_PORT))
    assert parse_pod_reply(reply) == (server.name, client.ip(family))


@pytest.mark.parametrize("family", [4, 6], ids=["ipv4", "ipv6"])
def test_client_reaches_node_lan_ip(topology, family):
    start_podserver(topology.node("a"), "node-a", "--http", "18080", "--udp", "19090")
    reply = curl_in(topology.client, http_url(topology.node_ip("a", family), 18080))
    assert parse_pod_reply(reply) == ("node-a", ("192.168.50.100", "fd00:50::100")[family == 6])


_POD_A1, _POD_B2 = (lambda t: t.pod("a", 1)), (lambda t: t.pod("b", 2))
_NODE_A, _NODE_B, _CLIENT = (lambda t: t.node("a")), (lambda t: t.node("b")), (lambda t: t.client)


@pytest.mark.parametrize(("where", "destination", "gateway"), [
    (_POD_A1, "10.96.0.10", "10.244.1.1"),
    (_POD_A1, "fd00:10:96::a", "fd00:10:244:1::1"),
    (_POD_B2, "10.111.22.33", "10.244.2.1"),
    (_POD_B2, "fd00:10:96::ffff", "fd00:10:244:2::1"),
    (_NODE_A, "10.244.2.12", "192.168.50.12"),
    (_NODE_A, "fd00:10:244:2::12", "fd00:50::12"),
    (_NODE_B, "10.244.1.11", "192.168.50.11"),
    (_NODE_B, "fd00:10:244:1::11", "fd00:50::11"),
    (_CLIENT, "192.168.60.7", "192.168.50.11"),
    (_CLIENT, "192.168.70.7", "192.168.50.11"),
    (_CLIENT, "fd00:60::7", "fd00:50::11"),
    (_CLIENT, "fd00:70::7", "fd00:50::11"),
], ids=[
    "pod_a__service_range_v4_via_own_node", "pod_a__service_range_v6_via_own_node",
    "pod_b__service_range_v4_via_own_node", "pod_b__service_range_v6_via_own_node",
    "node_a__pods_of_b_v4", "node_a__pods_of_b_v6", "node_b__pods_of_a_v4", "node_b__pods_of_a_v6",
    "client__external_ips_v4_via_node_a", "client__lb_ips_v4_via_node_a",
    "client__external_ips_v6_via_node_a", "client__lb_ips_v6_via_node_a",
])
def test_routes(topology, where, destination, gateway):
    route = json.loads(run_in(None, "ip", "-n", where(topology), "-j", "route", "get", destination).stdout)
    assert route[0]["gateway"] == gateway


def test_client_is_outside_the_cluster(topology, pods):
    with pytest.raises(CommandFailed) as failure:
        curl_in(topology.client, http_url(topology.pod_ip("a", 1), POD_HTTP_PORT), timeout=2)
    assert failure.value.returncode == 7  # no route to the pod network


# --- the pod workload ---------------------------------------------------------------------------


@pytest.mark.parametrize("family", [4, 6], ids=["ipv4", "ipv6"])
def test_udp_echo_prefixes_pod_name(topology, pods, family):
    assert udp_request(topology.pod("a", 1), topology.pod_ip("b", 2, family), POD_UDP_PORT, b"ping") == b"b2 ping"


def test_udp_to_closed_port_is_refused_and_silence_is_noreply(topology, pods):
    with pytest.raises(ConnectionRefusedError):
        udp_request(topology.pod("a", 1), topology.pod_ip("b", 1), 9999, b"x")
    # No route on node-a: its ICMP net-unreachable is a soft error a UDP socket doesn't report.
    with pytest.raises(NoReply):
        udp_request(topology.client, "192.168.60.7", 9999, b"x", timeout=0.3)


@pytest.mark.parametrize(("length", "seed"), [(0, 0), (1, 5), (251 * 4096 + 17, 0), (3_000_001, 250)],
                         ids=["empty", "one_byte_seeded", "block_boundary", "several_blocks_seeded"])
def test_bytes_stream_is_the_documented_pattern(topology, pods, length, seed):
    url = http_url(topology.pod_ip("b", 1), POD_HTTP_PORT, f"/bytes/{length}?seed={seed}")
    body = run_in(topology.pod("a", 1), "curl", "-sS", "--noproxy", "*", url, text=False).stdout
    assert body == pattern_bytes(length, seed)
    assert hashlib.sha256(body).hexdigest() == pattern_sha256(length, seed)


def test_http_keep_alive_reuses_one_connection(topology, pods):
    url = http_url(topology.pod_ip("b", 1), POD_HTTP_PORT)
    done = run_in(topology.pod("a", 1), "curl", "-sS", "-v", "--noproxy", "*", url, url + "sleep/0.1")
    first, second = done.stdout.splitlines()
    assert "Re-using existing connection" in done.stderr
    assert first.split()[1] == second.split()[1]  # the same client port
    assert second.endswith("slept=0.1")


def test_sleep_answers_after_the_delay(topology, pods):
    started = time.monotonic()
    reply = curl_in(topology.pod("a", 1), http_url(topology.pod_ip("a", 2), POD_HTTP_PORT, "/sleep/0.3"))
    assert time.monotonic() - started >= 0.3
    assert reply.startswith("pod=a2 ") and reply.rstrip().endswith("slept=0.3")


_HALF_CLOSE_CLIENT = """
import socket, sys
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
payload = bytes(range(256)) * 4096
sock.sendall(payload)
sock.shutdown(socket.SHUT_WR)
echoed = bytearray()
while chunk := sock.recv(65536):
    echoed += chunk
print(len(echoed), echoed == payload)
"""


@pytest.mark.parametrize("family", [4, 6], ids=["ipv4", "ipv6"])
def test_tcp_echo_returns_everything_then_half_closes(topology, pods, family):
    done = python_in(topology.pod("a", 1), _HALF_CLOSE_CLIENT, topology.pod_ip("b", 2, family), POD_ECHO_PORT)
    assert done.stdout.split() == [str(256 * 4096), "True"]


# --- the kubeport daemon harness, driven with a stand-in until the real daemon exists ----------

_STAND_IN = """
import http.server, signal, sys
print("stand-in", *sys.argv[1:], flush=True)
if "--fail" in sys.argv:
    sys.exit("stand-in: --fail given")
class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/readyz" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
def terminate(*_):
    print("stand-in: SIGTERM", flush=True)
    sys.exit(0)
flag = "--healthz-bind-address"
port = int(sys.argv[sys.argv.index(flag) + 1].rpartition(":")[2]) if flag in sys.argv else 10256
server = http.server.HTTPServer(("127.0.0.1", port), Ready)
signal.signal(signal.SIGTERM, terminate)
server.serve_forever()
"""


@pytest.mark.parametrize("extra", [(), ("--healthz-bind-address", "0.0.0.0:10300")], ids=["default", "own_port"])
def test_daemon_start_ready_stop_restart(topology, tmp_path, extra):
    daemon = KubeportDaemon(topology.node("b"), tmp_path / "m", tmp_path / "state", *extra,
                            program=[sys.executable, "-I", "-c", _STAND_IN])
    daemon.wait_ready(10)
    assert "--manifests " + str(tmp_path / "m") + " --hostname-override node-b --state-dir" in daemon.log_text()
    assert daemon.stop() == 0 and "stand-in: SIGTERM" in daemon.log_text()
    assert daemon.readyz().status == 0
    daemon.restart()
    daemon.wait_ready(10)
    assert daemon.log_text().count("stand-in run") == 2


def test_daemon_exiting_before_ready_fails_fast_with_its_log(topology, tmp_path):
    daemon = KubeportDaemon(topology.node("a"), tmp_path / "m", tmp_path / "state", "--fail",
                            program=[sys.executable, "-I", "-c", _STAND_IN])
    started = time.monotonic()
    with pytest.raises(DaemonExited, match="--fail given"):
        daemon.wait_ready(20)
    assert time.monotonic() - started < 10


def test_process_scopes_nest_and_kill_only_their_own():
    outer_proc = spawn_in(None, "sleep", "600")  # owned by this test's scope (the autouse fixture)
    with process_scope():
        with process_scope():
            pass  # an empty inner scope must not take an equal-looking empty outer one with it
        inner_proc = spawn_in(None, "sleep", "600")
    assert inner_proc.returncode == -signal.SIGTERM
    assert outer_proc.poll() is None
    assert current_scope()[-1].proc is outer_proc


@pytest.mark.parametrize(("args", "address"), [
    ((), "127.0.0.1:10256"),
    (("--healthz-bind-address", "0.0.0.0:10300"), "127.0.0.1:10300"),
    (("--healthz-bind-address=[::]:10301",), "[::1]:10301"),
    (("--healthz-bind-address", "192.168.50.11:10256"), "192.168.50.11:10256"),
], ids=["default", "any_v4", "any_v6", "specific"])
def test_readyz_probe_address_follows_the_bind_flag(args, address):
    assert probe_address(args) == address


# --- lifecycle: up, down, coexistence, crashes --------------------------------------------------


@pytest.fixture
def fresh_prefix():
    """A prefix for a topology the test builds itself; removed even if the test fails."""
    require_netns()
    prefix = unique_prefix()
    yield prefix
    topology_script("down", "--prefix", prefix)


def test_up_is_fast_complete_and_idempotent(fresh_prefix):
    started = time.monotonic()
    topo = Topology.up(fresh_prefix)
    elapsed = time.monotonic() - started
    Topology.up(fresh_prefix)  # `up` starts with `down`: a second run rebuilds the same thing
    assert namespaces_with_prefix(fresh_prefix) == sorted(topo.namespaces)
    assert elapsed < 2.0, f"up took {elapsed:.2f}s"
    status = topology_script("status", "--prefix", fresh_prefix).stdout
    assert "10.244.1.11/24" in status and "fd00:10:244:2::12/64" in status


def test_new_addresses_are_usable_at_once__no_dad(fresh_prefix):
    topo = Topology.up(fresh_prefix)
    for ns in topo.namespaces:
        assert run_in(None, "ip", "-n", ns, "-6", "addr", "show", "tentative").stdout == "", ns
    start_podserver(topo.pod("b", 1), "b1")
    url = http_url(topo.pod_ip("b", 1, 6), POD_HTTP_PORT)
    # A tentative link-local address on the path once cost the first SYN (1 s retransmit timer).
    seconds = float(curl_in(topo.pod("a", 1), url, "-o", "/dev/null", "-w", "%{time_connect}"))
    assert seconds < 0.5


def _process_gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_down_kills_every_process_and_removes_every_namespace(fresh_prefix):
    topo = Topology.up(fresh_prefix)
    # Not spawn_in: the script alone must find and kill these, including an orphaned daemon.
    direct = subprocess.Popen(["ip", "netns", "exec", topo.pod("a", 1), "sleep", "600"])
    run_in(topo.node("b"), "sh", "-c", "sleep 600 >/dev/null 2>&1 &")
    orphan_pids = until_sync(lambda: run_in(None, "ip", "netns", "pids", topo.node("b")).stdout.split(),
                             "the orphaned sleep in node-b", 5)
    topology_script("down", "--prefix", fresh_prefix)
    assert direct.wait(5) == -signal.SIGKILL
    assert all(_process_gone(int(pid)) for pid in orphan_pids)
    assert namespaces_with_prefix(fresh_prefix) == []
    assert topology_script("down", "--prefix", fresh_prefix).returncode == 0  # nothing left: still fine
    status = run_in(None, TOPOLOGY_SH, "status", "--prefix", fresh_prefix, check=False)
    assert (status.returncode, status.stdout.strip()) == (1, f"prefix '{fresh_prefix}': down")


def test_two_prefixes_coexist_with_the_same_addresses(topology, pods, fresh_prefix):
    other = Topology.up(fresh_prefix)
    start_podserver(other.pod("b", 1), "other-b1")
    url = http_url(topology.pod_ip("b", 1), POD_HTTP_PORT)
    assert parse_pod_reply(curl_in(other.pod("a", 1), url))[0] == "other-b1"
    assert parse_pod_reply(curl_in(topology.pod("a", 1), url))[0] == "b1"
    other.down()
    assert parse_pod_reply(curl_in(topology.pod("a", 1), url))[0] == "b1"
    assert namespaces_with_prefix(topology.prefix) == sorted(topology.namespaces)


def _half_build_by_hand(prefix: str) -> None:
    batch = (f"netns add {prefix}-lan\nnetns add {prefix}-node-a\nnetns add {prefix}-a7\n"
             f"link add eth0 netns {prefix}-a7 type veth peer name veth-a7 netns {prefix}-node-a\n")
    run_in(None, "ip", "-batch", "-", input=batch)
    run_in(f"{prefix}-a7", "sh", "-c", "sleep 600 >/dev/null 2>&1 &")


def _kill_up_midway(prefix: str) -> None:
    up = subprocess.Popen([TOPOLOGY_SH, "up", "--prefix", prefix, "--pods-per-node", "40"],
                          start_new_session=True, stderr=subprocess.DEVNULL)
    try:
        until_sync(lambda: namespaces_with_prefix(prefix), f"{prefix}-* namespaces", 10, interval=0.005)
    finally:
        os.killpg(up.pid, signal.SIGKILL)
        up.wait()


@pytest.mark.parametrize("crash", [_half_build_by_hand, _kill_up_midway],
                         ids=["half_built_by_hand_with_a_process", "up_killed_midway"])
def test_down_cleans_up_after_a_crash(fresh_prefix, crash):
    crash(fresh_prefix)
    assert namespaces_with_prefix(fresh_prefix)
    topology_script("down", "--prefix", fresh_prefix)
    assert namespaces_with_prefix(fresh_prefix) == []


@pytest.mark.parametrize("args", [
    ["--prefix", ""], ["--prefix", "-kp"], ["--prefix", "kp-"], ["--prefix", "k p"], ["--prefix", "kp;true"],
    ["--prefix", "x" * 25], ["--pods-per-node", "0"], ["--pods-per-node", "100"], ["--pods-per-node", "two"],
    ["--bogus"],
], ids=["empty_prefix", "leading_dash", "trailing_dash", "space", "shell_metachar", "too_long",
        "zero_pods", "too_many_pods", "non_numeric_pods", "unknown_flag"])
def test_bad_arguments_are_rejected_with_a_clear_message(args):
    require_netns()
    done = run_in(None, TOPOLOGY_SH, "up", *args, check=False)
    assert done.returncode != 0
    assert "topology.sh: error:" in done.stderr

"""ClusterIP services through the real daemon, one per node, in the two-node netns topology.

Pods on node-a and node-b use curl and a UDP client against the VIPs; changes are made by
editing the manifest directory both daemons watch.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from support.netns import (
    EXT_IPS,
    CommandFailed,
    curl_in,
    http_url,
    pattern_sha256,
    pod_answering,
    pods_seen,
    python_in,
    run_in,
    spawn_in,
    start_podserver,
    udp_request,
    until_sync,
    wait_for_output,
)
from support.netns.manifests import endpoint_slice, node, remove, service, start_daemon, write

pytestmark = pytest.mark.integration

WEB_V4, WEB_V6, EMPTY, NAMED, ECHO, FLAKY, OTHER = (
    "10.96.0.20", "fd00:10:96::20", "10.96.0.21", "10.96.0.22", "10.96.0.23", "10.96.0.24", "10.96.0.25",
)
HTTP = {"name": "http", "protocol": "TCP", "port": 8080}
UDP = {"name": "udp", "protocol": "UDP", "port": 9090}
WEB_PORTS = [
    {"name": "http", "protocol": "TCP", "port": 80, "targetPort": "http"},
    {"name": "udp", "protocol": "UDP", "port": 90, "targetPort": 9090},
]
ALL_PODS = {"a1", "a2", "b1", "b2"}


@pytest.fixture(scope="module")
def cluster(topology, pods, tmp_path_factory):
    manifests = tmp_path_factory.mktemp("manifests")
    state = tmp_path_factory.mktemp("state")
    everyone = topology.pods
    write(manifests, "nodes", node(topology, "a"), node(topology, "b"))
    write(manifests, "web",
          service("web", [WEB_V4, WEB_V6], WEB_PORTS),
          endpoint_slice("web-v4", "web", [HTTP, UDP], everyone),
          endpoint_slice("web-v6", "web", [HTTP, UDP], everyone, family=6))
    write(manifests, "empty", service("empty", [EMPTY], [{"name": "http", "port": 80, "targetPort": 8080}]))
    daemons = [start_daemon(topology, "a", manifests, state), start_daemon(topology, "b", manifests, state)]
    yield manifests
    for daemon in daemons:
        daemon.stop()


def test_pods_on_both_nodes_reach_every_ready_endpoint_by_curl(topology, cluster):
    for client in (topology.pod("a", 1), topology.pod("b", 1)):
        assert pods_seen(client, WEB_V4, 80, ALL_PODS) == ALL_PODS


def test_pods_on_both_nodes_reach_every_endpoint_by_udp(topology, cluster):
    for client in (topology.pod("a", 2), topology.pod("b", 2)):
        seen = set()
        for source_port in range(40000, 40060):  # a new source port is a new flow: a new choice
            seen.add(udp_request(client, WEB_V4, 90, "hi", source_port=source_port).split()[0].decode())
            if seen == ALL_PODS:
                break
        assert seen == ALL_PODS


def test_ipv6_cluster_ip_reaches_ipv6_endpoints(topology, cluster):
    reply = curl_in(topology.pod("a", 1), http_url(WEB_V6, 80))
    assert "client=fd00:" in reply  # the endpoint was reached over IPv6 (from a pod or node-a)
    assert udp_request(topology.pod("b", 1), WEB_V6, 90, "six").split()[0].decode() in ALL_PODS


def test_service_without_endpoints_is_refused_at_once(topology, cluster):
    """pkg/proxy/iptables/proxier.go syncProxyRules: a service without endpoints is REJECT."""
    started = time.monotonic()
    with pytest.raises(CommandFailed) as failure:
        curl_in(topology.pod("a", 1), http_url(EMPTY, 80), timeout=5)
    assert failure.value.returncode == 7  # connection refused, not a timeout (28)
    assert time.monotonic() - started < 2


def test_named_target_port_resolved_per_pod(topology, cluster):
    # b2 serves "web" on 8181, a1 on 8080: one service port, two numbers.
    start_podserver(topology.pod("b", 2), "b2", "--http", "8181", "--udp", "9191")
    write(cluster, "named",
          service("named", [NAMED], [{"name": "web", "port": 80, "targetPort": "web"}]),
          endpoint_slice("named-a", "named", [{"name": "web", "port": 8080}], [topology.pod_info("a", 1)]),
          endpoint_slice("named-b", "named", [{"name": "web", "port": 8181}], [topology.pod_info("b", 2)]))
    try:
        until_sync(lambda: _answers(topology.pod("a", 2), NAMED), "named service answering", 15)
        assert pods_seen(topology.pod("a", 2), NAMED, 80, {"a1", "b2"}) == {"a1", "b2"}
    finally:
        remove(cluster, "named")


def test_added_service_answers__removed_service_stops__new_endpoint_gets_traffic(topology, cluster):
    client = topology.pod("b", 1)
    a1, b2 = topology.pod_info("a", 1), topology.pod_info("b", 2)
    ports = [{"name": "http", "port": 80, "targetPort": 8080}]
    write(cluster, "other", service("other", [OTHER], ports),
          endpoint_slice("other-1", "other", [HTTP], [a1]))
    until_sync(lambda: _answers(client, OTHER), "the new service answering", 15)
    assert pod_answering(client, OTHER, 80) == "a1"

    write(cluster, "other", service("other", [OTHER], ports),
          endpoint_slice("other-1", "other", [HTTP], [a1, b2]))
    until_sync(lambda: pod_answering(client, OTHER, 80) == "b2", "the new endpoint answering", 15)

    remove(cluster, "other")
    until_sync(lambda: _refused(client, OTHER), "the removed service refusing", 15)


_STREAM_CLIENT = """
import socket, sys
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
print("connected", flush=True)
sent = 0
for line in sys.stdin:
    if line.strip() == "stop":
        break
    block = line.strip().encode() * 4096
    sock.sendall(block)
    got = b""
    while len(got) < len(block):
        chunk = sock.recv(len(block) - len(got))
        if not chunk:
            sys.exit("stream closed")
        got += chunk
    assert got == block
    sent += len(block)
    print("echoed", sent, flush=True)
sock.shutdown(socket.SHUT_WR)
assert sock.recv(1) == b""
print("ok", sent, flush=True)
"""


def test_established_stream_survives_unrelated_and_own_endpoint_changes(topology, cluster):
    a1, b1 = topology.pod_info("a", 1), topology.pod_info("b", 1)
    # The HTTP port changes with the echo port: it shows when a daemon has applied a change.
    slice_ports = [{"name": "echo", "protocol": "TCP", "port": 7000}, HTTP]
    ports = [{"name": "echo", "port": 7000, "targetPort": 7000}, {"name": "http", "port": 80, "targetPort": 8080}]

    def echo_service(*pods):
        write(cluster, "echo", service("echo", [ECHO], ports), endpoint_slice("echo-1", "echo", slice_ports, pods))

    echo_service(a1)
    client = topology.pod("b", 2)
    until_sync(lambda: _answers(client, ECHO), "the echo service", 15)
    stream = spawn_in(client, sys.executable, "-I", "-c", _STREAM_CLIENT, ECHO, "7000",
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        wait_for_output(stream, b"connected\n", 10, "stream client")

        def step(tag: str) -> None:
            stream.stdin.write(f"{tag}\n".encode())
            stream.stdin.flush()
            wait_for_output(stream, b"echoed", 10, f"echo after {tag}")

        step("before")
        write(cluster, "other", service("other", [OTHER], [{"name": "http", "port": 80, "targetPort": 8080}]),
              endpoint_slice("other-1", "other", [HTTP], [a1]))
        until_sync(lambda: _answers(client, OTHER), "the unrelated service", 15)
        step("unrelated")
        echo_service(a1, b1)
        until_sync(lambda: pod_answering(client, ECHO, 80) == "b1", "the added endpoint", 15)
        step("added")
        echo_service(a1)
        until_sync(lambda: {pod_answering(client, ECHO, 80) for _ in range(8)} == {"a1"},
                   "the removed endpoint gone", 15)
        step("removed")
        stream.stdin.write(b"stop\n")
        stream.stdin.flush()
        wait_for_output(stream, b"ok ", 10, "the stream's clean end")
    finally:
        remove(cluster, "echo")
        remove(cluster, "other")


def test_refusing_backend_is_skipped_and_ejected(topology, cluster):
    a1 = topology.pod_info("a", 1)
    ports = [{"name": "http", "port": 80, "targetPort": "http"}]
    write(cluster, "flaky", service("flaky", [FLAKY], ports),
          endpoint_slice("flaky-good", "flaky", [HTTP], [a1]),
          endpoint_slice("flaky-bad", "flaky", [{"name": "http", "port": 8089}], [a1]))  # nothing listens
    client = topology.pod("a", 2)
    try:
        until_sync(lambda: _answers(client, FLAKY), "the flaky service", 15)
        for _ in range(20):
            assert pod_answering(client, FLAKY, 80) == "a1"  # every request answered: retried
        daemon_log = _daemon_log(topology, "a")
        assert "endpoint 10.244.1.11:8089 ejected after connect failures" in daemon_log
    finally:
        remove(cluster, "flaky")


_HOLD_SERVER = """
import socket
srv = socket.socket(socket.AF_INET6)
srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
srv.bind(("::", 7100))
srv.listen()
print("ready", flush=True)
conn, _ = srv.accept()
conn.sendall(b"hello")
conn.recv(1, socket.MSG_PEEK)  # wait for the client's bytes, leave them unread
print("accepted", flush=True)
import time
time.sleep(3600)  # never reads: the kernel resets when this process dies with unread data
"""

_RESET_CLIENT = """
import socket, sys
sock = socket.create_connection((sys.argv[1], 7100), timeout=20)
assert sock.recv(5) == b"hello"
sock.sendall(b"x" * 1000)
print("streaming", flush=True)
try:
    data = sock.recv(100)
    print("eof" if not data else "data", flush=True)
except ConnectionResetError:
    print("reset", flush=True)
"""


def test_backend_killed_mid_stream__client_gets_a_reset__others_still_served(topology, cluster):
    b2 = topology.pod_info("b", 2)
    server = spawn_in(b2.ns, sys.executable, "-I", "-c", _HOLD_SERVER, stdout=subprocess.PIPE)
    wait_for_output(server, b"ready\n", 10, "hold server")
    write(cluster, "doomed", service("doomed", ["10.96.0.26"], [{"name": "t", "port": 7100}]),
          endpoint_slice("doomed-1", "doomed", [{"name": "t", "port": 7100}], [b2]))
    client = topology.pod("a", 1)
    try:
        until_sync(lambda: _listening(topology, "a", "10.96.0.26", 7100), "the doomed service", 15)
        victim = spawn_in(client, sys.executable, "-I", "-c", _RESET_CLIENT, "10.96.0.26", stdout=subprocess.PIPE)
        wait_for_output(victim, b"streaming\n", 10, "reset client")
        wait_for_output(server, b"accepted\n", 10, "hold server accept")
        server.kill()
        wait_for_output(victim, b"reset\n", 10, "the client's reset")
        assert pods_seen(client, WEB_V4, 80, {"a1"}) >= {"a1"}
    finally:
        remove(cluster, "doomed")


def test_bulk_1gib_arrives_byte_exact(topology, cluster):
    size, seed = 1 << 30, 7
    script = f"curl -sS --noproxy '*' --max-time 50 http://{WEB_V4}/bytes/{size}?seed={seed} | sha256sum"
    digest = run_in(topology.pod("a", 1), "sh", "-c", script, timeout=55).stdout.split()[0]
    assert digest == pattern_sha256(size, seed)


# --- helpers ------------------------------------------------------------------------------------


def _answers(ns: str, host: str, port: int = 80) -> bool:
    try:
        pod_answering(ns, host, port, timeout=1)
    except CommandFailed:
        return False
    return True


def _refused(ns: str, host: str, port: int = 80) -> bool:
    try:
        curl_in(ns, http_url(host, port), timeout=1)
    except CommandFailed as failure:
        return failure.returncode == 7
    return False


def _connects(ns: str, host: str, port: int) -> bool:
    code = f"import socket; socket.create_connection(({host!r}, {port}), timeout=1).close()"
    return python_in(ns, code, check=False).returncode == 0


def _listening(topology, which: str, host: str, port: int) -> bool:
    listing = run_in(topology.node(which), "ss", "-Hltn", f"src {host}:{port}").stdout
    return bool(listing.strip())


def _daemon_log(topology, which: str) -> str:
    from support.netns import DAEMONS

    return "\n".join(d.log_text() for d in DAEMONS if d.ns == topology.node(which))


def test_what_is_routed_to_an_unallocated_cluster_ip_is_dropped_as_by_nftables(topology, cluster):
    """Every ClusterIP in use is a local address of the node: a pod's packet for an unallocated
    one would be routed on, out of the node. kube-proxy's nftables mode drops it; so does
    kubeport. Here a host beyond the node owns the address, and the node itself reaches it.
    (pkg/proxy/nftables/proxier.go, the cluster-ips-check chain.)"""
    unallocated, node_a, ext = "10.96.0.99", topology.node("a"), topology.ext
    setup = [(ext, "addr", "add", f"{unallocated}/32", "dev", "lo"),
             (ext, "route", "add", "10.244.0.0/16", "via", topology.node_ip("a")),
             (node_a, "route", "add", f"{unallocated}/32", "via", EXT_IPS[0])]
    for ns, *args in setup:
        run_in(ns, "ip", *args)
    server = start_podserver(ext, "beyond")
    try:
        assert "pod=beyond" in curl_in(node_a, http_url(unallocated, 8080))  # the route itself works
        with pytest.raises(CommandFailed) as dropped:
            curl_in(topology.pod("a", 1), http_url(unallocated, 8080), timeout=1)
        assert dropped.value.returncode == 28, dropped.value  # a timeout: dropped, not refused
    finally:
        server.kill()
        server.wait()
        for ns, verb, *args in reversed(setup):
            run_in(ns, "ip", verb, "del", *args[1:], check=False)

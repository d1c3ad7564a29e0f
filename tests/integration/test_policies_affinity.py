"""ClientIP session affinity through the daemon on node-a, TCP and UDP (kube-proxy's `recent`
rules, pkg/proxy/iptables/proxier.go writeServiceToEndpointRules).

How the "moves after the timeout" assertions stay deterministic: those services have two
endpoints, and the client keeps one connection (or UDP flow) open to the pod it is pinned to.
The balancer (power of two choices on active connections) then always prefers the *other* pod
for a fresh pick. So while affinity holds, every new connection lands on the busier pod, which
nothing but affinity explains; once the timeout has passed, the next connection lands on the
other pod, which nothing but an expired entry explains. The one real wait is for the 2 s
timeout to pass.
"""

from __future__ import annotations

import json

import pytest

from support.netns import CommandFailed, NoReply, python_in, udp_request, until_sync
from support.netns.manifests import endpoint, endpoint_slice, node, service, write
from support.netns.policies import (
    HTTP_PORT,
    HTTP_SLICE_PORT,
    PER_POD,
    UDP_PORT,
    UDP_SLICE_PORT,
    daemons_on,
    pods_over,
    settle_on,
)

pytestmark = pytest.mark.integration

STICKY_TCP, STICKY_UDP, REPICK, REPICK_PROBE = "10.96.0.50", "10.96.0.51", "10.96.0.52", "10.96.0.53"
TIMEOUT = 2  # sessionAffinityConfig.clientIP.timeoutSeconds
PINNED_CONNECTIONS = 50
AFTER_TIMEOUT_CONNECTIONS = 10


@pytest.fixture(scope="module")
def cluster(topology, pods, tmp_path_factory):
    nodes = [node(topology, "a"), node(topology, "b")]
    with daemons_on(topology, tmp_path_factory, nodes, on=("a",)) as manifests:
        yield manifests


def _sticky(cluster, pod_of, name: str, ip: str, ports: list[dict], slice_ports: list[dict],
            pods: tuple[str, ...] = ("a1", "b1"), timeout: int = TIMEOUT) -> None:
    write(cluster, name,
          service(name, [ip], ports, sessionAffinity="ClientIP",
                  sessionAffinityConfig={"clientIP": {"timeoutSeconds": timeout}}),
          endpoint_slice(f"{name}-1", name, slice_ports, [endpoint(pod_of(p)) for p in pods]))


# One process: pin with a kept-alive connection, N new connections, wait out the timeout, M more.
_TCP_SESSION = r"""
import http.client, json, sys, time
host, port, pinned, after, wait = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])

def pod(conn, close):
    conn.request("GET", "/", headers={"Connection": "close"} if close else {})
    return conn.getresponse().read().decode().split()[0].removeprefix("pod=")

def fresh():
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        return pod(conn, True)
    finally:
        conn.close()

held = http.client.HTTPConnection(host, port, timeout=5)
first = pod(held, False)  # stays open: the pinned pod keeps one active connection
during = [fresh() for _ in range(pinned)]
time.sleep(wait)  # the affinity timeout passing: the one wall-clock wait
later = [fresh() for _ in range(after)]
held.close()
print(json.dumps({"first": first, "during": during, "later": later}))
"""

# The same over UDP: every source port is a new flow; the first flow stays in the flow table.
_UDP_SESSION = r"""
import json, socket, sys, time
host, port, pinned, after, wait = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
kept = []

def flow():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(3)
    sock.connect((host, port))
    sock.send(b"who")
    kept.append(sock)  # a flow lives in the proxy until its idle timeout, whatever the client does
    return sock.recv(100).split()[0].decode()

first = flow()
during = [flow() for _ in range(pinned)]
time.sleep(wait)
later = [flow() for _ in range(after)]
print(json.dumps({"first": first, "during": during, "later": later}))
"""


def _session(ns: str, script: str, host: str, port: int) -> dict:
    done = python_in(ns, script, host, port, PINNED_CONNECTIONS, AFTER_TIMEOUT_CONNECTIONS, TIMEOUT + 0.5, timeout=40)
    return json.loads(done.stdout)


def _assert_pinned_then_moved(session: dict) -> None:
    first = session["first"]
    assert session["during"] == [first] * PINNED_CONNECTIONS, "affinity must keep the client on one pod"
    other = {"a1", "b1"} - {first}
    # After the timeout a fresh pick prefers the idle pod, and the client is pinned there anew.
    assert session["later"] == [*other] * AFTER_TIMEOUT_CONNECTIONS, "after the timeout the client moves"


def test_client_ip_affinity__tcp_client_kept_on_one_pod__moved_after_timeout(cluster, topology, pod_of):
    """pkg/proxy/iptables/proxier.go writeServiceToEndpointRules: `recent --rcheck --seconds` per endpoint."""
    _sticky(cluster, pod_of, "sticky-tcp", STICKY_TCP, [HTTP_PORT], [HTTP_SLICE_PORT])
    # Waiting from a1 leaves the client's (a2's) affinity untouched.
    until_sync(lambda: pods_over(topology.pod("a", 1), STICKY_TCP, 80, 1)[0] in {"a1", "b1"},
               "sticky-tcp answering", 15, ignore=(CommandFailed,))
    _assert_pinned_then_moved(_session(topology.pod("a", 2), _TCP_SESSION, STICKY_TCP, 80))


def test_client_ip_affinity__udp_flows_kept_on_one_pod__moved_after_timeout(cluster, topology, pod_of):
    """pkg/proxy/iptables/proxier.go writeServiceToEndpointRules: UDP flows pinned like TCP connections."""
    _sticky(cluster, pod_of, "sticky-udp", STICKY_UDP, [UDP_PORT], [UDP_SLICE_PORT])
    until_sync(lambda: udp_request(topology.pod("a", 1), STICKY_UDP, 90, "up?", timeout=1),
               "sticky-udp answering", 15, ignore=(ConnectionRefusedError, NoReply, CommandFailed))
    _assert_pinned_then_moved(_session(topology.pod("a", 2), _UDP_SESSION, STICKY_UDP, 90))


def _repick(cluster, pod_of, pods: tuple[str, ...]) -> None:
    """The sticky service and, in the same file (so in the same snapshot), a probe service without
    affinity over the same pods: the probe shows when the daemon has applied a change."""
    endpoints = [endpoint(pod_of(p)) for p in pods]
    write(cluster, "repick",
          service("repick", [REPICK], [HTTP_PORT], sessionAffinity="ClientIP",
                  sessionAffinityConfig={"clientIP": {"timeoutSeconds": 600}}),  # nothing may expire here
          endpoint_slice("repick-1", "repick", [HTTP_SLICE_PORT], endpoints),
          service("repick-probe", [REPICK_PROBE], [HTTP_PORT]),
          endpoint_slice("repick-probe-1", "repick-probe", [HTTP_SLICE_PORT], endpoints))


def test_client_ip_affinity__removed_endpoint_forgotten__new_pick_sticks(cluster, topology, pod_of):
    """Only usable endpoints are eligible (proxier.go writeServiceToEndpointRules; the removed userspace
    balancer's roundrobin.go removeStaleAffinity)."""
    everyone = ("a1", "b1", "b2")  # three, so the new pick is not forced
    _repick(cluster, pod_of, everyone)
    client = topology.pod("a", 2)
    settle_on(client, REPICK_PROBE, 80, set(everyone))
    pinned = pods_over(client, REPICK, 80, 1)[0]
    assert pods_over(client, REPICK, 80, 3 * PER_POD) == [pinned] * (3 * PER_POD)
    # The pinned pod leaves: only usable endpoints are eligible, so the client gets a fresh pick ...
    rest = tuple(p for p in everyone if p != pinned)
    _repick(cluster, pod_of, rest)
    settle_on(client, REPICK_PROBE, 80, set(rest))
    repicked = pods_over(client, REPICK, 80, 1)[0]
    assert repicked in rest
    # ... which is remembered: with the old pod back, the client stays on the new one.
    _repick(cluster, pod_of, everyone)
    settle_on(client, REPICK_PROBE, 80, set(everyone))
    assert pods_over(client, REPICK, 80, 3 * PER_POD) == [repicked] * (3 * PER_POD)

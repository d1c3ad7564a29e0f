"""The daemon against unfriendly pods: reaching node sockets through the VIPs, starving TCP
DNS, reset storms, malformed DNS packets.

kubeport runs in node-a; the attackers are processes in its pods' namespaces, the node's
own sockets a test listener on [::]:2222 (TCP) and [::]:2223 (UDP), both families, and the
health server on 0.0.0.0:10256, which slow HTTP clients cannot hold. The web Service is
dual-stack: a VIP of either family answers only its service ports.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from dnslib import EDNSOption

from support.netns import (
    DNS_SERVICE_IP,
    HEALTHZ_PORT,
    dig_in,
    pods_seen,
    python_in,
    spawn_in,
    udp_request,
    wait_for_output,
)
from support.netns.manifests import endpoint_slice, node, service, start_daemon, write
from support.zonetext import header_only, question

pytestmark = pytest.mark.integration

WEB_V4, WEB_V6 = "10.96.0.20", "fd00:10:96::20"
WEB_PORTS = [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": "http"},
             {"name": "udp", "protocol": "UDP", "port": 90, "targetPort": 9090}]
POD_PORTS = [{"name": "http", "protocol": "TCP", "port": 8080}, {"name": "udp", "protocol": "UDP", "port": 9090}]
WEB_NAME = "web.demo.svc.cluster.local"
NODE_TCP, NODE_UDP = 2222, 2223

_NODE_LISTENERS = """
import socket, sys
tcp = socket.socket(socket.AF_INET6); tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # both families, as a daemon on 0.0.0.0 and ::
tcp.bind(("::", int(sys.argv[1]))); tcp.listen(64)
udp = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); udp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
udp.bind(("::", int(sys.argv[2])))
import selectors
sel = selectors.DefaultSelector(); sel.register(tcp, selectors.EVENT_READ); sel.register(udp, selectors.EVENT_READ)
print("listening", flush=True)
while True:
    for key, _ in sel.select():
        if key.fileobj is tcp:
            conn, _ = tcp.accept(); conn.sendall(b"node-secret\\n"); conn.close()
        else:
            data, peer = udp.recvfrom(2048); udp.sendto(b"node-secret", peer)
"""

_TCP_PROBE = """
import socket, sys
try:
    sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
except ConnectionRefusedError:
    print("refused")
except OSError as exc:
    print("error", exc)
else:
    sock.settimeout(3)
    try:
        print("connected", sock.recv(100).decode().strip() or "-")
    except OSError as exc:
        print("connected", exc)
"""


def tcp_probe(ns: str, host: str, port: int) -> str:
    return python_in(ns, _TCP_PROBE, host, port, timeout=15).stdout.strip()


@pytest.fixture(scope="module")
def node_a(topology, pods, tmp_path_factory):
    manifests = tmp_path_factory.mktemp("manifests")
    state = tmp_path_factory.mktemp("state")
    write(manifests, "nodes", node(topology, "a"), node(topology, "b"))
    write(manifests, "web", service("web", [WEB_V4, WEB_V6], WEB_PORTS),
          endpoint_slice("web", "web", POD_PORTS, topology.pods),
          endpoint_slice("web-v6", "web", POD_PORTS, topology.pods, family=6))
    listeners = spawn_in(topology.node("a"), sys.executable, "-I", "-c", _NODE_LISTENERS, NODE_TCP, NODE_UDP,
                         stdout=subprocess.PIPE)
    wait_for_output(listeners, b"listening", 10, "the node's test listeners")
    daemon = start_daemon(topology, "a", manifests, state)
    yield daemon
    daemon.stop()
    listeners.kill()
    listeners.wait()


# --- a VIP answers only its service ports -----------------------------------------------------

@pytest.mark.parametrize("port", [pytest.param(NODE_TCP, id="a_listener_on_0.0.0.0"),
                                  pytest.param(HEALTHZ_PORT, id="the_health_port")])
@pytest.mark.parametrize("vip", [pytest.param(WEB_V4, id="cluster_ip"),
                                 pytest.param(DNS_SERVICE_IP, id="dns_address")])
def test_node_sockets_are_not_reachable_through_a_vip(topology, node_a, vip, port):
    """A pod reaching <VIP>:<port> is reset (node processes reach their own sockets anyway)."""
    assert tcp_probe(topology.pod("a", 1), vip, port) == "refused"


@pytest.mark.parametrize("port", [pytest.param(NODE_TCP, id="a_listener_on_the_wildcard"),
                                  pytest.param(HEALTHZ_PORT, id="the_health_port")])
def test_node_sockets_are_not_reachable_through_an_ipv6_cluster_ip(topology, node_a, port):
    """The same over IPv6 (vips6, vipports6): reset, while the node's own IPv6 address reaches
    the listener and the IPv6 ClusterIP serves its port."""
    a1 = topology.pod("a", 1)
    assert tcp_probe(a1, WEB_V6, port) == "refused"
    if port == NODE_TCP:
        assert tcp_probe(a1, topology.node_spec("a").gateways[1], NODE_TCP) == "connected node-secret"
    assert tcp_probe(a1, WEB_V6, 80).startswith("connected")


def test_node_udp_socket_is_not_reachable_through_an_ipv6_cluster_ip(topology, node_a):
    with pytest.raises(ConnectionRefusedError):
        udp_request(topology.pod("a", 1), WEB_V6, NODE_UDP, "hello")
    assert udp_request(topology.pod("a", 1), WEB_V6, 90, "hi").split()[0].decode() in {"a1", "a2", "b1", "b2"}


def test_node_udp_socket_is_not_reachable_through_a_cluster_ip(topology, node_a):
    with pytest.raises(ConnectionRefusedError):
        udp_request(topology.pod("a", 1), WEB_V4, NODE_UDP, "hello")
    assert udp_request(topology.pod("a", 1), WEB_V4, 90, "hi").split()[0].decode() in {"a1", "a2", "b1", "b2"}


def test_service_ports_and_the_node_own_address_still_answer(topology, node_a):
    a1 = topology.pod("a", 1)
    assert pods_seen(a1, WEB_V4, 80, {"a1", "a2", "b1", "b2"}) == {"a1", "a2", "b1", "b2"}
    assert dig_in(a1, "+short", WEB_NAME, "A", server=DNS_SERVICE_IP).split() == [WEB_V4]
    assert dig_in(a1, "+tcp", "+short", WEB_NAME, "A", server=DNS_SERVICE_IP).split() == [WEB_V4]
    # The node's own address is not a VIP: its sockets stay reachable (from its pod gateway).
    assert tcp_probe(a1, topology.node_spec("a").gateways[0], NODE_TCP) == "connected node-secret"
    # A node process uses the VIP as its source: the replies to its port are not rejected.
    assert tcp_probe(topology.node("a"), WEB_V4, 80).startswith("connected")


# --- TCP DNS cannot be starved from one pod ---------------------------------------------------

_TRICKLE = """
import json, socket, sys, time
host, count, pace, duration = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
socks = []
for _ in range(count):
    s = socket.create_connection((host, 53), timeout=5); s.setblocking(False); socks.append(s)
print("opened", flush=True)
open_ = set(range(count)); closed_at = {}
start = time.monotonic(); frame = bytes.fromhex(sys.argv[5]); sent = 0
while time.monotonic() - start < duration and open_:
    for i in list(open_):
        try:
            socks[i].send(frame[sent:sent + 1])
            if socks[i].recv(1) == b"":
                raise ConnectionResetError
        except BlockingIOError:
            pass
        except OSError:
            open_.discard(i); closed_at[i] = time.monotonic() - start
    sent = min(sent + 1, len(frame) - 1)
    time.sleep(pace)  # the attacker's pace: one byte per connection per round
print(json.dumps({"still_open": len(open_), "closed": len(closed_at),
                  "latest_close": max(closed_at.values(), default=0)}), flush=True)
"""


def test_tcp_dns_trickle_from_one_pod__other_clients_answered(topology, node_a):
    """1,000 connections trickling one byte a second from pod a1 (the cap, all of it): each is
    closed within the read deadline or at once (one client's share); a2's dig +tcp is answered."""
    frame = len(q := question(WEB_NAME)).to_bytes(2, "big") + q
    trickler = spawn_in(topology.pod("a", 1), sys.executable, "-I", "-c", _TRICKLE, DNS_SERVICE_IP, 1000, 1.0,
                        12.0, frame.hex(), stdout=subprocess.PIPE)
    wait_for_output(trickler, b"opened", 20, "the trickling client")
    for _ in range(3):
        assert dig_in(topology.pod("a", 2), "+tcp", "+short", WEB_NAME, "A", server=DNS_SERVICE_IP).split() == [WEB_V4]
    out, _ = trickler.communicate(timeout=60)
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert result["still_open"] == 0 and result["closed"] == 1000
    assert result["latest_close"] < 8  # 2 s read deadline, plus the trickler's own rounds


_HOLD_IDLE = """
import socket, sys
socks = [socket.create_connection((sys.argv[1], 53), timeout=5) for _ in range(int(sys.argv[2]))]
print("opened", flush=True)
sys.stdin.read()  # held, idle, until the test closes stdin
"""


def test_tcp_dns_500_idle_connections_from_one_pod__its_next_query_is_answered(topology, node_a):
    """Pod a1 opens 500 TCP connections to the DNS address and leaves them idle (five times its
    share): at the per-client cap its own connection idle longest makes room, so a1's own
    dig +tcp is answered, as a2's is."""
    holder = spawn_in(topology.pod("a", 1), sys.executable, "-I", "-c", _HOLD_IDLE, DNS_SERVICE_IP, 500,
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    wait_for_output(holder, b"opened", 30, "the idle connections")
    for pod in ("a1", "a2", "a1"):
        got = dig_in(topology.pod(pod[0], int(pod[1])), "+tcp", "+short", WEB_NAME, "A", server=DNS_SERVICE_IP)
        assert got.split() == [WEB_V4], f"{pod}: {got!r}"
    holder.stdin.close()
    holder.wait(timeout=10)


# --- the health port cannot be held by slow clients --------------------------------------------

_HTTP_TRICKLE = """
import json, socket, sys, time
host, port, count, duration = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
socks = [socket.create_connection((host, port), timeout=5) for _ in range(count)]
for s in socks:
    s.setblocking(False)
print("opened", flush=True)
open_ = set(range(count)); closed_at = {}
start = time.monotonic(); head = b"GET /healthz HTTP/1.1\\r\\nHost: x\\r\\nX-Slow: "; sent = 0
while time.monotonic() - start < duration and open_:
    byte = head[sent:sent + 1] or b"a"  # a header that never ends
    for i in list(open_):
        try:
            socks[i].send(byte)
            if socks[i].recv(1) == b"":
                raise ConnectionResetError
        except BlockingIOError:
            pass
        except OSError:
            open_.discard(i); closed_at[i] = time.monotonic() - start
    sent += 1
    time.sleep(1.0)  # a byte a second on every connection
print(json.dumps({"still_open": len(open_), "closed": len(closed_at)}), flush=True)
"""


def test_http_trickle_to_the_health_port__closed_unanswered_and_others_answered(topology, node_a):
    """50 connections sending a request head a byte a second: each is closed, at the request
    deadline (10 s, where kube-proxy's Go server sets none) or, beyond the per-client cap of 16,
    as the idle one making room for the next; /livez answers meanwhile."""
    node_address = topology.node_spec("a").gateways[0]
    trickler = spawn_in(topology.pod("a", 1), sys.executable, "-I", "-c", _HTTP_TRICKLE, node_address,
                        HEALTHZ_PORT, 50, 30.0, stdout=subprocess.PIPE)
    wait_for_output(trickler, b"opened", 20, "the trickling client")
    probe = python_in(topology.pod("a", 2), "import sys, urllib.request; "
                      "print(urllib.request.urlopen(f'http://{sys.argv[1]}:{sys.argv[2]}/livez', timeout=5).status)",
                      node_address, HEALTHZ_PORT)
    assert probe.stdout.strip() == "200"
    out, _ = trickler.communicate(timeout=60)
    assert json.loads(out.decode().strip().splitlines()[-1]) == {"still_open": 0, "closed": 50}


# --- a reset storm ----------------------------------------------------------------------------

_RESET_STORM = """
import socket, struct, sys
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
linger = struct.pack("ii", 1, 0)
done = 0
for _ in range(count):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
    try:
        s.connect((host, port))
        done += 1
    except OSError:
        pass
    s.close()  # an RST, before the proxy's connect to a backend can complete
print(done)
"""


def test_reset_storm__no_traceback_and_a_bounded_log(topology, node_a):
    before = len(node_a.log_text().splitlines())
    done = python_in(topology.pod("a", 1), _RESET_STORM, WEB_V4, 80, 5000, timeout=120)
    assert int(done.stdout) > 4000
    assert pods_seen(topology.pod("a", 2), WEB_V4, 80, {"a1", "a2", "b1", "b2"}) == {"a1", "a2", "b1", "b2"}
    added = node_a.log_text().splitlines()[before:]
    assert not [line for line in added if "Traceback" in line or "Error" in line], "\n".join(added[-20:])
    assert len(added) < 20, "\n".join(added[-20:])
    assert node_a.running


# --- malformed DNS packets --------------------------------------------------------------------

def test_malformed_edns_option__formerr(topology, node_a):
    query = bytearray(question(WEB_NAME, query_id=0x4242, edns=1232, options=[EDNSOption(10, b"\x01" * 8)]))
    query[-10:-8] = b"\x00\x20"  # the cookie's length runs past the OPT record
    reply = udp_request(topology.pod("a", 1), DNS_SERVICE_IP, 53, bytes(query))
    assert header_only(reply)[0] == 0x4242 and header_only(reply)[2] == "FORMERR"


def test_oversized_udp_query__formerr(topology, node_a):
    query = question(WEB_NAME, query_id=0x4343) + bytes(5000)
    reply = udp_request(topology.pod("a", 1), DNS_SERVICE_IP, 53, query)
    assert header_only(reply)[0] == 0x4343 and header_only(reply)[2] == "FORMERR"

"""The node's pods reach Services straight at an endpoint: balanced inside their own connect().

node-a's daemon attaches its programs to a cgroup of this module's, and the pods' processes
this module runs as that node's pods (curl, a Python client) join it first: their sockets then
connect to the endpoint itself. Nothing of kubeport's is on the path (its relay counts no
connection for the Service port, the programs count the connects), the endpoint sees the pod,
and the application still sees the Service address it dialled (getpeername, recvfrom).

One daemon serves the module; its Services are written once. The tests that kill or stop it
(a crash keeps the pins serving, the next instance adopts them, a clean stop or ``--cleanup``
removes them) come last and leave it stopped; ``balancing`` starts it again for whoever needs it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections import Counter

import pytest

from support.netns import http_url, parse_pod_reply, python_in, run_in, until_sync
from support.netns.cgroups import TestCgroup, connect_balancing_possible, mount_bpffs, unmount
from support.netns.daemon import KubeportDaemon, kubeport, problems_of, status_api
from support.netns.manifests import DAEMON_ARGS, endpoint, endpoint_slice, node, remove, service, start_daemon, write
from support.netns.policies import FAST_STOP, HTTP_SLICE_PORT, UDP_SLICE_PORT
from support.netns.proc import in_ns

pytestmark = [pytest.mark.integration,
              pytest.mark.host_privileges("BPF programs attached to a cgroup of the host, a bpffs of the test's")]

IN_CI = os.environ.get("CI", "").lower() == "true"
PORTS = [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080},
         {"name": "udp", "protocol": "UDP", "port": 90, "targetPort": 9090}]
SLICE_PORTS = (HTTP_SLICE_PORT, UDP_SLICE_PORT)
# Dual-stack Service addresses (IPv4, IPv6); the first five are written once for the module
# (SERVICES: name -> addresses, endpoints, spec), the others by the tests that use them.
FAR = ("10.96.0.71", "fd00:10:96::71")        # b1 only: on the other node
NEAR = ("10.96.0.72", "fd00:10:96::72")       # a2 only: on the client's own node
STICKY = ("10.96.0.73", "fd00:10:96::73")     # a2 and b1, ClientIP affinity
SPREAD = ("10.96.0.74", "fd00:10:96::74")     # a2 and b1, no affinity
EMPTY = ("10.96.0.75", "fd00:10:96::75")      # an empty slice: refused
CHANGING = ("10.96.0.76", "fd00:10:96::76")   # its endpoints change in a test
LATE = ("10.96.0.77", "fd00:10:96::77")       # written while the daemon is dead, changed after
GONE = ("10.96.0.78", "fd00:10:96::78")       # removed while the daemon is dead
REPICK = ("10.96.0.79", "fd00:10:96::79")     # ClientIP affinity, its endpoints change in a test
CANARY = ("10.96.0.80", "fd00:10:96::80")     # changed with REPICK: shows the change applied
MOVED = ("10.96.0.81", "fd00:10:96::81")      # moved while a daemon that cannot attach serves
KEPT = ("10.96.0.86", "fd00:10:96::86")       # ClientIP affinity across a restart
KEPT_CANARY = ("10.96.0.87", "fd00:10:96::87")
SERVICES = {"far": (FAR, ("b1",), {}), "near": (NEAR, ("a2",), {}),
            "sticky": (STICKY, ("a2", "b1"), {"sessionAffinity": "ClientIP"}),
            "spread": (SPREAD, ("a2", "b1"), {}), "empty": (EMPTY, (), {})}
METRICS = "http://127.0.0.1:10249/metrics"
LINKS = ("connect4", "connect6", "sendmsg4", "sendmsg6", "recvmsg4", "recvmsg6", "getpeername4", "getpeername6")


@pytest.fixture(scope="module")
def pods_cgroup():
    why = connect_balancing_possible()
    if why is not None:
        pytest.fail(f"connect-time balancing cannot be tested here: {why}")
    cgroup = TestCgroup(f"connect-balancing-pods-{os.getpid()}")  # two runs at once must not share one
    yield cgroup
    cgroup.remove()


@pytest.fixture(scope="module")
def bpffs(tmp_path_factory):
    where = mount_bpffs(tmp_path_factory.mktemp("bpffs"))
    yield where
    unmount(where)


def _dual_stack(name: str, ips: tuple[str, str], pods, **spec) -> list[dict]:
    return [service(name, list(ips), PORTS, **spec),
            endpoint_slice(f"{name}-v4", name, SLICE_PORTS, [endpoint(p) for p in pods], family=4),
            endpoint_slice(f"{name}-v6", name, SLICE_PORTS, [endpoint(p, family=6) for p in pods], family=6)]


class Cluster:
    """The module's manifests and node-a's daemon (restartable with the same arguments)."""

    def __init__(self, topology, manifests, daemon, cgroup: TestCgroup, bpffs) -> None:
        self.topology, self.manifests, self.daemon, self.cgroup, self.bpffs = topology, manifests, daemon, cgroup, bpffs
        self.pins = bpffs / "kubeport" / "node-a"

    def write(self, name: str, ips: tuple[str, str], pods, **spec) -> None:
        write(self.manifests, name, *_dual_stack(name, ips, pods, **spec))

    def ensure_running(self) -> None:
        if not self.daemon.running:
            self.daemon.start()
            self.daemon.wait_ready(timeout=30)


@pytest.fixture(scope="module")
def cluster(topology, pods, pods_cgroup, bpffs, tmp_path_factory):
    manifests, state = tmp_path_factory.mktemp("manifests"), tmp_path_factory.mktemp("state")
    write(manifests, "nodes", node(topology, "a"), node(topology, "b"))
    pod = topology.pod_info
    for name, (ips, names, spec) in SERVICES.items():
        write(manifests, name, *_dual_stack(name, ips, [pod(n[0], int(n[1:])) for n in names], **spec))
    daemon = start_daemon(topology, "a", manifests, state, *FAST_STOP,
                          f"--connect-balancing-cgroup={pods_cgroup.hierarchy_path}", f"--bpf-root={bpffs}")
    try:
        yield Cluster(topology, manifests, daemon, pods_cgroup, bpffs)
    finally:
        daemon.stop()


@pytest.fixture
def balancing(cluster) -> Cluster:
    """The module's daemon, serving (a test before may have killed or stopped it)."""
    cluster.ensure_running()
    return cluster


# --- the pods' clients ------------------------------------------------------------------------------

# One process per call: a list of requests [kind, host, port, count] in, a list of results per
# request out (JSON). "http": a GET on a new connection; "udp": a connected socket's send and
# recv; "sendto": an unconnected socket's sendto and recvfrom; "nonblocking": connect() on a
# non-blocking socket, whose immediate outcome tells a refusal in connect() itself (the
# programs) from one coming back over the network (EINPROGRESS first).
_CLIENT = r"""
import errno, json, socket, sys

def family(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET

def failed(exc):
    return {"error": errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno else type(exc).__name__}

def answer(data):
    fields = dict(part.split("=", 1) for part in data.split() if "=" in part)
    return fields["client"].rsplit(":", 1)[0]

def http(host, port):
    sock = socket.socket(family(host), socket.SOCK_STREAM)
    sock.settimeout(3)
    try:
        sock.connect((host, port))
        peer = sock.getpeername()[:2]
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    except OSError as exc:
        return failed(exc)
    finally:
        sock.close()
    body = data.split(b"\r\n\r\n", 1)[1].decode()
    pod = body.split()[0].removeprefix("pod=")
    return {"pod": pod, "client": answer(body), "peer": list(peer)}

def udp(host, port, connected):
    sock = socket.socket(family(host), socket.SOCK_DGRAM)
    sock.settimeout(2)
    try:
        if connected:
            sock.connect((host, port))
            sock.send(b"peer?")
            data, source = sock.recv(65535), sock.getpeername()
        else:
            sock.sendto(b"peer?", (host, port))
            data, source = sock.recvfrom(65535)
    except OSError as exc:
        return failed(exc)
    finally:
        sock.close()
    text = data.decode()
    return {"pod": text.split()[0], "client": answer(text), "source": list(source[:2])}

def nonblocking(host, port):
    sock = socket.socket(family(host), socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        code = sock.connect_ex((host, port))
    finally:
        sock.close()
    return {"error": errno.errorcode.get(code, str(code)) if code else "connected"}

KINDS = {"http": http, "udp": lambda h, p: udp(h, p, True), "sendto": lambda h, p: udp(h, p, False),
         "nonblocking": nonblocking}
requests = json.loads(sys.argv[1])
print(json.dumps([[KINDS[kind](host, port) for _ in range(count)] for kind, host, port, count in requests]))
"""


def as_pod(cgroup: TestCgroup | None, ns: str, *requests: tuple[str, str, int, int]) -> list[list[dict]]:
    """Run the requests from pod ``ns``: as one of node-a's balanced pods (a member of ``cgroup``),
    or, ``cgroup`` None, as a process the programs do not see."""
    argv = [sys.executable, "-I", "-c", _CLIENT, json.dumps(requests)]
    timeout = 10 + 3 * sum(count for *_, count in requests)
    if cgroup is None:
        done = python_in(ns, _CLIENT, json.dumps(requests), timeout=timeout)
    else:
        done = run_in(None, *cgroup.command(in_ns(ns, argv)), timeout=timeout)
    return json.loads(done.stdout)


def one(cgroup: TestCgroup | None, ns: str, kind: str, host: str, port: int) -> dict:
    return as_pod(cgroup, ns, (kind, host, port, 1))[0][0]


def pods_answering(cgroup: TestCgroup | None, ns: str, host: str, port: int = 80, count: int = 20) -> list[str]:
    return [reply.get("pod", reply.get("error")) for reply in as_pod(cgroup, ns, ("http", host, port, count))[0]]


def curl_as_pod(cgroup: TestCgroup, ns: str, url: str, timeout: float = 3.0) -> str:
    return run_in(None, *cgroup.command(in_ns(ns, ["curl", "-sS", "-g", "--noproxy", "*", "--max-time",
                                                   f"{timeout:g}", url])), timeout=timeout + 5).stdout


def answered_by(cgroup: TestCgroup | None, ns: str, host: str, pod: str, what: str = "",
                deadline: float = 15.0) -> None:
    """Wait until ``pod`` answers a connection from ``ns`` to ``host``:80 (the daemon applied a change);
    ``cgroup`` None: from a process outside it."""
    until_sync(lambda: one(cgroup, ns, "http", host, 80).get("pod") == pod,
               what or f"{pod} answering {host}:80", deadline, interval=0.1)


def only(cgroup: TestCgroup, ns: str, host: str, pods: set[str], count: int = 20, deadline: float = 15.0) -> None:
    """Wait until a window of ``count`` connects reaches exactly ``pods``; then assert it of the next window."""
    until_sync(lambda: set(pods_answering(cgroup, ns, host, count=count)) == pods,
               f"only {sorted(pods)} answering {host}:80", deadline, interval=0.1)
    assert set(pods_answering(cgroup, ns, host, count=count)) == pods


# --- what the daemon says -------------------------------------------------------------------------


def metric(topology, name: str, service_port: str) -> float:
    """A counter of node-a's metrics for one service port (summed over other labels); 0 when absent."""
    text = run_in(topology.node("a"), "curl", "-s", "--max-time", "5", METRICS).stdout
    label = f'service_port="{service_port}"'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and label in line.split("}", 1)[0])


def relayed_reaches(topology, service_port: str, count: float) -> None:
    """Wait for the relay's connection counter of ``service_port`` to reach ``count`` (it is
    counted by the relay's own task, which may still be finishing the last connection)."""
    until_sync(lambda: metric(topology, "kubeport_proxy_connections_total", service_port) >= count,
               f"the relay counting {count:g} connections of {service_port}", 10, interval=0.1)
    assert metric(topology, "kubeport_proxy_connections_total", service_port) == count


def pod_traffic(topology) -> str:
    return status_api(topology.node("a"), "/api/v1/status")["proxy"]["podTraffic"]


def attached_hooks(cgroup: TestCgroup) -> set[str]:
    """The hooks whose program (named kp_<hook>) is attached to ``cgroup``, as bpftool lists them."""
    shown = run_in(None, "bpftool", "-j", "cgroup", "show", cgroup.path).stdout.strip()
    return {entry.get("name", "").removeprefix("kp_") for entry in json.loads(shown or "[]")} & set(LINKS)


def bpftool_or_none() -> str | None:
    """bpftool, when installed; under CI it must be (netns-scripts/apt-install.sh bpftool)."""
    found = shutil.which("bpftool")
    if found is None and IN_CI:
        pytest.fail("bpftool is not installed (Debian package bpftool)")
    return found


def log_since_last_start(daemon: KubeportDaemon) -> str:
    return daemon.log_text().rsplit("=== ", 1)[-1]


# --- while the daemon serves ------------------------------------------------------------------------


def test_status_says_the_pods_are_balanced_at_connect(balancing, topology, pods_cgroup, bpffs):
    assert pod_traffic(topology) == f"connect(): cgroup {pods_cgroup.hierarchy_path}, pinned in {bpffs}/kubeport/node-a"


@pytest.mark.parametrize("family", [4, 6], ids=["ipv4", "ipv6"])
@pytest.mark.parametrize("name, ips, target", [("far", FAR, "b1"), ("near", NEAR, "a2")],
                         ids=["other-node-endpoint", "same-node-endpoint"])
def test_pod_to_cluster_ip_reaches_the_endpoint_directly(balancing, topology, pod_of, pods_cgroup,
                                                         family, name, ips, target):
    client, vip = pod_of("a1"), ips[family == 6]
    answered_by(pods_cgroup, client.ns, vip, target)
    balanced = {proto: metric(topology, "kubeport_proxy_connects_balanced_total", f"demo/{name}:{port}/{proto}")
                for proto, port in (("TCP", "http"), ("UDP", "udp"))}

    tcp, udp, sendto = as_pod(pods_cgroup, client.ns, ("http", vip, 80, 3), ("udp", vip, 90, 2),
                              ("sendto", vip, 90, 2))
    # The endpoint sees the pod itself; the socket sees the Service address it dialled.
    assert tcp == [{"pod": target, "client": client.ip(family), "peer": [vip, 80]}] * 3
    assert udp == [{"pod": target, "client": client.ip(family), "source": [vip, 90]}] * 2
    assert sendto == [{"pod": target, "client": client.ip(family), "source": [vip, 90]}] * 2
    # The programs counted the connects (connected UDP too); the relay saw nothing of this port.
    assert metric(topology, "kubeport_proxy_connects_balanced_total", f"demo/{name}:http/TCP") >= balanced["TCP"] + 3
    assert metric(topology, "kubeport_proxy_connects_balanced_total", f"demo/{name}:udp/UDP") >= balanced["UDP"] + 2
    assert metric(topology, "kubeport_proxy_connections_total", f"demo/{name}:http/TCP") == 0
    assert metric(topology, "kubeport_proxy_udp_flows_total", f"demo/{name}:udp/UDP") == 0


def test_curl_in_the_cgroup_reaches_the_endpoint(balancing, topology, pod_of, pods_cgroup):
    client = pod_of("a1")
    answered_by(pods_cgroup, client.ns, FAR[0], "b1")
    assert parse_pod_reply(curl_as_pod(pods_cgroup, client.ns, http_url(FAR[1], 80))) == ("b1", client.ip(6))


PEERNAME = r"""
import json, socket, sys
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
print(json.dumps([sock.getpeername()[:2], sock.getsockname()[0]]))
"""


@pytest.mark.parametrize("family", [4, 6], ids=["ipv4", "ipv6"])
def test_getpeername_is_the_service_address(balancing, pod_of, pods_cgroup, family):
    client, vip = pod_of("a1"), FAR[family == 6]
    answered_by(pods_cgroup, client.ns, vip, "b1")
    done = run_in(None, *pods_cgroup.command(in_ns(client.ns, [sys.executable, "-I", "-c", PEERNAME, vip, "80"])))
    assert json.loads(done.stdout) == [[vip, 80], client.ip(family)]


@pytest.mark.parametrize("family", [4, 6], ids=["ipv4", "ipv6"])
def test_client_ip_affinity_keeps_a_pod_on_one_endpoint(balancing, pod_of, pods_cgroup, family):
    client = pod_of("a1")
    answered_by(pods_cgroup, client.ns, SPREAD[family == 6], "b1")  # (a2 answers too: it may take a few)
    sticky, spread = as_pod(pods_cgroup, client.ns, ("http", STICKY[family == 6], 80, 30),
                            ("http", SPREAD[family == 6], 80, 30))
    assert len(Counter(reply.get("pod") for reply in sticky)) == 1, sticky
    assert sticky[0]["pod"] in ("a2", "b1"), sticky
    # Without affinity both are seen: 30 uniform picks miss one of two with probability 2**-29.
    assert Counter(reply.get("pod") for reply in spread).keys() == {"a2", "b1"}, spread


def test_client_ip_affinity_forgets_a_removed_endpoint(balancing, pod_of, pods_cgroup):
    client, pod = pod_of("a1"), pod_of

    def repick(pods: list[str], canary: str) -> None:
        """The affinity Service's endpoints, and in the same file (one snapshot, applied at once)
        a canary whose answer shows the daemon has applied it: a connect to the affinity
        Service itself would be pinned by affinity and could not tell."""
        write(balancing.manifests, "repick",
              *_dual_stack("repick", REPICK, [pod(p) for p in pods], sessionAffinity="ClientIP"),
              *_dual_stack("canary", CANARY, [pod(canary)]))
        answered_by(pods_cgroup, client.ns, CANARY[0], canary)

    repick(["a2", "b1"], "b2")
    first = set(pods_answering(pods_cgroup, client.ns, REPICK[0]))
    assert len(first) == 1 and first <= {"a2", "b1"}, first
    other = ({"a2", "b1"} - first).pop()
    repick([other], "a2")  # the remembered endpoint removed: the next connect picks anew
    assert set(pods_answering(pods_cgroup, client.ns, REPICK[0])) == {other}
    repick(["a2", "b1"], "b2")  # and back: the pod stays where affinity moved it
    assert set(pods_answering(pods_cgroup, client.ns, REPICK[0], count=30)) == {other}


def test_an_endpoint_change_moves_the_next_connects(balancing, pod_of, pods_cgroup):
    client, pod = pod_of("a1"), pod_of
    balancing.write("changing", CHANGING, [pod("a2"), pod("b1")])
    only(pods_cgroup, client.ns, CHANGING[0], {"a2", "b1"}, count=30)
    balancing.write("changing", CHANGING, [pod("a2")])  # b1 removed
    only(pods_cgroup, client.ns, CHANGING[0], {"a2"})
    only(pods_cgroup, client.ns, CHANGING[1], {"a2"})
    balancing.write("changing", CHANGING, [pod("b2")])  # b2 added, a2 removed
    only(pods_cgroup, client.ns, CHANGING[0], {"b2"})
    only(pods_cgroup, client.ns, CHANGING[1], {"b2"})


@pytest.mark.parametrize("family", [4, 6], ids=["ipv4", "ipv6"])
def test_a_service_without_endpoints_is_refused_in_connect(balancing, topology, pod_of, pods_cgroup, family):
    client, vip = pod_of("a1"), EMPTY[family == 6]
    # Refused by connect() itself, not by a reset coming back: a non-blocking connect would
    # otherwise say EINPROGRESS first. A sendto() is refused the same way, before any datagram.
    until_sync(lambda: one(pods_cgroup, client.ns, "nonblocking", vip, 80) == {"error": "ECONNREFUSED"},
               f"connect() to {vip}:80 refused at once", 15, interval=0.1)
    http, sendto = as_pod(pods_cgroup, client.ns, ("http", vip, 80, 1), ("sendto", vip, 90, 1))
    assert http == [{"error": "ECONNREFUSED"}] and sendto == [{"error": "ECONNREFUSED"}]
    code = run_in(None, *pods_cgroup.command(in_ns(client.ns, ["curl", "-sS", "-g", "--max-time", "3",
                                                               http_url(vip, 80)])), check=False).returncode
    assert code == 7  # curl: couldn't connect
    assert metric(topology, "kubeport_proxy_connections_total", "demo/empty:http/TCP") == 0


def test_a_pod_outside_the_cgroup_goes_through_the_relay(balancing, topology, pod_of, pods_cgroup):
    client = pod_of("a1")
    answered_by(pods_cgroup, client.ns, FAR[0], "b1")
    relayed = metric(topology, "kubeport_proxy_connections_total", "demo/far:http/TCP")
    balanced = metric(topology, "kubeport_proxy_connects_balanced_total", "demo/far:http/TCP")

    outside = as_pod(None, client.ns, ("http", FAR[0], 80, 3))[0]
    assert [reply["pod"] for reply in outside] == ["b1"] * 3 and all(r["peer"] == [FAR[0], 80] for r in outside)
    relayed_reaches(topology, "demo/far:http/TCP", relayed + 3)
    assert metric(topology, "kubeport_proxy_connects_balanced_total", "demo/far:http/TCP") == balanced
    # ... while a member of the cgroup, in the same pod at the same time, is still balanced
    inside = as_pod(pods_cgroup, client.ns, ("http", FAR[0], 80, 2))[0]
    assert [reply["pod"] for reply in inside] == ["b1"] * 2
    assert metric(topology, "kubeport_proxy_connections_total", "demo/far:http/TCP") == relayed + 3
    assert metric(topology, "kubeport_proxy_connects_balanced_total", "demo/far:http/TCP") == balanced + 2


EXT_CLUSTER, EXT_IP, EXT_LB = "10.96.0.82", "192.168.60.82", "192.168.70.82"
RANGED_CLUSTER, RANGED_LB, RANGED_NODE_PORT = "10.96.0.83", "192.168.70.83", 30283
LOCAL_ONLY = "10.96.0.84"
LOCAL_CANARY = ("10.96.0.85", "fd00:10:96::85")


def test_external_ips_and_lb_ips_are_balanced_node_ports_and_source_ranges_relayed(balancing, topology, pod_of,
                                                                                  pods_cgroup):
    client, b1 = pod_of("a1"), pod_of("b1")
    # externalTrafficPolicy Local without an endpoint on node-a: the node's pods still use any
    # endpoint (kube-proxy's short-circuit), at connect() too.
    write(balancing.manifests, "outside",
          service("ext", [EXT_CLUSTER], [{**PORTS[0], "nodePort": 30282}, {**PORTS[1], "nodePort": 30284}],
                  type="LoadBalancer", externalIPs=[EXT_IP], externalTrafficPolicy="Local",
                  status={"loadBalancer": {"ingress": [{"ip": EXT_LB}]}}),
          endpoint_slice("ext-1", "ext", SLICE_PORTS, [b1]),
          service("ranged", [RANGED_CLUSTER], [{**PORTS[0], "nodePort": RANGED_NODE_PORT}], type="LoadBalancer",
                  loadBalancerSourceRanges=["10.244.0.0/16", "192.168.50.0/24"],
                  status={"loadBalancer": {"ingress": [{"ip": RANGED_LB}]}}),
          endpoint_slice("ranged-1", "ranged", [HTTP_SLICE_PORT], [b1]))
    answered_by(pods_cgroup, client.ns, EXT_LB, "b1")
    answered_by(pods_cgroup, client.ns, RANGED_LB, "b1")

    tcp_ip, tcp_lb, udp_lb = as_pod(pods_cgroup, client.ns, ("http", EXT_IP, 80, 2), ("http", EXT_LB, 80, 2),
                                    ("sendto", EXT_LB, 90, 1))
    assert tcp_ip == [{"pod": "b1", "client": client.ip(4), "peer": [EXT_IP, 80]}] * 2
    assert tcp_lb == [{"pod": "b1", "client": client.ip(4), "peer": [EXT_LB, 80]}] * 2
    assert udp_lb == [{"pod": "b1", "client": client.ip(4), "source": [EXT_LB, 90]}]
    assert metric(topology, "kubeport_proxy_connections_total", "demo/ext:http/TCP") == 0
    assert metric(topology, "kubeport_proxy_udp_flows_total", "demo/ext:udp/UDP") == 0
    assert metric(topology, "kubeport_proxy_connects_balanced_total", "demo/ext:http/TCP") >= 4

    # A NodePort (reached from outside the node) and an LB IP filtered by the client's address
    # (which connect() does not know yet) stay with the relay.
    relayed = metric(topology, "kubeport_proxy_connections_total", "demo/ranged:http/TCP")
    node_port = (topology.node_ip("a"), RANGED_NODE_PORT)
    lb, by_node_port = as_pod(pods_cgroup, client.ns, ("http", RANGED_LB, 80, 1), ("http", *node_port, 1))
    assert [lb[0]["pod"], by_node_port[0]["pod"]] == ["b1", "b1"]
    relayed_reaches(topology, "demo/ranged:http/TCP", relayed + 2)
    assert metric(topology, "kubeport_proxy_connects_balanced_total", "demo/ranged:http/TCP") == 0


def test_internal_traffic_policy_local_without_a_local_endpoint_is_left_to_the_node(balancing, topology, pod_of,
                                                                                   pods_cgroup):
    """kube-proxy drops it; connect() does not refuse it (a refusal is for a Service with no
    endpoint at all): the connect goes to the Service address, where nothing answers."""
    client = pod_of("a1")
    write(balancing.manifests, "local-only",
          service("local-only", [LOCAL_ONLY], PORTS[:1], internalTrafficPolicy="Local"),
          endpoint_slice("local-only-1", "local-only", [HTTP_SLICE_PORT], [pod_of("b1")]),
          *_dual_stack("local-canary", LOCAL_CANARY, [pod_of("a2")]))
    answered_by(pods_cgroup, client.ns, LOCAL_CANARY[0], "a2")  # the same file: applied with it
    assert one(pods_cgroup, client.ns, "nonblocking", LOCAL_ONLY, 80) == {"error": "EINPROGRESS"}
    assert "pod" not in one(pods_cgroup, client.ns, "http", LOCAL_ONLY, 80)
    assert metric(topology, "kubeport_proxy_connects_balanced_total", "demo/local-only:http/TCP") == 0


def test_an_ipv4_mapped_address_is_left_to_the_relay(balancing, topology, pod_of, pods_cgroup):
    """An AF_INET6 socket dialling ::ffff:<ClusterIP> is not translated, one way or the other
    (programs.py: its sendto would pass the IPv4 hook, its reply the IPv6 one): the relay serves it."""
    client, mapped = pod_of("a1"), f"::ffff:{FAR[0]}"
    answered_by(pods_cgroup, client.ns, FAR[0], "b1")
    relayed = metric(topology, "kubeport_proxy_connections_total", "demo/far:http/TCP")
    flows = metric(topology, "kubeport_proxy_udp_flows_total", "demo/far:udp/UDP")
    balanced = metric(topology, "kubeport_proxy_connects_balanced_total", "demo/far:http/TCP")
    tcp, sendto = as_pod(pods_cgroup, client.ns, ("http", mapped, 80, 2), ("sendto", mapped, 90, 1))
    assert [(reply["pod"], reply["peer"]) for reply in tcp] == [("b1", [mapped, 80])] * 2
    assert [(reply["pod"], reply["source"]) for reply in sendto] == [("b1", [mapped, 90])]
    relayed_reaches(topology, "demo/far:http/TCP", relayed + 2)
    assert metric(topology, "kubeport_proxy_udp_flows_total", "demo/far:udp/UDP") == flows + 1
    assert metric(topology, "kubeport_proxy_connects_balanced_total", "demo/far:http/TCP") == balanced


# --- a daemon killed, restarted, stopped --------------------------------------------------------------


def test_a_killed_daemon_leaves_the_pods_balanced_and_the_next_one_adopts(balancing, topology, pod_of, pods_cgroup):
    client, pod, daemon = pod_of("a1"), pod_of, balancing.daemon
    balancing.write("gone", GONE, [pod("b2")])
    answered_by(pods_cgroup, client.ns, GONE[0], "b2")
    daemon.proc.kill()
    daemon.proc.wait(timeout=10)
    assert {p.name for p in balancing.pins.iterdir()} >= {f"link_{hook}" for hook in LINKS}

    # No daemon runs: the pinned links and maps keep translating.
    tcp, udp, sendto = as_pod(pods_cgroup, client.ns, ("http", FAR[0], 80, 3), ("udp", FAR[1], 90, 1),
                              ("sendto", FAR[0], 90, 1))
    assert tcp == [{"pod": "b1", "client": client.ip(4), "peer": [FAR[0], 80]}] * 3
    assert udp == [{"pod": "b1", "client": client.ip(6), "source": [FAR[1], 90]}]
    assert sendto == [{"pod": "b1", "client": client.ip(4), "source": [FAR[0], 90]}]
    assert one(pods_cgroup, client.ns, "http", GONE[0], 80)["pod"] == "b2"
    balancing.write("late", LATE, [pod("a2")])  # written while nobody serves
    remove(balancing.manifests, "gone")  # and removed: the next instance removes its entry

    balancing.ensure_running()  # the same arguments
    assert "taken over from the previous instance" in log_since_last_start(daemon)
    assert pod_traffic(topology).startswith(f"connect(): cgroup {pods_cgroup.hierarchy_path}")
    only(pods_cgroup, client.ns, LATE[0], {"a2"})
    until_sync(lambda: "error" in one(pods_cgroup, client.ns, "http", GONE[0], 80),
               "the removed Service's address no longer translated", 10, interval=0.1)
    balancing.write("late", LATE, [pod("b2")])  # and a change after the restart
    only(pods_cgroup, client.ns, LATE[0], {"b2"})
    only(pods_cgroup, client.ns, LATE[1], {"b2"})
    assert one(pods_cgroup, client.ns, "http", FAR[1], 80)["pod"] == "b1"

    # A clean stop takes the programs away: the pins go, and a connect is the pod's own again.
    assert daemon.stop() == 0
    assert not balancing.pins.exists()
    if bpftool_or_none():
        until_sync(lambda: not attached_hooks(pods_cgroup), "no program left on the cgroup", 10)
    assert one(pods_cgroup, client.ns, "http", FAR[0], 80).get("pod") is None


def test_client_ip_affinity_outlives_a_restart(balancing, topology, pod_of, pods_cgroup):
    """The next instance takes the affinity map over: every pod stays on its endpoint. (The
    programs translate for any socket of the cgroup, whichever pod's namespace it is in: each of
    the four pods is a client with an affinity of its own, among four endpoints.)"""
    everyone = ["a1", "a2", "b1", "b2"]
    write(balancing.manifests, "kept", *_dual_stack("kept", KEPT, [pod_of(p) for p in everyone],
                                                    sessionAffinity="ClientIP"))
    until_sync(lambda: one(pods_cgroup, pod_of("a1").ns, "http", KEPT[0], 80).get("pod"), "kept answering", 15,
               interval=0.1)

    def sticking() -> dict[str, str]:
        seen = {name: set(pods_answering(pods_cgroup, pod_of(name).ns, KEPT[0], count=5)) for name in everyone}
        assert all(len(pods) == 1 for pods in seen.values()), seen
        return {name: pods.pop() for name, pods in seen.items()}

    before = sticking()
    balancing.daemon.proc.kill()
    balancing.daemon.proc.wait(timeout=10)
    balancing.ensure_running()
    write(balancing.manifests, "kept-canary", *_dual_stack("kept-canary", KEPT_CANARY, [pod_of("b2")]))
    answered_by(pods_cgroup, pod_of("a1").ns, KEPT_CANARY[0], "b2")  # this instance's programs now
    assert "taken over from the previous instance" in log_since_last_start(balancing.daemon)
    assert sticking() == before


def test_cleanup_after_kill_9_removes_the_pins_and_detaches(balancing, topology, pod_of, pods_cgroup, bpffs):
    client, daemon = pod_of("a1"), balancing.daemon
    answered_by(pods_cgroup, client.ns, FAR[0], "b1")
    bpftool = bpftool_or_none()
    if bpftool:
        assert attached_hooks(pods_cgroup) == set(LINKS)
    daemon.proc.kill()
    daemon.proc.wait(timeout=10)
    assert one(pods_cgroup, client.ns, "http", FAR[0], 80)["pod"] == "b1"  # still translated

    out = kubeport(topology.node("a"), "--cleanup", "--hostname-override=node-a", f"--bpf-root={bpffs}")
    assert f"removed connect-time balancing pins in {balancing.pins}" in out, out
    assert not balancing.pins.exists()
    if bpftool:
        until_sync(lambda: not attached_hooks(pods_cgroup), "no program left on the cgroup", 10)
    # Not translated any more: the Service address is dialled as such, and nothing serves it now.
    until_sync(lambda: one(pods_cgroup, client.ns, "http", FAR[0], 80).get("pod") is None,
               "connects to the Service address no longer translated", 10)
    assert "nothing to remove" in kubeport(topology.node("a"), "--cleanup", "--hostname-override=node-a",
                                           f"--bpf-root={bpffs}")


def test_a_next_instance_that_cannot_attach_unpins_what_the_killed_one_left(balancing, topology, pod_of,
                                                                           pods_cgroup, bpffs, tmp_path):
    """Else the dead instance's programs would go on translating with its last endpoints, while
    the status and the problem line say the relay serves the pods."""
    client, pod = pod_of("a1"), pod_of
    balancing.write("moved", MOVED, [pod("b1")])
    answered_by(pods_cgroup, client.ns, MOVED[0], "b1")
    balancing.daemon.proc.kill()
    balancing.daemon.proc.wait(timeout=10)
    missing = f"{pods_cgroup.hierarchy_path}-missing"
    daemon = KubeportDaemon(topology.node("a"), balancing.manifests, tmp_path / "state", *DAEMON_ARGS, *FAST_STOP,
                            f"--connect-balancing-cgroup={missing}", f"--bpf-root={bpffs}")
    daemon.wait_ready(timeout=30)
    assert pod_traffic(topology).startswith(f"relay: cgroup {missing} does not exist")
    assert any(f"connect-time balancing is off, the relay serves the node's pods: cgroup {missing}" in line
               for line in problems_of(topology.node("a")))
    assert not balancing.pins.exists()
    balancing.write("moved", MOVED, [pod("b2")])
    answered_by(None, client.ns, MOVED[0], "b2")  # the relay has the change
    relayed = metric(topology, "kubeport_proxy_connections_total", "demo/moved:http/TCP")
    assert pods_answering(pods_cgroup, client.ns, MOVED[0], count=3) == ["b2"] * 3
    relayed_reaches(topology, "demo/moved:http/TCP", relayed + 3)
    assert daemon.stop() == 0


def test_a_next_instance_without_connect_balancing_unpins_what_the_killed_one_left(balancing, topology, pod_of,
                                                                                   pods_cgroup, bpffs, tmp_path):
    """--no-connect-balancing after a crash: the dead instance's programs must not go on sending
    the pods to its last endpoints while the status says the relay serves them."""
    client, pod = pod_of("a1"), pod_of
    balancing.write("moved", MOVED, [pod("b1")])
    answered_by(pods_cgroup, client.ns, MOVED[0], "b1")
    balancing.daemon.proc.kill()
    balancing.daemon.proc.wait(timeout=10)
    daemon = KubeportDaemon(topology.node("a"), balancing.manifests, tmp_path / "state", *DAEMON_ARGS, *FAST_STOP,
                            "--no-connect-balancing", f"--bpf-root={bpffs}")
    daemon.wait_ready(timeout=30)
    assert pod_traffic(topology) == "relay: --no-connect-balancing"
    assert not balancing.pins.exists()
    if bpftool_or_none():
        until_sync(lambda: not attached_hooks(pods_cgroup), "no program left on the cgroup", 10)
    balancing.write("moved", MOVED, [pod("b2")])
    answered_by(None, client.ns, MOVED[0], "b2")  # the relay has the change
    assert pods_answering(pods_cgroup, client.ns, MOVED[0], count=3) == ["b2"] * 3
    assert daemon.stop() == 0


def test_no_connect_balancing_leaves_the_pods_to_the_relay(cluster, topology, pod_of, pods_cgroup, tmp_path):
    cluster.daemon.stop()  # one daemon per node: this one instead of the module's
    daemon = KubeportDaemon(topology.node("a"), cluster.manifests, tmp_path / "state", *DAEMON_ARGS, *FAST_STOP,
                            "--no-connect-balancing")
    daemon.wait_ready(timeout=30)
    assert pod_traffic(topology) == "relay: --no-connect-balancing"
    client = pod_of("a1")
    answered_by(pods_cgroup, client.ns, FAR[0], "b1")
    relayed = metric(topology, "kubeport_proxy_connections_total", "demo/far:http/TCP")
    inside = as_pod(pods_cgroup, client.ns, ("http", FAR[0], 80, 3))[0]
    assert [reply["pod"] for reply in inside] == ["b1"] * 3
    relayed_reaches(topology, "demo/far:http/TCP", relayed + 3)
    assert metric(topology, "kubeport_proxy_connects_balanced_total", "demo/far:http/TCP") == 0
    if bpftool_or_none():
        assert not attached_hooks(pods_cgroup)
    assert daemon.stop() == 0

"""The node's pods reach Services straight at an endpoint: balanced inside their own connect().

node-a's daemon attaches its programs to a cgroup of this module's, and the pods' processes
this module runs as that node's pods (curl, a Python client) join it first: their sockets then
connect to the endpoint itself. Nothing of kubeport's is on the path (its relay counts no
connection for the Service port, the programs count the connects), the endpoint sees the pod,
and the application still sees the Service address it dialled (getpeername).
"""

from __future__ import annotations

import json

import pytest

from support.netns import CommandFailed, http_url, parse_pod_reply, run_in, until_sync
from support.netns.cgroups import TestCgroup, connect_balancing_possible, mount_bpffs, unmount
from support.netns.daemon import status_api
from support.netns.manifests import endpoint, endpoint_slice, node, service, start_daemon, write
from support.netns.policies import FAST_STOP, HTTP_SLICE_PORT, UDP_SLICE_PORT
from support.netns.proc import in_ns

pytestmark = pytest.mark.integration

VIP = "10.96.0.70"
PORTS = [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080},
         {"name": "udp", "protocol": "UDP", "port": 90, "targetPort": 9090}]
SLICE_PORTS = (HTTP_SLICE_PORT, UDP_SLICE_PORT)


@pytest.fixture(scope="module")
def pods_cgroup():
    why = connect_balancing_possible()
    if why is not None:
        pytest.fail(f"connect-time balancing cannot be tested here: {why}")
    cgroup = TestCgroup("connect-balancing-pods")
    yield cgroup
    cgroup.remove()


@pytest.fixture(scope="module")
def bpffs(tmp_path_factory):
    where = mount_bpffs(tmp_path_factory.mktemp("bpffs"))
    yield where
    unmount(where)


@pytest.fixture(scope="module")
def cluster(topology, pods, pods_cgroup, bpffs, tmp_path_factory):
    manifests, state = tmp_path_factory.mktemp("manifests"), tmp_path_factory.mktemp("state")
    write(manifests, "nodes", node(topology, "a"), node(topology, "b"))
    daemon = start_daemon(topology, "a", manifests, state, *FAST_STOP,
                          f"--connect-balancing-cgroup={pods_cgroup.hierarchy_path}", f"--bpf-root={bpffs}")
    try:
        yield manifests, daemon
    finally:
        daemon.stop()


def in_pods_cgroup(cgroup: TestCgroup, ns: str, *cmd, timeout: float = 10.0, check: bool = True):
    return run_in(None, *cgroup.command(in_ns(ns, cmd)), timeout=timeout, check=check)


def curl_as_pod(cgroup: TestCgroup, ns: str, url: str, timeout: float = 3.0) -> str:
    return in_pods_cgroup(cgroup, ns, "curl", "-sS", "-g", "--noproxy", "*", "--max-time", f"{timeout:g}", url,
                          timeout=timeout + 5).stdout


def test_status_says_the_pods_are_balanced_at_connect(cluster, topology, pods_cgroup):
    traffic = status_api(topology.node("a"), "/api/v1/status")["proxy"]["podTraffic"]
    assert traffic.startswith(f"connect(): cgroup {pods_cgroup.hierarchy_path}, pinned in "), traffic


def test_pod_to_cluster_ip_reaches_the_endpoint_directly(cluster, topology, pod_of, pods_cgroup):
    manifests, daemon = cluster
    client = pod_of("a1")
    write(manifests, "direct", service("direct", [VIP], PORTS),
          endpoint_slice("direct-1", "direct", SLICE_PORTS, [endpoint(pod_of("b1"))]))

    def answered() -> str:
        return parse_pod_reply(curl_as_pod(pods_cgroup, client.ns, http_url(VIP, 80)))

    until_sync(lambda: answered()[0] == "b1", "b1 answering through the ClusterIP", 15, interval=0.2,
               ignore=(CommandFailed,))
    assert answered() == ("b1", client.ip(4))
    metrics = run_in(topology.node("a"), "curl", "-s", "http://127.0.0.1:10249/metrics").stdout
    balanced = [line for line in metrics.splitlines() if line.startswith("kubeport_proxy_connects_balanced_total")]
    counted = [line for line in balanced if 'service_port="demo/direct:http/TCP"' in line]
    assert counted and not counted[0].endswith(" 0.0"), balanced
    relayed = [line for line in metrics.splitlines()
               if line.startswith('kubeport_proxy_connections_total{service_port="demo/direct:http/TCP"')]
    assert not relayed or relayed[0].endswith(" 0.0"), relayed


PEERNAME = r"""
import json, socket, sys
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
print(json.dumps([sock.getpeername()[:2], sock.getsockname()[0]]))
"""


def test_getpeername_is_the_service_address(cluster, topology, pod_of, pods_cgroup):
    manifests, _ = cluster
    write(manifests, "direct", service("direct", [VIP], PORTS),
          endpoint_slice("direct-1", "direct", SLICE_PORTS, [endpoint(pod_of("b1"))]))
    client = pod_of("a1")
    until_sync(lambda: parse_pod_reply(curl_as_pod(pods_cgroup, client.ns, http_url(VIP, 80)))[0] == "b1",
               "b1 answering", 15, interval=0.2, ignore=(CommandFailed,))
    done = in_pods_cgroup(pods_cgroup, client.ns, "python3", "-c", PEERNAME, VIP, "80")
    assert json.loads(done.stdout) == [[VIP, 80], client.ip(4)]

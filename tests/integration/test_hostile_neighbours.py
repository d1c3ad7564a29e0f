"""An unfriendly user of the node against the daemon: files that block or never end in the
manifest directory, a takeover from another user, a squatter on the handover socket,
/readyz asked from the network, and the descriptors run out by relayed connections.

During each attack pods still resolve with dig and connect with curl: the node's DNS and
proxy go on serving, and the attack is a problem line naming what it was.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.netns import (
    DNS_SERVICE_IP,
    HEALTHZ_PORT,
    METRICS_PORT,
    CommandFailed,
    KubeportDaemon,
    pod_answering,
    run_in,
    spawn_in,
    until_sync,
    wait_for_output,
)
from support.netns.daemon import kubeport_bin, problems_of, status_api
from support.netns.manifests import DAEMON_ARGS, endpoint_slice, node, service, write

pytestmark = pytest.mark.integration

WEB_IP = "10.96.0.20"
WEB_NAME = "web.demo.svc.cluster.local"
HTTP = {"name": "http", "protocol": "TCP", "port": 8080}
WEB_PORTS = [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": "http"}]
PLANTED = "planted-value-7d41"
NOBODY = "65534"
# Another user's process: a user namespace made by an unprivileged user maps one uid, its own.
ANOTHER_USER = pytest.mark.host_privileges("a process of another uid (a user namespace maps only its maker's)")


def cluster_manifests(directory, topology, which: str) -> None:
    pods = [pod for pod in topology.pods if pod.node.name == topology.node_spec(which).name]
    write(directory, "nodes", node(topology, "a"), node(topology, "b"))
    write(directory, "web", service("web", [WEB_IP], WEB_PORTS), endpoint_slice("web-v4", "web", [HTTP], pods))
    write(directory, "kube-dns", service("kube-dns", ["10.96.0.10"], [
        {"name": "dns", "protocol": "UDP", "port": 53}, {"name": "dns-tcp", "protocol": "TCP", "port": 53}],
        namespace="kube-system"))


def start(topology, which: str, manifests, state, *extra: str, program=None) -> KubeportDaemon:
    daemon = KubeportDaemon(topology.node(which), manifests, state, *DAEMON_ARGS, "--upstream", "192.168.50.200",
                            *extra, program=program)
    daemon.wait_ready(timeout=30)
    return daemon


def problems(ns: str) -> list[str]:
    """The problem lines of the status API (what `kubeport get` prints)."""
    return problems_of(ns)


def status(ns: str, timeout: float = 2) -> dict:
    return status_api(ns, "/api/v1/status", timeout)


def problem_about(ns: str, text: str, timeout: float = 10.0) -> str:
    return until_sync(lambda: next((line for line in problems(ns) if text in line), None),
                      f"a problem line with {text!r}", timeout, ignore=(ValueError,))


def assert_serving(topology, pod: str) -> None:
    """DNS answers (dig) and the ClusterIP relays (curl), from a pod."""
    answer = run_in(pod, "dig", "+time=2", "+tries=1", f"@{DNS_SERVICE_IP}", "+short", WEB_NAME, timeout=10).stdout
    assert answer.split() == [WEB_IP], answer
    assert pod_answering(pod, WEB_IP, 80) in {p.name for p in topology.pods}


@pytest.fixture(scope="module")
def node_a(topology, pods, tmp_path_factory):
    manifests = tmp_path_factory.mktemp("manifests")
    cluster_manifests(manifests, topology, "a")
    daemon = start(topology, "a", manifests, tmp_path_factory.mktemp("state") / "a")
    yield daemon
    daemon.stop()


# --- files that are not regular files, or too large -----------------------------------------------


def test_a_fifo_named_yaml_is_a_problem_line_and_the_daemon_serves_and_stops(topology, node_a):
    ns, manifests, pod = node_a.ns, node_a.manifests_dir, topology.pod("a", 1)
    subprocess.run(["mkfifo", manifests / "x.yaml"], check=True)
    try:
        line = problem_about(ns, "x.yaml")
        assert line == "x.yaml: not read: a named pipe (FIFO), not a regular file"
        assert_serving(topology, pod)
        # The watch still applies edits: the loop is not stuck in a read.
        write(manifests, "more", service("more", ["10.96.0.21"], WEB_PORTS))
        until_sync(lambda: run_in(pod, "dig", "+time=2", "+tries=1", "+short", f"@{DNS_SERVICE_IP}",
                                  "more.demo.svc.cluster.local").stdout.split() == ["10.96.0.21"] or None,
                   "more.json applied", 10)
        # A restart with the FIFO in place: SIGTERM is obeyed, the first load does not hang.
        assert node_a.stop() == 0
        node_a.start()
        node_a.wait_ready(timeout=30)
        assert problem_about(ns, "x.yaml") == line
        assert_serving(topology, pod)
        assert "cannot keep copies" not in node_a.log_text()
    finally:
        (manifests / "x.yaml").unlink()
        (manifests / "more.json").unlink(missing_ok=True)


def test_a_link_to_dev_zero_is_not_read(topology, node_a):
    ns, manifests = node_a.ns, node_a.manifests_dir
    subprocess.run(["ln", "-s", "/dev/zero", manifests / "zero.yaml"], check=True)
    try:
        assert problem_about(ns, "zero.yaml") == (
            "zero.yaml: not read: a symbolic link to a character device (/dev/zero), not a regular file")
        assert_serving(topology, topology.pod("a", 2))
        assert node_a.running
        proc_status = Path(f"/proc/{_daemon_pid(node_a)}/status").read_text()
        rss_kib = int(next(line.split()[1] for line in proc_status.splitlines() if line.startswith("VmRSS:")))
        assert rss_kib < 400 * 1024, rss_kib  # it read nothing of /dev/zero
    finally:
        (manifests / "zero.yaml").unlink()


def test_a_socket_file_and_an_oversized_file_are_not_read(topology, node_a):
    ns, manifests = node_a.ns, node_a.manifests_dir
    subprocess.run([sys.executable, "-c", "import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])",
                    manifests / "sock.yaml"], check=True)
    subprocess.run(["truncate", "-s", "65M", manifests / "big.yaml"], check=True)  # past the 64 MiB default
    try:
        assert problem_about(ns, "sock.yaml") == "sock.yaml: not read: a socket, not a regular file"
        assert problem_about(ns, "big.yaml") == (
            "big.yaml: not read: 65 MiB, over the limit of 64 MiB per file (manifestLimits.fileBytes)")
        assert_serving(topology, topology.pod("a", 1))
    finally:
        (manifests / "sock.yaml").unlink()
        (manifests / "big.yaml").unlink()
    until_sync(lambda: not any("big.yaml" in p or "sock.yaml" in p for p in problems(ns)), "problems gone", 10)


def _daemon_pid(daemon: KubeportDaemon) -> int:
    """The kubeport process (``ip netns exec`` execs it: the spawned pid is kubeport's)."""
    return daemon.proc.pid


# --- the handover socket ----------------------------------------------------------------------


KNOCK = """
import socket, sys
c = socket.socket(socket.AF_UNIX)
c.connect("\\0kubeport/" + sys.argv[1])
try:
    c.sendall(b"takeover\\n")
    print(c.recv(100).decode().strip() or "closed", flush=True)
except (BrokenPipeError, ConnectionResetError):
    print("closed", flush=True)
"""


@ANOTHER_USER
def test_a_takeover_from_another_user_is_refused_and_the_daemon_keeps_serving(topology, node_a):
    ns = node_a.ns
    knocked = run_in(ns, "setpriv", "--reuid", NOBODY, "--regid", NOBODY, "--clear-groups",
                     sys.executable, "-c", KNOCK, node_a.node_name)
    assert knocked.stdout.strip() == "closed"  # never "leaving"
    line = problem_about(ns, "refused")
    assert line.startswith(f"handover: refused 1 connection(s) to @kubeport/{node_a.node_name} from other users, "
                           "the last from pid ") and f"(uid {NOBODY})" in line
    assert node_a.running and node_a.readyz().status == 200
    assert status(ns)["handover"]["holdsNode"] is True
    assert_serving(topology, topology.pod("a", 2))


SQUAT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind("\\0kubeport/" + sys.argv[1])
s.listen(64)
print("bound", flush=True)
while True:
    c, _ = s.accept()
    try:
        c.sendall(b"refused\\n")
    except OSError:
        pass
    c.close()
"""


@ANOTHER_USER
def test_a_squatter_on_the_handover_socket_is_reported_and_the_node_is_served(topology, pods, tmp_path):
    node_ns = topology.node("b")
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    cluster_manifests(manifests, topology, "b")
    node_name = topology.node_spec("b").name
    squatter = spawn_in(node_ns, "setpriv", "--reuid", NOBODY, "--regid", NOBODY, "--clear-groups",
                        sys.executable, "-u", "-c", SQUAT, node_name, stdout=subprocess.PIPE)
    wait_for_output(squatter, b"bound", 10, "the squatter")
    daemon = start(topology, "b", manifests, tmp_path / "state")  # ready: it does not wait on the squatter
    line = problem_about(node_ns, "not kubeport")
    assert line.startswith(f"handover: the node's socket @kubeport/{node_name} is held by pid ")
    assert f"(uid {NOBODY}), which is not kubeport" in line
    assert_serving(topology, topology.pod("b", 1))
    assert squatter.poll() is None  # still squatting all along
    squatter.kill()
    squatter.wait()
    until_sync(lambda: status(node_ns)["handover"]["holdsNode"] or None, "the name taken once the squatter left", 10)
    until_sync(lambda: not any("not kubeport" in p for p in problems(node_ns)), "the squatter line gone", 5)
    assert_serving(topology, topology.pod("b", 2))
    daemon.stop()


# --- what the network may learn -------------------------------------------------------------------


def test_readyz_from_the_network_shows_no_problem_details(topology, node_a):
    ns, manifests = node_a.ns, node_a.manifests_dir
    broken = service("broken", ["10.96.0.22"], [{"name": PLANTED.upper(), "port": 80}])
    write(manifests, "broken", broken)
    try:
        assert PLANTED.upper() in problem_about(ns, "broken.json")
        node_ip = topology.node_ip("a")
        remote = run_in(topology.client, "curl", "-sS", "--max-time", "2", "-w", "\n%{http_code}",
                        f"http://{node_ip}:{HEALTHZ_PORT}/readyz").stdout
        body, _, code = remote.rpartition("\n")
        assert code == "200" and json.loads(body) == {"ready": True, "pending": []}
        assert PLANTED.upper() not in remote and "broken" not in remote
        for port in (HEALTHZ_PORT, METRICS_PORT):  # nor to another user of the node itself, on loopback
            local = run_in(ns, "curl", "-sS", "--max-time", "2", f"http://127.0.0.1:{port}/readyz").stdout
            assert PLANTED.upper() not in local and "broken" not in local, port
        assert PLANTED.upper() in json.dumps(status_api(ns, "/readyz"))  # root, on the status socket
        healthz = json.loads(run_in(topology.client, "curl", "-sS", "--max-time", "2",
                                    f"http://{node_ip}:{HEALTHZ_PORT}/healthz").stdout)
        assert set(healthz) <= {"lastUpdated", "currentTime", "nodeEligible", "healthy", "status"}
    finally:
        (manifests / "broken.json").unlink()


# --- out of descriptors -----------------------------------------------------------------------


ROUNDS = 20

HOLD = """
import resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex((sys.argv[1], 80))
    held.append(s)
print("opened", len(held), flush=True)
# Then a connection every millisecond, as a busy client would: the proxy always has one to accept.
churn = []
while True:
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex((sys.argv[1], 80))
    churn.append(s)
    if len(churn) > 200:
        churn.pop(0).close()
    time.sleep(0.001)
"""


def test_out_of_descriptors_the_status_api_dns_and_health_port_keep_answering(topology, pods, tmp_path):
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    cluster_manifests(manifests, topology, "b")
    program = ["prlimit", "--nofile=1024:1024", str(kubeport_bin())]
    daemon = start(topology, "b", manifests, tmp_path / "state", program=program)
    ns, pod = daemon.ns, topology.pod("b", 1)
    holder = spawn_in(topology.pod("b", 2), sys.executable, "-u", "-c", HOLD, WEB_IP, "2000",
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        wait_for_output(holder, b"opened 2000", 20, "the connection holder")
        until_sync(lambda: "Too many open files" in daemon.log_text() or None, "the proxy out of descriptors", 20)
        # Relayed connections hold descriptors in pairs: one more listener (a UDP service) flips
        # whether the limit is met at an accept or at a backend socket. Both must leave a reserve.
        slowest = [_rounds(ns, pod)]
        write(manifests, "udp", service("udp", ["10.96.0.23"], [{"name": "u", "protocol": "UDP", "port": 90}]))
        until_sync(lambda: run_in(pod, "dig", "+time=1", "+tries=1", "+short", f"@{DNS_SERVICE_IP}",
                                  "udp.demo.svc.cluster.local").stdout.split() == ["10.96.0.23"] or None,
                   "the UDP service applied", 10)
        slowest.append(_rounds(ns, pod))
        print("out of descriptors: the slowest round of the status API, DNS over TCP and /healthz took "
              + ", ".join(f"{value:.3f} s" for value in slowest))
        assert daemon.running
    finally:
        holder.kill()
        holder.wait()
    until_sync(lambda: _answers(pod), "the ClusterIP relays again once the load left", 15)
    daemon.stop()


def _rounds(ns: str, pod: str) -> float:
    """The status API, DNS over TCP and /healthz, each answering every time within a second; the slowest round."""
    slowest = 0.0
    for _ in range(ROUNDS):
        started = time.monotonic()
        assert status(ns, timeout=1)["ready"] is True
        answer = run_in(pod, "dig", "+time=1", "+tries=1", "+tcp", f"@{DNS_SERVICE_IP}", "+short", WEB_NAME).stdout
        assert answer.split() == [WEB_IP]
        health = run_in(ns, "curl", "-sS", "--max-time", "1", "-o", "/dev/null", "-w", "%{http_code}",
                        f"http://127.0.0.1:{HEALTHZ_PORT}/healthz").stdout
        assert health == "200"
        slowest = max(slowest, time.monotonic() - started)
    return slowest


def _answers(pod: str) -> bool:
    try:
        pod_answering(pod, WEB_IP, 80, timeout=1)
        return True
    except (CommandFailed, ValueError):
        return False


def test_a_takeover_no_instance_follows_ends_the_daemon_non_zero(topology, pods, tmp_path):
    """Root may ask the daemon to leave; if nothing takes the node, exit 0 would leave it unserved
    for good (``Restart=on-failure`` would not bring it back)."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    cluster_manifests(manifests, topology, "b")
    daemon = start(topology, "b", manifests, tmp_path / "state")
    knocked = run_in(daemon.ns, sys.executable, "-c", KNOCK, daemon.node_name)  # as root: trusted
    assert knocked.stdout.strip() == "leaving"
    until_sync(lambda: not daemon.running or None, "the daemon gone", 20)
    assert daemon.proc.returncode not in (0, None)
    assert "but no instance took it: exiting non-zero" in daemon.log_text()

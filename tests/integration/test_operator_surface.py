"""The operator's surface of a real daemon: kube-proxy's flag forms, a disabled metrics server,
process metrics without *_created series, a busy health-check node port retried until it opens,
the HTTP ports as curl sees them, and what another local user can read of them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kubeport.status import STATUS_SOCKET

from support.netns import CommandFailed, KubeportDaemon, curl_in, kubeport, run_in, spawn_in, stop_process, until_sync
from support.netns.daemon import kubeport_bin, problems_of
from support.netns.manifests import DAEMON_ARGS, endpoint_slice, node, service, write

pytestmark = pytest.mark.integration

METRICS = "127.0.0.1:10249"
ETP_IP = "10.96.0.60"
HEALTH_PORT = 30190


@pytest.fixture
def manifests(topology, tmp_path) -> Path:
    directory = tmp_path / "manifests"
    directory.mkdir()
    write(directory, "node", node(topology, "a"))
    write(directory, "etp",
          service("etp", [ETP_IP], [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30191}],
                  type="LoadBalancer", externalTrafficPolicy="Local", healthCheckNodePort=HEALTH_PORT),
          endpoint_slice("etp-1", "etp", [{"name": "http", "port": 8080}], [topology.pod_info("a", 1)]))
    return directory


def daemon(topology, manifests: Path, tmp_path: Path, *extra: str) -> KubeportDaemon:
    started = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS, *extra)
    started.wait_ready(timeout=30)
    return started


def test_kube_proxy_flag_forms_and_disabled_metrics_server(topology, manifests, tmp_path):
    ns = topology.node("a")
    kp = daemon(topology, manifests, tmp_path, "--v=2", "--conntrack-udp-timeout", "5s",
                "--conntrack-udp-timeout-stream", "1m", "--metrics-bind-address", "")
    with pytest.raises(CommandFailed) as refused:
        curl_in(ns, f"http://{METRICS}/metrics", timeout=2)
    assert refused.value.returncode == 7  # nothing listens there
    got = run_in(ns, kubeport_bin(), "get", "svc", "-A", "--server", METRICS, check=False)
    assert got.returncode == 1
    assert f"cannot reach the daemon at http://{METRICS}" in got.stderr
    assert "metrics server disabled" in kp.log_text()
    assert "etp" in kubeport(ns, "get", "svc", "-A")  # the status socket does not depend on it
    assert kp.stop() == 0


def test_metrics_have_process_series_and_no_created_series(topology, manifests, tmp_path):
    daemon(topology, manifests, tmp_path)
    text = curl_in(topology.node("a"), f"http://{METRICS}/metrics")
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
                 "python_gc_collections_total", "kubeproxy_sync_proxy_rules_duration_seconds_count"):
        assert f"\n{name}" in text, name
    assert "_created" not in text


def problems(ns: str) -> str:
    return "\n".join(problems_of(ns))


def test_busy_health_check_node_port_is_retried_until_it_opens(topology, manifests, tmp_path):
    ns, node_ip = topology.node("a"), topology.node_spec("a").lan_ips[0]
    blocker = spawn_in(ns, sys.executable, "-I", "-c",
                       "import socket, sys, time; s = socket.socket(); "
                       f"s.bind(('0.0.0.0', {HEALTH_PORT})); s.listen(); print('bound', flush=True); time.sleep(120)",
                       stdout=subprocess.PIPE, text=True)
    assert blocker.stdout.readline().strip() == "bound"
    daemon(topology, manifests, tmp_path)
    failure = f"failed to start healthcheck 'demo/etp' on port {HEALTH_PORT}"
    until_sync(lambda: failure in problems(ns), "the busy port among the problems", 10)
    stop_process(blocker)
    # Nothing else changes: no new snapshot arrives, only the retry (1 s doubling to 30 s) opens it.
    until_sync(lambda: curl_in(ns, f"http://{node_ip}:{HEALTH_PORT}/healthz", timeout=2),
               "health-check node port open after the retry", 40, ignore=(CommandFailed,))
    assert '"localEndpoints": 1' in curl_in(ns, f"http://{node_ip}:{HEALTH_PORT}/healthz")
    assert failure not in problems(ns)


def test_nodeport_addresses_matching_nothing_open_no_health_check_port(topology, manifests, tmp_path):
    """nodeport_addresses.go matches nothing: no NodePort, and service_health.go opens no port."""
    ns, node_ip = topology.node("a"), topology.node_spec("a").lan_ips[0]
    kp = daemon(topology, manifests, tmp_path, "--nodeport-addresses", "10.9.0.0/16,fd09::/64")
    said = "nodePortAddresses '10.9.0.0/16,fd09::/64': no local IPv4 address in 10.9.0.0/16"
    until_sync(lambda: said in problems(ns), "the unmatched nodePortAddresses among the problems", 10)
    for host in (node_ip, "127.0.0.1"):  # not the wildcard: nowhere at all
        with pytest.raises(CommandFailed) as refused:
            curl_in(ns, f"http://{host}:{HEALTH_PORT}/healthz", timeout=2)
        assert refused.value.returncode == 7
    assert f"failed to start healthcheck 'demo/etp' on port {HEALTH_PORT}" not in problems(ns)
    assert kp.log_text().count(said) == 1
    assert kp.stop() == 0


def test_http_ports_answer_curl_as_gos_servers_and_map_no_aiohttp(topology, manifests, tmp_path):
    """HEAD, POST, HTTP/1.0 and a kept connection on each port; the daemon serving manifests never
    loads aiohttp (its C extensions and multidict's, yarl's would be mapped)."""
    ns, node_ip = topology.node("a"), topology.node_spec("a").lan_ips[0]
    kp = daemon(topology, manifests, tmp_path)
    health = f"http://{node_ip}:{HEALTH_PORT}/any/path"
    until_sync(lambda: curl_in(ns, health, timeout=2), "health-check node port open", 10, ignore=(CommandFailed,))
    head = curl_in(ns, health, "-I").splitlines()  # text mode: CRLF read as newlines
    assert head[0] == "HTTP/1.1 200 OK" and "X-Load-Balancing-Endpoint-Weight: 1" in head
    assert [line for line in head if line.startswith("Date: ") and line.endswith(" GMT")]
    assert [line for line in head if line.startswith("Content-Length: ")] != ["Content-Length: 0"]
    assert '"localEndpoints": 1' in curl_in(ns, health, "-X", "POST", "-d", "ignored")
    assert curl_in(ns, "http://127.0.0.1:10256/livez", "-0", "-o", "/dev/null", "-w", "%{http_code}") == "200"
    # Two URLs, one connection: the second transfer connects nowhere new.
    both = curl_in(ns, f"http://{METRICS}/proxyMode", "-w", " %{num_connects}\n", f"http://{METRICS}/healthz")
    assert both == "ok 1\nuserspace-splice 0\n"  # curl_in puts its url last
    assert curl_in(ns, f"http://{METRICS}/proxyMode", "-X", "DELETE", "-o", "/dev/null",
                   "-w", "%{http_code}") == "405"
    assert curl_in(ns, f"http://{METRICS}/nothing", "-o", "/dev/null", "-w", "%{http_code}") == "404"
    maps = Path(f"/proc/{kp.proc.pid}/maps").read_text()
    assert not [line for line in maps.splitlines() if any(name in line for name in ("aiohttp", "multidict", "yarl"))]
    assert kp.stop() == 0


# --- what another user of the node reads ---------------------------------------------------------

PLANTED = "planted-name-5e0c"
AS_NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--")
_ASK_EVERY_LISTENER = """
import json, socket, sys
asked = {}
for host, port in json.loads(sys.argv[1]):
    for path in ("/", "/readyz", "/api/v1/services", "/api/v1/problems", "/api/v1/status", "/api/v1/pods"):
        try:
            with socket.create_connection((host, port), timeout=2) as sock:
                sock.sendall(f"GET {path} HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n".encode())
                got = b""
                while chunk := sock.recv(65536):
                    got += chunk
        except OSError as exc:
            got = repr(exc).encode()
        asked[f"{host}:{port}{path}"] = got.decode(errors="replace")
print(json.dumps(asked))
"""


_ASK_UNIX = """
import json, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(5)
sock.connect(sys.argv[1])  # the socket's mode lets anyone connect: what answers is the daemon's to say
got = b""
try:
    sock.sendall(f"GET {sys.argv[2]} HTTP/1.0\\r\\n\\r\\n".encode())
    while chunk := sock.recv(65536):
        got += chunk
except (BrokenPipeError, ConnectionResetError):
    pass
print(json.dumps({"connected": True, "answer": got.decode(errors="replace")}))
"""


def tcp_listeners(ns: str, pid: int) -> list[tuple[str, int]]:
    """Every TCP socket the daemon listens on (its own ports and the Services' frontends)."""
    out = run_in(ns, "ss", "-Hltnp").stdout
    found = []
    for line in out.splitlines():
        if f"pid={pid}," not in line:
            continue
        host, _, port = line.split()[3].rpartition(":")
        host = host.strip("[]").split("%")[0]
        found.append(({"*": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host), int(port)))
    return sorted(set(found))


@pytest.mark.host_privileges("a process of another uid (a user namespace maps only its maker's)")
def test_another_local_user_reads_metrics_only__kubeport_get_as_root_unchanged(topology, pods, manifests, tmp_path):
    """As uid 65534 on the node: every TCP listener of the daemon, asked for the status API's
    paths, tells nothing of the Services; the status socket refuses it (its mode, and
    SO_PEERCRED where the mode would not), and `kubeport get` says so in one line."""
    ns = topology.node("a")
    write(manifests, "planted", service(PLANTED, ["10.96.0.61"], [{"name": "http", "port": 80, "targetPort": 8080}]))
    kp = daemon(topology, manifests, tmp_path, "--healthz-bind-address", "0.0.0.0:10256")
    until_sync(lambda: PLANTED in kubeport(ns, "get", "svc", "-A"), "the planted Service served", 10)
    listeners = tcp_listeners(ns, kp.proc.pid)
    assert ("127.0.0.1", 10249) in listeners and len(listeners) > 3
    asked = json.loads(run_in(ns, *AS_NOBODY, sys.executable, "-I", "-c", _ASK_EVERY_LISTENER,
                              json.dumps(listeners), timeout=60).stdout)
    leaked = {where: text[:200] for where, text in asked.items() if PLANTED in text}
    assert not leaked, leaked
    assert "kubeproxy_sync_proxy_rules_duration_seconds" in curl_in(ns, f"http://{METRICS}/metrics")

    socket_path = kp.state_dir / STATUS_SOCKET
    refused = run_in(ns, *AS_NOBODY, "curl", "-sS", "--max-time", "2", "--unix-socket", str(socket_path),
                     "http://kubeport/api/v1/services", check=False)
    assert refused.returncode == 7 and PLANTED not in refused.stdout  # connect(): permission denied
    got = run_in(ns, *AS_NOBODY, kubeport_bin(), "get", "svc", "-A", check=False)
    assert got.returncode == 1 and PLANTED not in got.stdout
    assert got.stderr.splitlines() == [f"kubeport: {socket_path}: permission denied: the status API is root's and "
                                       "the daemon user's only"]
    # A mode opened by mistake, in a directory anyone may enter (a hard link to the socket):
    # the daemon still answers only root and its own user.
    public = Path(tempfile.mkdtemp(prefix="kubeport-public-", dir="/tmp"))
    try:
        public.chmod(0o755)
        os.link(socket_path, public / STATUS_SOCKET)
        socket_path.chmod(0o666)
        asked = json.loads(run_in(ns, *AS_NOBODY, sys.executable, "-I", "-c", _ASK_UNIX, str(public / STATUS_SOCKET),
                                  "/api/v1/services").stdout)
        assert asked == {"connected": True, "answer": ""}, asked  # connected, then closed unanswered
    finally:
        shutil.rmtree(public)
    assert PLANTED in kubeport(ns, "get", "svc", "-A")  # root, unchanged

"""`kubeport get --server`: a bare HOST:PORT means http://, bad values and unreachable daemons are one clear line."""

from __future__ import annotations

import asyncio
import json
import socket
import stat
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry

from kubeport import cli
from kubeport.endpoints.types import Snapshot
from kubeport.get_client import find_status_socket, resource_path, server_url, status_sockets
from kubeport.status import STATUS_SOCKET, StatusServer, StatusSocketError


@pytest.mark.parametrize(
    "server, url",
    [
        pytest.param("127.0.0.1:10249", "http://127.0.0.1:10249", id="bare_host_port_is_http"),
        pytest.param("[::1]:10249", "http://[::1]:10249", id="bare_ipv6_in_brackets"),
        pytest.param("localhost:10249", "http://localhost:10249", id="bare_name_not_taken_for_a_scheme"),
        pytest.param("http://127.0.0.1:10249/", "http://127.0.0.1:10249", id="url_trailing_slash"),
        pytest.param("https://node-a:10249", "https://node-a:10249", id="https"),
        pytest.param(" 127.0.0.1:10249 ", "http://127.0.0.1:10249", id="spaces"),
    ],
)
def test_server_url(server, url):
    assert server_url(server) == url


@pytest.mark.parametrize(
    "server, message",
    [
        pytest.param("ftp://127.0.0.1:10249", "the scheme must be http:// or https://", id="other_scheme"),
        pytest.param("127.0.0.1:port", "expected HOST:PORT", id="bad_port"),
        pytest.param("", "expected HOST:PORT", id="empty"),
        pytest.param("::1:10249", "in brackets", id="unbracketed_ipv6"),
    ],
)
def test_bad_server_is_a_clear_error(server, message):
    with pytest.raises(ValueError, match=message) as info:
        server_url(server)
    assert repr(server) in str(info.value)


@pytest.mark.parametrize(
    "resource, namespace, all_namespaces, expected",
    [
        ("svc", "default", False, ("services", "/api/v1/namespaces/default/services")),
        ("eps", "kube-system", False, ("endpointslices", "/api/v1/namespaces/kube-system/endpointslices")),
        ("services", "default", True, ("services", "/api/v1/services")),
        ("status", "default", False, ("status", "/api/v1/status")),
    ],
)
def test_resource_path(resource, namespace, all_namespaces, expected):
    assert resource_path(resource, namespace, all_namespaces) == expected


@pytest.fixture
def daemon_api():
    """A stand-in status API on loopback answering /api/v1/status."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"path": self.path}).encode()
            self.send_response(200 if self.path == "/api/v1/status" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_get_with_bare_host_port_reaches_the_daemon(capsys, daemon_api):
    assert cli.main(["get", "status", "-o", "json", "--server", daemon_api]) == 0
    assert json.loads(capsys.readouterr().out) == {"path": "/api/v1/status"}


def test_bad_server_exits_2_with_one_line(capsys):
    assert cli.main(["get", "svc", "--server", "ftp://127.0.0.1:1"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "kubeport: --server 'ftp://127.0.0.1:1': the scheme must be http:// or https://"]


def test_unreachable_daemon_says_why_in_one_line(capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    assert cli.main(["get", "svc", "--server", f"127.0.0.1:{port}"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"kubeport: cannot reach the daemon at http://127.0.0.1:{port}: ")
    assert "Connection refused" in lines[0] and "--status-bind-address" in lines[0]
    assert "unknown url type" not in lines[0]


# --- the status socket --------------------------------------------------------------------------

# /proc/net/unix as Linux 6.1 prints it: Num RefCount Protocol Flags Type St Inode Path
PROC_NET_UNIX = """\
Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 313542 /var/lib/kubeport/kubeport.sock
0000000000000000: 00000002 00000000 00010000 0001 01 313999 /tmp/state/kubeport.sock
0000000000000000: 00000003 00000000 00000000 0001 03 314001 /tmp/state/kubeport.sock
0000000000000000: 00000002 00000000 00010000 0002 01 314002 /tmp/dgram/kubeport.sock
0000000000000000: 00000002 00000000 00010000 0001 01 314003 @kubeport/node-a
0000000000000000: 00000002 00000000 00010000 0001 01 314004 /run/other/status.sock
0000000000000000: 00000002 00000000 00010000 0001 01 314005 /tmp/a dir with spaces/kubeport.sock
0000000000000000: 00000003 00000000 00000000 0001 03 314006
"""


def test_status_sockets_are_the_listening_ones_newest_first():
    """Listening (__SO_ACCEPTCON) stream sockets named kubeport.sock; connected ends, datagram
    sockets, abstract names and other names are not; the newest inode first (a successor)."""
    assert status_sockets(PROC_NET_UNIX) == [
        "/tmp/a dir with spaces/kubeport.sock", "/tmp/state/kubeport.sock", "/var/lib/kubeport/kubeport.sock"]


def test_status_sockets_of_a_namespace_without_a_daemon():
    assert status_sockets(PROC_NET_UNIX.splitlines()[0]) == []
    assert find_status_socket("/nonexistent/proc/net/unix") is None


class View:
    def snapshot(self):
        return Snapshot(generation=3)

    def pending(self):
        return []

    def problems(self):
        return ["web.yaml: broken"]

    def status(self):
        return {"generation": 3}

    def proxy_health(self, path):  # pragma: no cover - not asked here
        raise NotImplementedError


@pytest.fixture
async def status_socket(tmp_path):
    path = tmp_path / "state" / STATUS_SOCKET
    server = StatusServer(View(), healthz_bind="", metrics_bind="", registry=CollectorRegistry(), status_socket=path)
    await server.start()
    try:
        yield path
    finally:
        await server.stop()


async def test_the_status_socket_is_owner_only_and_answers_kubeport_get(status_socket):
    assert stat.S_IMODE(status_socket.stat().st_mode) == 0o600
    assert stat.S_IMODE(status_socket.parent.stat().st_mode) == 0o700
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "kubeport", "get", "status", "-o", "json",
                                                    "--socket", str(status_socket)],
                                   capture_output=True, text=True, timeout=30, cwd="/")
    assert (done.returncode, json.loads(done.stdout)) == (0, {"generation": 3}), done.stderr


async def test_kubeport_get_finds_the_socket_of_its_network_namespace(status_socket):
    """No --socket: the newest listening kubeport.sock in /proc/net/unix, which is ours."""
    assert find_status_socket() == str(status_socket)
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "kubeport", "get", "svc", "-A"],
                                   capture_output=True, text=True, timeout=30, cwd="/")
    assert done.returncode == 0, done.stderr
    assert "web.yaml: broken" in done.stderr  # the problem lines, as the listing carries them


async def test_the_status_socket_is_gone_after_a_stop__a_successors_is_left(tmp_path):
    path = tmp_path / STATUS_SOCKET
    first = StatusServer(View(), healthz_bind="", metrics_bind="", registry=CollectorRegistry(), status_socket=path)
    second = StatusServer(View(), healthz_bind="", metrics_bind="", registry=CollectorRegistry(), status_socket=path)
    await first.start()
    await second.start()  # a handover's successor in the same state directory: the path is its now
    await first.stop()
    assert path.exists()
    await second.stop()
    assert not path.exists()


async def test_a_state_directory_too_long_for_a_unix_socket_is_a_clear_error(tmp_path):
    path = tmp_path / ("d" * 120) / STATUS_SOCKET
    server = StatusServer(View(), healthz_bind="", metrics_bind="", registry=CollectorRegistry(), status_socket=path)
    with pytest.raises(StatusSocketError, match="longer than a Unix socket address holds"):
        await server.start()
    await server.stop()

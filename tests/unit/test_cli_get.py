"""`kubeport get --server`: a bare HOST:PORT means http://, bad values and unreachable daemons are one clear line."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kubeport import cli
from kubeport.get_client import resource_path, server_url


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
    assert "Connection refused" in lines[0] and "--metrics-bind-address" in lines[0]
    assert "unknown url type" not in lines[0]

"""`kubeport get` and `kubeport env`: read the running daemon's status API and print it.

The API is served on a Unix socket in the daemon's state directory, owner-only (``kubeport
run``'s :data:`~kubeport.status.STATUS_SOCKET`). `kubeport get` finds it without being told
where the state directory is: among the listening Unix sockets of its own network namespace
(``/proc/net/unix``, which the kernel keeps per namespace), the one of that name; two daemons
(a handover in progress) serve the same node, and the newer socket is taken. ``--socket``
names one; ``--server`` reads a TCP address an operator opened (``--status-bind-address``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from kubeport import envvars, printers
from kubeport.status import STATUS_SOCKET

#: __SO_ACCEPTCON in /proc/net/unix's Flags: the socket listens
_LISTENING = 0x10000

_KINDS = {"svc": "services", "endpointslice": "endpointslices", "eps": "endpointslices", "pod": "pods",
          "po": "pods"}


def server_url(server: str) -> str:
    """``--server`` as given -> the base URL. A bare ``HOST:PORT`` (``127.0.0.1:10249``,
    ``[::1]:10249``, ``localhost:10249``) means ``http://HOST:PORT``, as kubectl's ``--server``
    takes one; ValueError naming the value when it is no http(s) URL."""
    text = server.strip().rstrip("/")
    if "://" not in text:
        text = f"http://{text}"
    parsed = urllib.parse.urlsplit(text)
    if parsed.scheme not in ("http", "https"):
        raise ValueError(f"--server {server!r}: the scheme must be http:// or https://")
    try:
        port = parsed.port
    except ValueError:
        port = -1
    if not parsed.hostname or port == -1:
        raise ValueError(f"--server {server!r}: expected HOST:PORT or http://HOST:PORT "
                         f"(an IPv6 address in brackets: [::1]:10249)")
    return text


def resource_path(resource: str, namespace: str, all_namespaces: bool) -> tuple[str, str]:
    """(kind, status API path) of a ``kubeport get`` resource argument."""
    kind = _KINDS.get(resource, resource)
    if kind == "status":
        return kind, "/api/v1/status"
    if all_namespaces:
        return kind, f"/api/v1/{kind}"
    return kind, f"/api/v1/namespaces/{namespace}/{kind}"


def status_sockets(proc_net_unix: str) -> list[str]:
    """The paths of the listening status sockets in a ``/proc/net/unix`` text, newest first
    (socket inode numbers grow as sockets are made)."""
    found: list[tuple[int, str]] = []
    for line in proc_net_unix.splitlines()[1:]:
        fields = line.split(None, 7)
        if len(fields) < 8:
            continue  # unbound: no path
        flags, socket_type, inode, path = fields[3], fields[4], fields[6], fields[7]
        try:
            listening = int(flags, 16) & _LISTENING and int(socket_type, 16) == socket.SOCK_STREAM
            number = int(inode)
        except ValueError:
            continue
        if listening and path.startswith("/") and os.path.basename(path) == STATUS_SOCKET:
            found.append((number, path))
    return [path for _, path in sorted(found, reverse=True)]


def find_status_socket(proc_net_unix: str = "/proc/net/unix") -> str | None:
    try:
        with open(proc_net_unix, encoding="utf-8", errors="replace") as listing:
            paths = status_sockets(listing.read())
    except OSError:
        return None
    return paths[0] if paths else None


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("kubeport", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _fetch_unix(path: str, resource: str) -> Any:
    connection = _UnixConnection(path, timeout=10)
    try:
        connection.request("GET", resource)
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise urllib.error.HTTPError(resource, response.status, response.reason, response.headers, None)
        return json.loads(body)
    finally:
        connection.close()


def _fetch(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def _ask(args: argparse.Namespace, path: str) -> tuple[Any, int]:
    """The daemon's answer at ``path``, and 0; else None and the exit code (the error printed)."""
    if args.server:
        return _ask_tcp(args.server, path)
    where = args.socket or find_status_socket()
    if where is None:
        print("kubeport: no kubeport daemon's status socket listens in this network namespace (is kubeport "
              "running here? `ip netns exec NS kubeport get ...` asks the daemon of namespace NS; --socket PATH "
              f"names its {STATUS_SOCKET} in the state directory)", file=sys.stderr)
        return None, 1
    try:
        return _fetch_unix(where, path), 0
    except urllib.error.HTTPError as exc:
        print(f"kubeport: {where}: {path}: HTTP {exc.code} {exc.reason}", file=sys.stderr)
    except PermissionError:
        print(f"kubeport: {where}: permission denied: the status API is root's and the daemon user's only",
              file=sys.stderr)
    except (OSError, http.client.HTTPException) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        print(f"kubeport: cannot read the daemon's answer from {where}: {reason or 'closed unanswered'} "
              f"(a daemon answers only root and its own user)", file=sys.stderr)
    except ValueError as exc:
        print(f"kubeport: cannot read the daemon's answer from {where}: {exc}", file=sys.stderr)
    return None, 1


def _ask_tcp(server: str, path: str) -> tuple[Any, int]:
    try:
        base = server_url(server)
    except ValueError as exc:
        print(f"kubeport: {exc}", file=sys.stderr)
        return None, 2
    try:
        return _fetch(base + path), 0
    except urllib.error.HTTPError as exc:
        print(f"kubeport: {base}{path}: HTTP {exc.code} {exc.reason}", file=sys.stderr)
    except urllib.error.URLError as exc:
        print(f"kubeport: cannot reach the daemon at {base}: {exc.reason} (is kubeport running, with "
              f"--status-bind-address on this address?)", file=sys.stderr)
    except (OSError, ValueError) as exc:
        print(f"kubeport: cannot read the daemon's answer from {base}: {exc}", file=sys.stderr)
    return None, 1


def cmd_get(args: argparse.Namespace) -> int:
    kind, path = resource_path(args.resource, args.namespace, args.all_namespaces)
    listing, code = _ask(args, path)
    if code:
        return code
    if kind == "status":
        print(json.dumps(listing, indent=2) if args.output == "json" else printers.render_status(listing))
        return 0
    problems = listing.pop("problems", [])
    print(printers.render(kind, listing, args.output, args.all_namespaces))
    if problems and args.output not in ("json", "yaml"):
        print("\nProblems (the last good version of these objects is kept):", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    """`kubeport env -n NS`: the service variables a pod of NS gets from the kubelet."""
    listing, code = _ask(args, "/api/v1/services")
    if code:
        return code
    variables = envvars.environment(args.namespace, listing["items"])
    if args.output == "json":
        print(json.dumps([{"name": name, "value": value} for name, value in variables.items()], indent=2))
    elif variables:
        print(envvars.shell_lines(variables))
    return 0

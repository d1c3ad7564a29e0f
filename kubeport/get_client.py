"""`kubeport get`: read the running daemon's status API (served on its metrics address) and print it."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from kubeport import envvars, printers

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


def _fetch(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def _ask(server: str, path: str) -> tuple[Any, int]:
    """The daemon's answer at ``path``, and 0; else None and the exit code (the error printed)."""
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
        print(f"kubeport: cannot reach the daemon at {base}: {exc.reason} (is kubeport running, with its "
              f"metrics server on this address? --metrics-bind-address '' disables it)", file=sys.stderr)
    except (OSError, ValueError) as exc:
        print(f"kubeport: cannot read the daemon's answer from {base}: {exc}", file=sys.stderr)
    return None, 1


def cmd_get(args: argparse.Namespace) -> int:
    kind, path = resource_path(args.resource, args.namespace, args.all_namespaces)
    listing, code = _ask(args.server, path)
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
    listing, code = _ask(args.server, "/api/v1/services")
    if code:
        return code
    variables = envvars.environment(args.namespace, listing["items"])
    if args.output == "json":
        print(json.dumps([{"name": name, "value": value} for name, value in variables.items()], indent=2))
    elif variables:
        print(envvars.shell_lines(variables))
    return 0

"""Endpoint states, daemons and clients shared by the traffic-policy integration tests.

Endpoints are written with explicit conditions, nodes and zones (support.netns.manifests), so a
test can state a kube-proxy rule's input directly (a serving-terminating pod, a pod declared on
another node). Clients run many connections from one Python process inside a namespace: fast
enough to look at 50-100 connections per assertion, which is what makes "only these pods
answer" a statistical certainty.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Iterator

from . import CommandFailed, Pod, Topology, curl_in, http_url, python_in, until_sync
from .manifests import endpoint, start_daemon, write

HTTP_SLICE_PORT = {"name": "http", "protocol": "TCP", "port": 8080}
UDP_SLICE_PORT = {"name": "udp", "protocol": "UDP", "port": 9090}
HTTP_PORT = {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}
UDP_PORT = {"name": "udp", "protocol": "UDP", "port": 90, "targetPort": 9090}
#: what a slice of the policy tests serves: both pod ports
SLICE_PORTS = (HTTP_SLICE_PORT, UDP_SLICE_PORT)

#: Open connections and UDP flows are not drained when a test module's daemons stop.
FAST_STOP = ("--shutdown-grace-period", "0s")

#: Connections per distinct expected pod in one window: with a uniform first pick, a window of
#: 25 x k connections misses one of k pods with probability below k * (1 - 1/k) ** (25 k) < 1e-6.
PER_POD = 25


# --- daemons and endpoint states ------------------------------------------------------------------


@contextlib.contextmanager
def daemons_on(topology: Topology, tmp_path_factory, nodes: Iterable[dict], on: Iterable[str]) -> Iterator:
    """A manifest directory holding ``nodes``, and a daemon (fast stop) on each node of ``on``;
    yields the directory, stops the daemons after."""
    manifests = tmp_path_factory.mktemp("manifests")
    state = tmp_path_factory.mktemp("state")
    write(manifests, "nodes", *nodes)
    daemons = [start_daemon(topology, which, manifests, state, *FAST_STOP) for which in on]
    try:
        yield manifests
    finally:
        for daemon in daemons:
            daemon.stop()


def serving_terminating(pod: Pod, **where: str) -> dict:
    """A pod being deleted that still passes its readiness probe (KEP-1669)."""
    return endpoint(pod, ready=False, serving=True, terminating=True, **where)


def terminating_not_serving(pod: Pod, **where: str) -> dict:
    return endpoint(pod, ready=False, serving=False, terminating=True, **where)


# --- clients ------------------------------------------------------------------------------------

# Prints one line per connection: the pod that answered; the first failure ends the series
# with "refused" or "timeout", so a window never waits on more than one dropped connection.
_HTTP_SERIES = r"""
import http.client, sys
host, port, count, timeout = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
for _ in range(count):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/", headers={"Connection": "close"})
        body = conn.getresponse().read().decode()
    except ConnectionRefusedError:
        sys.exit(print("refused"))
    except TimeoutError:
        sys.exit(print("timeout"))
    finally:
        conn.close()
    print(body.split()[0].removeprefix("pod="), flush=True)
"""


def pods_over(ns: str, host: str, port: int, count: int, timeout: float = 2.0) -> list[str]:
    """The pod answering each of `count` new HTTP connections from `ns`, in order (ending with
    "refused" or "timeout" at the first connection that is not answered)."""
    done = python_in(ns, _HTTP_SERIES, host, port, count, timeout, timeout=count * timeout + 10)
    return done.stdout.split()


def settle_on(ns: str, host: str, port: int, expected: set[str], deadline: float = 15.0) -> Counter[str]:
    """Wait until a window of connections is answered by exactly `expected` (the daemon applied the
    change), then return the counts of a fresh window: the assertion is made on that one."""
    count = PER_POD * max(len(expected), 1)

    def window() -> set[str]:
        seen = set(pods_over(ns, host, port, count))
        return seen if seen == expected else set()

    until_sync(window, f"only {sorted(expected)} answering {host}:{port} from {ns}", deadline, interval=0.2,
               ignore=(CommandFailed,))
    return Counter(pods_over(ns, host, port, count))


def curl_exit_code(ns: str, host: str, port: int, connect_timeout: float = 1.0) -> int:
    """curl's exit code for one request: 0 answered, 7 refused (REJECT), 28 timed out (DROP)."""
    try:
        curl_in(ns, http_url(host, port), "--connect-timeout", f"{connect_timeout:g}", timeout=connect_timeout + 2)
    except CommandFailed as failure:
        return failure.returncode if failure.returncode is not None else -1
    return 0


def settle_curl_exit(ns: str, host: str, port: int, code: int, deadline: float = 15.0) -> None:
    """Wait until curl from `ns` to host:port exits with `code` (the daemon applied the change)."""
    until_sync(lambda: curl_exit_code(ns, host, port) == code,
               f"curl {host}:{port} from {ns} exiting {code}", deadline, interval=0.1)


def settle_health(ns: str, host: str, port: int, status: int, local_endpoints: int,
                  deadline: float = 15.0) -> "HttpReply":
    """Wait until the health-check node port answers `status` counting `local_endpoints`; that reply."""
    def reply() -> HttpReply | None:
        got = http_get(ns, host, port, "/healthz")
        return got if got.status == status and got.json().get("localEndpoints") == local_endpoints else None

    return until_sync(reply, f"{host}:{port} answering {status} with localEndpoints {local_endpoints} to {ns}",
                      deadline, interval=0.1, ignore=(CommandFailed, ValueError))


@dataclass(frozen=True)
class HttpReply:
    status: int
    headers: dict[str, str]  # names lower-cased
    body: str

    def json(self) -> dict:
        return json.loads(self.body)


def http_get(ns: str, host: str, port: int, path: str = "/", timeout: float = 3.0) -> HttpReply:
    """Status, headers and body of one GET (any status; curl -i)."""
    raw = curl_in(ns, http_url(host, port, path), "-i", timeout=timeout)
    head, _, body = raw.replace("\r\n", "\n").partition("\n\n")
    status_line, *header_lines = head.splitlines()
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return HttpReply(int(status_line.split()[1]), headers, body)

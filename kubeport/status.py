"""The daemon's HTTP surface.

- healthz server (``--healthz-bind-address``, kube-proxy's 10256): /healthz, /livez, /readyz
- metrics server (``--metrics-bind-address``, kube-proxy's 10249): /metrics, /healthz,
  /proxyMode and /readyz, as kube-proxy's metrics port serves metrics and no objects
  (``cmd/kube-proxy/app/server.go serveMetrics``).
- DNS metrics server (``--dns-metrics-bind-address``, NodeLocal DNSCache's 9253): /metrics
  with the DNS server's CoreDNS series and the process's only, as CoreDNS's ``prometheus``.
- the status API that `kubeport get` and `kubeport env` read (/api/v1/..., and /readyz with
  the problem lines): on a Unix socket in the state directory (:data:`STATUS_SOCKET`, mode
  0600, and each peer checked with ``SO_PEERCRED``: root or the daemon's user, as the
  handover socket's), and on ``--status-bind-address`` only if an operator sets one.

An empty bind address disables that server, as kube-proxy's flags do.

What the daemon holds (Services, endpoint addresses, Pods, problem lines that quote values
from manifests and objects) is readable only where reading the manifests or the API would be:
a local user who is not root reaches the TCP ports, which tell whether the daemon is ready
and what it waits for, metrics, and kube-proxy's /healthz and /livez bodies (timestamps).

/readyz is polled (kubelet probes, a start-up wait loop) while the daemon loads a large
cluster, so its per-request work is O(1): the problem list it carries (which costs work
proportional to the cluster) is computed at most once per ``problems_ttl`` seconds, and at
once whenever the snapshot generation or the pending list changes. /api/v1/problems and
the listings always compute it afresh.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kubeport import printers
from kubeport.config import split_host_port
from kubeport.endpoints.types import Snapshot
from kubeport.lib.http.request import Request
from kubeport.lib.http.response import Response
from kubeport.lib.http.routes import Routes
from kubeport.lib.http.server import HttpServer
from kubeport.proxy.healthcheck.proxier_health import HealthResponse
from kubeport.survival.handover import peer_of, trusted

log = logging.getLogger(__name__)


class DaemonView(Protocol):
    """What the status server reads from the running daemon."""

    def snapshot(self) -> Snapshot: ...

    def pending(self) -> list[str]:
        """What readiness still waits for; empty when ready."""
        ...

    def problems(self) -> list[str]: ...

    def status(self) -> dict[str, Any]: ...

    def proxy_health(self, path: str) -> HealthResponse:
        """kube-proxy's /healthz or /livez response."""
        ...


def source_status(kind: str, source: Any, problems: int) -> dict[str, Any]:
    """The source part of `kubeport get status`: per-resource watch statistics, or files read."""
    status: dict[str, Any] = {"kind": kind}
    if hasattr(source, "stats_dict"):
        status["resources"] = source.stats_dict()
    else:
        status.update(files=getattr(source, "files_loaded", 0), objects=getattr(source, "objects_loaded", 0))
    status["problems"] = problems
    return status


_WILDCARDS = ("0.0.0.0", "::")

#: the status API's Unix socket, in the state directory; `kubeport get` finds it by this name
#: among the listening Unix sockets of its network namespace (/proc/net/unix)
STATUS_SOCKET = "kubeport.sock"
#: the longest path a Unix socket address holds (sun_path, with its terminating NUL)
_SUN_PATH_MAX = 107


class StatusSocketError(OSError):
    """The status API's Unix socket cannot be made (its path, its directory)."""


def _trusted_peer(sock: Any) -> bool:
    try:
        return trusted(peer_of(sock))
    except OSError:
        return False


class StatusServer:
    def __init__(
        self,
        view: DaemonView,
        *,
        healthz_bind: str,
        metrics_bind: str,
        registry: CollectorRegistry,
        dns_metrics_bind: str = "",
        dns_registry: CollectorRegistry | None = None,
        on_request: Callable[[str, int], None] | None = None,
        status_socket: Path | None = None,
        status_bind: str = "",
        problems_ttl: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """
        :param status_socket: the status API's Unix socket (None: not served there).
        :param status_bind: IP:PORT serving the status API over TCP too, to whoever reaches it.
        :param problems_ttl: how long /readyz may reuse its problem list while neither the
            snapshot generation nor the pending list changed.
        :param clock: monotonic seconds (injected in tests).
        """
        self._view = view
        self._status_socket = status_socket
        self._status_bind = status_bind
        self._socket_identity: tuple[int, int] | None = None
        self._readyz_problems = _CachedProblems(view, problems_ttl, clock)
        self._healthz_bind = healthz_bind
        self._metrics_bind = metrics_bind
        self._registry = registry
        self._dns_metrics_bind = dns_metrics_bind
        self._dns_registry = dns_registry
        self._on_request = on_request or (lambda path, code: None)
        self._servers: list[HttpServer] = []

    async def start(self) -> None:
        healthz = Routes()
        # kube-proxy's handlers answer any method (a load balancer may probe with POST or OPTIONS).
        healthz.add("/healthz", self._healthz, methods=None)
        healthz.add("/livez", self._livez, methods=None)
        healthz.add("/readyz", self._readyz)
        metrics = Routes()
        metrics.add("/metrics", self._metrics)
        metrics.add("/healthz", self._plain_ok)
        metrics.add("/proxyMode", self._proxy_mode)
        metrics.add("/readyz", self._readyz)
        status = Routes()
        status.add("/readyz", self._readyz_with_problems)
        status.add("/api/v1/problems", self._problems)
        status.add("/api/v1/status", self._status)
        status.add("/api/v1/{kind}", self._list)
        status.add("/api/v1/namespaces/{namespace}/{kind}", self._list)
        dns_metrics = Routes()
        dns_metrics.add("/metrics", self._dns_metrics)
        if self._status_socket is not None:
            await self._listen_status_socket(status, self._status_socket)
        servers = [("healthz", healthz, self._healthz_bind), ("metrics", metrics, self._metrics_bind)]
        if self._dns_registry is not None:
            servers.append(("dns metrics", dns_metrics, self._dns_metrics_bind))
        if self._status_bind:
            log.warning("status API on %s (--status-bind-address): whoever reaches it reads every Service, "
                        "endpoint and Pod this daemon holds", self._status_bind)
            servers.append(("status", status, self._status_bind))
        for name, routes, bind in servers:
            if not bind:
                log.info("%s server disabled (empty bind address)", name)
                continue
            host, port = split_host_port(bind)
            # Go's listener on a wildcard ("0.0.0.0:10256", kube-proxy's default) takes both
            # families: an IPv6 load-balancer probe of the node must reach /healthz too.
            server = HttpServer(routes)
            await server.listen(None if host in _WILDCARDS else host, port)
            self._servers.append(server)
            log.info("serving http on %s", bind)

    async def _listen_status_socket(self, routes: Routes, path: Path) -> None:
        if len(os.fsencode(path)) > _SUN_PATH_MAX:
            raise StatusSocketError(f"--state-dir: the status socket path {path} is longer than a Unix socket "
                                    f"address holds ({_SUN_PATH_MAX} bytes); choose a shorter state directory")
        server = HttpServer(routes, admit=_trusted_peer)
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            await server.listen_unix(str(path), mode=0o600)
        except OSError as exc:
            raise StatusSocketError(f"status socket {path}: {exc.strerror or exc}") from exc
        found = os.stat(path)
        self._socket_identity = (found.st_dev, found.st_ino)
        self._servers.append(server)
        log.info("serving the status API on %s", path)

    async def stop(self) -> None:
        for server in reversed(self._servers):
            await server.close()
        self._servers.clear()
        if self._status_socket is not None and self._socket_identity is not None:
            # A successor (a handover in the same state directory) may have bound the path since.
            with contextlib.suppress(OSError):
                found = os.stat(self._status_socket)
                if (found.st_dev, found.st_ino) == self._socket_identity:
                    os.unlink(self._status_socket)
            self._socket_identity = None

    async def _healthz(self, request: Request) -> Response:
        return self._health_response("healthz")

    async def _livez(self, request: Request) -> Response:
        return self._health_response("livez")

    def _health_response(self, path: str) -> Response:
        response = self._view.proxy_health(path)
        self._on_request(path, response.status)
        return Response(response.status, response.body, response.headers)

    async def _readyz(self, request: Request) -> Response:
        pending = self._view.pending()
        return Response.json({"ready": not pending, "pending": pending}, 503 if pending else 200)

    async def _readyz_with_problems(self, request: Request) -> Response:
        pending = self._view.pending()
        body = {"ready": not pending, "pending": pending, "problems": self._readyz_problems.get(pending)}
        return Response.json(body, 503 if pending else 200)

    async def _plain_ok(self, request: Request) -> Response:
        return Response.text("ok")

    async def _proxy_mode(self, request: Request) -> Response:
        return Response.text("userspace-splice")

    async def _metrics(self, request: Request) -> Response:
        return Response(200, generate_latest(self._registry), (("Content-Type", CONTENT_TYPE_LATEST),))

    async def _dns_metrics(self, request: Request) -> Response:
        return Response(200, generate_latest(self._dns_registry), (("Content-Type", CONTENT_TYPE_LATEST),))

    async def _list(self, request: Request) -> Response:
        kind = request.params["kind"]
        if kind not in printers.HEADERS:
            return Response.json({"kind": "Status", "status": "Failure", "reason": "NotFound",
                                  "message": f"the server doesn't have a resource type \"{kind}\""}, 404)
        listing = printers.list_objects(self._view.snapshot(), kind, request.params.get("namespace"))
        listing["problems"] = self._view.problems()
        return Response.json(listing)

    async def _status(self, request: Request) -> Response:
        return Response.json(self._view.status())

    async def _problems(self, request: Request) -> Response:
        return Response.json({"problems": self._view.problems()})


class _CachedProblems:
    """The view's problems, recomputed when the generation or pending list moves, or after ``ttl``."""

    def __init__(self, view: DaemonView, ttl: float, clock: Callable[[], float]) -> None:
        self._view = view
        self._ttl = ttl
        self._clock = clock
        self._key: tuple[int, tuple[str, ...]] | None = None
        self._expires = 0.0
        self._problems: list[str] = []

    def get(self, pending: list[str]) -> list[str]:
        key = (self._view.snapshot().generation, tuple(pending))
        now = self._clock()
        if key != self._key or now >= self._expires:
            self._problems = self._view.problems()
            self._key, self._expires = key, now + self._ttl
        return self._problems

"""The daemon's HTTP surface.

- healthz server (``--healthz-bind-address``, kube-proxy's 10256): /healthz, /livez, /readyz
- metrics server (``--metrics-bind-address``, kube-proxy's 10249): /metrics, /healthz,
  /proxyMode, and the status API that `kubeport get` reads (/api/v1/...).
- DNS metrics server (``--dns-metrics-bind-address``, NodeLocal DNSCache's 9253): /metrics
  with the DNS server's CoreDNS series and the process's only, as CoreDNS's ``prometheus``.

An empty bind address disables that server, as kube-proxy's flags do.

/readyz tells a peer on loopback (the node itself) every current problem line; any other
peer (the healthz port listens on every address by default) learns only whether the daemon
is ready and what it waits for: problem lines quote values from manifests and objects, and
the network has no business with them. They stay on the loopback status API, `kubeport
get` and the log. /healthz and /livez answer kube-proxy's bodies, which hold timestamps only.

/readyz is polled (kubelet probes, a start-up wait loop) while the daemon loads a large
cluster, so its per-request work is O(1): the problem list it carries (which costs work
proportional to the cluster) is computed at most once per ``problems_ttl`` seconds, and at
once whenever the snapshot generation or the pending list changes. /api/v1/problems and
the listings always compute it afresh.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from typing import Any, Callable, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kubeport import printers
from kubeport.config import split_host_port
from kubeport.endpoints.types import Snapshot
from kubeport.lib.httpserver import HttpServer, Request, Response, Routes
from kubeport.proxy.health import HealthResponse

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
        problems_ttl: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """
        :param problems_ttl: how long /readyz may reuse its problem list while neither the
            snapshot generation nor the pending list changed.
        :param clock: monotonic seconds (injected in tests).
        """
        self._view = view
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
        metrics.add("/api/v1/problems", self._problems)
        metrics.add("/api/v1/status", self._status)
        metrics.add("/api/v1/{kind}", self._list)
        metrics.add("/api/v1/namespaces/{namespace}/{kind}", self._list)
        dns_metrics = Routes()
        dns_metrics.add("/metrics", self._dns_metrics)
        servers = [("healthz", healthz, self._healthz_bind), ("metrics", metrics, self._metrics_bind)]
        if self._dns_registry is not None:
            servers.append(("dns metrics", dns_metrics, self._dns_metrics_bind))
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

    async def stop(self) -> None:
        for server in reversed(self._servers):
            await server.close()
        self._servers.clear()

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
        body: dict[str, Any] = {"ready": not pending, "pending": pending}
        if from_loopback(request.peer):
            body["problems"] = self._readyz_problems.get(pending)
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


def from_loopback(peername: Any) -> bool:
    """Whether a request's peer (``peername`` of its socket) is this host's loopback."""
    if not isinstance(peername, tuple) or not peername:
        return False
    try:
        address = ipaddress.ip_address(str(peername[0]).split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


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

"""Health-check node ports for ``externalTrafficPolicy: Local`` LoadBalancers (KEP-1669 drain).

Restated from ``pkg/proxy/healthcheck/service_health.go``. A cloud load balancer probes
``healthCheckNodePort`` on every node and only sends traffic to nodes answering 200,
i.e. nodes with a local ready endpoint (so the client IP can be kept).

* Pure part: :func:`desired_health_checks` turns a snapshot into
  ``{port: (service, localEndpoints)}``; :func:`service_health_response` is the answer.
* Shell: :class:`HealthCheckServers` reconciles one HTTP server per port against that
  map (opens new ports, closes gone ones, leaves the rest alone; counts change in place).
  A port that fails to open (busy) is retried with backoff until it opens, as kube-proxy
  retries it on every sync rather than only when the Services change. Ports listen where
  --nodeport-addresses says (``NodePortSelection.health_check_addresses``): nowhere when
  it matches no local address.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Awaitable, Callable, Iterable, Mapping, Sequence

from kubeport.endpoints.types import ServiceInfo, ServiceName, ServiceState
from kubeport.lib.http.request import Request
from kubeport.lib.http.response import Response
from kubeport.lib.http.server import HttpServer
from kubeport.proxy.healthcheck.proxier_health import JSON_HEADERS, HealthResponse

log = logging.getLogger(__name__)

#: {healthCheckNodePort: (service, number of local ready endpoint IPs)}
DesiredHealthChecks = Mapping[int, tuple[ServiceName, int]]

#: How long closing a port waits for in-flight probes.
SHUTDOWN_TIMEOUT = 1.0

#: A port that failed to open (busy) is retried after 1 s, doubling up to kube-proxy's
#: syncPeriod (30 s): kube-proxy retries it on every sync, and syncs at least that often.
RETRY_FIRST = 1.0
RETRY_MAX = 30.0


# --- pure ---------------------------------------------------------------------------------


def needs_health_check(info: ServiceInfo) -> bool:
    """NeedsHealthCheck (LoadBalancer + eTP=Local) with a port allocated, on a proxied service."""
    return (
        info.proxied
        and info.type == "LoadBalancer"
        and info.external_policy_local
        and info.health_check_node_port != 0
    )


def local_ready_endpoints(state: ServiceState, node_name: str) -> int:
    """Distinct IPs of this node's READY endpoints over all the service's ports, in one family.

    Terminating endpoints never count, so a node whose pods are draining fails the
    check while still serving them (KEP-1669's intended LB drain). kube-proxy's proxier of
    each family reports its own family's count (LocalReadyEndpoints), so a dual-stack pod
    is one endpoint, not two: the larger family's count is the answer.
    """
    if not node_name:
        return 0
    ips = set()
    for port in state.service.ports:
        for candidate in state.endpoints_for_port(port):
            if candidate.endpoint.ready and candidate.endpoint.node_name == node_name:
                ips.add(candidate.ip)
    ipv6 = sum(1 for ip in ips if ":" in ip)
    return max(ipv6, len(ips) - ipv6)


def desired_health_checks(
    services: Mapping[ServiceName, ServiceState], node_name: str
) -> dict[int, tuple[ServiceName, int]]:
    """The health-check ports this node must serve (ports are cluster-unique: the
    nodePort allocator hands them out; on a clash the first service by name wins)."""
    desired: dict[int, tuple[ServiceName, int]] = {}
    for name in sorted(services):
        _add(desired, services[name], node_name)
    return desired


def update_health_checks(
    previous: DesiredHealthChecks,
    services: Mapping[ServiceName, ServiceState],
    changed: Iterable[ServiceName],
    node_name: str,
) -> dict[int, tuple[ServiceName, int]]:
    """:func:`desired_health_checks` recomputed for the ``changed`` services only."""
    changed = set(changed)
    desired = {port: entry for port, entry in previous.items() if entry[0] not in changed}
    for name in sorted(changed):
        state = services.get(name)
        if state is not None:
            _add(desired, state, node_name)
    return desired


def _add(desired: dict[int, tuple[ServiceName, int]], state: ServiceState, node_name: str) -> None:
    info = state.service
    if needs_health_check(info):
        desired.setdefault(info.health_check_node_port, (info.name, local_ready_endpoints(state, node_name)))


def next_retry_delay(previous: float | None) -> float:
    """Seconds before the next retry of failed ports: RETRY_FIRST, doubling to RETRY_MAX."""
    return RETRY_FIRST if previous is None else min(previous * 2, RETRY_MAX)


def service_health_response(service: ServiceName, local_endpoints: int, proxy_healthy: bool) -> HealthResponse:
    """200 iff there is a local endpoint and the proxy is healthy; kube-proxy's body, byte for byte."""
    body = (
        "{\n"
        '\t"service": {\n'
        f'\t\t"namespace": {json.dumps(service.namespace)},\n'
        f'\t\t"name": {json.dumps(service.name)}\n'
        "\t},\n"
        f'\t"localEndpoints": {local_endpoints},\n'
        f'\t"serviceProxyHealthy": {"true" if proxy_healthy else "false"}\n'
        "}"
    )
    headers = JSON_HEADERS + (("X-Load-Balancing-Endpoint-Weight", str(local_endpoints)),)
    status = 200 if local_endpoints and proxy_healthy else 503
    return HealthResponse(status, body.encode(), headers)


# --- shell --------------------------------------------------------------------------------


class HealthCheckServers:
    """One HTTP server per health-check node port, reconciled by :meth:`sync`."""

    def __init__(self, proxy_healthy: Callable[[], bool]) -> None:
        """
        :param proxy_healthy: the proxy's own health at request time, ignoring node
            eligibility (e.g. ``lambda: proxy_health.healthy(time.time())``).
        """
        self._proxy_healthy = proxy_healthy
        self._records: dict[int, tuple[ServiceName, int]] = {}
        self._listeners: dict[int, HttpServer] = {}
        #: where ports listen: None every address (the wildcard), () nowhere.
        self._addresses: tuple[str, ...] | None = None
        self._lock = asyncio.Lock()
        #: ports that failed to open -> error text (retried by :meth:`keep_retrying` and every sync).
        self.failures: dict[int, str] = {}
        self._failing = asyncio.Event()

    @property
    def ports(self) -> frozenset[int]:
        """Ports currently listening."""
        return frozenset(self._listeners)

    async def sync(
        self, desired: DesiredHealthChecks, addresses: Sequence[str] | None = None
    ) -> dict[int, str]:
        """Serve exactly the ports of ``desired`` on ``addresses``.

        ``addresses``: where to listen (``"0.0.0.0"``/``"::"`` for a family's wildcard, see
        ``NodePortSelection.health_check_addresses``); None: every address; empty: nowhere,
        so no port opens (--nodeport-addresses matched no local address, as in kube-proxy).
        Counts and names of open ports change in place; new addresses reopen every port.
        A port that cannot be opened is reported (``{port: error}``, also in :attr:`failures`)
        and retried: by :meth:`keep_retrying`, and at the next sync.
        """
        async with self._lock:
            addresses = tuple(addresses) if addresses is not None else None
            if addresses != self._addresses:
                await self._close(list(self._listeners))
                self._addresses = addresses
            self._records = dict(desired)
            await self._close([port for port in self._listeners if port not in desired])
            return await self._open_missing(sorted(desired))

    async def retry_failed(self) -> dict[int, str]:
        """Try again to open the ports that failed (the desired set unchanged); what still fails."""
        async with self._lock:
            return await self._open_missing(sorted(self.failures))

    async def keep_retrying(self, sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        """Forever: while ports have failed to open, retry them with :func:`next_retry_delay`
        backoff (a sync in between retries them too). Cancel to stop."""
        delay: float | None = None
        while True:
            await self._failing.wait()
            delay = next_retry_delay(delay)
            await sleep(delay)
            if not await self.retry_failed():
                delay = None

    async def _open_missing(self, ports: Iterable[int]) -> dict[int, str]:
        """Open those of ``ports`` that are desired and not listening; record what fails."""
        failures: dict[int, str] = {}
        if self._addresses == ():  # no node address to listen on: nothing opens, nothing fails
            ports = ()
        for port in ports:
            if port in self._records and port not in self._listeners:
                error = await self._open(port)
                if error is not None:
                    failures[port] = error
                elif port in self.failures:
                    log.info("health check port %d for %s opened on retry", port, self._records[port][0])
        self.failures = failures
        if failures:
            self._failing.set()
        else:
            self._failing.clear()
        return failures

    async def close(self) -> None:
        async with self._lock:
            await self._close(list(self._listeners))
            self._records = {}
            self.failures = {}
            self._failing.clear()

    def response(self, port: int) -> HealthResponse:
        """What a probe of ``port`` gets right now."""
        record = self._records.get(port)
        if record is None:  # a probe racing the port's removal
            return HealthResponse(503, b"", JSON_HEADERS)
        service, count = record
        return service_health_response(service, count, self._proxy_healthy())

    async def _open(self, port: int) -> str | None:
        async def handle(_request: Request) -> Response:  # any path, any method: kube-proxy's
            answer = self.response(port)
            return Response(answer.status, answer.body, answer.headers)

        server = HttpServer(handle)
        try:
            await server.listen(list(self._addresses) if self._addresses is not None else None, port)
        except OSError as err:
            await server.close()
            service = self._records[port][0]
            message = f"failed to start healthcheck {str(service)!r} on port {port}: {err}"
            log.warning("FailedToStartServiceHealthcheck: %s", message)
            return message
        self._listeners[port] = server
        log.debug("opened health check port %d for %s", port, self._records[port][0])
        return None

    async def _close(self, ports: list[int]) -> None:
        for port in ports:
            await self._listeners.pop(port).close(SHUTDOWN_TIMEOUT)
            log.debug("closed health check port %d", port)

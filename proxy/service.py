"""The service proxy as the daemon sees it: one object that applies snapshots and owns the
proxy's health, its health-check node ports, its full syncs and its metrics.

Inside: a :class:`~kubeport.proxy.proxier.Proxier` (or
:class:`~kubeport.proxy.workers.parent.ProxyWorkers` with ``--workers N``) for listeners, VIPs and
nftables; :class:`~kubeport.proxy.healthcheck.proxier_health.ProxyHealth` for kube-proxy's ``/healthz`` and
``/livez``; :class:`~kubeport.proxy.healthcheck.service_health.HealthCheckServers` for the
``healthCheckNodePort`` of each ``externalTrafficPolicy: Local`` LoadBalancer; the full-sync
loop (:mod:`.fullsync`); and the kube-proxy metrics (:mod:`.metrics`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry

from kubeport.endpoints.types import NodeInfo, ServiceName, Snapshot
from kubeport.lib.heldsockets import NOT_HELD, HeldSockets
from kubeport.proxy.config import ProxyConfig
from kubeport.proxy.fullsync import follow_node_addresses, keep_host_in_sync
from kubeport.proxy.healthcheck.proxier_health import HealthResponse, ProxyHealth
from kubeport.proxy.healthcheck.service_health import DesiredHealthChecks, HealthCheckServers, update_health_checks
from kubeport.proxy.host.address_events import AddressEvents
from kubeport.proxy.metrics import ProxyMetrics
from kubeport.proxy.relays import Relays
from kubeport.proxy.workers.parent import WORKER_COMMAND, ProxyWorkers, create_proxier

log = logging.getLogger(__name__)


class ProxyService:
    """A :class:`~kubeport.endpoints.interfaces.Consumer` of snapshots: the node's service proxy."""

    name = "proxy"

    def __init__(
        self,
        config: ProxyConfig,
        node_name: str,
        registry: CollectorRegistry,
        *,
        families: tuple[str, ...],
        require_node: bool,
        clock: Callable[[], float] = time.time,
        address_events: AddressEvents | None = None,
        hold: HeldSockets = NOT_HELD,
        worker_command: Sequence[str] = WORKER_COMMAND,
    ) -> None:
        """
        :param families: the IP families proxied, primary first (one /healthz entry each).
        :param require_node: the Node object is needed for /healthz to be eligible (with an
            API server; manifest mode may have none).
        """
        self.node_name = node_name
        self.relays: Relays = create_proxier(config, node_name, hold=hold, worker_command=worker_command)
        self.health = ProxyHealth(families=families, require_node=require_node)
        self.health_checks = HealthCheckServers(lambda: self.health.healthy(clock()))
        self.metrics = ProxyMetrics(registry, node_name, families=families)
        self.metrics.attach_proxier(self.relays)
        self._clock = clock
        self._desired_health_checks: DesiredHealthChecks = {}
        #: what the conversion reported for each service that has a problem (a bad annotation)
        self._service_problems: dict[ServiceName, tuple[str, ...]] = {}
        self._applied: Snapshot | None = None
        #: SIGHUP: the node's addresses and nftables table are put right in full
        self._resync = asyncio.Event()
        self._address_events = address_events

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self, extra_addresses: Iterable[str] = ()) -> None:
        """Listeners come with snapshots; this takes the VIP link and the nftables table,
        and ``extra_addresses`` (the DNS addresses) are made local at once."""
        await self.relays.start(extra_addresses=extra_addresses)
        if self._address_events is not None:
            try:
                self._address_events.open()
            except OSError as exc:
                self._address_events = None
                log.error("following the node's addresses (netlink): %s; they are read again on SIGHUP only",
                          exc.strerror or exc)

    async def run(self, may_resync: Callable[[], bool]) -> None:
        """Until cancelled: health-check ports retried, full syncs (when ``may_resync()``), and
        a relay failure raised (the daemon cannot serve without its relays)."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.relays.wait_failed(), name="proxy-failure")
            tasks.create_task(self.health_checks.keep_retrying(), name="healthcheck-retry")
            tasks.create_task(
                keep_host_in_sync(self.relays, self._resync, lambda: self._applied is not None and may_resync(),
                                  self._sync_health_checks, synced=self.metrics.sync_done), name="host-resync")
            if self._address_events is not None:
                tasks.create_task(follow_node_addresses(self.relays, self._address_events.changed,
                                                        self._sync_health_checks), name="node-addresses")

    def request_resync(self) -> None:
        self._resync.set()

    async def stop(self, *, grace: float, abort: asyncio.Event, release: bool, hand_over: bool,
                   keep_if: Callable[[], bool]) -> None:
        """Health-check ports close, then the relays stop accepting and drain up to ``grace``
        seconds (``abort`` ends the drain); see :meth:`Proxier.stop` for the rest."""
        await self.health_checks.close()
        if self._address_events is not None:
            self._address_events.close()
        await self.relays.stop(grace=grace, abort=abort, release=release, hand_over=hand_over, keep_if=keep_if)

    # --- following the snapshots ----------------------------------------------------------

    def snapshot_queued(self, snapshot: Snapshot) -> None:
        self.health.queued_update(self._clock())
        self.metrics.queued(snapshot)

    async def apply_snapshot(self, snapshot: Snapshot) -> None:
        # The first apply builds every service: a full sync (see ProxyMetrics for what a sync is).
        full = not self.relays.ready
        started = time.monotonic()
        try:
            await self.relays.apply(snapshot)
        except Exception:
            self.metrics.sync_done(time.monotonic() - started, full=full, failed=True)
            raise
        self._desired_health_checks = update_health_checks(
            self._desired_health_checks, snapshot.services, snapshot.changed_since(self._applied), self.node_name)
        self._note_service_problems(snapshot)
        self._applied = snapshot
        await self._sync_health_checks()
        self.metrics.synced(snapshot, time.monotonic() - started, full=full, failed=self.relays.host_problems)
        self.health.updated(self._clock())

    def _note_service_problems(self, snapshot: Snapshot) -> None:
        """Kept per service, updated for the changed ones only (a snapshot holds thousands)."""
        for name in snapshot.changed_since(self._applied):
            state = snapshot.services.get(name)
            problems = state.service.problems if state is not None else ()
            if problems:
                self._service_problems[name] = problems
            else:
                self._service_problems.pop(name, None)

    async def _sync_health_checks(self) -> None:
        await self.health_checks.sync(self._desired_health_checks, self.relays.health_check_addresses)

    # --- what the daemon reports ------------------------------------------------------------

    @property
    def problems(self) -> list[str]:
        return (self.relays.problems + [problem for _, problem in sorted(self.health_checks.failures.items())]
                + [problem for _, problems in sorted(self._service_problems.items()) for problem in problems])

    def healthy(self, now: float | None = None) -> bool:
        """kube-proxy's /livez verdict at ``now`` (default: now; the pod's liveness file and
        systemd's watchdog follow it)."""
        return self.health.healthy(self._clock() if now is None else now)

    def health_request(self, path: str, code: int) -> None:
        """Count a ``/healthz`` or ``/livez`` request answered with ``code`` (the status server's hook)."""
        self.metrics.health_request(path, code)

    def health_response(self, path: str, node: NodeInfo | None) -> HealthResponse:
        """kube-proxy's ``/healthz`` (``path == "healthz"``) or ``/livez`` for ``node`` as it is now."""
        self.health.sync_node(node)
        now = self._clock()
        return self.health.healthz(now) if path == "healthz" else self.health.livez(now)

    def status(self) -> dict[str, int | str]:
        found: dict[str, int | str] = {"listeners": len(self.relays.listening), "tcpRelay": self.relays.tcp_relay,
                                       "clientAddress": self.relays.client_address,
                                       "podTraffic": self.relays.pod_traffic}
        if isinstance(self.relays, ProxyWorkers):
            found["workers"] = self.relays.worker_status
        return found

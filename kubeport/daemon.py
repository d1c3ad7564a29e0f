"""Daemon wiring and lifecycle: source -> ClusterState -> proxy and DNS, plus the status server.

Startup: status server (not ready), service addresses, DNS listeners (SERVFAIL until
synced), source. A primary (no other instance serves the node) that finds the last applied
state an earlier process kept in the state directory, young enough, serves it at once, while
/readyz stays 503 until the source has synced. Each consumer follows the snapshots on its own task, so a slow proxy
sync never delays DNS.

Shutdown (SIGTERM/SIGINT): readiness goes false; DNS and the proxy keep serving for the
lame-duck period; the proxy stops accepting and drains established connections up to
the shutdown grace period; addresses are removed; exit 0. A second signal ends the
lame duck and the drain at once. When a new instance takes over (kubeport.survival.handover),
the old one skips the lame duck and leaves the addresses to its successor; once drained it
exits, or with ``--after-handover wait`` (a DaemonSet pod) waits for its SIGTERM and then
exits without touching what the successor holds.
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import logging
import signal
from pathlib import Path
from typing import Any, Awaitable

import uvloop
from prometheus_client import disable_created_metrics

from kubeport import components, nodesettings
from kubeport.cleanup import report_previous_instance
from kubeport.config import KubeportConfiguration, changed_fields
from kubeport.dns.server import DnsServer
from kubeport.endpoints.interfaces import Consumer, Source
from kubeport.endpoints.types import Snapshot
from kubeport.lib.heap import keep_heap_trimmed, release_freed_memory
from kubeport.lib.heldsockets import NOT_HELD, HeldSockets
from kubeport.lib.sdnotify import Notifier
from kubeport.process import process_registry, raise_open_file_limit, seconds_since_exec
from kubeport.proxy.healthcheck.proxier_health import HealthResponse
from kubeport.proxy.service import ProxyService
from kubeport.readiness import LiveFile, ReadyFile
from kubeport.reload import Reloader
from kubeport.status import STATUS_SOCKET, StatusServer
from kubeport.survival import handover
from kubeport.survival.laststate import LastState
from kubeport.survival.sockethold import SocketHold
from kubeport.systemd import SystemdNotifications

log = logging.getLogger("kubeport.daemon")

#: after handing over: how long the drain's end waits for the new instance to hold the node
HANDOVER_ARRIVAL_S = 5.0
#: a restarted daemon serving its last applied state: how long the source waits for every
#: part to serve it before it starts anyway (a part that cannot apply it retries meanwhile)
RESTORED_VIEW_WAIT_S = 2.0
#: serving the last applied state, how often a source that cannot be built is tried again
SOURCE_RETRY_S = 2.0


class DaemonError(Exception):
    """The daemon cannot start or run; the message says why."""


class _Stop(Exception):
    pass


class Daemon:
    def __init__(
        self,
        config: KubeportConfiguration,
        config_file: Path | None = None,
        flags: dict[str, Any] | None = None,
        hold: HeldSockets = NOT_HELD,
    ) -> None:
        self.config = config
        #: the channel to --hold-sockets' supervisor, through which every listener is opened
        self._hold = hold
        self.registry = process_registry()
        #: what the DNS metrics address serves: CoreDNS's series and the process's, as CoreDNS's :9153
        self.dns_registry = process_registry()
        self.state = components.build_state(self.config)
        self._reloader = Reloader(config_file, flags or {})
        #: consumer name -> the generation it applied last
        self._applied: dict[str, int] = {}
        self._ready = asyncio.Event()
        #: set when a change was applied: the freed heap goes back to the kernel in a quiet moment
        self._heap_changed = asyncio.Event()
        #: the snapshot generation served when the heap was last trimmed (status: the bench waits on it)
        self._heap_trimmed_generation: int | None = None
        self._stopping = asyncio.Event()
        self._forced = asyncio.Event()
        self._signalled = asyncio.Event()
        self._handing_over = False
        self._ready_file = ReadyFile(config.ready_file)
        self._live_file = LiveFile(config.live_file)
        self._systemd = SystemdNotifications(Notifier.from_environment(), config.hostname_override)
        self._source: Source | None = None
        #: why the source of a start from the last applied state cannot be built (retried)
        self._source_problem: str | None = None
        self._proxy: ProxyService | None = None
        self._dns: DnsServer | None = None
        self._instance = handover.Instance(config.hostname_override, self._on_takeover,
                                           config.handover_generation)
        self._last_state = LastState(config.state_dir / "last-state", base_written=self._heap_changed.set)
        #: the Unix time of the last applied state served before the first sync (None: none)
        self._restored_at: float | None = None
        self._held_sockets_settled = False
        #: every consumer applied a view (the restored one, when there is one)
        self._restored_view_applied = asyncio.Event()
        #: the node's sysctls that do not hold and this process could not set (checked at start)
        self._node_settings: list[str] = []

    # --- DaemonView (read by the status server) -------------------------------------

    def snapshot(self) -> Snapshot:
        return self.state.snapshot

    def pending(self) -> list[str]:
        if self._stopping.is_set():
            return ["shutting down"]
        pending = []
        if self._instance.predecessor:
            pending.append("handover: the previous instance still serves this node")
        if not self.state.snapshot.synced:
            restored = self.state.snapshot.restored_at
            pending.append("source: first list not complete" + (
                f" (serving the last applied state from {_iso(restored)})" if restored is not None else ""))
        for consumer in self._consumers():
            if consumer.name not in self._applied:
                pending.append(f"{consumer.name}: first snapshot not applied")
        return pending

    def problems(self) -> list[str]:
        found = list(self._source.problems) if self._source is not None else []
        if self._source_problem is not None:
            found.append(self._source_problem)
        if self._last_state.problem is not None:
            found.append(self._last_state.problem)
        for consumer in self._consumers():
            found += [f"{consumer.name}: {problem}" for problem in consumer.problems]
        return found + self._instance.problems + self._node_settings

    def status(self) -> dict[str, Any]:
        """What `kubeport get status` prints: the source's progress and what is being served."""
        snapshot = self.state.snapshot
        source = self._source.status() if self._source is not None else {}
        return {
            "node": self.config.hostname_override,
            "zone": snapshot.node.zone if snapshot.node else None,
            "ready": not self.pending(),
            "generation": snapshot.generation,
            "synced": snapshot.synced,
            "services": len(snapshot.services),
            "endpoints": sum(len(s.endpoints) for st in snapshot.services.values() for s in st.slices),
            "source": {"kind": self.config.source_kind, **source, "problems": len(self.problems())},
            "proxy": {**(self._proxy.status() if self._proxy is not None else {"listeners": 0}),
                      "appliedGeneration": self._applied.get("proxy")},
            "dns": {"addresses": self.config.dns_addresses, "appliedGeneration": self._applied.get("dns")},
            "heap": {"trimmedGeneration": self._heap_trimmed_generation},
            "handover": self._instance.status(),
            "socketHold": self._hold.status(),
            "lastState": {"restoredFrom": _iso(self._restored_at) if self._restored_at is not None else None,
                          "servingIt": snapshot.restored_at is not None,
                          "keptAt": _iso(self._last_state.saved_at) if self._last_state.saved_at else None},
        }

    def proxy_health(self, path: str) -> HealthResponse:
        assert self._proxy is not None
        return self._proxy.health_response(path, self.state.snapshot.node)

    # --- construction -------------------------------------------------------------------

    def _build(self) -> tuple[ProxyService, DnsServer]:
        self._proxy = components.build_proxy(self.config, self.registry, self._hold)
        self._dns = components.build_dns(self.config, self.registry, self.dns_registry, hold=self._hold)
        return self._proxy, self._dns

    def _build_source(self) -> Source:
        try:
            self._source = components.build_source(self.config, self.state, self.registry)
        except components.ComponentError as exc:
            raise DaemonError(str(exc)) from exc
        return self._source

    def _consumers(self) -> tuple[Consumer, ...]:
        # DNS first: its apply is quick and synchronous, so it never waits for the proxy's
        # listeners and netlink work on the same loop.
        if self._dns is None or self._proxy is None:
            return ()
        return (self._dns, self._proxy)

    # --- lifecycle --------------------------------------------------------------------

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal)
        loop.add_signal_handler(signal.SIGHUP, self._on_hangup)
        proxy, dns = self._build()
        # Not in the task group: a handed-over process waiting for its SIGTERM is alive too.
        self._live_task = asyncio.create_task(self._live_file.keep(proxy.health.healthy), name="live-file")
        self._watchdog_task = asyncio.create_task(self._systemd.keep_watchdog(proxy.health.healthy), name="watchdog")
        self._systemd.readiness(self.pending())
        # Beside a squatter on the name (not kubeport) this instance is the node's all the same.
        primary = await self._instance.claim() or self._instance.squatter is not None
        previous_reported: Awaitable[None] | None = None
        if primary:
            # On a thread while the last state is restored (~0.25 s at 10,000 services: the
            # route dump, nft and ip): it must only be done before the proxy takes them over.
            previous_reported = loop.run_in_executor(None, report_previous_instance)
        else:
            log.info("another kubeport instance runs on node %s in this network namespace: "
                     "starting beside it and taking over once ready", self.config.hostname_override)
            await self._instance.announce()
        self._node_settings = nodesettings.check_at_start(self.config)
        if primary:
            # Before DNS listens: queries held across a crash are answered from this state.
            self._restore_last_state()
        status = StatusServer(
            self,
            healthz_bind=self.config.healthz_bind_address,
            metrics_bind=self.config.metrics_bind_address,
            registry=self.registry,
            dns_metrics_bind=self.config.dns_metrics_bind_address,
            dns_registry=self.dns_registry,
            on_request=proxy.metrics.health_request,
            status_socket=self.config.state_dir / STATUS_SOCKET,
            status_bind=self.config.status_bind_address,
        )
        restored = self._restored_at is not None
        # With a restored state the source is built once that is served: the API source's
        # modules (aiohttp) and the manifest source's (the reader, the allocation store) would
        # come before the first answer.
        source = None if restored else self._build_source()
        try:
            await status.start()
            if previous_reported is not None:
                await previous_reported
            await proxy.start(extra_addresses=self.config.dns_addresses)
            if primary:
                if restored:
                    dns.apply(self.state.snapshot)
                await dns.start()
        except OSError as exc:
            await self._shutdown(status)
            raise DaemonError(f"cannot start: {exc}") from exc
        since_exec = seconds_since_exec()
        log.info("kubeport started on node %s%s (source: %s)", self.config.hostname_override,
                 f" {since_exec:.2f}s after exec" if since_exec is not None else "", self.config.source_kind)
        try:
            async with asyncio.TaskGroup() as tasks:
                if self.config.last_state_max_age > 0:
                    tasks.create_task(self._keep_last_state(), name="last-state")
                for consumer in self._consumers():
                    tasks.create_task(self._follow(consumer), name=consumer.name)
                if source is None:
                    # The kept view first: the source's imports and connects (~0.2 s)
                    # would hold the loop before its first answer.
                    tasks.create_task(self._source_after_restored_view(), name="source")
                else:
                    tasks.create_task(source.run(), name="source")
                tasks.create_task(proxy.run(may_resync=self._alone), name="proxy-host")
                tasks.create_task(self._reloader.run(self._reload), name="reload")
                tasks.create_task(self._reloader.watch(), name="reload-watch")
                tasks.create_task(keep_heap_trimmed(self._heap_changed, self._heap_trimmed), name="heap")
                tasks.create_task(self._stop_when_asked(), name="stop")
                if not primary:
                    tasks.create_task(self._take_over(dns), name="takeover")
                elif self._instance.squatter is not None:
                    tasks.create_task(self._instance.keep_claiming(), name="claim")
        except* _Stop:
            pass
        finally:
            await self._shutdown(status)
        if self._handing_over and self.config.after_handover == "wait" and not self._signalled.is_set():
            # A pod's container that exits is restarted by the kubelet, and would take the node back.
            log.info("handed over: waiting for SIGTERM (--after-handover=wait); "
                     "the addresses and rules stay with the new instance")
            if not await handover.idle_until(self._signalled, self.config.hostname_override):
                raise DaemonError("the instance that took node %s over is gone and none serves it: exiting, "
                                  "so that this container restarts and serves it" % self.config.hostname_override)
        if self._handing_over and not await self._instance.claimed_by_another(wait=HANDOVER_ARRIVAL_S):
            # A takeover whose sender never took the node: exit 0 would leave it unserved for good.
            raise DaemonError(f"handed node {self.config.hostname_override} over, but no instance took it: "
                              "exiting non-zero, so that this one is started again")
        if self._handing_over:
            log.info("exiting; node %s is served by the new instance", self.config.hostname_override)

    async def _source_after_restored_view(self) -> None:
        """The source, once the consumers serve the restored view (or after
        RESTORED_VIEW_WAIT_S, should one of them fail to apply it)."""
        try:
            await asyncio.wait_for(self._restored_view_applied.wait(), RESTORED_VIEW_WAIT_S)
        except TimeoutError:
            log.warning("the last applied state is not served by every part after %ss: starting the source",
                        RESTORED_VIEW_WAIT_S)
            gc.enable()  # off while the restored view was being applied
        await asyncio.get_running_loop().run_in_executor(None, components.import_source_modules, self.config)
        while True:
            try:
                source = self._build_source()
                break
            except DaemonError as exc:
                # Without a kept state this ends the start; with one, the kept state is what
                # worked, and a volume that is not mounted yet may well come.
                if self._source_problem != str(exc):
                    log.error("%s: serving the last applied state meanwhile, trying again every %gs",
                              exc, SOURCE_RETRY_S)
                self._source_problem = str(exc)
                await asyncio.sleep(SOURCE_RETRY_S)
        if self._source_problem is not None:
            log.info("the source is built: %s", self.config.source_kind)
            self._source_problem = None
        await source.run()

    async def _keep_last_state(self) -> None:
        """Write the last applied state from the first complete view on: during the cold
        start its first (whole) write would compete with the start for the CPU."""
        await self._ready.wait()
        # Only now: the first base holds everything anyway, and recording the first sync's
        # objects one by one left 3.4 MiB of holes in the heap at 10,000 services (RSS 155.1 -> 151.7).
        self.state.keep_in(self._last_state)
        try:
            await self._last_state.run()
        except Exception as exc:  # noqa: BLE001 - a copy that cannot be kept never stops the serving
            self._last_state.problem = f"cannot keep the last applied state in {self._last_state.directory}: {exc}"
            log.exception("%s", self._last_state.problem)

    def _restore_last_state(self) -> None:
        """Serve what an earlier process last applied, unless it is too old to trust."""
        # Without the cyclic collector: it would walk the growing heap of restored objects
        # again and again (10,000 services from the API: load and restore 0.93 s with it,
        # 0.23 s without). They live until the first sync, so they join the permanent
        # generation, as everything the first sync builds does. The collector stays off
        # until the proxy and DNS serve them (_follow): building 10,000 services' listeners
        # and pools with it took 0.2 s more, spent walking the same young objects.
        gc.disable()
        try:
            self._restore_last_state_now()
        finally:
            gc.freeze()
            if self._restored_at is None:
                gc.enable()

    def _restore_last_state_now(self) -> None:
        saved = self._last_state.load()
        if saved is None:
            return
        max_age = self.config.last_state_max_age
        if max_age <= 0 or saved.age() > max_age:
            log.info("the last applied state in %s is from %s, older than %ss (lastStateMaxAge): not served",
                     self._last_state.directory, _iso(saved.saved_at), f"{max_age:g}")
            return
        self.state.restore(saved)
        snapshot = self.state.commit()
        self._restored_at = saved.saved_at
        log.info("serving the last applied state from %s (%d services) until the source has synced",
                 _iso(saved.saved_at), len(snapshot.services) if snapshot is not None else 0)

    def _on_signal(self) -> None:
        first = not self._signalled.is_set()
        self._signalled.set()
        if self._handing_over and first:
            # The pod's SIGTERM once its successor is ready: the drain under way goes on.
            return
        if self._stopping.is_set():
            log.info("second signal: ending the lame duck and the drain now")
            self._forced.set()
        self._stopping.set()

    def _on_hangup(self) -> None:
        self._reloader.request()
        if self._proxy is not None:
            self._proxy.request_resync()

    def _readiness_changed(self) -> None:
        pending = self.pending()
        self._ready_file.update(not pending)
        self._systemd.readiness(pending)

    def _alone(self) -> bool:
        # Beside another instance the addresses and table are shared: a full sync here would
        # remove what the other one added.
        return not (self._instance.predecessor or self._instance.successors or self._handing_over)

    async def _on_takeover(self) -> None:
        self._handing_over = True
        self._ready_file.update(False)
        self._stopping.set()

    async def _take_over(self, dns: DnsServer) -> None:
        await self._instance.take_over_once(self._ready)
        log.info("handover: this instance now serves node %s", self.config.hostname_override)
        if not dns.listening:
            # The predecessor left before this instance synced: external names are still
            # forwarded, cluster names SERVFAIL until the sync (a primary's start).
            await dns.start()
        self._readiness_changed()
        await self._instance.keep_claiming()  # a squatter took the name the predecessor let go

    async def _stop_when_asked(self) -> None:
        await self._stopping.wait()
        log.info("stopping%s", " (handing over to the new instance)" if self._handing_over else "")
        raise _Stop

    async def _shutdown(self, status: StatusServer) -> None:
        self._stopping.set()
        self._ready_file.update(False)
        self._systemd.stopping("handing over to the new instance" if self._handing_over else "stopping")
        config = self.config
        if not self._handing_over and self._applied:
            await self._unless_forced(asyncio.sleep(config.dns.lame_duck), "lame duck")
        dns_stopped = None
        if self._dns is not None:
            dns_stopped = asyncio.ensure_future(self._dns.stop(hand_over=self._handing_over))
            if not self._handing_over:
                await dns_stopped  # the successors are told to take the node only after it
        # The name is held until here: an instance started meanwhile is a successor, and
        # waits (DNS off) instead of answering beside this one unsynced. It takes the node now.
        self._instance.leave()
        if self._proxy is not None:
            await self._proxy.stop(
                grace=config.shutdown_grace_period, abort=self._forced, release=not self._handing_over,
                hand_over=self._handing_over, keep_if=self._instance.another_serves_the_node)
        if dns_stopped is not None:
            await dns_stopped  # a handover's forwards in flight finish meanwhile
        await status.stop()
        log.info("stopped")

    async def _unless_forced(self, work: Awaitable[Any], what: str) -> None:
        task = asyncio.ensure_future(work)
        forced = asyncio.ensure_future(self._forced.wait())
        done, _ = await asyncio.wait({task, forced}, return_when=asyncio.FIRST_COMPLETED)
        for pending in (task, forced):
            pending.cancel()
        if forced in done:
            log.info("%s cut short", what)

    # --- following the snapshots ----------------------------------------------------------

    async def _follow(self, consumer: Consumer) -> None:
        """Apply every new synced snapshot; on error keep the last good state and retry."""
        name = consumer.name
        generation = 0
        while True:
            snapshot = await self.state.wait_newer(generation)
            consumer.snapshot_queued(snapshot)
            if not snapshot.servable:
                generation = snapshot.generation
                continue
            try:
                await consumer.apply_snapshot(snapshot)
            except Exception:
                log.exception("%s: applying snapshot %d failed; keeping the last good state, retrying",
                              name, snapshot.generation)
                await asyncio.sleep(1.0)
                continue
            generation = snapshot.generation
            if name not in self._applied:
                log.info("%s: first snapshot applied (generation %d, %d services)",
                         name, generation, len(snapshot.services))
            elif snapshot.changed:
                # Debug, as kube-proxy logs each sync only from -v=2: with endpoint churn a line
                # per change per consumer floods the log, and costs ~0.1 ms each on the path
                # of the change (measured at 10,000 services).
                log.debug("%s: applied generation %d (%d services changed)",
                          name, generation, len(snapshot.changed))
            self._applied[name] = generation
            if len(self._applied) == len(self._consumers()) and not self._restored_view_applied.is_set():
                self._restored_view_applied.set()
                if self._restored_at is not None:
                    # The restored view is served: what the proxy and DNS built for it lives
                    # until the first sync, like the restored objects (see _restore_last_state).
                    gc.freeze()
                    gc.enable()
            self._readiness_changed()  # also retries a write that failed
            if len(self._applied) == len(self._consumers()) and not self._held_sockets_settled:
                # Every listener of this view is open (adopted or new): what the holder kept
                # for the previous process and nobody serves now must not take connections.
                self._held_sockets_settled = True
                self._hold.release_unadopted()
            if self._ready.is_set():
                if snapshot.changed or snapshot.pods_changed:  # a Pod-only change frees heap too
                    self._heap_changed.set()
            elif snapshot.synced and len(self._applied) == len(self._consumers()):
                # Everything built for the first view lives long: keep it out of the
                # collector's generations so later collections stay cheap.
                gc.freeze()
                if release_freed_memory():
                    self._heap_trimmed()
                self._ready.set()

    def _heap_trimmed(self) -> None:
        self._heap_trimmed_generation = self.state.snapshot.generation

    # --- SIGHUP ---------------------------------------------------------------------------

    async def _reload(self, new: KubeportConfiguration) -> None:
        applied, kept = await components.apply_live(self.config, new, self._dns)
        # The file's names (serviceNodePortRange, conntrack.udpTimeout), not Python's.
        for path in changed_fields(self.config, new, kept):
            log.warning("configuration: %s changed; it takes effect at the next restart", path)
        self.config = self.config.model_copy(update=applied)


def run(config: KubeportConfiguration, config_file: Path | None = None, flags: dict | None = None) -> int:
    # kube-proxy's and CoreDNS's counters have no *_created series: none here either. Process-wide,
    # so once at start, before any metric exists.
    disable_created_metrics()
    raise_open_file_limit()
    # Before any relay worker starts: they are no party to the holder's channel.
    hold = SocketHold.from_environment()
    try:
        uvloop.run(Daemon(config, config_file, flags, hold).serve())
    except ExceptionGroup as group:
        # A task of the daemon failed in a way it cannot recover from (it logged the rest).
        for error in _leaves(group):
            log.critical("fatal: %s", error, exc_info=error)
        return 1
    return 0


def _iso(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).isoformat(timespec="seconds").replace(
        "+00:00", "Z")


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    found: list[BaseException] = []
    for error in group.exceptions:
        found.extend(_leaves(error) if isinstance(error, BaseExceptionGroup) else [error])
    return found

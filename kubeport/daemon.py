"""Daemon wiring and lifecycle: source -> ClusterState -> proxy and DNS, plus the status server.

Startup: status server (not ready), service addresses, DNS listeners (SERVFAIL until
synced; with ``dns.startupTimeout``, opened once the first sync is applied or that long after
start, as CoreDNS's ``startup_timeout``), source. A primary (no other instance serves the node) that finds the last applied
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
import logging
import signal
from pathlib import Path
from typing import Any, Awaitable

import uvloop
from prometheus_client import disable_created_metrics

from kubeport import components, gctuning, nodesettings
from kubeport.cleanup import report_previous_instance
from kubeport.config import KubeportConfiguration, changed_fields
from kubeport.consumers import DnsConsumer
from kubeport.follow import Follower
from kubeport.lib.heldsockets import NOT_HELD, HeldSockets
from kubeport.lib.sdnotify import Notifier
from kubeport.process import process_registry, raise_open_file_limit, seconds_since_exec
from kubeport.readiness import LiveFile, ReadyFile
from kubeport.reload import Reloader
from kubeport.status import STATUS_SOCKET, StatusServer
from kubeport.statusview import StatusView
from kubeport.stopping import Stop, Stopping, after_handover
from kubeport.survival import handover
from kubeport.survival.laststate import LastState
from kubeport.survival.restore import keep_last_state, restore_last_state, run_source_after_restore
from kubeport.survival.sockethold import SocketHold
from kubeport.systemd import SystemdNotifications

log = logging.getLogger("kubeport.daemon")


class DaemonError(Exception):
    """The daemon cannot start or run; the message says why."""


class Daemon:
    def __init__(self, config: KubeportConfiguration, config_file: Path | None = None,
                 flags: dict[str, Any] | None = None, hold: HeldSockets = NOT_HELD) -> None:
        self.config = config
        #: the channel to --hold-sockets' supervisor, through which every listener is opened
        self._hold = hold
        self.registry = process_registry()
        #: what the DNS metrics address serves: CoreDNS's series and the process's, as CoreDNS's :9153
        self.dns_registry = process_registry()
        self.state = components.build_state(self.config)
        self._reloader = Reloader(config_file, flags or {})
        self._heap = gctuning.Heap()
        self._ready_file = ReadyFile(config.ready_file)
        self._stop = Stopping(self._ready_file)
        self._live_file = LiveFile(config.live_file)
        self._systemd = SystemdNotifications(Notifier.from_environment(), config.hostname_override)
        self._instance = handover.Instance(config.hostname_override, self._stop.on_takeover,
                                           config.handover_generation)
        self._last_state = LastState(config.state_dir / "last-state", base_written=self._heap.changed.set)
        #: what the status server reads; the daemon fills in what it builds and applies
        self.view = StatusView(lambda: self.config, self.state, self._instance, hold, self._last_state,
                               self._stop.requested)
        self._follower = Follower(self.state, self.view, hold, self._heap, self._readiness_changed)

    # --- lifecycle --------------------------------------------------------------------

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stop.on_signal)
        loop.add_signal_handler(signal.SIGHUP, self._on_hangup)
        view = self.view
        view.proxy = proxy = components.build_proxy(self.config, self.registry, self._hold)
        view.dns = dns = components.build_dns(self.config, self.registry, self.dns_registry, hold=self._hold)
        # Not in the task group: a handed-over process waiting for its SIGTERM is alive too.
        self._live_task = asyncio.create_task(self._live_file.keep(proxy.healthy), name="live-file")
        self._watchdog_task = asyncio.create_task(self._systemd.keep_watchdog(proxy.healthy), name="watchdog")
        self._systemd.readiness(self.view.pending())
        # Beside a squatter on the name (not kubeport) this instance is the node's all the same.
        primary = await self._instance.claim() or self._instance.squatter is not None
        previous_reported: Awaitable[None] | None = None
        if primary:
            # On a thread while the last state is restored (the route dump, nft and ip): it
            # must only be done before the proxy takes them over.
            previous_reported = loop.run_in_executor(None, report_previous_instance)
        else:
            log.info("another kubeport instance runs on node %s in this network namespace: "
                     "starting beside it and taking over once ready", self.config.hostname_override)
            await self._instance.announce()
        self.view.node_settings = nodesettings.check_at_start(self.config)
        if primary:
            self.view.restored_at = restore_last_state(self.state, self._last_state, self.config.last_state_max_age)
        config = self.config
        status = StatusServer(view, healthz_bind=config.healthz_bind_address, registry=self.registry,
                              metrics_bind=config.metrics_bind_address, dns_registry=self.dns_registry,
                              dns_metrics_bind=config.dns_metrics_bind_address, on_request=proxy.health_request,
                              status_socket=config.state_dir / STATUS_SOCKET, status_bind=config.status_bind_address)
        restored = view.restored_at is not None
        # With a restored state the source is built once that is served: the API source's
        # modules (aiohttp) and the manifest source's (the reader, the allocation store) would
        # come before the first answer.
        try:
            source = None if restored else components.build_source(config, self.state, self.registry, dns)
        except components.ComponentError as exc:
            raise DaemonError(str(exc)) from exc
        view.source = source
        try:
            await status.start()
            if previous_reported is not None:
                await previous_reported
            await proxy.start(extra_addresses=self.config.dns_addresses)
            dns_wait = dns_start_wait(restored, config.dns.startup_timeout)
            if primary:
                if restored:
                    # DNS's first apply, before it listens: queries held across a crash are
                    # answered from the restored state; following goes on after it.
                    await self._follower.apply(dns, self.state.snapshot)
                if dns_wait:
                    view.dns_waiting = True  # started in the task group, once the source runs
                else:
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
                    tasks.create_task(keep_last_state(self.state, self._last_state, self._follower.ready),
                                      name="last-state")
                for consumer in self.view.consumers():
                    tasks.create_task(self._follower.follow(consumer, self.view.applied.get(consumer.name, 0)),
                                      name=consumer.name)
                if source is None:  # the restored view first
                    tasks.create_task(run_source_after_restore(self.config, self.state, self.registry, self.view,
                                                               self._follower.restored_view_applied), name="source")
                else:
                    tasks.create_task(source.run(), name="source")
                tasks.create_task(proxy.run(may_resync=self._alone), name="proxy-host")
                if view.dns_waiting:
                    tasks.create_task(self._start_dns_after_sync(dns, dns_wait), name="dns-start")
                tasks.create_task(self._reloader.run(self._reload), name="reload")
                tasks.create_task(self._reloader.watch(), name="reload-watch")
                tasks.create_task(self._heap.keep_trimmed(), name="heap")
                tasks.create_task(self._stop.when_asked(), name="stop")
                if not primary:
                    tasks.create_task(self._take_over(dns), name="takeover")
                elif self._instance.squatter is not None:
                    tasks.create_task(self._instance.keep_claiming(), name="claim")
        except* Stop:
            pass
        finally:
            await self._shutdown(status)
        if self._stop.handing_over:
            problem = await after_handover(self._stop, self._instance, self.config.hostname_override,
                                           wait=self.config.after_handover == "wait")
            if problem is not None:
                raise DaemonError(problem)

    async def _start_dns_after_sync(self, dns: DnsConsumer, timeout: float) -> None:
        """CoreDNS's ``kubernetes`` plugin holds the server's start (its OnStartup,
        ``plugin/kubernetes/setup.go RegisterKubeCache``) until its informers have synced or
        ``startup_timeout`` has passed; the servers listen after the OnStartup functions
        return. Until the sync a cluster name not known yet is SERVFAIL, other names forwarded."""
        if not await self._follower.wait_synced(dns.name, timeout):
            log.warning("dns: the first sync did not complete within %gs (dns.startupTimeout): listening; "
                        "a cluster name not known yet is answered SERVFAIL until it does", timeout)
        try:
            await dns.start()
        except OSError as exc:
            raise DaemonError(f"cannot start DNS: {exc}") from exc
        self.view.dns_waiting = False
        self._readiness_changed()

    def _on_hangup(self) -> None:
        self._reloader.request()
        if self.view.proxy is not None:
            self.view.proxy.request_resync()

    def _readiness_changed(self) -> None:
        pending = self.view.pending()
        self._ready_file.update(not pending)
        self._systemd.readiness(pending)

    def _alone(self) -> bool:
        # Beside another instance the addresses and table are shared: a full sync here would
        # remove what the other one added.
        return not (self._instance.predecessor or self._instance.successors or self._stop.handing_over)

    async def _take_over(self, dns: DnsConsumer) -> None:
        await self._instance.take_over_once(self._follower.ready)
        log.info("handover: this instance now serves node %s", self.config.hostname_override)
        if not dns.listening:
            # The predecessor left before this instance synced: external names are still
            # forwarded, cluster names SERVFAIL until the sync (a primary's start).
            await dns.start()
        self._readiness_changed()
        await self._instance.keep_claiming()  # a squatter took the name the predecessor let go

    async def _shutdown(self, status: StatusServer) -> None:
        stop, view, config = self._stop, self.view, self.config
        stop.requested.set()
        self._ready_file.update(False)
        self._systemd.stopping("handing over to the new instance" if stop.handing_over else "stopping")
        if not stop.handing_over and view.applied:
            await stop.unless_forced(asyncio.sleep(config.dns.lame_duck), "lame duck")
        dns_stopped = None
        if view.dns is not None:
            dns_stopped = asyncio.ensure_future(view.dns.stop(hand_over=stop.handing_over))
            if not stop.handing_over:
                await dns_stopped  # the successors are told to take the node only after it
        # The name is held until here: an instance started meanwhile is a successor, and
        # waits (DNS off) instead of answering beside this one unsynced. It takes the node now.
        self._instance.leave()
        if view.proxy is not None:
            await view.proxy.stop(
                grace=config.shutdown_grace_period, abort=stop.forced, release=not stop.handing_over,
                hand_over=stop.handing_over, keep_if=self._instance.another_serves_the_node)
        if dns_stopped is not None:
            await dns_stopped  # a handover's forwards in flight finish meanwhile
        await status.stop()
        log.info("stopped")

    async def _reload(self, new: KubeportConfiguration) -> None:
        """SIGHUP or a changed configuration file: what can change live does."""
        applied, kept = await components.apply_live(self.config, new, self.view.dns)
        # The file's names (serviceNodePortRange, conntrack.udpTimeout), not Python's.
        for path in changed_fields(self.config, new, kept):
            log.warning("configuration: %s changed; it takes effect at the next restart", path)
        self.config = self.config.model_copy(update=applied)


def dns_start_wait(restored: bool, startup_timeout: float) -> float:
    """How long DNS may wait for the first sync before it listens (0: it listens at once).

    CoreDNS waits up to ``startup_timeout`` for its informers (``plugin/kubernetes/setup.go``).
    A restored last applied state is answered from at once instead: it is what the node
    served a moment ago, and queries held across a crash wait for it."""
    return 0.0 if restored else max(0.0, startup_timeout)


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


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    found: list[BaseException] = []
    for error in group.exceptions:
        found.extend(_leaves(error) if isinstance(error, BaseExceptionGroup) else [error])
    return found

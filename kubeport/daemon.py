"""Daemon wiring and lifecycle: source -> ClusterState -> proxy and DNS, plus the status server.

Startup: status server (not ready), service addresses, DNS listeners (SERVFAIL until
synced), source. Each consumer follows the snapshots on its own task, so a slow proxy
sync never delays DNS. Shutdown is ordered: readiness off, stop the source, stop
DNS and the proxy (draining), remove addresses, stop serving status.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import uvloop
from prometheus_client import CollectorRegistry

from kubeport.endpoints.state import REQUIRED_KINDS, ClusterState
from kubeport.endpoints.types import Snapshot

from kubeport.proxy.health import HealthResponse

from .config import KubeportConfiguration
from .status import StatusServer

log = logging.getLogger("kubeport.daemon")


class DaemonError(Exception):
    """The daemon cannot start or run; the message says why."""


class Daemon:
    def __init__(self, config: KubeportConfiguration) -> None:
        self.config = config
        self.manifest_mode = config.source_kind == "manifests"
        self.registry = CollectorRegistry()
        self.state = self._build_state()
        self._applied: dict[str, int] = {}
        self._stopping = asyncio.Event()
        self._source: Any = None
        self._proxier: Any = None
        self._dns: Any = None
        self._health: Any = None
        self._healthchecks: Any = None

    # --- DaemonView (read by the status server) -------------------------------------

    def snapshot(self) -> Snapshot:
        return self.state.snapshot

    def pending(self) -> list[str]:
        if self._stopping.is_set():
            return ["shutting down"]
        pending = []
        if not self.state.snapshot.synced:
            pending.append("source: first list not complete")
        for consumer in ("proxy", "dns"):
            if consumer not in self._applied:
                pending.append(f"{consumer}: first snapshot not applied")
        return pending

    def problems(self) -> list[str]:
        found = list(self._source.problems) if self._source is not None else []
        if self._proxier is not None:
            found += [f"proxy: {problem}" for problem in self._proxier.problems]
        return found

    def proxy_health(self, path: str) -> HealthResponse:
        self._health.sync_node(self.state.snapshot.node)
        now = time.time()
        return self._health.healthz(now) if path == "healthz" else self._health.livez(now)

    # --- lifecycle --------------------------------------------------------------------

    def _build_state(self) -> ClusterState:
        transform = None
        if self.manifest_mode:
            from kubeport.endpoints.hints import fill_hints

            transform = fill_hints
        # With an API server, DNS also waits for Namespaces (CoreDNS answers for namespace names).
        required = REQUIRED_KINDS if self.manifest_mode else REQUIRED_KINDS | {"Namespace"}
        return ClusterState(
            self.config.hostname_override,
            implicit_namespaces=self.manifest_mode,
            slice_transform=transform,
            required_kinds=required,
        )

    def _build_source(self) -> Any:
        config = self.config
        if not self.manifest_mode:
            from kubeport.endpoints.apiserver import ApiServerSource

            source = ApiServerSource(
                self.state,
                kubeconfig=config.client_connection.kubeconfig,
                in_cluster=config.in_cluster,
                node_name=config.hostname_override,
            )
            self.registry.register(source.collector())
            return source
        from kubeport.endpoints.allocstore import AllocationStore, StoreError
        from kubeport.endpoints.manifests import ManifestSource
        from kubeport.endpoints.registry import Registry

        directory = config.manifests
        if directory is None:
            raise DaemonError("no source: give --manifests DIR (or --kubeconfig / --in-cluster)")
        if not directory.is_dir():
            raise DaemonError(f"--manifests {directory}: not a directory")
        try:
            store = AllocationStore.in_state_dir(config.state_dir)
        except (OSError, StoreError) as exc:
            raise DaemonError(f"--state-dir {config.state_dir}: {exc}") from exc
        registry = Registry(store, list(config.service_cluster_ip_range), config.service_node_port_range)
        return ManifestSource(directory, registry, self.state)

    def _build_dns(self) -> Any:
        from kubeport.dns.config import DnsConfig, default_upstreams
        from kubeport.dns.server import DnsServer

        dns = self.config.dns
        upstreams = [_host_port(u, 53) for u in dns.upstreams] if dns.upstreams else default_upstreams()
        return DnsServer(DnsConfig(
            zone=dns.cluster_domain,
            ttl=dns.ttl,
            pods=dns.pods,
            endpoint_pod_names=dns.endpoint_pod_names,
            upstreams=upstreams,
            addresses=self.config.dns_addresses,
            port=dns.port,
        ))

    def _build_proxier(self) -> Any:
        from kubeport.proxy.config import ProxyConfig
        from kubeport.proxy.proxier import Proxier

        config = self.config
        reserved = {(ip, config.dns.port, proto) for ip in config.dns_addresses for proto in ("UDP", "TCP")}
        return Proxier(
            ProxyConfig(
                nodeport_addresses=tuple(config.node_port_addresses),
                cluster_cidrs=tuple(str(cidr) for cidr in config.cluster_cidr),
                vip_interface=config.vip_interface,
                udp_idle_timeout=config.conntrack.udp_stream_timeout,
                reserved_frontends=frozenset(reserved),
            ),
            node_name=config.hostname_override,
        )

    async def serve(self) -> None:
        from kubeport.proxy.health import ProxyHealth

        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stopping.set)
        # Manifest mode may have no Node object at all: then the node counts as eligible.
        self._health = ProxyHealth(require_node=not self.manifest_mode)
        self._source = self._build_source()
        self._proxier = self._build_proxier()
        self._dns = self._build_dns()
        from kubeport.dns.metrics import DnsCollector

        self.registry.register(DnsCollector(self._dns))
        status = StatusServer(
            self,
            healthz_bind=self.config.healthz_bind_address,
            metrics_bind=self.config.metrics_bind_address,
            registry=self.registry,
        )
        try:
            await status.start()
            await self._proxier.start(extra_addresses=self.config.dns_addresses)
            await self._dns.start()
        except OSError as exc:
            await self._shutdown(status)
            raise DaemonError(f"cannot start: {exc}") from exc
        log.info("kubeport started on node %s", self.config.hostname_override)
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._source.run(), name="source")
                tasks.create_task(self._follow("proxy", self._proxier.apply), name="proxy")
                tasks.create_task(self._follow("dns", self._apply_dns), name="dns")
                tasks.create_task(self._stop_when_asked(), name="stop")
        except* _Stop:
            pass
        finally:
            await self._shutdown(status)

    async def _stop_when_asked(self) -> None:
        await self._stopping.wait()
        log.info("stopping")
        raise _Stop

    async def _apply_dns(self, snapshot: Snapshot) -> None:
        self._dns.apply(snapshot)

    async def _follow(self, consumer: str, apply: Callable[[Snapshot], Awaitable[None]]) -> None:
        """Apply every new synced snapshot; on error keep the last good state and retry."""
        generation = 0
        while True:
            snapshot = await self.state.wait_newer(generation)
            if consumer == "proxy":
                self._health.queued_update(time.time())
            if not snapshot.synced:
                generation = snapshot.generation
                continue
            try:
                await apply(snapshot)
            except Exception:
                log.exception("%s: applying snapshot %d failed; keeping the last good state, retrying",
                              consumer, snapshot.generation)
                await asyncio.sleep(1.0)
                continue
            generation = snapshot.generation
            if consumer == "proxy":
                self._health.updated(time.time())
            if consumer not in self._applied:
                log.info("%s: first snapshot applied (generation %d, %d services)",
                         consumer, generation, len(snapshot.services))
            self._applied[consumer] = generation

    async def _shutdown(self, status: StatusServer) -> None:
        self._stopping.set()
        if self._dns is not None:
            await self._dns.stop()
        if self._proxier is not None:
            await self._proxier.stop(grace=0.0)
        await status.stop()


class _Stop(Exception):
    pass


def _host_port(text: str, default_port: int) -> tuple[str, int]:
    if text.startswith("["):
        host, _, port = text[1:].partition("]:")
        return host.rstrip("]"), int(port) if port else default_port
    if text.count(":") == 1:
        host, port = text.split(":")
        return host, int(port)
    return text, default_port


def run(config: KubeportConfiguration, config_file: Path | None = None, flags: dict | None = None) -> int:
    uvloop.run(Daemon(config).serve())
    return 0

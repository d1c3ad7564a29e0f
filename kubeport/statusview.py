"""The running daemon as the status server reads it (:class:`kubeport.status.DaemonView`):
readiness, problems, ``kubeport get status`` and kube-proxy's health. The daemon fills in
what it builds and applies as it goes; this module only reads."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable

from kubeport.config import KubeportConfiguration
from kubeport.consumers import DnsConsumer, ProxyConsumer
from kubeport.endpoints.interfaces import Consumer, Source
from kubeport.endpoints.state import ClusterState
from kubeport.endpoints.types import Snapshot
from kubeport.lib.heldsockets import HeldSockets
from kubeport.survival.handover import Instance
from kubeport.survival.laststate import LastState
from kubeport.survival.restore import iso

if TYPE_CHECKING:
    from kubeport.proxy.healthcheck.proxier_health import HealthResponse


class StatusView:
    def __init__(self, config: Callable[[], KubeportConfiguration], state: ClusterState, instance: Instance,
                 hold: HeldSockets, last_state: LastState, stopping: asyncio.Event) -> None:
        self._config = config
        self._state = state
        self._instance = instance
        self._hold = hold
        self._last_state = last_state
        self._stopping = stopping
        self.source: Source | None = None
        #: why the source of a start from the last applied state cannot be built (retried)
        self.source_problem: str | None = None
        self.proxy: ProxyConsumer | None = None
        self.dns: DnsConsumer | None = None
        #: consumer name -> the generation it applied last
        self.applied: dict[str, int] = {}
        #: the Unix time of the last applied state served before the first sync (None: none)
        self.restored_at: float | None = None
        #: the node's sysctls that do not hold and this process could not set (checked at start)
        self.node_settings: list[str] = []
        #: DNS waits for the first sync before it listens (dns.startupTimeout): not ready meanwhile
        self.dns_waiting = False

    def consumers(self) -> tuple[Consumer, ...]:
        # DNS first: its apply is quick and synchronous, so it never waits for the proxy's
        # listeners and netlink work on the same loop.
        if self.dns is None or self.proxy is None:
            return ()
        return (self.dns, self.proxy)

    def all_applied(self) -> bool:
        return len(self.applied) == len(self.consumers())

    # --- DaemonView ---------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        return self._state.snapshot

    def pending(self) -> list[str]:
        if self._stopping.is_set():
            return ["shutting down"]
        pending = []
        if self._instance.predecessor:
            pending.append("handover: the previous instance still serves this node")
        if not self._state.snapshot.synced:
            restored = self._state.snapshot.restored_at
            pending.append("source: first list not complete" + (
                f" (serving the last applied state from {iso(restored)})" if restored is not None else ""))
        for consumer in self.consumers():
            if consumer.name not in self.applied:
                pending.append(f"{consumer.name}: first snapshot not applied")
        if self.dns_waiting:
            pending.append("dns: not listening yet (waiting for the first sync, dns.startupTimeout)")
        return pending

    def problems(self) -> list[str]:
        found = list(self.source.problems) if self.source is not None else []
        if self.source_problem is not None:
            found.append(self.source_problem)
        if self._last_state.problem is not None:
            found.append(self._last_state.problem)
        for consumer in self.consumers():
            found += [f"{consumer.name}: {problem}" for problem in consumer.problems]
        return found + self._instance.problems + self.node_settings

    def status(self) -> dict[str, Any]:
        """What `kubeport get status` prints: the source's progress and what is being served."""
        config = self._config()
        snapshot = self._state.snapshot
        source = self.source.status() if self.source is not None else {}
        problems = self.problems()
        return {
            "node": config.hostname_override,
            "zone": snapshot.node.zone if snapshot.node else None,
            "ready": not self.pending(),
            "generation": snapshot.generation,
            "synced": snapshot.synced,
            "services": len(snapshot.services),
            "endpoints": sum(len(s.endpoints) for st in snapshot.services.values() for s in st.slices),
            "source": {"kind": config.source_kind, **source, "problems": len(problems)},
            "proxy": {**(self.proxy.status() if self.proxy is not None else {"listeners": 0}),
                      "appliedGeneration": self.applied.get("proxy")},
            "dns": {"addresses": config.dns_addresses, "appliedGeneration": self.applied.get("dns")},
            "handover": self._instance.status(),
            "socketHold": self._hold.status(),
            "lastState": {"restoredFrom": iso(self.restored_at) if self.restored_at is not None else None,
                          "servingIt": snapshot.restored_at is not None,
                          "keptAt": iso(self._last_state.saved_at) if self._last_state.saved_at else None},
            # The lines themselves too: what is not served (a frontend without a listener) shows
            # here while readiness, which is about syncing, stays true.
            "problems": problems,
        }

    def proxy_health(self, path: str) -> HealthResponse:
        assert self.proxy is not None
        return self.proxy.health_response(path, self._state.snapshot.node)

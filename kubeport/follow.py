"""Each consumer follows the ClusterState's snapshots on its own task, so a slow proxy sync
never delays DNS; what a consumer fails to apply is retried, its last good state kept
meanwhile. The first view every consumer serves settles the held sockets; the first synced
one makes the daemon ready, and may be what DNS waits for before it listens (its
``startupTimeout``)."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from kubeport import gctuning
from kubeport.endpoints.interfaces import Consumer
from kubeport.endpoints.state import ClusterState
from kubeport.endpoints.types import Snapshot
from kubeport.lib.heldsockets import HeldSockets
from kubeport.statusview import StatusView

log = logging.getLogger("kubeport.daemon")

#: after a failed apply, how long a consumer waits before it tries again
RETRY_S = 1.0


class Follower:
    def __init__(self, state: ClusterState, view: StatusView, hold: HeldSockets, heap: gctuning.Heap,
                 readiness_changed: Callable[[], None]) -> None:
        self._state = state
        self._view = view
        self._hold = hold
        self._heap = heap
        self._readiness_changed = readiness_changed
        #: every consumer serves the first synced view
        self.ready = asyncio.Event()
        #: every consumer applied a view (the restored one, when there is one)
        self.restored_view_applied = asyncio.Event()
        self._held_sockets_settled = False
        #: per consumer: it applied a synced snapshot (DNS listens on it: wait_synced)
        self._synced: dict[str, asyncio.Event] = {}

    async def wait_synced(self, name: str, timeout: float) -> bool:
        """Until consumer ``name`` has applied a synced snapshot, for at most ``timeout``
        seconds: False when the time ran out first."""
        try:
            await asyncio.wait_for(self._synced_event(name).wait(), timeout)
        except TimeoutError:
            return False
        return True

    def _synced_event(self, name: str) -> asyncio.Event:
        return self._synced.setdefault(name, asyncio.Event())

    async def follow(self, consumer: Consumer, generation: int = 0) -> None:
        """Apply every synced snapshot newer than ``generation``; on error keep the last good
        state and retry."""
        while True:
            snapshot = await self._state.wait_newer(generation)
            if await self.apply(consumer, snapshot):
                generation = snapshot.generation
            else:
                await asyncio.sleep(RETRY_S)

    async def apply(self, consumer: Consumer, snapshot: Snapshot) -> bool:
        """One snapshot to one consumer, and what follows from it; False: it failed (logged)."""
        consumer.snapshot_queued(snapshot)
        if not snapshot.servable:
            return True
        name, view = consumer.name, self._view
        try:
            await consumer.apply_snapshot(snapshot)
        except Exception:
            log.exception("%s: applying snapshot %d failed; keeping the last good state, retrying",
                          name, snapshot.generation)
            return False
        generation = snapshot.generation
        if name not in view.applied:
            log.info("%s: first snapshot applied (generation %d, %d services)",
                     name, generation, len(snapshot.services))
        elif snapshot.changed:
            # Debug, as kube-proxy logs each sync only from -v=2: with endpoint churn a line
            # per change per consumer floods the log, and it is on the path of the change.
            log.debug("%s: applied generation %d (%d services changed)", name, generation, len(snapshot.changed))
        view.applied[name] = generation
        if snapshot.synced:
            self._synced_event(name).set()
        if view.all_applied() and not self.restored_view_applied.is_set():
            self.restored_view_applied.set()
            if view.restored_at is not None:
                gctuning.restored_view_served()
        self._readiness_changed()  # also retries a write that failed
        if view.all_applied() and not self._held_sockets_settled:
            # Every listener of this view is open (adopted or new): what the holder kept
            # for the previous process and nobody serves now must not take connections.
            self._held_sockets_settled = True
            self._hold.release_unadopted()
        if self.ready.is_set():
            if snapshot.changed or snapshot.pods_changed:  # a Pod-only change frees heap too
                self._heap.changed.set()
        elif snapshot.synced and view.all_applied():
            self._heap.first_view_served()
            self.ready.set()
        return True

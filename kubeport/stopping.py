"""When and how the daemon stops: a signal, a second one that cuts the lame duck and the
drain short, or a new instance taking the node over (kubeport.survival.handover)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable

from kubeport.readiness import ReadyFile
from kubeport.survival import handover

log = logging.getLogger("kubeport.daemon")

#: after handing over: how long the drain's end waits for the new instance to hold the node
HANDOVER_ARRIVAL_S = 5.0


class Stop(Exception):
    """Raised in the daemon's task group to end it."""


class Stopping:
    def __init__(self, ready_file: ReadyFile) -> None:
        self._ready_file = ready_file
        #: the daemon stops (readiness reads it)
        self.requested = asyncio.Event()
        #: a second signal: the lame duck and the drain end now
        self.forced = asyncio.Event()
        self.signalled = asyncio.Event()
        #: a new instance took the node over: it keeps the addresses and rules
        self.handing_over = False

    def on_signal(self) -> None:
        first = not self.signalled.is_set()
        self.signalled.set()
        if self.handing_over and first:
            # The pod's SIGTERM once its successor is ready: the drain under way goes on.
            return
        if self.requested.is_set():
            log.info("second signal: ending the lame duck and the drain now")
            self.forced.set()
        self.requested.set()

    async def on_takeover(self) -> None:
        self.handing_over = True
        self._ready_file.update(False)
        self.requested.set()

    async def when_asked(self) -> None:
        await self.requested.wait()
        log.info("stopping%s", " (handing over to the new instance)" if self.handing_over else "")
        raise Stop

    async def unless_forced(self, work: Awaitable[Any], what: str) -> None:
        task = asyncio.ensure_future(work)
        forced = asyncio.ensure_future(self.forced.wait())
        done, _ = await asyncio.wait({task, forced}, return_when=asyncio.FIRST_COMPLETED)
        for pending in (task, forced):
            pending.cancel()
        if forced in done:
            log.info("%s cut short", what)


async def after_handover(stop: Stopping, instance: handover.Instance, node: str, wait: bool) -> str | None:
    """Once a handed-over instance has drained: with ``wait`` (--after-handover=wait) idle
    until SIGTERM, then check that the new instance holds the node. Returns why the daemon
    must exit non-zero, None when it may exit 0."""
    if wait and not stop.signalled.is_set():
        # A pod's container that exits is restarted by the kubelet, and would take the node back.
        log.info("handed over: waiting for SIGTERM (--after-handover=wait); "
                 "the addresses and rules stay with the new instance")
        if not await handover.idle_until(stop.signalled, node):
            return (f"the instance that took node {node} over is gone and none serves it: exiting, "
                    "so that this container restarts and serves it")
    if not await instance.claimed_by_another(wait=HANDOVER_ARRIVAL_S):
        # A takeover whose sender never took the node: exit 0 would leave it unserved for good.
        return f"handed node {node} over, but no instance took it: exiting non-zero, so that this one is started again"
    log.info("exiting; node %s is served by the new instance", node)
    return None

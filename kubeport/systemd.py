"""The daemon as a ``Type=notify`` systemd service (kubeport/lib/sdnotify.py): ``READY=1``
when /readyz would answer 200, ``STATUS=`` with what is pending, ``WATCHDOG=1`` from the event
loop while /livez's rule holds, ``STOPPING=1`` when the stop begins.

The pings come from a task on the event loop itself: a loop stuck in a callback sends none,
and systemd kills and restarts the service after ``WatchdogSec``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from kubeport.lib.sdnotify import Notifier

log = logging.getLogger(__name__)


class SystemdNotifications:
    def __init__(self, notifier: Notifier, node: str) -> None:
        self._notifier = notifier
        self._node = node
        self._status: str | None = None
        self._ready = False
        self._stopping = False

    def readiness(self, pending: list[str]) -> None:
        """After every change that may move /readyz: only what changed is sent."""
        if self._stopping or not self._notifier.enabled:
            return
        if pending:
            self._send_status("pending: " + "; ".join(pending))
        elif not self._ready:
            self._ready = True
            self._status = f"serving node {self._node}"
            self._notifier.notify("READY=1", f"STATUS={self._status}")
        else:
            self._send_status(f"serving node {self._node}")

    def stopping(self, why: str) -> None:
        if self._stopping:
            return
        self._stopping = True
        self._status = why
        self._notifier.notify("STOPPING=1", f"STATUS={why}")

    def _send_status(self, text: str) -> None:
        if text != self._status:
            self._status = text
            self._notifier.notify(f"STATUS={text}")

    async def keep_watchdog(self, live: Callable[[float], bool], clock: Callable[[], float] = time.time) -> None:
        """``WATCHDOG=1`` every half ``WatchdogSec`` while ``live(now)``, until cancelled."""
        period = self._notifier.watchdog
        if period is None:
            return
        log.info("systemd watchdog: a ping every %.3g s", period)
        while True:
            if live(clock()):
                self._notifier.notify("WATCHDOG=1")
            await asyncio.sleep(period)

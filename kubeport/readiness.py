"""A pod's own readiness and liveness files (see :class:`ReadyFile`, :class:`LiveFile`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)


def _remove_stale(path: Path | None) -> None:
    """The file and any scratch copy of it a killed process left in the pod's emptyDir."""
    if path is None:
        return
    for stale in (path, *path.parent.glob(f".{path.name}.*")):
        with contextlib.suppress(OSError):
            stale.unlink()


class ReadyFile:
    """A pod's own readiness: a file present while this process serves the node and is ready.

    In a DaemonSet with ``maxSurge``, the new pod starts beside the old one on the node's
    network (``hostNetwork``), and both listen on the same /readyz port: an HTTP probe may be
    answered by the other pod. The kubelet deletes the old pod once the new one is ready, so
    the new pod must not look ready before it has taken the node over. A file in the pod's own
    filesystem, read by an exec probe, belongs to one process only.
    """

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._present = False
        _remove_stale(path)  # left by this container's previous process (killed, OOM): not this one's

    def update(self, ready: bool) -> None:
        if self._path is None or ready == self._present:
            return
        try:
            if ready:
                scratch = self._path.with_name(f".{self._path.name}.{os.getpid()}")
                scratch.write_text(f"{os.getpid()}\n")
                scratch.rename(self._path)  # never a half-written file for the probe
            else:
                self._path.unlink(missing_ok=True)
        except OSError as exc:
            log.error("readiness file %s: %s", self._path, exc.strerror or exc)
            return
        self._present = ready


#: how often a live file is renewed while the process is healthy, and for how long it vouches
LIVE_RENEW = 5.0
LIVE_VALIDITY = 20.0


class LiveFile:
    """A pod's own liveness: a file holding the wall-clock second (POSIX) until which this
    process vouches for itself, renewed every :data:`LIVE_RENEW` seconds while it is live
    (``/livez``'s rule) and its event loop runs.

    During a DaemonSet rollout both pods' ``/livez`` listen on the node's shared port, so an
    HTTP liveness probe may be answered by the healthy pod for the hung one. The probe reads
    this file instead (``[ "$(date +%s)" -lt "$(cat FILE)" ]``): a process whose loop is stuck,
    or whose updates stay pending past the health timeout, stops renewing it, and the probe
    fails :data:`LIVE_VALIDITY` seconds later.
    """

    def __init__(self, path: Path | None, *, clock: Callable[[], float] = time.time) -> None:
        self._path = path
        self._clock = clock
        self._failed = False
        _remove_stale(path)  # a killed predecessor's promise is not this process's

    def renew(self, live: bool) -> None:
        if self._path is None or not live:
            return
        scratch = self._path.with_name(f".{self._path.name}.{os.getpid()}")
        try:
            scratch.write_text(f"{int(self._clock() + LIVE_VALIDITY)}\n")
            scratch.rename(self._path)
        except OSError as exc:
            if not self._failed:  # once per run of failures, not every 5 s
                log.error("liveness file %s: %s", self._path, exc.strerror or exc)
            self._failed = True
            return
        self._failed = False

    async def keep(self, live: Callable[[float], bool]) -> None:
        """Renew the file while ``live(now)``, until cancelled (the handed-over process that
        waits for its SIGTERM is alive too)."""
        if self._path is None:
            return
        try:
            while True:
                self.renew(live(self._clock()))
                await asyncio.sleep(LIVE_RENEW)
        finally:  # cancelled as the process ends (asyncio.run cancels what is left)
            with contextlib.suppress(OSError):
                self._path.unlink(missing_ok=True)

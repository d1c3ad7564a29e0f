"""A pod's own readiness file (see :class:`ReadyFile`)."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


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
        if path is not None:
            # Left by this container's previous process (killed, OOM): not this one's readiness.
            for stale in (path, *path.parent.glob(f".{path.name}.*")):
                with contextlib.suppress(OSError):
                    stale.unlink()

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

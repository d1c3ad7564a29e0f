"""SIGHUP, or a change of the file's content: re-read the configuration file (flags still
override it) and apply what can change live."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path
from typing import Any, Awaitable, Callable

from kubeport import config as config_module
from kubeport.config import ConfigError, KubeportConfiguration

log = logging.getLogger("kubeport.daemon")

#: how often the file's content is compared: CoreDNS's `reload` default. A ConfigMap update
#: reaches a pod's volume within the kubelet's sync period (about a minute) anyway.
WATCH_INTERVAL = 30.0


class Reloader:
    def __init__(self, config_file: Path | None, flags: dict[str, Any]) -> None:
        self._file = config_file
        self._flags = flags
        self._requested = asyncio.Event()
        self.reloads = 0
        self.failures = 0

    def request(self) -> None:
        """Signal handler: coalesces bursts of SIGHUP into one reload."""
        self._requested.set()

    async def run(self, apply: Callable[[KubeportConfiguration], Awaitable[None]]) -> None:
        while True:
            await self._requested.wait()
            self._requested.clear()
            if self._file is None:
                log.warning("reload: no --config file to re-read")
                continue
            try:
                new = config_module.build(self._file, self._flags)
            except ConfigError as exc:
                self.failures += 1
                log.error("reload: keeping the running configuration: %s", exc)
                continue
            await apply(new)
            self.reloads += 1
            log.info("reload: %s re-read", self._file)

    async def watch(self, interval: float = WATCH_INTERVAL,
                    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        """Request a reload when the file's content changes. Polled, not inotify: a mounted
        ConfigMap changes by swapping a symlink of its directory, which a watch on the file
        never sees; a read of a small file every 30 s costs nothing."""
        if self._file is None:
            return
        seen = _digest(self._file)
        while True:
            await sleep(interval)
            current = _digest(self._file)
            if current != seen and current is not None:
                log.info("configuration: %s changed; re-reading it", self._file)
                self.request()
            seen = current if current is not None else seen


def _digest(path: Path) -> bytes | None:
    try:
        return hashlib.sha256(path.read_bytes()).digest()
    except OSError:
        return None  # gone for a moment (an editor's rename): keep the last content

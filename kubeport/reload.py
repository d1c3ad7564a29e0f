"""SIGHUP: re-read the configuration file (flags still override it) and apply what can change live."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Awaitable, Callable

from . import config as config_module
from .config import ConfigError, KubeportConfiguration

log = logging.getLogger("kubeport.daemon")


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
                log.warning("SIGHUP: no --config file to re-read")
                continue
            try:
                new = config_module.build(self._file, self._flags)
            except ConfigError as exc:
                self.failures += 1
                log.error("SIGHUP: keeping the running configuration: %s", exc)
                continue
            await apply(new)
            self.reloads += 1
            log.info("SIGHUP: %s re-read", self._file)

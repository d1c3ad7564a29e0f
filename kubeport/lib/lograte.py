"""Repeated log lines counted, not written: a storm of one error must not flood the log.

A client that resets 20,000 connections, or a descriptor shortage, fails every connection
the same way; each failure is worth a line only once. Records are the same when they come
from the same call site with the same message template and exception type (the arguments
differ: a descriptor number, an address). The first of them in ``interval`` seconds is
written; the rest are counted, and their number is written once the interval is over (by a
timer on the running event loop, else with the next one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

_Key = tuple[str, int, str, int, object, str]
#: marks the count line, which passes the filter that wrote it.
_SUMMARY = "repeat_summary"


@dataclass
class _Window:
    opened: float
    suppressed: int = 0
    message: str = ""
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class RepeatFilter(logging.Filter):
    def __init__(self, logger: logging.Logger, interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._logger = logger
        self.interval = interval
        self._clock = clock
        self._windows: dict[_Key, _Window] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, _SUMMARY, False):
            return True
        exc_type = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
        key = (record.name, record.levelno, record.pathname, record.lineno, record.msg, exc_type)
        now = self._clock()
        window = self._windows.get(key)
        if window is not None and now - window.opened < self.interval:
            window.suppressed += 1
            window.message = record.getMessage()
            if window.timer is None:
                window.timer = self._flush_later(key, window)
            return False
        if window is not None:
            self._flush(key, window)
        self._windows[key] = _Window(now)
        return True

    def _flush_later(self, key: _Key, window: _Window) -> asyncio.TimerHandle | None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None  # no loop: the count is written with the next one
        delay = max(0.0, window.opened + self.interval - self._clock())
        return loop.call_later(delay, self._flush, key, window)

    def _flush(self, key: _Key, window: _Window) -> None:
        if window.timer is not None:
            window.timer.cancel()
            window.timer = None
        if not window.suppressed:
            return
        count, window.suppressed = window.suppressed, 0
        if self._windows.get(key) is window:
            del self._windows[key]
        self._logger.log(key[1], "%d more like this in %gs, the last: %s", count, self.interval, window.message,
                         extra={_SUMMARY: True})


def limit_repeats(logger: logging.Logger, interval: float = 10.0) -> RepeatFilter:
    """Count ``logger``'s repeated records instead of writing them (its own records only, not
    those of child loggers)."""
    repeats = RepeatFilter(logger, interval)
    logger.addFilter(repeats)
    return repeats

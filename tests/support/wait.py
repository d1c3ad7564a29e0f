"""Waiting on a condition with a deadline: the only way tests wait.

``until`` (in a coroutine) and ``until_sync`` (in plain code: integration tests driving
processes) check ``condition()`` until it returns something truthy, and return that. At
the deadline they raise WaitTimeout, an AssertionError naming what was awaited and the
last value seen, so that a stuck wait fails the test with a message instead of hanging it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: seconds: generous for a loaded CI machine; a passing test waits milliseconds
DEADLINE = 10.0
#: between two checks in a coroutine: short, as what it waits for is mostly on the same loop
INTERVAL = 0.005
#: between two checks in plain code, where a check is often a command run in a namespace
INTERVAL_SYNC = 0.05


class WaitTimeout(AssertionError):
    pass


async def until(condition: Callable[[], T], what: str, timeout: float = DEADLINE, *,
                interval: float = INTERVAL, changed: Callable[[], Awaitable[Any]] | None = None,
                ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Wait until ``condition()`` is truthy; return its value.

    ``changed``: an awaitable's factory that completes when the condition may have changed
    (a new snapshot, a finished batch): awaited between checks instead of polling every
    ``interval``. Exceptions of the ``ignore`` types count as "not yet".
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        done, last = _check(condition, ignore)
        if done:
            return last
        remaining = end - loop.time()
        if remaining <= 0:
            raise WaitTimeout(_timed_out(what, timeout, last))
        if changed is None:
            await asyncio.sleep(min(interval, remaining))
            continue
        try:
            async with asyncio.timeout(remaining):
                await changed()
        except TimeoutError:
            pass  # checked once more, then failed above


def until_sync(condition: Callable[[], T], what: str, timeout: float = DEADLINE, *,
               interval: float = INTERVAL_SYNC, ignore: tuple[type[BaseException], ...] = ()) -> T:
    """``until`` for plain code: check every ``interval`` seconds, blocking in between."""
    end = time.monotonic() + timeout
    while True:
        done, last = _check(condition, ignore)
        if done:
            return last
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise WaitTimeout(_timed_out(what, timeout, last))
        time.sleep(min(interval, remaining))


def _check(condition: Callable[[], Any], ignore: tuple[type[BaseException], ...]) -> tuple[bool, Any]:
    try:
        value = condition()
    except ignore as err:
        return False, err
    return bool(value), value


def _timed_out(what: str, timeout: float, last: Any) -> str:
    return f"timed out after {timeout:g}s waiting for {what}; last observed: {last!r}"

"""Waiting for a quiet moment: housekeeping that can wait should not delay the next change."""

from __future__ import annotations

import asyncio


async def quiet_moment(wanted: asyncio.Event, *, quiet: float, max_delay: float) -> None:
    """Return once ``wanted`` was set and then stayed unset for ``quiet`` seconds, or
    ``max_delay`` seconds after it was first seen set, whichever comes first (so steady
    activity postpones the work, but never forever). ``wanted`` is left cleared."""
    loop = asyncio.get_running_loop()
    await wanted.wait()
    latest = loop.time() + max_delay
    while True:
        wanted.clear()
        wait = min(quiet, latest - loop.time())
        if wait <= 0:
            return
        try:
            async with asyncio.timeout(wait):
                await wanted.wait()
        except TimeoutError:
            return

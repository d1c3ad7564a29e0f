"""Giving freed heap memory back to the kernel: once the first full view is built, then
whenever the control plane has been quiet for a moment after changes.

Building the first view of a large cluster (parsing every object, converting it, encoding
DNS answers) allocates far more than it keeps; glibc's malloc keeps what was freed for reuse
and trims the heap only from its top, so the daemon's RSS would stay near that peak.
``malloc_trim(0)`` returns every free page, wherever it lies.

Changes free memory too: at 10,000 services through the API watch, 200 endpoint changes
left ~7 MiB free inside the heap (RSS 150 MiB, 143 after a trim), where an early trim
found nothing to return. A trim walks the whole heap (~5 ms at that size, on the event
loop), so it waits for a quiet moment, as the last-good manifest copies do.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from typing import Callable

from kubeport.lib.quiet import quiet_moment

#: Trim once no change was applied for this long (seconds), at the latest after TRIM_MAX_DELAY:
#: under steady churn one ~5 ms stall every few minutes, never one per change.
TRIM_QUIET = 1.0
TRIM_MAX_DELAY = 300.0


def release_freed_memory() -> bool:
    """True when the C library had a malloc_trim to call (glibc); elsewhere nothing happens."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # musl, or no C library found: nothing to give back this way
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True


async def keep_heap_trimmed(changed: asyncio.Event, trimmed: Callable[[], None] = lambda: None, *,
                            quiet: float = TRIM_QUIET, max_delay: float = TRIM_MAX_DELAY,
                            release: Callable[[], bool] = release_freed_memory) -> None:
    """Each time ``changed`` was set, release the freed heap in the next quiet moment, then
    call ``trimmed()``. Returns when there is no malloc_trim to call."""
    while True:
        await quiet_moment(changed, quiet=quiet, max_delay=max_delay)
        if not release():
            return
        trimmed()

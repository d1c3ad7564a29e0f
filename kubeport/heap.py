"""Giving freed heap memory back to the kernel once the first full view is built.

Building the first view of a large cluster (parsing every object, converting it, encoding
DNS answers) allocates far more than it keeps; glibc's malloc keeps what was freed for reuse
and trims the heap only from its top, so the daemon's RSS would stay near that peak.
``malloc_trim(0)`` returns every free page, wherever it lies. It runs once, in a few
milliseconds; later changes are small and reuse the freed space.
"""

from __future__ import annotations

import ctypes
import ctypes.util


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

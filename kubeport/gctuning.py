"""The cyclic collector and the heap around the daemon's long-lived views.

A restored last state and the first synced view are built once and live long (the restored
one until the first sync, the first view until its objects change). Walking them again and
again while they grow is wasted work, so the collector is off while the restored state is
built and until the proxy and DNS serve it, and everything such a view holds goes into the
permanent generation (``gc.freeze``) so that later collections stay cheap. Once the first
synced view is served, the heap it freed on the way goes back to the kernel; later changes
free heap too, given back in a quiet moment (:mod:`kubeport.lib.heap`).
"""

from __future__ import annotations

import asyncio
import gc
from typing import Callable, TypeVar

from kubeport.lib.heap import keep_heap_trimmed, release_freed_memory

T = TypeVar("T")


def restoring(restore: Callable[[], T | None]) -> T | None:
    """``restore()`` without the collector: it would walk the growing heap of restored
    objects again and again. Those objects live until the first sync, so they join the
    permanent generation, as everything the first sync builds does. When something was
    restored the collector stays off until :func:`restored_view_served` (or
    :func:`restored_view_late`): building the proxy's listeners and pools and DNS's answers
    for it with the collector on would walk the same young objects again."""
    gc.disable()
    restored = None
    try:
        restored = restore()
    finally:
        gc.freeze()
        if restored is None:
            gc.enable()
    return restored


def restored_view_served() -> None:
    """The proxy and DNS serve the restored view: what they built for it lives until the
    first sync, like the restored objects."""
    gc.freeze()
    gc.enable()


def restored_view_late() -> None:
    """A part did not serve the restored view in time: the collector comes back on anyway."""
    gc.enable()


class Heap:
    """When the freed heap goes back to the kernel: once the first synced view is served,
    then after changes, in a quiet moment."""

    def __init__(self) -> None:
        #: set when a change was applied: the freed heap goes back to the kernel in a quiet moment
        self.changed = asyncio.Event()

    def first_view_served(self) -> None:
        """Everything built for the first view lives long: out of the collector's
        generations, and what its building freed back to the kernel."""
        gc.freeze()
        release_freed_memory()

    async def keep_trimmed(self) -> None:
        await keep_heap_trimmed(self.changed)

"""An edge-triggered epoll for relay sockets, nested in the event loop as one reader.

uvloop's add_reader/remove_reader costs epoll_ctl calls (and an ioctl) on every
toggle; a relay toggles several times per connection. Here each socket is
registered once, for input and output, edge-triggered, and stays registered until
it is closed (closing the descriptor removes it from the epoll set). The owner
keeps "may read"/"may write" flags and works until EAGAIN: two epoll_ctl calls per
connection instead of about eighteen.

A descriptor closed and reused while one batch of events is being handled would
receive the old descriptor's event from that batch: descriptors registered during a
batch get no events from it.

Listening sockets and UDP sockets are registered level-triggered (``LEVEL_INPUT``):
their handlers read a bounded batch, and what is left is reported again. ``defer``
runs a callback once the current batch of events is handled (the UDP relay sends the
replies gathered from every ready flow with one call).
"""

from __future__ import annotations

import asyncio
import logging
import select
from typing import Callable

from kubeport.lib.lograte import limit_repeats

log = logging.getLogger(__name__)
limit_repeats(log)  # a bug met by one connection is met by every one like it

EPOLLIN = select.EPOLLIN
EPOLLOUT = select.EPOLLOUT
EPOLLERR = select.EPOLLERR
EPOLLHUP = select.EPOLLHUP
EPOLLRDHUP = select.EPOLLRDHUP
_EDGE = select.EPOLLIN | select.EPOLLOUT | select.EPOLLRDHUP | select.EPOLLET
#: input only: output edges are asked for when a write first blocks (see watch_output).
EDGE_INPUT = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLET
#: level-triggered input: reported while unread input is left (listeners, UDP sockets).
LEVEL_INPUT = select.EPOLLIN
_BATCH = 256

Handler = Callable[[int], None]


class EdgePoller:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._epoll = select.epoll()
        self._handlers: dict[int, Handler] = {}
        #: descriptors registered while a batch is being handled (its events are not theirs).
        self._fresh: set[int] = set()
        self._dispatching = False
        self._deferred: list[Callable[[], None]] = []
        self._fd = self._epoll.fileno()
        loop.add_reader(self._fd, self._dispatch)

    def register(self, fd: int, handler: Handler, events: int = _EDGE) -> None:
        """``handler(events)`` is called on every edge of ``fd`` until ``forget(fd)``."""
        self._handlers[fd] = handler
        self._epoll.register(fd, events)
        if self._dispatching:
            self._fresh.add(fd)

    def watch_output(self, fd: int) -> None:
        """Add output edges to a descriptor registered with EDGE_INPUT (one is reported at once
        if it is writable now)."""
        self._epoll.modify(fd, _EDGE)

    def forget(self, fd: int) -> None:
        """Call before closing ``fd`` (the close itself removes it from the epoll set)."""
        self._handlers.pop(fd, None)

    def unregister(self, fd: int) -> None:
        """Stop watching ``fd``, which stays open (register it again to resume)."""
        if self._handlers.pop(fd, None) is not None:
            self._epoll.unregister(fd)

    def defer(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the events being handled now are done (at once outside a batch)."""
        if self._dispatching:
            self._deferred.append(callback)
        else:
            callback()

    def _dispatch(self) -> None:
        handlers = self._handlers
        fresh = self._fresh
        self._dispatching = True
        try:
            for fd, events in self._epoll.poll(0, _BATCH):
                if fresh and fd in fresh:
                    continue
                handler = handlers.get(fd)
                if handler is not None:
                    try:
                        handler(events)
                    except Exception:  # a bug in one relay must not cost the others their edges
                        log.exception("relay handler for fd %d failed", fd)
        finally:
            self._dispatching = False
            fresh.clear()
            if self._deferred:
                self._run_deferred()

    def _run_deferred(self) -> None:
        deferred, self._deferred = self._deferred, []
        for callback in deferred:
            try:
                callback()
            except Exception:
                log.exception("deferred relay callback failed")

    def close(self) -> None:
        self._loop.remove_reader(self._fd)
        self._epoll.close()
        self._handlers.clear()

    def __len__(self) -> int:
        return len(self._handlers)

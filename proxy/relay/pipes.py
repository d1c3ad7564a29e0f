"""A pool of non-blocking pipes for splice(2), reused across connections.

Creating a pipe and growing it (F_SETPIPE_SZ) costs three syscalls; a pooled
pipe costs none. Pipe pages are allocated only while data sits in them, so an
idle 1 MiB pipe holds little memory. A pipe goes back to the pool only empty.

New pipes are made under the proxy's descriptor ceiling (``reserve.py``): at the ceiling
:meth:`PipePool.get` raises ``EMFILE`` and the direction keeps copying.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)


class Pipe:
    __slots__ = ("read_fd", "write_fd", "capacity")

    def __init__(self, read_fd: int, write_fd: int, capacity: int) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd
        self.capacity = capacity

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)


class PipePool:
    def __init__(self, size: int = 1 << 20, keep: int = 256,
                 pipe2: Callable[[int], tuple[int, int]] = os.pipe2) -> None:
        """``pipe2``: how a pipe is made (the reserve's opener of ``os.pipe2``)."""
        self.size = size
        self.keep = keep
        self._pipe2 = pipe2
        self._idle: list[Pipe] = []
        self._warned = False
        self.created = 0
        #: pipes not made for lack of descriptors (their directions copied instead)
        self.refused = 0

    def get(self) -> Pipe:
        """A pipe from the pool, or a new one; OSError (``EMFILE`` at the ceiling) when none
        can be made."""
        if self._idle:
            return self._idle.pop()
        try:
            read_fd, write_fd = self._pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            self.refused += 1
            raise
        capacity = 65536
        try:
            capacity = fcntl.fcntl(write_fd, _F_SETPIPE_SZ, self.size)
        except OSError as exc:
            # Non-root is capped by /proc/sys/fs/pipe-max-size and the per-user pipe quota.
            if not self._warned:
                log.warning("splice pipes stay at the default size: F_SETPIPE_SZ %d refused (%s)", self.size, exc)
                self._warned = True
            capacity = fcntl.fcntl(write_fd, _F_GETPIPE_SZ)
        self.created += 1
        return Pipe(read_fd, write_fd, capacity)

    def put(self, pipe: Pipe) -> None:
        """Return an EMPTY pipe for reuse (a pipe with data left in it must be closed instead)."""
        if len(self._idle) < self.keep:
            self._idle.append(pipe)
        else:
            pipe.close()

    def close(self) -> None:
        for pipe in self._idle:
            pipe.close()
        self._idle.clear()

    def __len__(self) -> int:
        return len(self._idle)

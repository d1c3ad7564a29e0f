"""inotify(7) through ctypes: the descriptor, its watches and its events.

No third-party binding: the manifest watch needs four calls and a struct, and reads the
descriptor on the event loop itself (see ``kubeport.endpoints.manifests.watch`` for why
not watchfiles).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from typing import NamedTuple

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_UNMOUNT = 0x400, 0x800, 0x2000
IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR, IN_ISDIR = 0x4000, 0x8000, 0x1000000, 0x40000000
_HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)


class RawEvent(NamedTuple):
    wd: int
    mask: int
    name: str


def parse_events(buffer: bytes) -> list[RawEvent]:
    """The events of one read of an inotify descriptor."""
    events, offset = [], 0
    while offset + _HEADER.size <= len(buffer):
        wd, mask, _cookie, length = _HEADER.unpack_from(buffer, offset)
        offset += _HEADER.size
        name = buffer[offset : offset + length].split(b"\0", 1)[0]
        offset += length
        events.append(RawEvent(wd, mask, os.fsdecode(name)))
    return events


def init() -> int:
    """A new non-blocking, close-on-exec inotify descriptor (OSError: none on this system)."""
    return _call("inotify_init1", os.O_NONBLOCK | os.O_CLOEXEC)


def add_watch(fd: int, path: str | os.PathLike[str], mask: int) -> int:
    return _call("inotify_add_watch", fd, os.fsencode(path), ctypes.c_uint32(mask))


def rm_watch(fd: int, wd: int) -> None:
    _call("inotify_rm_watch", fd, wd)


_libc: ctypes.CDLL | None = None


def _call(name: str, *args: object) -> int:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    function = getattr(_libc, name, None)
    if function is None:
        raise OSError(errno.ENOSYS, f"{name} is not in the C library")
    result = function(*args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result

"""recvmmsg/sendmmsg through ctypes (Linux, 64-bit): the libc binding the DNS server's
batched listener (dns/batch_io.py) and the UDP relay (proxy/relay/datagrams.py) share.

One system call reads a burst of datagrams and one sends a batch, where a
recvfrom/sendto pair per datagram costs two.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import socket
import struct
import sys
from typing import Callable

MSG_DONTWAIT = 0x40
MSG_TRUNC = 0x20
#: sizes on 64-bit Linux: struct iovec, struct mmsghdr (a msghdr plus msg_len, padded)
IOVEC_SIZE = 16
MMSGHDR_SIZE = 64
#: offsets inside struct mmsghdr
NAME, NAMELEN, IOV, IOVLEN, FLAGS, LENGTH = 0, 8, 16, 24, 48, 56
SOCKADDR_SIZE = 28  # sockaddr_in6, room for sockaddr_in too


def libc_functions() -> tuple[Callable[..., int], Callable[..., int]] | None:
    if sys.platform != "linux" or struct.calcsize("P") != 8:
        return None
    try:
        # PyDLL keeps the GIL: the calls never block (MSG_DONTWAIT), and releasing it for
        # microseconds would only invite another thread to hold the event loop up.
        libc = ctypes.PyDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        recvmmsg, sendmmsg = libc.recvmmsg, libc.sendmmsg
    except (OSError, AttributeError):
        return None
    recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
    sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
    recvmmsg.restype = sendmmsg.restype = ctypes.c_int
    return recvmmsg, sendmmsg


#: libc's (recvmmsg, sendmmsg), or None where they are not available (see ``available``).
LIBC_MMSG = libc_functions()


def available() -> bool:
    return LIBC_MMSG is not None


def address_of(name: bytes) -> tuple:
    """A received sockaddr (sockaddr_in or sockaddr_in6) as the tuple socket.sendto takes."""
    family = int.from_bytes(name[:2], sys.byteorder)
    port = int.from_bytes(name[2:4], "big")
    if family == socket.AF_INET6:
        flowinfo = int.from_bytes(name[4:8], "big")
        scope = int.from_bytes(name[24:28], sys.byteorder)
        return socket.inet_ntop(socket.AF_INET6, name[8:24]), port, flowinfo, scope
    return socket.inet_ntop(socket.AF_INET, name[4:8]), port

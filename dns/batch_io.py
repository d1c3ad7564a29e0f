"""Batched UDP I/O: recvmmsg/sendmmsg through ctypes (Linux), for the DNS hot path.

One system call reads up to ``slots`` datagrams and one sends every reply of the batch,
where a recvfrom/sendto pair per query costs two. The buffers (messages, iovecs,
addresses, data) are allocated once per socket and reused; per datagram Python only
reads its length, copies the query out and points an iovec at the reply. The client
address never becomes a Python tuple: its sockaddr, as received, is where the reply is sent.

A reply goes out as two iovecs: the query's own ID, read where it was received, and the
reply's bytes after the ID, read where the Python bytes object keeps them (a kept answer
is never copied or concatenated). Reply ``r`` of a batch is set up in advance for query
``r`` (its sockaddr, its ID); only when an earlier query of the batch got no reply (a
forward, a drop) does a reply name another slot, and those headers are set up again
before the next batch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import struct
from typing import Callable

from kubeport.lib.mmsg import (  # noqa: F401  (the names dns/udp.py reads through this module)
    FLAGS,
    IOV,
    IOVEC_SIZE,
    IOVLEN,
    LENGTH,
    LIBC_MMSG,
    MMSGHDR_SIZE,
    MSG_DONTWAIT,
    MSG_TRUNC,
    NAME,
    NAMELEN,
    SOCKADDR_SIZE,
    address_of,
    available,
)

SLOT_SIZE = 4096  # a query longer than this is cut (MSG_TRUNC) and answered FORMERR (udp.py)
ID_SIZE = 2

_NAME = struct.Struct("=QI")  # msg_name, msg_namelen
_RECEIVED = struct.Struct("=8xI36xI")  # msg_namelen, msg_flags of a received mmsghdr
_REPLY = struct.Struct("=QQQQ")  # the ID's iovec, the rest's
_IOVEC = struct.Struct("=QQ")
#: where CPython keeps a bytes object's data, from the object's address (id): found, not assumed
_PROBE = b"kubeport"
BYTES_DATA = ctypes.cast(ctypes.c_char_p(_PROBE), ctypes.c_void_p).value - id(_PROBE)  # type: ignore[operator]


def iovec_of(body: bytes) -> bytes:
    """The iovec (address, length) of a bytes object's data: valid while the object lives."""
    return _IOVEC.pack(id(body) + BYTES_DATA, len(body))


class BatchIO:
    """Preallocated recvmmsg/sendmmsg buffers for one socket."""

    def __init__(self, fd: int, slots: int, namelen: int = SOCKADDR_SIZE,
                 sendmmsg: Callable[[int, int, int, int], int] | None = None):
        """``namelen``: the size of the socket's sockaddrs (16 for IPv4, 28 for IPv6).
        ``sendmmsg``: libc's by default; a stand-in sees (fd, address of the first mmsghdr,
        count, flags) and returns what the kernel would (a count, or -1 with errno)."""
        assert LIBC_MMSG is not None
        self.fd = fd
        self.slots = slots
        self._recvmmsg, self._sendmmsg = LIBC_MMSG
        if sendmmsg is not None:
            self._sendmmsg = sendmmsg
        self.received = ctypes.create_string_buffer(slots * MMSGHDR_SIZE)
        self.to_send = ctypes.create_string_buffer(slots * MMSGHDR_SIZE)
        self.names = ctypes.create_string_buffer(slots * SOCKADDR_SIZE)
        self.data = ctypes.create_string_buffer(slots * SLOT_SIZE)
        self._iovecs = ctypes.create_string_buffer(3 * slots * IOVEC_SIZE)
        self.received_view = memoryview(self.received).cast("B")
        self.to_send_view = memoryview(self.to_send).cast("B")
        self.data_view = memoryview(self.data).cast("B")
        self.names_view = memoryview(self.names).cast("B")
        #: per reply: the ID's iovec, then the rest's
        self.send_iovecs_view = memoryview(self._iovecs).cast("B")[slots * IOVEC_SIZE :]
        #: what keeps the bytes each prepared reply points into alive until it is sent
        self.bodies: list[object] = [None] * slots
        names, data, iovecs = ctypes.addressof(self.names), ctypes.addressof(self.data), ctypes.addressof(self._iovecs)
        #: address of each slot's sockaddr, for the replies' msg_name
        self.name_addresses = [names + i * SOCKADDR_SIZE for i in range(slots)]
        #: address of each slot's query, whose first bytes are the ID its reply starts with
        self.data_addresses = [data + i * SLOT_SIZE for i in range(slots)]
        iovec_view = memoryview(self._iovecs).cast("B")
        for i in range(slots):
            receive_iov = iovecs + i * IOVEC_SIZE
            send_iov = iovecs + (slots + 2 * i) * IOVEC_SIZE
            struct.pack_into("=QQ", iovec_view, i * IOVEC_SIZE, self.data_addresses[i], SLOT_SIZE)
            struct.pack_into("=QQQQ", iovec_view, (slots + 2 * i) * IOVEC_SIZE, self.data_addresses[i], ID_SIZE, 0, 0)
            struct.pack_into("=QIxxxxQQ", self.received_view, i * MMSGHDR_SIZE, self.name_addresses[i],
                             SOCKADDR_SIZE, receive_iov, 1)
            struct.pack_into("=QIxxxxQQ", self.to_send_view, i * MMSGHDR_SIZE, self.name_addresses[i], namelen,
                             send_iov, 2)
        #: the receive headers as set up: restored before each recvmmsg (msg_namelen is in-out)
        self._received_template = bytes(self.received_view)
        #: the replies as set up (reply i to query i), restored after a batch that moved them
        self._send_template = bytes(self.to_send_view), bytes(self.send_iovecs_view)
        self.moved = False
        self._lengths: dict[int, struct.Struct] = {}
        self._received_address = ctypes.addressof(self.received)
        self._to_send_address = ctypes.addressof(self.to_send)

    def place(self, reply: int, slot: int, name_length: int, body: bytes, skip: int) -> None:
        """Reply number ``reply`` of the batch answers the query in ``slot``: ``body`` after
        its first ``skip`` bytes follows the query's ID."""
        _NAME.pack_into(self.to_send_view, reply * MMSGHDR_SIZE, self.name_addresses[slot], name_length)
        _REPLY.pack_into(self.send_iovecs_view, reply * 2 * IOVEC_SIZE, self.data_addresses[slot], ID_SIZE,
                         id(body) + BYTES_DATA + skip, len(body) - skip)
        self.bodies[reply] = body
        self.moved = True

    def restore(self) -> None:
        """Reply i answers query i again (after :meth:`place` moved some)."""
        self.to_send_view[:] = self._send_template[0]
        self.send_iovecs_view[:] = self._send_template[1]
        self.moved = False

    def receive(self) -> int:
        """Datagrams now in the slots (0: none waiting); raises OSError on other errors."""
        self.received_view[:] = self._received_template
        count = self._recvmmsg(self.fd, self._received_address, self.slots, MSG_DONTWAIT, None)
        if count < 0:
            error = ctypes.get_errno()
            if error in (errno.EAGAIN, errno.EINTR):
                return 0
            raise OSError(error, errno.errorcode.get(error, str(error)))
        return count

    def received_lengths(self, count: int) -> tuple[int, ...]:
        """msg_len of the first ``count`` slots: one struct call for the batch."""
        lengths = self._lengths.get(count)
        if lengths is None:
            lengths = self._lengths[count] = struct.Struct("=" + "56xI4x" * count)
        return lengths.unpack_from(self.received_view, 0)

    def received_header(self, slot: int) -> tuple[int, int]:
        """(msg_namelen, msg_flags) of one slot."""
        return _RECEIVED.unpack_from(self.received_view, slot * MMSGHDR_SIZE)  # type: ignore[return-value]

    def send(self, count: int) -> int:
        """Send the first ``count`` prepared replies; how many the kernel refused.

        sendmmsg stops at the first message that fails (a full send buffer, a client the
        kernel cannot route to): that one is skipped and the rest go in another call, so
        one bad address costs its own reply only."""
        start = failed = 0
        while start < count:
            sent = self._sendmmsg(self.fd, self._to_send_address + start * MMSGHDR_SIZE, count - start,
                                  MSG_DONTWAIT)
            start += max(sent, 0)
            if start < count:
                start += 1
                failed += 1
        if self.moved:
            self.restore()
        return failed

"""Batched datagram I/O for the UDP relay: recvmmsg/sendmmsg through ctypes (Linux, 64-bit).

A request/response through the relay costs four system calls one datagram at a time
(receive from the client, send to the endpoint, receive the reply, send it back), each
a kernel entry and exit, and every send may wake the peer and be preempted by it. Here
one recvmmsg reads a burst from a frontend, one sendmmsg per flow passes it on, one
recvmmsg per ready flow reads the replies and one sendmmsg per frontend answers them all.

Datagrams stay where the kernel put them: the slots are 64 KiB each (the largest UDP
payload fits; nothing is ever cut) in anonymous memory, so only the pages datagrams
actually touch become resident. Python reads lengths and addresses, never the data.
The buffers belong to the relay context and are shared by every frontend: the loop runs
one callback at a time, and a batch is sent before its callback returns (``Inbound``) or
before the poller's dispatch ends (``Outbound``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import struct

from kubeport.lib.mmsg import IOVEC_SIZE, LIBC_MMSG, MMSGHDR_SIZE, MSG_DONTWAIT, SOCKADDR_SIZE

#: one slot per datagram: the largest UDP payload (65,507 bytes over IPv4) fits.
SLOT_SIZE = 65536

_HEADER = struct.Struct("=QIxxxxQQ")  # msg_name, msg_namelen, msg_iov, msg_iovlen
_NAME = struct.Struct("=QI")  # msg_name, msg_namelen
_IOV_LEN = struct.Struct("=Q")
_AGAIN = (errno.EAGAIN, errno.EINTR)
_FULL = (errno.EAGAIN, errno.ENOBUFS)



def buffer_address(name: bytes) -> int:
    """Where the bytes of ``name`` live (valid while the object lives: CPython never moves it).

    A reply's msg_name points straight at its flow's key, so no per-reply copy is needed."""
    return ctypes.cast(ctypes.c_char_p(name), ctypes.c_void_p).value or 0


class _Slots:
    """``count`` 64 KiB datagram slots, an iovec per slot for receiving (whole slot) and one
    for sending (the datagram's length), and two header arrays."""

    def __init__(self, count: int) -> None:
        assert LIBC_MMSG is not None
        self._recvmmsg, self._sendmmsg = LIBC_MMSG
        self.count = count
        self._data = mmap.mmap(-1, count * SLOT_SIZE)  # untouched pages cost no memory
        # receive iovecs, send iovecs, receive headers, send headers (one per slot, then as many
        # to gather slots that are not in a row), source addresses
        self._control = ctypes.create_string_buffer(
            count * (2 * IOVEC_SIZE + 3 * MMSGHDR_SIZE + SOCKADDR_SIZE))
        base = ctypes.addressof(self._control)
        data = ctypes.addressof(ctypes.c_char.from_buffer(self._data))
        self._receive_iovecs = base
        self._send_iovecs = base + count * IOVEC_SIZE
        self.receive_headers = self._send_iovecs + count * IOVEC_SIZE
        self.send_headers = self.receive_headers + count * MMSGHDR_SIZE
        self._gather_headers = self.send_headers + count * MMSGHDR_SIZE
        self.names = self._gather_headers + count * MMSGHDR_SIZE
        view = memoryview(self._control).cast("B")
        self.view = view
        self._send_iov_offset = count * IOVEC_SIZE
        self._receive_offset = 2 * count * IOVEC_SIZE
        self._send_offset = self._receive_offset + count * MMSGHDR_SIZE
        self._gather_offset = self._send_offset + count * MMSGHDR_SIZE
        self._names_offset = self._gather_offset + count * MMSGHDR_SIZE
        for i in range(count):
            slot = data + i * SLOT_SIZE
            struct.pack_into("=QQ", view, i * IOVEC_SIZE, slot, SLOT_SIZE)
            struct.pack_into("=QQ", view, self._send_iov_offset + i * IOVEC_SIZE, slot, 0)
            _HEADER.pack_into(view, self._send_offset + i * MMSGHDR_SIZE, 0, 0,
                              self._send_iovecs + i * IOVEC_SIZE, 1)

    def _receive(self, fd: int, start: int, room: int) -> int:
        got = self._recvmmsg(fd, self.receive_headers + start * MMSGHDR_SIZE, room, MSG_DONTWAIT, None)
        if got < 0:
            error = ctypes.get_errno()
            if error in _AGAIN:
                return 0
            raise OSError(error, errno.errorcode.get(error, str(error)))
        return got

    def _send(self, fd: int, headers: int, count: int) -> tuple[int, int]:
        """sendmmsg ``count`` headers: (how many went, errno when none did, else 0).

        A failure after the first message is not reported (the kernel keeps it for the
        next call): a caller that wants to know calls again with the rest."""
        sent = self._sendmmsg(fd, headers, count, MSG_DONTWAIT)
        if sent <= 0:
            return 0, (ctypes.get_errno() or errno.EAGAIN) if sent < 0 else errno.EAGAIN
        return sent, 0

    def set_length(self, slot: int, length: int) -> None:
        _IOV_LEN.pack_into(self.view, self._send_iov_offset + slot * IOVEC_SIZE + 8, length)

    def close(self) -> None:
        self.view.release()
        # The slots (an mmap) are unmapped with this object.


class Inbound(_Slots):
    """Client datagrams: one recvmmsg with the senders' addresses, then a sendmmsg per flow."""

    _FIELDS = "8xI36xI4xI4x"  # per header: msg_namelen, msg_flags, msg_len

    def __init__(self, count: int) -> None:
        super().__init__(count)
        view = self.view
        for i in range(count):
            _HEADER.pack_into(view, self._receive_offset + i * MMSGHDR_SIZE, self.names + i * SOCKADDR_SIZE,
                              SOCKADDR_SIZE, self._receive_iovecs + i * IOVEC_SIZE, 1)
        #: msg_namelen is in-out: the headers as set up are restored before each receive.
        self._template = bytes(view[self._receive_offset:self._send_offset])
        self._fields: dict[int, struct.Struct] = {}

    def receive(self, fd: int) -> tuple[int, ...]:
        """Read up to ``count`` datagrams: (namelen, flags, length) per datagram, flattened."""
        self.view[self._receive_offset:self._send_offset] = self._template
        got = self._receive(fd, 0, self.count)
        if not got:
            return ()
        fields = self._fields.get(got)
        if fields is None:
            fields = self._fields[got] = struct.Struct("=" + self._FIELDS * got)
        return fields.unpack_from(self.view, self._receive_offset)

    def name(self, slot: int, length: int) -> bytes:
        start = self._names_offset + slot * SOCKADDR_SIZE
        return self.view[start:start + length].tobytes()

    def send(self, fd: int, slots: list[int]) -> tuple[int, int]:
        """Send the datagrams in ``slots`` (lengths set) on a connected socket, in order.

        (sent, errno of the first refused or 0). Slots in a row go straight from their
        own headers; others are gathered into headers of their own first."""
        first, count = slots[0], len(slots)
        if slots[-1] - first == count - 1:
            return self._send(fd, self.send_headers + first * MMSGHDR_SIZE, count)
        view, offset, iovecs = self.view, self._gather_offset, self._send_iovecs
        for position, slot in enumerate(slots):
            _HEADER.pack_into(view, offset + position * MMSGHDR_SIZE, 0, 0, iovecs + slot * IOVEC_SIZE, 1)
        return self._send(fd, self._gather_headers, count)


class Outbound(_Slots):
    """Replies: recvmmsg from flows' connected sockets into free slots, each addressed to its
    client, then one sendmmsg per frontend socket for the whole batch."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        view = self.view
        for i in range(count):  # connected sockets: no source address wanted
            _HEADER.pack_into(view, self._receive_offset + i * MMSGHDR_SIZE, 0, 0,
                              self._receive_iovecs + i * IOVEC_SIZE, 1)
        self.used = 0
        self._lengths_cache: dict[int, struct.Struct] = {}

    def receive(self, fd: int, name_address: int, name_length: int) -> tuple[int, ...]:
        """Read replies into the free slots, addressed to ``name``; their lengths."""
        start = self.used
        got = self._receive(fd, start, self.count - start)
        if not got:
            return ()
        lengths = self._lengths_cache.get(got)
        if lengths is None:
            lengths = self._lengths_cache[got] = struct.Struct("=" + "56xI4x" * got)
        sizes = lengths.unpack_from(self.view, self._receive_offset + start * MMSGHDR_SIZE)
        view, iov_offset, send_offset = self.view, self._send_iov_offset, self._send_offset
        for i, size in enumerate(sizes, start):
            _IOV_LEN.pack_into(view, iov_offset + i * IOVEC_SIZE + 8, size)
            _NAME.pack_into(view, send_offset + i * MMSGHDR_SIZE, name_address, name_length)
        self.used = start + got
        return sizes

    def full(self) -> bool:
        return self.used >= self.count

    def send(self, fd: int, start: int, count: int) -> int:
        """Send slots [start, start + count) to their addresses; how many the kernel refused.

        sendmmsg stops at the first message that fails (a full buffer, an unroutable
        client): that one is dropped, as a router would, and the rest go on."""
        failed = 0
        end = start + count
        while start < end:
            sent, error = self._send(fd, self.send_headers + start * MMSGHDR_SIZE, end - start)
            start += sent
            if error:
                if error in _FULL:  # the rest would meet the same full buffer
                    return failed + end - start
                start += 1  # that message cannot go (an unroutable client): the next ones may
                failed += 1
        return failed

"""One direction of a TCP relay: copy while the data is small, splice(2) once it is bulk.

Edge-triggered (see poller.py): the connection sets ``readable`` when the source
signals input and ``writable`` when the destination signals room, then calls
``pump``, which moves data until the source is drained (EAGAIN), the destination
is full, or the buffer is full.

Two modes, one direction:

* copy (the start): ``recv_into`` one buffer shared by every connection of the
  loop, ``send`` from it at once; only a part the destination refuses is kept
  (at most one buffer per direction). For requests and responses of a few KiB
  this is cheaper than splice and needs no pipe.
* splice (from the first read that fills the whole buffer: a bulk transfer):
  src socket -> pooled pipe -> dst socket, zero-copy. Backpressure is the pipe:
  at most one pipe of data is read ahead of the destination.

EOF from the source becomes ``shutdown(SHUT_WR)`` on the destination once nothing
is held (half-close). Errors go to the connection, which resets both sides. A
socket type splice cannot read (EINVAL, e.g. SCTP) stays in copy mode.
"""

from __future__ import annotations

import errno
import os
import socket

_splice = os.splice
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
_SHUT_WR = socket.SHUT_WR
#: the client socket may still be blocking (see tcp.py): copy mode never waits.
_DONTWAIT = socket.MSG_DONTWAIT
#: full reads copied while waiting for one that empties the source's queue, before splicing.
#: The sockmap program reads whole skbs (tcp_read_skb ignores a partly read one, whose read
#: bytes it would send again), so a direction goes to the kernel only after such a read.
_KERNEL_ALIGN_READS = 16


class Direction:
    __slots__ = (
        "conn", "src", "src_fd", "dst", "dst_fd", "pipe", "pipe_r", "pipe_w", "cap", "leftover",
        "pending", "readable", "writable", "eof", "done", "up", "stats", "splice_ok", "_bulk", "peer_closed",
        "fin_clean", "sent", "kernel", "kernel_ok", "bulk_reads", "cookie", "checked", "counted", "base",
        "waiting", "src_base",
    )

    def __init__(self, conn, src, dst, up: bool) -> None:
        self.conn = conn
        self.src = src
        self.src_fd = src.fileno()
        self.dst = dst
        self.dst_fd = dst.fileno()
        self.pipe = None  # copy mode until a bulk read
        self.leftover: bytes | None = None  # copy mode: what the destination has not taken yet
        self.pending = 0  # bytes held (leftover or pipe)
        self.readable = True  # the source may have input (until EAGAIN)
        #: the source reported EPOLLRDHUP: its FIN has arrived, a read of 0 will follow the data.
        self.peer_closed = False
        #: that report was a TCP FIN, not an error: once a read comes back short, only the
        #: FIN is left (all data precedes it), so the read of 0 can be skipped.
        self.fin_clean = False
        self.writable = True  # the destination may take output (until EAGAIN)
        self.eof = False
        self.done = False
        self.up = up  # client -> backend
        self.stats = conn.stats
        self.splice_ok = True
        #: the last read filled the whole shared buffer: more is likely to follow (bulk).
        self._bulk = False
        #: bytes this process wrote into dst (the kernel's share is counted by the sockmap program).
        self.sent = 0
        #: None: relayed here; KERNEL or PAUSED: by the sockmap program (kernel_relays.py, sockmap.py).
        self.kernel = None
        #: the sockmap may relay this direction (False once the kernel gave it back: spliced).
        self.kernel_ok = conn.ctx.kernel is not None and not conn.proto
        #: consecutive reads that filled the buffer (the last may have left an skb partly read).
        self.bulk_reads = 0
        self.cookie = 0
        #: the program's count when dst was last seen to have taken everything but ``limit``.
        self.checked = 0
        #: the program's count already added to the port's byte counters.
        self.counted = 0
        #: bytes_written(dst) when the kernel took over (what this process wrote, and a SYN).
        self.base = 0
        #: (written, since): a paused or finished direction whose destination still lacks
        #: counted bytes, what it had taken and since when (KernelRelays._lost).
        self.waiting: tuple[int, float] | None = None
        #: bytes_consumed(src) when the kernel took over (None: not known exactly).
        self.src_base: int | None = None

    def pump(self) -> None:
        moved = self._splice() if self.pipe is not None else self._copy()
        if moved:
            self.sent += moved
            if self.up:
                self.stats.bytes_to_backend += moved
            else:
                self.stats.bytes_to_client += moved
        if self.eof and not self.pending and not self.done:
            self.finish()

    def _full(self) -> None:
        """The destination refused more: wait for its output edge (asked for on the client
        socket only now: most connections never fill it and so pay no epoll_ctl for it)."""
        self.writable = False
        if not self.up:
            self.conn.watch_client_output()

    # --- copy mode ----------------------------------------------------------------------

    def _copy(self) -> int:
        ctx = self.conn.ctx
        buffer, view = ctx.copy_buffer, ctx.copy_view
        size = len(buffer)
        moved = 0
        while True:
            leftover = self.leftover
            if leftover is not None:
                if not self.writable:
                    return moved
                try:
                    sent = self.dst.send(leftover, _DONTWAIT)
                except BlockingIOError:
                    self._full()
                    return moved
                except OSError as exc:
                    self.conn.abort(exc)
                    return moved
                moved += sent
                if sent < len(leftover):
                    self.leftover = leftover[sent:]
                    self.pending = len(self.leftover)
                    self._full()
                    return moved
                self.leftover = None
                self.pending = 0
            if not self.readable:
                return moved
            if self.splice_ok and self.pipe is None and self._bulk and (
                    not self.kernel_ok or self.bulk_reads > _KERNEL_ALIGN_READS):
                return moved + self._start_splicing()
            try:
                n = self.src.recv_into(buffer, 0, _DONTWAIT)
            except BlockingIOError:
                self.readable = False
                if self.bulk_reads and self.leftover is None:
                    self.conn.to_kernel(self)
                return moved
            except OSError as exc:
                self.conn.abort(exc)
                return moved
            if not n:
                self.readable = False
                self.eof = True
                return moved
            self._bulk = n == size
            if n < size:
                # A short TCP read empties the receive queue; new data, or a FIN, is a new edge.
                # A FIN flagged before this read (EPOLLRDHUP) is all that is left: the EOF.
                if not self.peer_closed:
                    self.readable = False
                elif self.fin_clean:
                    self.readable = False
                    self.eof = True
            sent = 0
            if self.writable:
                try:
                    sent = self.dst.send(view[:n], _DONTWAIT)
                except BlockingIOError:
                    self._full()
                except OSError as exc:
                    self.conn.abort(exc)
                    return moved
            moved += sent
            if sent < n:
                self.leftover = bytes(view[sent:n])
                self.pending = n - sent
                self._full()
            elif n < size and self.bulk_reads and self.conn.to_kernel(self):
                return moved
            self.bulk_reads = self.bulk_reads + 1 if n == size else 0

    def _start_splicing(self) -> int:
        conn = self.conn
        if not conn.client_nonblocking:
            conn.client.setblocking(False)  # splice(2) waits on a blocking socket
            conn.client_nonblocking = True
        try:
            pipe = conn.ctx.pipes.get()
        except OSError:
            # No descriptors below the reserve's ceiling (reserve.py): copying needs none.
            self.splice_ok = False
            return self._copy()
        self.pipe = pipe
        self.pipe_r = pipe.read_fd
        self.pipe_w = pipe.write_fd
        self.cap = pipe.capacity
        return self._splice()

    # --- splice mode --------------------------------------------------------------------

    def _splice(self) -> int:
        pending = self.pending
        moved = 0
        while True:
            if pending and self.writable:
                try:
                    while pending:
                        sent = _splice(self.pipe_r, self.dst_fd, pending, None, None, _FLAGS)
                        pending -= sent
                        moved += sent
                except BlockingIOError:
                    self._full()
                except OSError as exc:
                    self.pending = pending
                    self.conn.abort(exc)
                    return moved
            if self.readable and pending < self.cap:
                try:
                    n = _splice(self.src_fd, self.pipe_w, self.cap - pending, None, None, _FLAGS)
                except BlockingIOError:
                    self.readable = False
                except OSError as exc:
                    self.pending = pending
                    if exc.errno == errno.EINVAL and not pending:
                        return moved + self._stop_splicing()
                    self.conn.abort(exc)
                    return moved
                else:
                    if n:
                        pending += n
                        continue
                    self.readable = False
                    self.eof = True
            break
        self.pending = pending
        return moved

    def _stop_splicing(self) -> int:
        """splice cannot read this socket type: copy for the rest of the connection."""
        self.splice_ok = False
        self.release_pipe(self.conn.ctx.pipes)
        return self._copy()

    # --- the end ------------------------------------------------------------------------

    def finish(self) -> None:
        self.done = True
        if self.conn.direction_done(self):
            return  # both directions ended: closing the sockets sends the last FIN
        try:
            self.dst.shutdown(_SHUT_WR)
        except OSError as exc:
            if exc.errno != errno.ENOTCONN:
                self.conn.abort(exc)

    def release_pipe(self, pool) -> None:
        pipe, self.pipe = self.pipe, None
        if pipe is None:
            return
        if self.pending:
            pipe.close()  # data left in it: not reusable
        else:
            pool.put(pipe)

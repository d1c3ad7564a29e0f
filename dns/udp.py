"""The UDP hot path: a non-blocking socket drained in batches from one reader callback.

asyncio's DatagramProtocol costs a callback, an address tuple and a transport check per
datagram on top of the two system calls. Here one readiness event reads datagrams until
the socket is empty (EAGAIN) or a batch is done, and answers them in the same callback:
cached answers never leave this loop. On Linux :class:`BatchedUdpListener` reads a
batch with one recvmmsg and sends its answers with one sendmmsg (:mod:`.batch_io`);
:class:`UdpListener` is the portable recvfrom/sendto loop. A batch cap keeps TCP and the
rest of the event loop served under a flood (the reader is level-triggered: a socket left
non-empty is reported again at once). Questions that need an upstream go to ``forward``
with a function that sends the answer later.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from typing import Callable, Protocol

from kubeport.dns import batch_io
from kubeport.dns.answer import Answerer, Forward
from kubeport.dns.stats import DnsStats
from kubeport.dns.wire import FORMERR, HEADER, QR, error_reply
from kubeport.lib.sockbuf import enlarge_receive_buffer

log = logging.getLogger(__name__)

#: datagrams answered per readiness event at most
BATCH = 128
#: a DNS query over UDP is at most this big (EDNS payloads above 64 KiB do not exist)
MAX_DATAGRAM = 65535
#: a longer query is answered FORMERR unread: miekg/dns reads a datagram into a buffer
#: of its UDP size and answers FORMERR for what it then cannot unpack.
MAX_QUERY = batch_io.SLOT_SIZE
Address = tuple  # (host, port) or (host, port, flowinfo, scope_id)


def oversized_reply(head: bytes, stats: DnsStats) -> bytes | None:
    """The FORMERR for a query longer than MAX_QUERY, from its first bytes; None (dropped)
    without a query header."""
    if len(head) < HEADER.size:
        stats.dropped += 1
        return None
    query_id, flags = HEADER.unpack_from(head)[:2]
    if flags & QR:
        stats.dropped += 1  # a response: never answered
        return None
    stats.oversized += 1
    return error_reply(query_id, flags, FORMERR, None, 512)
Send = Callable[[bytes], None]
ForwardHandler = Callable[[Forward, Send], None]


class DatagramSocket(Protocol):
    def recvfrom(self, size: int, /) -> tuple[bytes, Address]: ...

    def sendto(self, data: bytes, address: Address, /) -> int: ...


class UdpListener:
    """Answers the queries arriving on one bound UDP socket."""

    def __init__(self, sock: DatagramSocket, answerer: Answerer, forward: ForwardHandler, stats: DnsStats,
                 *, batch: int = BATCH):
        self.sock = sock
        self.answerer = answerer
        self.forward = forward
        self.stats = stats
        self.batch = batch
        self.closed = False

    def drain(self) -> int:
        """Answer what is queued on the socket, at most ``batch`` datagrams; how many were read."""
        recvfrom = self.sock.recvfrom
        sendto = self.sock.sendto
        answer = self.answerer.answer
        autopath = self.answerer.autopath
        count = 0
        while count < self.batch:
            try:
                packet, address = recvfrom(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as error:  # nothing is lost by stopping: the socket reports again
                log.debug("dns: udp receive failed: %s", error)
                break
            count += 1
            try:
                if len(packet) > MAX_QUERY:
                    reply = oversized_reply(packet, self.stats)
                else:  # the client's address matters to autopath only
                    reply = answer(packet, False, address[0]) if autopath else answer(packet)
            except Exception:  # a bug costs this query, not the rest of the batch
                self._failed()
                continue
            if reply.__class__ is bytes:
                try:
                    sendto(reply, address)  # type: ignore[arg-type]
                except OSError:
                    self.stats.send_failed += 1  # full send buffer: the client will retry
            elif reply is not None:
                self.forward(reply, self._sender(address))  # type: ignore[arg-type]
        return count

    def _failed(self) -> None:
        self.stats.dropped += 1
        self.stats.panics += 1  # CoreDNS's recover() counts a panic and answers nothing
        log.exception("dns: answering a query failed; it is dropped")

    def _sender(self, address: Address) -> Send:
        def send(reply: bytes) -> None:
            if self.closed:
                return
            try:
                self.sock.sendto(reply, address)
            except OSError:
                self.stats.send_failed += 1

        return send


#: a reply's iovec after the ID: address, length
_BODY = struct.Struct("=QQ")
_SLOT_SIZE, _IOVEC_SIZE = batch_io.SLOT_SIZE, batch_io.IOVEC_SIZE


class BatchedUdpListener(UdpListener):
    """The same answers, read with recvmmsg and sent with sendmmsg (:mod:`.batch_io`)."""

    def __init__(self, sock: socket.socket, answerer: Answerer, forward: ForwardHandler, stats: DnsStats,
                 *, batch: int = BATCH, slots: int = 64):
        super().__init__(sock, answerer, forward, stats, batch=batch)
        namelen = 16 if sock.family == socket.AF_INET else batch_io.SOCKADDR_SIZE
        self.io = batch_io.BatchIO(sock.fileno(), slots, namelen)

    def drain(self) -> int:
        io = self.io
        total = 0
        while total < self.batch:
            try:
                count = io.receive()
            except OSError as error:
                log.debug("dns: udp receive failed: %s", error)
                break
            total += count
            self._answer_batch(count)
            if count < io.slots:
                break
        return total

    def _answer_batch(self, count: int) -> None:
        """Answer the ``count`` datagrams received, then send the replies with one sendmmsg.

        A plain query (no OPT record: what glibc's and musl's stubs send) whose answer is
        kept, cluster or relayed from upstream, is served by this loop itself. Without its
        ID such a query is its own cache key (:func:`~.wire.cache_key` of a packet that ends
        with its question), so it is copied once, never searched for the end of its name,
        and answered with the iovec kept beside the reply. ARCOUNT must be 0: a packet of a
        canonical EDNS key's bytes has ARCOUNT 1 and is not that query (a cut record,
        FORMERR). Everything else (EDNS, answers whose records turn per reply, misses, a
        relayed answer due to age, every query after one that got no reply in the batch)
        takes :meth:`_answer_slot`, which answers any query as :meth:`Answerer.answer` does.

        Why a loop of its own: most queries on a node are plain stub queries for names already
        answered, and for them the generic path's work (parsing the question, building a
        Query, looking the key up by its parts) is most of the CPU spent; here such a query
        costs a copy, a dict lookup and the ID patch (bench/dns_cpu.py measures CPU per query).
        """
        io = self.io
        data, iovecs, bodies = io.data_view, io.send_iovecs_view, io.bodies
        answerer = self.answerer
        kept, relayed = answerer.cache.entries.get, answerer.forwarded.entries.get
        now = None
        ready = 0
        for i, length in enumerate(io.received_lengths(count)):
            start = i * _SLOT_SIZE
            # reply i still set up for query i, and ARCOUNT (bytes 10 and 11) 0
            if ready == i and length > 11 and not data[start + 11] and not data[start + 10]:
                key = data[start + 2 : start + length].tobytes()
                try:
                    entry = kept(key)
                    if entry is not None:
                        entry.udp_hits[0] += 1
                        iovec = entry.udp_iovec
                        if iovec is None:
                            iovec = entry.udp_iovec = batch_io.iovec_of(entry.replies[0])
                        offset = (2 * i + 1) * _IOVEC_SIZE
                        iovecs[offset : offset + _IOVEC_SIZE] = iovec
                        bodies[i] = entry  # keeps its replies alive until sent
                        ready += 1
                        continue
                    forwarded = relayed(key)
                    if forwarded is not None:
                        if now is None:  # one reading per batch: the TTLs age by whole seconds
                            now = answerer.clock()
                        if forwarded.aged_from <= now < forwarded.aged_until:  # else cached() ages it
                            forwarded.udp_served[0] += 1
                            iovec = forwarded.udp_iovec
                            if iovec is None:
                                iovec = forwarded.udp_iovec = batch_io.iovec_of(forwarded.aged[0])
                            offset = (2 * i + 1) * _IOVEC_SIZE
                            iovecs[offset : offset + _IOVEC_SIZE] = iovec
                            bodies[i] = forwarded.aged  # the entry may age again before the send
                            ready += 1
                            continue
                except Exception:  # a bug costs this query, not the rest of the batch
                    self._failed()
                    continue
            ready = self._answer_slot(i, length, ready)
        if ready:
            self.stats.send_failed += io.send(ready)

    def _answer_slot(self, i: int, length: int, ready: int) -> int:
        """Answer the datagram in slot ``i`` as :meth:`Answerer.answer` would; its reply, if
        any, becomes reply number ``ready``. The replies prepared so far, after this one."""
        io = self.io
        name_length, flags = io.received_header(i)
        start = i * _SLOT_SIZE
        data = io.data_view
        if flags & batch_io.MSG_TRUNC:  # longer than any real query
            body = oversized_reply(bytes(data[start : start + HEADER.size]), self.stats)
            if body is None:
                return ready
            io.place(ready, i, name_length, body, batch_io.ID_SIZE)
            return ready + 1
        packet = data[start : start + length].tobytes()
        try:
            body = self.answerer.cached(packet)
            skip = 0
            if body is None:
                # the client's address costs a parse: only autopath answers depend on it
                body = self.answerer.build(packet, False, self._address(i, name_length)[0]) \
                    if self.answerer.autopath else self.answerer.build(packet)
                skip = batch_io.ID_SIZE  # a whole reply: the query's ID is already in it
        except Exception:  # a bug costs this query, not the rest of the batch
            self._failed()
            return ready
        if body.__class__ is bytes:
            if ready == i:  # reply i answers query i: its address and ID are in place
                _BODY.pack_into(io.send_iovecs_view, (2 * i + 1) * _IOVEC_SIZE,
                                id(body) + batch_io.BYTES_DATA + skip, len(body) - skip)  # type: ignore[arg-type]
                io.bodies[i] = body  # type: ignore[assignment]
            else:
                io.place(ready, i, name_length, body, skip)  # type: ignore[arg-type]
            return ready + 1
        if body is not None:
            self.forward(body, self._sender(self._address(i, name_length)))  # type: ignore[arg-type]
        return ready

    def _address(self, slot: int, length: int) -> Address:
        start = slot * batch_io.SOCKADDR_SIZE
        return batch_io.address_of(bytes(self.io.names_view[start : start + length]))


#: IP_FREEBIND / IPV6_FREEBIND (Linux; Python's socket module names only the first)
_FREEBIND = {socket.AF_INET: (socket.IPPROTO_IP, 15), socket.AF_INET6: (socket.IPPROTO_IPV6, 78)}


def free_bind(sock: socket.socket, family: socket.AddressFamily) -> None:
    """The DNS addresses are made local by routes (proxy/host/addresses.py): IPv6 binds such an
    address only with IPV6_FREEBIND."""
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    level, option = _FREEBIND[family]
    sock.setsockopt(level, option, 1)


def bind_udp(address: str, port: int, family: socket.AddressFamily) -> socket.socket:
    """A non-blocking UDP socket on (address, port) with SO_REUSEPORT (a new instance or
    another worker binds beside it) and a large receive buffer."""
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        free_bind(sock, family)
        enlarge_receive_buffer(sock)
        sock.bind((address, port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def bind_tcp(address: str, port: int, family: socket.AddressFamily, backlog: int = 128) -> socket.socket:
    """The TCP listener beside :func:`bind_udp`: SO_REUSEADDR and SO_REUSEPORT, as
    asyncio's create_server(reuse_address=True, reuse_port=True) sets them, and FREEBIND."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        free_bind(sock, family)
        sock.bind((address, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def udp_listener(sock: socket.socket, answerer: Answerer, forward: ForwardHandler,
                 stats: DnsStats) -> UdpListener:
    """The batched listener where recvmmsg/sendmmsg are available, else the portable one."""
    if batch_io.available():
        return BatchedUdpListener(sock, answerer, forward, stats)
    return UdpListener(sock, answerer, forward, stats)


class UdpServing:
    """A bound socket read by the event loop through a :class:`UdpListener`."""

    def __init__(self, sock: socket.socket, listener: UdpListener, loop: asyncio.AbstractEventLoop):
        self.sock = sock
        self.listener = listener
        self.loop = loop
        loop.add_reader(sock.fileno(), listener.drain)

    def step_aside(self) -> None:
        """A successor bound the same address: connected to its own address, this socket no
        longer matches new queries (the kernel gives them to the successor's), while what is
        queued is still read, and answered (a reply with an address goes out on a connected
        UDP socket too)."""
        try:
            self.sock.connect(self.sock.getsockname())
        except OSError as exc:
            log.warning("dns: cannot step aside for the successor: %s", exc)
            return
        while self.listener.drain():  # what was queued before: no new datagram arrives now
            pass

    def close(self) -> None:
        if self.listener.closed:
            return
        self.listener.closed = True
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()

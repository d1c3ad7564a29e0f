"""DNS over TCP (RFC 7766) for :class:`~kubeport.dns.server.DnsServer`, beside :mod:`.udp`.

A connection reads 2-byte length framed queries and answers them as they complete
(pipelining): cluster answers at once, forwarded ones when the upstream replies. An idle
timeout closes a connection nobody uses; as miekg/dns (CoreDNS's server) a message must
arrive whole within a read deadline, so a client trickling bytes cannot hold a connection;
reading pauses while the client does not read its answers. The server's admission
(:class:`~kubeport.lib.admission.ConnectionAdmission`) caps connections, per client too,
and at the cap evicts the connection idle longest (RFC 7766 section 6.2.3).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubeport.dns.server import DnsServer


class TcpConnection(asyncio.Protocol):
    """One client connection: 2-byte length framed queries, answered as they complete."""

    def __init__(self, server: "DnsServer"):
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.pending = 0
        self.last_activity = 0.0
        self.idle_handle: asyncio.TimerHandle | None = None
        #: armed from the connect to the first message, then while part of a message is buffered:
        #: the rest must come within tcp_read_timeout.
        self.read_deadline: asyncio.TimerHandle | None = None
        self.eof = False
        self.client = ""
        #: a whole message has arrived (until then the read deadline runs from the connect).
        self.started = False

    @property
    def idle(self) -> bool:
        """No query under way: nothing pending, no message begun."""
        return not self.pending and not self.buffer and self.transport is not None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        server = self.server
        peer = transport.get_extra_info("peername")
        self.client = peer[0] if peer else ""
        if not server._connections.admit(self):
            self.transport = None
            transport.abort()  # type: ignore[attr-defined]
            return
        loop = asyncio.get_running_loop()
        self.last_activity = loop.time()
        self.idle_handle = loop.call_later(server.config.tcp_idle_timeout, self._check_idle)
        # The first message has the read deadline from the connect on, as in miekg/dns.
        self.read_deadline = loop.call_later(server.config.tcp_read_timeout, self._read_timed_out)

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return  # refused or closed: what was in flight is not read
        loop = asyncio.get_running_loop()
        self.last_activity = loop.time()
        buffer = self.buffer + data if self.buffer else data
        answerer = self.server.answerer
        offset = 0
        while len(buffer) - offset >= 2:
            size = (buffer[offset] << 8) | buffer[offset + 1]
            if len(buffer) - offset - 2 < size:
                break
            message = buffer[offset + 2 : offset + 2 + size]
            offset += 2 + size
            reply = answerer.answer(message, True, self.client)
            if reply.__class__ is bytes:
                self._write(reply)  # type: ignore[arg-type]
            elif reply is None:
                self.close()  # no header: the stream cannot be trusted any more
                return
            else:
                self.pending += 1
                self.server._forward(reply, self._write_forwarded)  # type: ignore[arg-type]
        self.buffer = buffer[offset:]
        if offset:
            self.started = True
        if self.buffer:  # a message begun: its deadline runs from its first bytes
            if offset or self.read_deadline is None:
                if self.read_deadline is not None:
                    self.read_deadline.cancel()
                self.read_deadline = loop.call_later(self.server.config.tcp_read_timeout, self._read_timed_out)
        elif self.read_deadline is not None:
            self.read_deadline.cancel()
            self.read_deadline = None

    def _read_timed_out(self) -> None:
        self.read_deadline = None
        if self.transport is not None and (self.buffer or not self.started):
            self.server.stats.tcp_read_timeouts += 1
            self.transport.abort()

    def _write(self, reply: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(len(reply).to_bytes(2, "big") + reply)

    def _write_forwarded(self, reply: bytes) -> None:
        self.pending -= 1
        self._write(reply)
        if self.transport is not None:
            self.last_activity = asyncio.get_running_loop().time()
            if self.eof and not self.pending:
                self.close()

    def _check_idle(self) -> None:
        loop = asyncio.get_running_loop()
        timeout = self.server.config.tcp_idle_timeout
        idle_for = loop.time() - self.last_activity
        if idle_for >= timeout and not self.pending:
            self.close()
            return
        self.idle_handle = loop.call_later(max(timeout - idle_for, timeout / 10), self._check_idle)

    def pause_writing(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()  # the client is not reading its answers

    def resume_writing(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def eof_received(self) -> bool:
        # A client may half-close after its last query: finish the answers in flight first.
        self.eof = True
        return self.pending > 0

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    evict = close  # at a connection cap (ConnectionAdmission): it was idle, nothing is cut short

    def connection_lost(self, exc: Exception | None) -> None:
        if self.idle_handle is not None:
            self.idle_handle.cancel()
        if self.read_deadline is not None:
            self.read_deadline.cancel()
        self.server._connections.discard(self)
        self.transport = None

"""Asking upstreams over TCP on reused connections, as CoreDNS ``forward`` does.

CoreDNS (plugin/pkg/proxy persistent.go, connect.go) keeps the connections it is done with
per upstream and protocol, takes the most recently used one first, and closes, unused, any
idle longer than ``expire`` (10 s); a cached connection the upstream closed meanwhile
fails at once (EOF), and the query is asked again (forward.go, ErrCachedClosed). Here, the
idle connections are swept when one is taken or given back, by a timer while any is idle
(as CoreDNS's sweep every ``expire``: a burst's connections do not stay open), and on
:meth:`TcpPool.close`.

One query at a time per connection (RFC 7766 framing: a 2-byte length before each
message); a connection goes back to the pool only after the answer with its query's ID,
with nothing unread behind it. A failure, an EOF, a cancellation or a timeout while a
query is in flight closes the connection.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import deque
from typing import Callable

from kubeport.dns.forward.udp import Upstream, upstream_query

#: seconds an idle connection may wait to be reused (CoreDNS forward ``expire`` default)
EXPIRE = 10.0


class TcpConnection(asyncio.Protocol):
    """One TCP connection to an upstream, asked one query at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.heard = False  # a byte arrived since the query in flight was sent
        self._buffer = bytearray()
        self._waiting: tuple[int, asyncio.Future[bytes]] | None = None

    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._waiting is None:  # bytes nobody asked for: the framing is no longer known
            self.close()
            return
        self.heard = True
        buffer = self._buffer
        buffer += data
        while len(buffer) >= 2 and len(buffer) >= 2 + (size := (buffer[0] << 8) | buffer[1]):
            message = bytes(buffer[2 : 2 + size])
            del buffer[: 2 + size]
            query_id, future = self._waiting
            if len(message) >= 12 and ((message[0] << 8) | message[1]) == query_id:
                self._waiting = None
                if buffer:  # more than the answer came: what it is can't be known, not reused
                    self.close()
                if not future.done():
                    future.set_result(message)
                return
            # another ID (an answer to some earlier query): skipped, as CoreDNS does

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._waiting is not None and not self._waiting[1].done():
            self._waiting[1].set_exception(exc or EOFError("upstream closed the TCP connection"))

    async def ask(self, query_id: int, packet: bytes) -> bytes:
        """The answer with ``query_id``; raises OSError or EOFError when the connection fails."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("upstream TCP connection closed")
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting, self.heard = (query_id, future), False
        try:
            self.transport.write(len(packet).to_bytes(2, "big") + packet)
            return await future
        finally:
            self._waiting = None


class TcpPool:
    """Idle TCP connections per upstream: the most recently used is taken first (CoreDNS's
    LIFO), none idle longer than ``expire`` is reused; no cap on how many are kept (CoreDNS
    ``max_idle_conns`` 0). ``clock``: monotonic seconds."""

    def __init__(self, *, expire: float = EXPIRE, clock: Callable[[], float] = time.monotonic,
                 counted: Callable[[Upstream, bool], None] | None = None):
        """``counted(upstream, reused)``: called once per connection taken for a query, as
        CoreDNS counts its connection cache hits and misses (a cached connection found
        closed counts a hit, then the new one a miss)."""
        self.expire = expire
        self._clock = clock
        self._counted = counted
        self._idle: dict[Upstream, deque[TcpConnection]] = {}
        self._closed = False
        self._sweeper: asyncio.TimerHandle | None = None

    def idle(self, upstream: Upstream) -> int:
        return len(self._idle.get(upstream, ()))

    async def ask(self, upstream: Upstream, question: bytes, *, do: bool, cd: bool, udp_size: int) -> bytes:
        """The upstream's answer; raises OSError or EOFError when it failed. No timeout
        here: the caller bounds the ask (a cancelled ask closes its connection)."""
        query_id = secrets.randbits(16)
        packet = upstream_query(query_id, question, do=do, cd=cd, udp_size=udp_size)
        reused = self._take(upstream, self._clock())
        counted = self._counted
        if counted is not None:
            counted(upstream, reused is not None)
        if reused is not None:
            try:
                return await self._exchange(upstream, reused, query_id, packet)
            except (OSError, EOFError):
                if reused.heard:
                    raise
                # closed by the upstream while idle (CoreDNS ErrCachedClosed); the ones idle
                # longer are likely closed too: asked again once, on a new connection
                self._close_idle(upstream)
                if counted is not None:
                    counted(upstream, False)
        _, connection = await asyncio.get_running_loop().create_connection(TcpConnection, *upstream)
        return await self._exchange(upstream, connection, query_id, packet)

    async def _exchange(self, upstream: Upstream, connection: TcpConnection, query_id: int, packet: bytes) -> bytes:
        try:
            answer = await connection.ask(query_id, packet)
        except BaseException:  # failed, timed out or cancelled: an answer may still be on its way
            connection.close()
            raise
        self._give_back(upstream, connection, self._clock())
        return answer

    def _take(self, upstream: Upstream, now: float) -> TcpConnection | None:
        idle = self._idle.get(upstream)
        while idle:
            connection = idle.pop()
            if now - connection.idle_since > self.expire:  # the newest expired: all have
                connection.close()
                self._close_idle(upstream)
                return None
            if connection.open:
                return connection
        return None

    def _give_back(self, upstream: Upstream, connection: TcpConnection, now: float) -> None:
        if self._closed or not connection.open:
            connection.close()
            return
        idle = self._idle.setdefault(upstream, deque())
        while idle and now - idle[0].idle_since > self.expire:
            idle.popleft().close()
        connection.idle_since = now
        idle.append(connection)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(self.expire, self.sweep)

    def sweep(self) -> None:
        """Close the connections idle longer than ``expire``; again later while any is idle."""
        self._sweeper = None
        now = self._clock()
        for upstream, idle in list(self._idle.items()):
            while idle and now - idle[0].idle_since > self.expire:
                idle.popleft().close()
            if not idle:
                del self._idle[upstream]
        if self._idle and not self._closed:
            self._sweeper = asyncio.get_running_loop().call_later(self.expire, self.sweep)

    def _close_idle(self, upstream: Upstream) -> None:
        for connection in self._idle.pop(upstream, ()):
            connection.close()

    def close(self) -> None:
        """Close every idle connection; those in use are closed when their query ends."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for upstream in list(self._idle):
            self._close_idle(upstream)

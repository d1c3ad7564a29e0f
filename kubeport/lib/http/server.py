"""The asyncio shell: :class:`HttpServer` listens, and a connection protocol per socket reads
requests (:class:`~kubeport.lib.http.request.RequestReader`), answers them one at a time, and
applies the timeouts and connection caps described in :mod:`kubeport.lib.http`.

Descriptors: connections are accepted by the loop (``loop.create_server``), outside the
proxy's lowered ceiling (``kubeport/proxy/relay/reserve.py``), so they come from the reserve.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kubeport.lib.admission import ConnectionAdmission
from kubeport.lib.http.request import MAX_HEAD_BYTES, BadRequest, Request, RequestReader
from kubeport.lib.http.response import Response, encode_response, error_response, http_date
from kubeport.lib.http.routes import Handler, Routes

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = 10.0
IDLE_TIMEOUT = 60.0
#: how long :meth:`HttpServer.close` lets answers in progress finish
SHUTDOWN_TIMEOUT = 1.0
#: how long a connection's last answer waits for the peer's FIN (Go's rstAvoidanceDelay)
LINGER = 0.5
#: open connections of one server, and of one client address on it
MAX_CONNECTIONS = 128
MAX_CONNECTIONS_PER_CLIENT = 16


@dataclass(slots=True)
class ConnectionStats:
    """Connections turned away at the caps, summed over the servers that share this."""

    #: reset at once: at a cap with none of the connections that could make room idle
    rejected: int = 0
    #: idle connections closed to make room for a new one
    evicted: int = 0

    def count_rejected(self) -> None:
        self.rejected += 1

    def count_evicted(self) -> None:
        self.evicted += 1


#: the process's servers count here unless given their own
CONNECTION_STATS = ConnectionStats()


class HttpServer:
    """Serves ``handle`` (a :class:`Routes`, or any request -> response coroutine) on sockets."""

    def __init__(self, handle: Routes | Handler, *, request_timeout: float = REQUEST_TIMEOUT,
                 idle_timeout: float = IDLE_TIMEOUT, max_head: int = MAX_HEAD_BYTES,
                 admit: Callable[[Any], bool] | None = None,
                 max_connections: int = MAX_CONNECTIONS, max_connections_per_client: int = MAX_CONNECTIONS_PER_CLIENT,
                 stats: ConnectionStats | None = None) -> None:
        """``admit``: called with each accepted socket; False closes it unanswered (a Unix
        socket's ``SO_PEERCRED`` check)."""
        self._handle = handle
        self.admit = admit
        self.request_timeout = request_timeout
        self.idle_timeout = idle_timeout
        self.max_head = max_head
        self._servers: list[Any] = []
        self.connections: set[_Connection] = set()
        counted = CONNECTION_STATS if stats is None else stats
        self._admission: ConnectionAdmission[_Connection] = ConnectionAdmission(
            max_connections, max_connections_per_client, rejected=counted.count_rejected, evicted=counted.count_evicted)
        self._drained: asyncio.Future[None] | None = None
        self._date_second = -1
        self._date = ""

    async def listen(self, host: str | Sequence[str] | None, port: int, *, backlog: int = 128) -> None:
        """Listen on ``host`` (None: every address of both families) with SO_REUSEADDR and
        SO_REUSEPORT: a successor (seamless restart) binds the same ports before we leave."""
        server = await asyncio.get_running_loop().create_server(
            lambda: _Connection(self), host=host, port=port, backlog=backlog,
            reuse_address=True, reuse_port=True)
        self._servers.append(server)

    async def listen_unix(self, path: str, *, mode: int = 0o600, backlog: int = 128) -> None:
        """Listen on a Unix socket at ``path`` (a stale one there is replaced), with ``mode``
        set before the first connection can be accepted."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    os.unlink(path)
            sock.bind(path)
            os.chmod(path, mode)
            server = await asyncio.get_running_loop().create_unix_server(
                lambda: _Connection(self), sock=sock, backlog=backlog)
        except BaseException:
            sock.close()
            raise
        self._servers.append(server)

    @property
    def sockets(self) -> list[Any]:
        return [sock for server in self._servers for sock in server.sockets]

    async def close(self, timeout: float = SHUTDOWN_TIMEOUT) -> None:
        """Stop listening; let answers in progress finish (``timeout`` at most), close the rest."""
        for server in self._servers:
            server.close()
        for connection in list(self.connections):
            connection.close_when_idle()
        answering = [connection.task for connection in self.connections
                     if connection.task is not None and not connection.task.done()]
        if answering:
            await asyncio.wait(answering, timeout=timeout)
        for connection in list(self.connections):
            connection.abort()
        if self.connections:  # their connection_lost comes with the loop's next iteration
            self._drained = asyncio.get_running_loop().create_future()
            await asyncio.wait_for(self._drained, timeout)
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()

    def _forget(self, connection: _Connection) -> None:
        self.connections.discard(connection)
        self._admission.discard(connection)
        if not self.connections and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def date(self) -> str:
        now = time.time()
        second = int(now)
        if second != self._date_second:
            self._date_second, self._date = second, http_date(now)
        return self._date

    async def respond(self, request: Request) -> Response:
        if not isinstance(self._handle, Routes):
            return await self._handle(request)
        if request.path == "*":  # OPTIONS *: nothing to say beyond the status, as Go's
            return Response(200)
        found = self._handle.match(request.method, request.path)
        if isinstance(found, Response):
            return found
        handler, params = found
        return await handler(replace(request, params=params))


class _Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._reader = RequestReader(server.max_head)
        self._transport: asyncio.Transport | None = None
        self._peer: Any = None
        #: a request is being answered; what arrives meanwhile waits in the reader
        self._busy = False
        #: no request follows: the server closes, or the peer sent its FIN
        self._closing = False
        self._eof = False
        self._write_paused = False
        self._read_paused = False
        #: the deadline of the request being read, or of the idle wait for the next
        self._timer: asyncio.TimerHandle | None = None
        self._idle = False
        self.task: asyncio.Task[None] | None = None
        #: the peer's address (the per-client cap's key)
        self.client = ""
        #: monotonic time of the last bytes in or the last answer out (not the loop's time:
        #: uvloop's has milliseconds, cached per iteration, and would tie)
        self.last_activity = 0.0

    @property
    def idle(self) -> bool:
        """Nothing under way: no request begun, none being answered, no answer left unsent,
        and not closing (a closing connection goes by itself)."""
        return (not self._busy and not self._closing and not self._write_paused and not self._reader.started
                and self._transport is not None)

    # --- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._server.admit is not None and not self._server.admit(transport.get_extra_info("socket")):
            transport.abort()
            return
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport
        self._peer = transport.get_extra_info("peername")
        self.client = str(self._peer[0]) if isinstance(self._peer, tuple) and self._peer else ""
        self.last_activity = time.monotonic()
        if not self._server._admission.admit(self):
            self._transport = None
            transport.abort()  # type: ignore[attr-defined]
            return
        self._server.connections.add(self)
        self._arm(self._server.request_timeout, idle=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server._forget(self)
        self._cancel_timer()
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self._transport = None

    def data_received(self, data: bytes) -> None:
        if self._transport is None or self._closing:
            return
        self.last_activity = time.monotonic()
        self._reader.feed(data)
        if self._idle:  # the next request's first bytes: its own deadline starts
            self._arm(self._server.request_timeout, idle=False)
        if self._busy or self._write_paused:
            if self._reader.buffered > self._server.max_head and not self._read_paused:
                self._read_paused = True  # pipelined beyond one head: wait for the answers
                self._transport.pause_reading()
            return
        self._advance()

    def eof_received(self) -> bool:
        self._eof = True
        if self._closing:
            return False  # the transport closes
        if not self._busy:
            self._advance()
        return True  # half-closed: what was asked before the FIN is still answered

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if not self._busy:
            self._advance()

    # --- the server's

    def close_when_idle(self) -> None:
        self._closing = True
        if not self._busy and self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def evict(self) -> None:
        """Closed, idle, for a new connection at a cap: as an idle timeout closes it."""
        self._closing = True
        self._cancel_timer()
        if self._transport is not None:
            self._transport.close()

    # --- requests

    def _advance(self) -> None:
        transport = self._transport
        if transport is None or self._write_paused:
            return
        if self._closing:
            transport.close()
            return
        try:
            request = self._reader.next()
        except BadRequest as error:
            self._cancel_timer()
            self._write(error_response(error), head_only=False, keep_alive=False, version=(1, 1))
            self._finish()
            return
        if request is None:
            if self._eof:
                transport.close()
            elif not self._reader.started and not self._idle:
                self._arm(self._server.idle_timeout, idle=True)
            return
        self._cancel_timer()
        self._busy = True
        if self._read_paused:
            self._read_paused = False
            transport.resume_reading()
        self.task = asyncio.get_running_loop().create_task(self._serve(replace(request, peer=self._peer)))

    async def _serve(self, request: Request) -> None:
        try:
            response = await self._server.respond(request)
        except Exception:
            log.exception("answering %s %s failed", request.method, request.path)
            response = Response.text("500 Internal Server Error", 500)
        if self._transport is None:
            return
        keep_alive = request.keep_alive and not self._closing
        self._write(response, head_only=request.method == "HEAD", keep_alive=keep_alive, version=request.version)
        self._busy = False
        if not keep_alive:
            self._finish()
            return
        if self._reader.started:  # the next request began arriving while this one was answered
            self._arm(self._server.request_timeout, idle=False)
        self._advance()

    def _finish(self) -> None:
        """The last answer is written: half-close, and drop what still arrives until the peer's
        FIN or :data:`LINGER`, so that unread bytes do not turn the close into a reset that
        destroys the answer before the peer read it (Go's ``closeWriteAndWait``)."""
        transport = self._transport
        assert transport is not None
        self._closing = True
        self._cancel_timer()
        if self._eof or not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        if self._read_paused:
            self._read_paused = False
            transport.resume_reading()
        self._arm(LINGER, idle=False)

    def _write(self, response: Response, *, head_only: bool, keep_alive: bool, version: tuple[int, int]) -> None:
        assert self._transport is not None
        self.last_activity = time.monotonic()
        self._transport.write(encode_response(response, head_only=head_only, keep_alive=keep_alive,
                                              version=version, date=self._server.date()))

    # --- timeouts

    def _arm(self, seconds: float, *, idle: bool) -> None:
        self._cancel_timer()
        self._idle = idle
        self._timer = asyncio.get_running_loop().call_later(seconds, self._timed_out)

    def _cancel_timer(self) -> None:
        self._idle = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        """A request not complete in time, a kept connection idle too long (closed unanswered),
        or the linger after the last answer over."""
        self._timer = None
        if not self._busy and self._transport is not None:
            self._transport.close()

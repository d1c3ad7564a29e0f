"""A small HTTP/1.1 server for the daemon's status, metrics and health-check ports.

Why not aiohttp.web: importing it costs the daemon ~9 MiB of RSS (its C parser and websocket
reader, multidict, yarl, attrs, and two SSL contexts with the CA store built when its
client connector is imported) and 0.18-0.20 s at every start. VmRSS of ``import uvloop,
kubeport.daemon`` then ``import aiohttp.web``: 52.7 MiB; with this module instead, 43.6 MiB.
With the status server's three ports and a health-check port started and answering: 54.2
MiB on aiohttp.web, 44.8 MiB here. Handlers answer probes, scrapes and `kubeport get`; none
reads a body.

Requests follow Go's net/http server, which kube-proxy's ports run on:

* Request line and headers: at most :data:`MAX_HEAD_BYTES` (64 KiB, not Go's
  DefaultMaxHeaderBytes of 1 MiB: what a probe or a scraper sends is under 1 KiB, and every
  open connection may hold that much in its buffer). Larger: 431; malformed: 400; a major
  version other than 1: 505; a transfer coding other than chunked: 501. Each answer closes.
* Bodies are read and discarded, not used: a Content-Length body, and a chunked one (Go
  reads chunked requests, it does not answer 411). Like Go's ``chunkWriter.writeHeader``
  for a handler that ignores the body, up to 256 KiB (``maxPostHandlerReadBytes``) is read
  so the connection stays usable; a larger body is not read, and the answer closes.
  ``Expect: 100-continue`` is never answered with 100 (the handler never reads): the
  answer closes, as Go's.
* HTTP/1.1 keeps the connection unless ``Connection: close``; HTTP/1.0 closes unless
  ``Connection: keep-alive``. Pipelined requests are answered in order, one at a time.
* Timeouts. kube-proxy sets none (``pkg/proxy/healthcheck/common.go``
  ``stdHTTPServerFactory.New`` builds ``&http.Server{Handler: handler}``; the metrics
  port is ``http.ListenAndServe`` in ``cmd/kube-proxy/app/server.go serveMetrics``), so
  there a client sending a byte a second holds a goroutine forever. Here a request must be
  complete (head and the body read) within :data:`REQUEST_TIMEOUT` (10 s) of its first
  byte (Go's ``ReadTimeout``), the first within that of the accept (Go's
  ``ReadHeaderTimeout`` applies from the accept too), and a kept connection may idle
  :data:`IDLE_TIMEOUT` (60 s) between requests (Go's ``IdleTimeout``). A connection timed
  out is closed without an answer, as Go's. After a connection's last answer it is
  half-closed and waits :data:`LINGER` for the peer's FIN, as Go's ``closeWriteAndWait``.
* Connections. Go's server (so kube-proxy's) accepts any number. Here one server holds at
  most :data:`MAX_CONNECTIONS` (128), :data:`MAX_CONNECTIONS_PER_CLIENT` (16) of them from
  one client address, with the rule TCP DNS follows (:mod:`kubeport.lib.admission`): at the global cap the connection idle longest (no request
  begun, no answer under way or unsent) is closed for the new one, at the per-client cap
  that client's own connection idle longest, and when none is idle the new one is reset at
  once. A probe or scrape opens one connection, or a few kept alive; the caps keep one
  client (or many slow ones) from spending the descriptors the daemon's other servers need.
  Counted in :class:`ConnectionStats` (``kubeport_http_connections_*_total``).
* Every answer has ``Date`` (``http.TimeFormat``), ``Content-Length`` and, with a body, a
  ``Content-Type`` (``text/plain; charset=utf-8`` unless the handler sets one, what Go's
  sniffing says of text). HEAD gets the headers of GET and no body. An unknown path: 404
  ``404 page not found``; a known path with another method: 405 with ``Allow``.

Descriptors: connections are accepted by the loop (``loop.create_server``), outside the
proxy's lowered ceiling (``kubeport/proxy/relay/reserve.py``), so they come from the reserve.

:class:`RequestReader` (bytes in, requests out) and :class:`Routes` are pure; :class:`HttpServer`
is the asyncio shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import stat
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kubeport.lib.admission import ConnectionAdmission

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
#: Go's maxPostHandlerReadBytes: a body the handler did not read is discarded up to this.
MAX_DISCARDED_BODY = 256 * 1024
REQUEST_TIMEOUT = 10.0
IDLE_TIMEOUT = 60.0
#: how long :meth:`HttpServer.close` lets answers in progress finish
SHUTDOWN_TIMEOUT = 1.0
#: how long a connection's last answer waits for the peer's FIN (Go's rstAvoidanceDelay)
LINGER = 0.5
#: open connections of one server, and of one client address on it
MAX_CONNECTIONS = 128
MAX_CONNECTIONS_PER_CLIENT = 16

TEXT_PLAIN = "text/plain; charset=utf-8"
JSON = "application/json"

REASONS = {
    200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}

_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
#: control characters a header value must not hold (HTAB is allowed)
_VALUE_FORBIDDEN = frozenset(range(0x20)) - {0x09} | {0x7F}


# --- pure: requests ---------------------------------------------------------------------------


class BadRequest(Exception):
    """A request the server answers with ``status`` and closes the connection after."""

    def __init__(self, status: int, detail: str = "") -> None:
        super().__init__(f"{status} {REASONS.get(status, '')}{': ' + detail if detail else ''}")
        self.status = status
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    #: the path of the target, without the query
    path: str
    query: str
    #: (1, 0) or (1, 1)
    version: tuple[int, int]
    #: names lower-cased, in arrival order
    headers: tuple[tuple[str, str], ...]
    #: whether the connection may carry another request after this one's answer
    keep_alive: bool
    #: the socket's peer (``peername``), set by the server
    peer: Any = None
    #: values of the ``{name}`` segments of the matched route
    params: dict[str, str] = field(default_factory=dict)

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case)."""
        name = name.lower()
        return next((value for key, value in self.headers if key == name), None)


@dataclass(slots=True)
class _Body:
    """What remains of the body of the request being read."""

    #: bytes left of a Content-Length body, or of the current chunk's data
    remaining: int = 0
    chunked: bool = False
    #: in a chunked body: "size", "data", "data-end" (CRLF after the data), "trailer"
    state: str = "size"
    discarded: int = 0
    #: more than is discarded for a handler that ignores it: answered unread, then closed
    too_large: bool = False


class RequestReader:
    """Bytes of one connection in, complete requests out (their bodies read and discarded).

    :meth:`feed` what arrives, then :meth:`next` until it returns None (more bytes needed).
    A :class:`BadRequest` from :meth:`next` ends the connection: the caller answers it and
    closes. ``started`` tells whether part of a request has arrived (for the timeouts).
    """

    def __init__(self, max_head: int = MAX_HEAD_BYTES, max_discarded_body: int = MAX_DISCARDED_BODY) -> None:
        self._buffer = bytearray()
        self._max_head = max_head
        self._max_body = max_discarded_body
        self._pending: Request | None = None
        self._body: _Body | None = None
        #: how much of the buffer is known to hold no end of the head
        self._searched = 0

    def feed(self, data: bytes) -> None:
        self._buffer += data

    @property
    def started(self) -> bool:
        return bool(self._buffer) or self._pending is not None

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def next(self) -> Request | None:
        if self._pending is None:
            self._skip_empty_lines()
            head = self._take_head()
            if head is None:
                return None
            request, body = parse_head(head, self._max_body)
            self._pending, self._body = request, body
        if self._body is not None and not self._discard_body(self._body):
            return None
        request, body = self._pending, self._body
        self._pending = self._body = None
        if body is not None and body.too_large:
            request = replace(request, keep_alive=False)
        return request

    def _skip_empty_lines(self) -> None:
        # RFC 9112 2.2: a server SHOULD ignore an empty line before the request line (some
        # clients send CRLF after a body).
        start = 0
        while self._buffer[start:start + 2] == b"\r\n" or self._buffer[start:start + 1] == b"\n":
            start += 2 if self._buffer[start:start + 1] == b"\r" else 1
        if start:
            del self._buffer[:start]
            self._searched = 0

    def _take_head(self) -> bytes | None:
        buffer = self._buffer
        # From where the last search stopped: a head arriving a byte at a time is searched
        # once, not once per byte.
        start = max(0, self._searched - 2)
        end = buffer.find(b"\n\r\n", start, self._max_head + 3)
        lf_end = buffer.find(b"\n\n", start, self._max_head + 2)
        found = min(((at, size) for at, size in ((end, 3), (lf_end, 2)) if at >= 0), default=None)
        if found is None:
            if len(buffer) > self._max_head:
                raise BadRequest(431)
            self._searched = len(buffer)
            return None
        at, size = found
        if at > self._max_head:
            raise BadRequest(431)
        head = bytes(buffer[:at])
        del buffer[:at + size]
        self._searched = 0
        return head

    def _discard_body(self, body: _Body) -> bool:
        """Consume what there is of the body; whether it is complete."""
        buffer = self._buffer
        while True:
            if not body.chunked or body.state == "data":
                taken = min(body.remaining, len(buffer))
                del buffer[:taken]
                body.remaining -= taken
                body.discarded += taken
                if body.remaining:
                    return False
                if not body.chunked:
                    return True
                body.state = "data-end"
                continue
            line_end = buffer.find(b"\n")
            if line_end < 0:
                if len(buffer) > 4096:
                    raise BadRequest(400, "chunk line too long")
                return False
            line = bytes(buffer[:line_end]).rstrip(b"\r")
            del buffer[:line_end + 1]
            if body.state == "data-end":
                if line:
                    raise BadRequest(400, "malformed chunked encoding")
                body.state = "size"
            elif body.state == "size":
                size = _chunk_size(line)
                if size == 0:
                    body.state = "trailer"
                    continue
                if body.discarded + size > self._max_body:
                    body.too_large = True
                    return True
                body.state, body.remaining = "data", size
            else:  # trailer: fields until an empty line
                if not line:
                    return True


def _chunk_size(line: bytes) -> int:
    size_text = line.split(b";", 1)[0].strip(b" \t")
    if not size_text or len(size_text) > 16 or any(c not in b"0123456789abcdefABCDEF" for c in size_text):
        raise BadRequest(400, "malformed chunked encoding")
    return int(size_text, 16)


def parse_head(head: bytes, max_discarded_body: int = MAX_DISCARDED_BODY) -> tuple[Request, _Body | None]:
    """A request line and header lines (without the empty line that ends them)."""
    lines = head.split(b"\n")
    request_line = lines[0].removesuffix(b"\r")
    parts = request_line.split(b" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise BadRequest(400, "malformed request line")
    method_bytes, target, version_bytes = parts
    if not all(c in _TOKEN for c in method_bytes):
        raise BadRequest(400, "invalid method")
    version = _version(version_bytes)
    headers: list[tuple[str, str]] = []
    for raw in lines[1:]:
        line = raw.removesuffix(b"\r")
        if line[:1] in (b" ", b"\t"):
            raise BadRequest(400, "obsolete line folding")
        name, colon, value = line.partition(b":")
        if not colon or not name or not all(c in _TOKEN for c in name):
            raise BadRequest(400, "malformed header line")
        value = value.strip(b" \t")
        if any(c in _VALUE_FORBIDDEN for c in value):
            raise BadRequest(400, "invalid header value")
        headers.append((name.decode("ascii").lower(), value.decode("latin-1")))
    path, query = _target(target, method_bytes)
    values: dict[str, list[str]] = {}
    for name, value in headers:
        values.setdefault(name, []).append(value)
    if version >= (1, 1) and "host" not in values:
        raise BadRequest(400, "missing required Host header")
    if len(values.get("host", ())) > 1:
        raise BadRequest(400, "too many Host headers")
    expects_continue = any(value.lower() == "100-continue" for value in values.get("expect", ()))
    body, close = _body_framing(values, max_discarded_body)
    if expects_continue:  # the body waits for a 100 Continue no handler asks for: not read
        body, close = None, True
    connection = {token.strip().lower() for value in values.get("connection", ()) for token in value.split(",")}
    if version >= (1, 1):
        keep_alive = "close" not in connection
    else:
        keep_alive = "keep-alive" in connection
    if close:
        keep_alive = False
    request = Request(method_bytes.decode("ascii"), path, query, version, tuple(headers), keep_alive)
    return request, body


def _version(text: bytes) -> tuple[int, int]:
    if text == b"HTTP/1.1":
        return (1, 1)
    if text == b"HTTP/1.0":
        return (1, 0)
    # Go's ParseHTTPVersion: "HTTP/" and one digit each side of the dot.
    if len(text) != 8 or not text.startswith(b"HTTP/") or text[6:7] != b"." \
            or not text[5:6].isdigit() or not text[7:8].isdigit():
        raise BadRequest(400, "malformed HTTP version")
    major, minor = int(text[5:6]), int(text[7:8])
    if major != 1:
        raise BadRequest(505, "unsupported protocol version")
    return (1, minor)


def _target(target: bytes, method: bytes) -> tuple[str, str]:
    text = target.decode("latin-1")
    if any(ord(c) <= 0x20 or ord(c) >= 0x7F for c in text):
        raise BadRequest(400, "invalid request target")
    if text == "*" and method == b"OPTIONS":
        return "*", ""
    lowered = text[:8].lower()
    if lowered.startswith(("http://", "https://")):  # absolute form
        rest = text.split("://", 1)[1]
        slash = rest.find("/")
        text = rest[slash:] if slash >= 0 else "/"
    if not text.startswith("/"):
        raise BadRequest(400, "invalid request target")
    path, _, query = text.partition("?")
    return _unquote(path), query


def _unquote(path: str) -> str:
    """The path with its %XX escapes decoded (Go's URL.Path, on which ServeMux matches)."""
    if "%" not in path:
        return path
    pieces = path.split("%")
    decoded = bytearray(pieces[0].encode())
    for piece in pieces[1:]:
        if len(piece) < 2 or any(c not in "0123456789abcdefABCDEF" for c in piece[:2]):
            raise BadRequest(400, "invalid escape in path")
        decoded.append(int(piece[:2], 16))
        decoded += piece[2:].encode()
    return decoded.decode("utf-8", "replace")


def _body_framing(values: dict[str, list[str]], max_discarded_body: int) -> tuple[_Body | None, bool]:
    """How the body is delimited, and whether the answer must close (a body too large to discard)."""
    codings = [token.strip().lower() for value in values.get("transfer-encoding", ()) for token in value.split(",")]
    if codings:
        if codings != ["chunked"]:
            raise BadRequest(501, "unsupported transfer encoding")
        return _Body(chunked=True), False  # a Content-Length beside chunked is ignored (RFC 9112 6.3)
    lengths = {value.strip() for value in values.get("content-length", ())}
    if not lengths:
        return None, False
    if len(lengths) > 1:
        raise BadRequest(400, "multiple Content-Length values")
    (text,) = lengths
    if not text.isdigit() or len(text) > 18:
        raise BadRequest(400, "invalid Content-Length")
    length = int(text)
    if length > max_discarded_body:
        return None, True
    return (_Body(remaining=length) if length else None), False


# --- pure: answers ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Response:
    status: int = 200
    body: bytes = b""
    #: extra headers; a Content-Type here replaces the default
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def text(cls, text: str, status: int = 200) -> Response:
        return cls(status, text.encode(), (("Content-Type", TEXT_PLAIN),))

    @classmethod
    def json(cls, document: Any, status: int = 200) -> Response:
        """``document`` indented by two, newline-terminated."""
        return cls(status, (json.dumps(document, indent=2) + "\n").encode(), (("Content-Type", JSON),))


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(timestamp: float) -> str:
    """Go's http.TimeFormat: ``Mon, 02 Jan 2006 15:04:05 GMT``."""
    t = time.gmtime(timestamp)
    return (f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT")


def encode_response(response: Response, *, head_only: bool, keep_alive: bool, version: tuple[int, int],
                    date: str) -> bytes:
    """The bytes of ``response``: status line, headers (Date, Content-Length, Content-Type), body."""
    status = response.status
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}"]
    has_type = False
    for name, value in response.headers:
        lowered = name.lower()
        if lowered in ("content-length", "connection", "date", "transfer-encoding"):
            continue
        has_type = has_type or lowered == "content-type"
        lines.append(f"{name}: {value}")
    if not has_type and response.body:
        lines.append(f"Content-Type: {TEXT_PLAIN}")
    lines.append(f"Date: {date}")
    lines.append(f"Content-Length: {len(response.body)}")
    if not keep_alive:
        lines.append("Connection: close")
    elif version < (1, 1):
        lines.append("Connection: keep-alive")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + response.body


def error_response(error: BadRequest) -> Response:
    """Go's answer to a request it could not read: ``400 Bad Request: <why>`` as text."""
    text = f"{error.status} {REASONS.get(error.status, '')}"
    if error.detail and error.status == 400:
        text += f": {error.detail}"
    return Response.text(text, error.status)


# --- pure: routing ----------------------------------------------------------------------------

Handler = Callable[[Request], Awaitable[Response]]

NOT_FOUND = Response(404, b"404 page not found\n", (("Content-Type", TEXT_PLAIN), ("X-Content-Type-Options", "nosniff")))


@dataclass(frozen=True, slots=True)
class _Route:
    methods: frozenset[str] | None
    segments: tuple[str, ...]
    handler: Handler


class Routes:
    """Exact paths, and paths with ``{name}`` segments (one non-empty segment each); methods.

    A route for GET answers HEAD too (Go's ServeMux); ``methods=None`` answers any method.
    Exact paths win over patterns; patterns match in the order added.
    """

    def __init__(self) -> None:
        self._exact: dict[str, list[_Route]] = {}
        self._patterns: list[_Route] = []

    def add(self, path: str, handler: Handler, methods: Iterable[str] | None = ("GET",)) -> None:
        allowed = None if methods is None else frozenset(methods)
        if allowed is not None and "GET" in allowed:
            allowed = allowed | {"HEAD"}
        segments = tuple(path.split("/"))
        route = _Route(allowed, segments, handler)
        if any(_is_parameter(segment) for segment in segments):
            self._patterns.append(route)
        else:
            self._exact.setdefault(path, []).append(route)

    def match(self, method: str, path: str) -> tuple[Handler, dict[str, str]] | Response:
        """The handler for ``method path`` and its parameters, or the 404/405 to answer."""
        allowed: set[str] = set()
        for route in self._exact.get(path, ()):
            if route.methods is None or method in route.methods:
                return route.handler, {}
            allowed |= route.methods
        segments = path.split("/")
        for route in self._patterns:
            params = _match_segments(route.segments, segments)
            if params is None:
                continue
            if route.methods is None or method in route.methods:
                return route.handler, params
            allowed |= route.methods
        if allowed:
            return Response(405, b"Method Not Allowed\n", (
                ("Allow", ", ".join(sorted(allowed))), ("Content-Type", TEXT_PLAIN),
                ("X-Content-Type-Options", "nosniff")))
        return NOT_FOUND


def _is_parameter(segment: str) -> bool:
    return len(segment) > 2 and segment.startswith("{") and segment.endswith("}")


def _match_segments(pattern: Sequence[str], segments: Sequence[str]) -> dict[str, str] | None:
    if len(pattern) != len(segments):
        return None
    params: dict[str, str] = {}
    for want, got in zip(pattern, segments):
        if _is_parameter(want):
            if not got:
                return None
            params[want[1:-1]] = got
        elif want != got:
            return None
    return params


# --- shell ------------------------------------------------------------------------------------


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

"""The sans-IO request parser: bytes of one connection in, complete requests out.

Request line and headers are bounded by :data:`MAX_HEAD_BYTES`; bodies are read and discarded
up to :data:`MAX_DISCARDED_BODY`. What the limits and answers follow (Go's net/http): the
package docstring, :mod:`kubeport.lib.http`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from kubeport.lib.http.response import REASONS

MAX_HEAD_BYTES = 64 * 1024
#: Go's maxPostHandlerReadBytes: a body the handler did not read is discarded up to this.
MAX_DISCARDED_BODY = 256 * 1024

_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
#: control characters a header value must not hold (HTAB is allowed)
_VALUE_FORBIDDEN = frozenset(range(0x20)) - {0x09} | {0x7F}


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


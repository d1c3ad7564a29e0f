"""Answers: :class:`Response`, and its bytes on the wire (status line, Date, Content-Length,
Content-Type, body) as Go's net/http writes them."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubeport.lib.http.request import BadRequest

TEXT_PLAIN = "text/plain; charset=utf-8"
JSON = "application/json"

REASONS = {
    200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


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

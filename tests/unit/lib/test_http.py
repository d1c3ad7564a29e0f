"""kubeport.lib.http: the request reader and routes as tables, then the server on loopback."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Awaitable, Callable

import pytest
import uvloop
from support.wait import until

from kubeport.lib.http.request import MAX_DISCARDED_BODY, BadRequest, Request, RequestReader
from kubeport.lib.http.response import Response, encode_response, http_date
from kubeport.lib.http.routes import Routes
from kubeport.lib.http.server import ConnectionStats, HttpServer

H = "Host: x\r\n"


def read_all(data: bytes, *, chunks: int = 0, max_head: int = 1024) -> list[tuple[str, str, bool] | int]:
    """Requests read from ``data`` as (method, path, keep_alive), ending in the error status if any.
    ``chunks``: fed in pieces of that many bytes (0: at once)."""
    reader = RequestReader(max_head=max_head, max_discarded_body=64)
    pieces = [data[i:i + chunks] for i in range(0, len(data), chunks)] if chunks else [data]
    out: list[tuple[str, str, bool] | int] = []
    try:
        for piece in pieces:
            reader.feed(piece)
            while (request := reader.next()) is not None:
                out.append((request.method, request.path, request.keep_alive))
                if not request.keep_alive:
                    return out
    except BadRequest as error:
        out.append(error.status)
    return out


READS = [
    ("http/1.1 keeps the connection", f"GET /a HTTP/1.1\r\n{H}\r\n", [("GET", "/a", True)]),
    ("http/1.1 connection close", f"GET /a HTTP/1.1\r\n{H}Connection: close\r\n\r\n", [("GET", "/a", False)]),
    ("http/1.0 closes", "GET /a HTTP/1.0\r\n\r\n", [("GET", "/a", False)]),
    ("http/1.0 keep-alive asked", "GET /a HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", [("GET", "/a", True)]),
    ("connection tokens", f"GET /a HTTP/1.1\r\n{H}Connection: upgrade, close\r\n\r\n", [("GET", "/a", False)]),
    ("pipelined in order", f"GET /a HTTP/1.1\r\n{H}\r\nHEAD /b HTTP/1.1\r\n{H}\r\n",
     [("GET", "/a", True), ("HEAD", "/b", True)]),
    ("bare LF line ends", "GET /a HTTP/1.1\nHost: x\n\n", [("GET", "/a", True)]),
    ("an empty line before the request line", f"\r\nGET /a HTTP/1.1\r\n{H}\r\n", [("GET", "/a", True)]),
    ("query left off the path", f"GET /a?b=c HTTP/1.1\r\n{H}\r\n", [("GET", "/a", True)]),
    ("absolute form", f"GET http://x:1/api/v1/status HTTP/1.1\r\n{H}\r\n", [("GET", "/api/v1/status", True)]),
    ("escapes decoded", f"GET /a%2Fb%20c HTTP/1.1\r\n{H}\r\n", [("GET", "/a/b c", True)]),
    ("options star", f"OPTIONS * HTTP/1.1\r\n{H}\r\n", [("OPTIONS", "*", True)]),
    ("http/1.9 is 1.x", f"GET / HTTP/1.9\r\n{H}\r\n", [("GET", "/", True)]),
    ("content-length body discarded", f"POST /a HTTP/1.1\r\n{H}Content-Length: 5\r\n\r\nhelloGET /b HTTP/1.1\r\n{H}\r\n",
     [("POST", "/a", True), ("GET", "/b", True)]),
    ("chunked body discarded (Go reads it, no 411)",
     (f"POST /a HTTP/1.1\r\n{H}Transfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nTrailer: t\r\n\r\n"
      f"GET /b HTTP/1.1\r\n{H}\r\n"), [("POST", "/a", True), ("GET", "/b", True)]),
    ("chunked wins over content-length",
     (f"POST /a HTTP/1.1\r\n{H}Content-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
      f"GET /b HTTP/1.1\r\n{H}\r\n"), [("POST", "/a", True), ("GET", "/b", True)]),
    ("a body larger than is discarded: answered unread, then closed",
     f"POST /a HTTP/1.1\r\n{H}Content-Length: 65\r\n\r\n", [("POST", "/a", False)]),
    ("a chunked body larger than is discarded",
     f"POST /a HTTP/1.1\r\n{H}Transfer-Encoding: chunked\r\n\r\n41\r\n", [("POST", "/a", False)]),
    ("expect 100-continue: answered unread, then closed",
     f"POST /a HTTP/1.1\r\n{H}Expect: 100-continue\r\nContent-Length: 5\r\n\r\n", [("POST", "/a", False)]),
    ("head too large: 431", f"GET /a HTTP/1.1\r\n{H}X: {'y' * 1100}\r\n\r\n", [431]),
    ("request line too large: 431", f"GET /{'a' * 1100} HTTP/1.1\r\n{H}\r\n", [431]),
    ("no end of head yet but over the limit: 431", "GET / HTTP/1.1\r\nX: " + "y" * 1100, [431]),
    ("missing host on 1.1", "GET /a HTTP/1.1\r\n\r\n", [400]),
    ("two hosts", f"GET /a HTTP/1.1\r\n{H}{H}\r\n", [400]),
    ("two spaces", f"GET  /a HTTP/1.1\r\n{H}\r\n", [400]),
    ("no version", f"GET /a\r\n{H}\r\n", [400]),
    ("bad version", f"GET /a HTTP/1.x\r\n{H}\r\n", [400]),
    ("version 2", f"GET /a HTTP/2.0\r\n{H}\r\n", [505]),
    ("method not a token", f"G(T /a HTTP/1.1\r\n{H}\r\n", [400]),
    ("target not a path", f"GET a HTTP/1.1\r\n{H}\r\n", [400]),
    ("header without colon", f"GET /a HTTP/1.1\r\n{H}bogus\r\n\r\n", [400]),
    ("space before colon", f"GET /a HTTP/1.1\r\n{H}X : y\r\n\r\n", [400]),
    ("obsolete folding", f"GET /a HTTP/1.1\r\n{H}X: y\r\n z\r\n\r\n", [400]),
    ("control character in a value", f"GET /a HTTP/1.1\r\n{H}X: a\x01b\r\n\r\n", [400]),
    ("two content-lengths", f"POST /a HTTP/1.1\r\n{H}Content-Length: 1\r\nContent-Length: 2\r\n\r\n", [400]),
    ("negative content-length", f"POST /a HTTP/1.1\r\n{H}Content-Length: -1\r\n\r\n", [400]),
    ("unknown transfer coding: 501", f"POST /a HTTP/1.1\r\n{H}Transfer-Encoding: gzip\r\n\r\n", [501]),
    ("malformed chunk size", f"POST /a HTTP/1.1\r\n{H}Transfer-Encoding: chunked\r\n\r\nzz\r\n", [400]),
    ("chunk data without its CRLF", f"POST /a HTTP/1.1\r\n{H}Transfer-Encoding: chunked\r\n\r\n1\r\nab\r\n", [400]),
    ("a bad escape", f"GET /a%zz HTTP/1.1\r\n{H}\r\n", [400]),
    ("incomplete: nothing yet", f"GET /a HTTP/1.1\r\n{H}", []),
    ("body incomplete: nothing yet", f"POST /a HTTP/1.1\r\n{H}Content-Length: 5\r\n\r\nhel", []),
]


@pytest.mark.parametrize("data, expected", [(d, e) for _, d, e in READS], ids=[w for w, _, _ in READS])
@pytest.mark.parametrize("chunks", [0, 1, 7], ids=["at_once", "byte_by_byte", "in_sevens"])
def test_reader(data, expected, chunks):
    assert read_all(data.encode("latin-1"), chunks=chunks) == expected


def test_headers_are_kept_lower_cased_and_the_version_read():
    reader = RequestReader()
    reader.feed(b"GET /a HTTP/1.0\r\nHost: x\r\nX-Thing:  v a l \r\n\r\n")
    request = reader.next()
    assert request is not None
    assert request.version == (1, 0) and request.header("x-thing") == "v a l" and request.header("HOST") == "x"
    assert not reader.started


def test_started_tells_a_request_is_partly_read():
    reader = RequestReader()
    assert not reader.started
    reader.feed(b"G")
    assert reader.started and reader.next() is None


# --- answers -----------------------------------------------------------------------------------


def test_http_date_is_gos_time_format():
    assert http_date(1136214245) == "Mon, 02 Jan 2006 15:04:05 GMT"


@pytest.mark.parametrize(
    "response, head_only, keep_alive, version, expected",
    [
        pytest.param(Response.text("ok"), False, True, (1, 1),
                     b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nDate: D\r\n"
                     b"Content-Length: 2\r\n\r\nok", id="text"),
        pytest.param(Response(503, b"{}", (("Content-Type", "application/json"), ("X-A", "b"))), True, False, (1, 1),
                     b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nX-A: b\r\nDate: D\r\n"
                     b"Content-Length: 2\r\nConnection: close\r\n\r\n", id="head_close_keeps_the_length"),
        pytest.param(Response(200, b"x"), False, True, (1, 0),
                     b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nDate: D\r\n"
                     b"Content-Length: 1\r\nConnection: keep-alive\r\n\r\nx", id="http10_keep_alive"),
        pytest.param(Response(200, b"", (("Content-Length", "9"), ("Connection", "x"))), False, True, (1, 1),
                     b"HTTP/1.1 200 OK\r\nDate: D\r\nContent-Length: 0\r\n\r\n",
                     id="framing_headers_are_the_servers_and_no_type_without_a_body"),
    ],
)
def test_encode_response(response, head_only, keep_alive, version, expected):
    assert encode_response(response, head_only=head_only, keep_alive=keep_alive, version=version, date="D") == expected


# --- routes ------------------------------------------------------------------------------------


async def _handler(request: Request) -> Response:  # pragma: no cover - identity only
    return Response()


async def _other(request: Request) -> Response:  # pragma: no cover - identity only
    return Response()


def routes() -> Routes:
    table = Routes()
    table.add("/any", _handler, methods=None)
    table.add("/get", _handler)
    table.add("/api/v1/status", _other)
    table.add("/api/v1/{kind}", _handler)
    table.add("/api/v1/namespaces/{namespace}/{kind}", _handler)
    return table


@pytest.mark.parametrize(
    "method, path, expected",
    [
        ("POST", "/any", (_handler, {})),
        ("OPTIONS", "/any", (_handler, {})),
        ("GET", "/get", (_handler, {})),
        ("HEAD", "/get", (_handler, {})),
        ("POST", "/get", (405, "GET, HEAD")),
        ("GET", "/get/", 404),
        ("GET", "/nothing", 404),
        ("GET", "/api/v1/status", (_other, {})),
        ("GET", "/api/v1/services", (_handler, {"kind": "services"})),
        ("GET", "/api/v1/", 404),
        ("DELETE", "/api/v1/services", (405, "GET, HEAD")),
        ("GET", "/api/v1/namespaces/default/endpoints", (_handler, {"namespace": "default", "kind": "endpoints"})),
        ("GET", "/api/v1/namespaces//endpoints", 404),
        ("GET", "/api/v1/namespaces/default/endpoints/x", 404),
    ],
)
def test_routes(method, path, expected):
    found = routes().match(method, path)
    if isinstance(found, Response):
        if found.status == 405:
            assert (405, dict(found.headers)["Allow"]) == expected
        else:
            assert found.status == expected and found.body == b"404 page not found\n"
    else:
        assert found == expected


# --- the server on loopback --------------------------------------------------------------------


LOOPS = {"uvloop": uvloop.run, "asyncio": asyncio.run}


def on_each_loop(test: Callable[[HttpServer, int], Awaitable[None]]):
    """Run ``test(server, port)`` against a served :class:`Routes` on uvloop (the daemon's loop) and asyncio's."""

    def run(loop: str) -> None:
        LOOPS[loop](_served(test))

    run.__name__ = test.__name__
    return pytest.mark.parametrize("loop", list(LOOPS))(run)


async def _served(test: Callable[[HttpServer, int], Awaitable[None]]) -> None:
    table = Routes()

    async def echo(request: Request) -> Response:
        return Response.text(f"{request.method} {request.path} {request.params}")

    async def fails(request: Request) -> Response:
        raise RuntimeError("broken handler")

    table.add("/echo", echo, methods=None)
    table.add("/v/{name}", echo)
    table.add("/fails", fails)
    http = HttpServer(table, request_timeout=0.5, idle_timeout=0.5)
    await http.listen("127.0.0.1", 0)
    try:
        await test(http, http.sockets[0].getsockname()[1])
    finally:
        await http.close()


async def exchange(port: int, data: bytes, *, host: str = "127.0.0.1", deadline: float = 5.0) -> bytes:
    """What the server sends back for ``data`` until it closes the connection."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), deadline)
    finally:
        writer.close()


def statuses(answer: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)]


@on_each_loop
async def test_pipelined_requests_answered_in_order_then_closed(http: HttpServer, port: int) -> None:
    answer = await exchange(port, b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"
                                  b"POST /v/a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
                                  b"GET /v/a HTTP/1.1\r\nHost: x\r\n\r\n"
                                  b"HEAD /echo HTTP/1.1\r\nHost: x\r\n\r\n"
                                  b"GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert statuses(answer) == [200, 405, 200, 200, 404]
    assert b"GET /echo {}" in answer and b"GET /v/a {'name': 'a'}" in answer
    assert b"HEAD /echo" not in answer  # HEAD: the headers only
    assert b"Allow: GET, HEAD\r\n" in answer
    assert answer.endswith(b"404 page not found\n")
    assert answer.count(b"\r\nDate: ") == 5


@on_each_loop
async def test_http10_closes_after_its_answer(http: HttpServer, port: int) -> None:
    answer = await exchange(port, b"GET /echo HTTP/1.0\r\n\r\n")
    assert statuses(answer) == [200] and b"Connection: close\r\n" in answer


@on_each_loop
async def test_a_bad_request_is_answered_and_closed(http: HttpServer, port: int) -> None:
    answer = await exchange(port, b"GET /echo HTTP/1.1\r\n\r\nGET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
    assert statuses(answer) == [400] and answer.endswith(b"400 Bad Request: missing required Host header")


@on_each_loop
async def test_headers_over_the_limit_get_431(http: HttpServer, port: int) -> None:
    answer = await exchange(port, b"GET /echo HTTP/1.1\r\nHost: x\r\nX: " + b"y" * (70 * 1024) + b"\r\n\r\n")
    assert statuses(answer) == [431]


@on_each_loop
async def test_a_failing_handler_gets_500_and_the_connection_goes_on(http: HttpServer, port: int) -> None:
    answer = await exchange(port, b"GET /fails HTTP/1.1\r\nHost: x\r\n\r\nGET /echo HTTP/1.1\r\nHost: x\r\n"
                                  b"Connection: close\r\n\r\n")
    assert statuses(answer) == [500, 200]


@on_each_loop
async def test_a_slow_client_is_cut_off_at_the_request_deadline(http: HttpServer, port: int) -> None:
    """A byte at a time, under the deadline each, never completing the head: closed unanswered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for byte in b"GET /echo HTTP/1.1\r\nHost: x\r\n":
            writer.write(bytes([byte]))
            await writer.drain()
            try:  # paced by the server's answer, which never comes: EOF once cut off
                got = await asyncio.wait_for(reader.read(1), 0.1)
            except TimeoutError:
                continue
            assert got == b""
            return
        pytest.fail("the connection stayed open past the request deadline")  # pragma: no cover
    finally:
        writer.close()


@on_each_loop
async def test_an_idle_kept_connection_is_closed(http: HttpServer, port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 ") and b"Connection: close" not in head
        length = int(next(line.split(b": ")[1] for line in head.split(b"\r\n") if line.startswith(b"Content-Length")))
        await reader.readexactly(length)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # the idle timeout closed it
    finally:
        writer.close()


@on_each_loop
async def test_close_ends_idle_connections(http: HttpServer, port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        await http.close()
        assert not http.connections
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)
    finally:
        writer.close()


@pytest.mark.parametrize("loop", list(LOOPS))
def test_wildcard_listens_on_both_families(loop):
    LOOPS[loop](_wildcard_listens_on_both_families())


async def _wildcard_listens_on_both_families():
    if not socket.has_ipv6:  # pragma: no cover - every CI host has IPv6 loopback
        pytest.fail("no IPv6")
    http = HttpServer(Routes())
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    await http.listen(None, port)
    try:
        families = {sock.family for sock in http.sockets}
        assert families == {socket.AF_INET, socket.AF_INET6}
        for host in ("127.0.0.1", "::1"):
            answer = await exchange(port, b"GET /x HTTP/1.0\r\n\r\n", host=host)
            assert statuses(answer) == [404], host
    finally:
        await http.close()


def test_discard_limit_is_gos_max_post_handler_read_bytes():
    assert MAX_DISCARDED_BODY == 256 << 10


@on_each_loop
async def test_a_body_too_large_to_discard_is_answered_unread_and_the_answer_arrives(http: HttpServer, port: int) -> None:
    """Go's requestTooLarge: answered with Connection: close; the unread bytes must not reset the
    connection before the answer is read."""
    size = 4 * MAX_DISCARDED_BODY
    answer = await exchange(port, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size)
    assert statuses(answer) == [200] and b"Connection: close\r\n" in answer and answer.endswith(b"POST /echo {}")


# --- the connection caps -----------------------------------------------------------------------

GET = b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n"


def on_each_loop_capped(test):
    """``test(server, port, stats)`` against a server of at most 3 connections, 2 per client."""

    async def served() -> None:
        stats = ConnectionStats()
        http = HttpServer(Routes(), max_connections=3, max_connections_per_client=2, stats=stats)
        await http.listen("127.0.0.1", 0)
        try:
            await test(http, http.sockets[0].getsockname()[1], stats)
        finally:
            await http.close()

    def run(loop: str) -> None:
        LOOPS[loop](served())

    run.__name__ = test.__name__
    return pytest.mark.parametrize("loop", list(LOOPS))(run)


async def opened(http: HttpServer, port: int, source: str = "127.0.0.1"):
    """A connection from ``source``, once the server holds it (so that the order of arrival,
    which eviction goes by, is the order of the calls)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    ours = writer.get_extra_info("sockname")
    await until(lambda: any(c.client and c._peer == ours for c in http.connections), "the server to hold it")
    return reader, writer


async def closed_unanswered(reader: asyncio.StreamReader) -> bool:
    """Whether the server closed (or reset) the connection without a byte of answer."""
    try:
        return await asyncio.wait_for(reader.read(), 5) == b""
    except ConnectionResetError:
        return True


async def answered(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes = GET) -> list[int]:
    writer.write(data)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    return statuses(head)


@on_each_loop_capped
async def test_at_the_per_client_cap_the_clients_idle_longest_connection_makes_room(http, port, stats) -> None:
    """As TCP DNS (kubeport/lib/admission.py): the client's new connection is served."""
    first = await opened(http, port)
    second = await opened(http, port)
    assert await answered(*second) == [404]  # the second was used last: the first is idle longest
    third = await opened(http, port)
    assert await closed_unanswered(first[0])
    assert await answered(*third) == [404] and await answered(*second) == [404]
    assert (stats.evicted, stats.rejected) == (1, 0)
    for _, writer in (first, second, third):
        writer.close()


@on_each_loop_capped
async def test_at_the_per_client_cap_with_none_idle_the_new_connection_is_reset(http, port, stats) -> None:
    """Two requests begun (a head half sent) are not idle: the new connection goes, they stay."""
    begun = [await opened(http, port) for _ in range(2)]
    for _, writer in begun:
        writer.write(GET[:10])
    await until(lambda: all(c._reader.started for c in http.connections), "both heads to begin arriving")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await closed_unanswered(reader)
    writer.close()
    assert stats.rejected == 1 and stats.evicted == 0
    for reader, writer in begun:
        assert await answered(reader, writer, GET[10:]) == [404]
        writer.close()


@on_each_loop_capped
async def test_at_the_global_cap_the_connection_idle_longest_makes_room_whoever_holds_it(http, port, stats) -> None:
    oldest = await opened(http, port, "127.0.0.2")
    others = [await opened(http, port, "127.0.0.3"), await opened(http, port, "127.0.0.4")]
    newcomer = await opened(http, port, "127.0.0.5")
    assert await closed_unanswered(oldest[0])
    assert await answered(*newcomer) == [404]
    assert all([await answered(*other) == [404] for other in others])
    assert (stats.evicted, stats.rejected) == (1, 0)
    for _, writer in (oldest, newcomer, *others):
        writer.close()

"""The TCP relay's connection set-up on loopback: retries, ejection, timeouts, accept errors.

Runs on uvloop, as the daemon does. No sleeps: every wait is on a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket

import pytest

from kubeport.proxy.testing import DEADLINE, LoopbackRelay as Relay, on_uvloop, until


async def serve(handler) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


@on_uvloop
async def test_refused_endpoint__retried_on_another_and_ejected():
    async def backend(reader, writer):
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server, port = await serve(backend)
    relay = Relay([("127.0.0.1", port), ("127.0.0.2", _closed_port())], eject_after_failures=2)
    try:
        for _ in range(10):
            reader, writer = await asyncio.open_connection(*relay.address)
            assert await asyncio.wait_for(reader.read(), DEADLINE) == b"ok"
            writer.close()
        assert relay.stats.connect_failures == 2
        assert relay.stats.ejections == 1
        assert relay.stats.connect_giveups == 0
    finally:
        relay.close()
        server.close()


def _blackhole() -> tuple[socket.socket, list[socket.socket], int]:
    """A port whose SYNs are dropped: listen(0) with a full accept queue, never accepting."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(0)
    port = sock.getsockname()[1]
    fillers = []
    for _ in range(2):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    return sock, fillers, port


@on_uvloop
async def test_connect_timeout__client_reset_when_no_endpoint_answers():
    hole, fillers, port = _blackhole()
    relay = Relay([("127.0.0.1", port)], connect_timeout=0.3, connect_attempts=2)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        reader, writer = await asyncio.open_connection(*relay.address)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(), DEADLINE)
        assert loop.time() - started >= 0.29  # uvloop clock: ms resolution
        assert relay.stats.connect_failures == 1 and relay.stats.connect_giveups == 1
        writer.close()
    finally:
        relay.close()
        hole.close()
        for filler in fillers:
            filler.close()


@on_uvloop
async def test_connect_timeout__then_another_endpoint_serves():
    hole, fillers, hole_port = _blackhole()

    async def backend(reader, writer):
        writer.write(b"ok")
        writer.close()

    server, port = await serve(backend)
    relay = Relay([("127.0.0.1", hole_port), ("127.0.0.1", port)], connect_timeout=0.2)
    try:
        for _ in range(4):
            reader, writer = await asyncio.open_connection(*relay.address)
            assert await asyncio.wait_for(reader.read(), DEADLINE) == b"ok"
            writer.close()
        assert relay.stats.connect_giveups == 0
    finally:
        relay.close()
        server.close()
        hole.close()
        for filler in fillers:
            filler.close()


@on_uvloop
async def test_no_candidate__client_reset():
    relay = Relay([])
    try:
        with pytest.raises(ConnectionResetError):
            reader, writer = await asyncio.open_connection(*relay.address)
            await asyncio.wait_for(reader.read(), DEADLINE)
    finally:
        relay.close()



class FlakyAccept:
    """The listening socket, with accept() failing as the kernel may before it works again."""

    def __init__(self, sock: socket.socket, errors: list[int]) -> None:
        self._sock = sock
        self._errors = list(errors)

    def _accept(self):
        if self._errors:
            code = self._errors.pop(0)
            raise OSError(code, os.strerror(code))
        return self._sock._accept()

    def close(self) -> None:
        self._sock.close()


async def _ok_backend():
    async def backend(reader, writer):
        writer.write(b"ok")
        writer.close()

    return await serve(backend)


@pytest.mark.parametrize(
    ("code", "pauses"),
    [
        pytest.param(errno.EMFILE, 1, id="emfile__pause_then_retry"),
        pytest.param(errno.ENOBUFS, 1, id="enobufs__pause_then_retry"),
        pytest.param(errno.ECONNABORTED, 0, id="econnaborted__next_connection_at_once"),
    ],
)
@on_uvloop
async def test_transient_accept_errors_are_retried(code, pauses):
    server, port = await _ok_backend()
    relay = Relay([("127.0.0.1", port)], accept_pause=0.05)
    relay.listener.sock = FlakyAccept(relay.listener.sock, [code])
    try:
        reader, writer = await asyncio.open_connection(*relay.address)
        assert await asyncio.wait_for(reader.read(), DEADLINE) == b"ok"
        writer.close()
        assert relay.listener.accept_pauses == pauses
        assert relay.fatal == []
    finally:
        relay.close()
        server.close()


@on_uvloop
async def test_unexpected_accept_error_propagates_and_closes_the_listener():
    server, port = await _ok_backend()
    relay = Relay([("127.0.0.1", port)])
    relay.listener.sock = FlakyAccept(relay.listener.sock, [errno.EINVAL])
    try:
        client = socket.create_connection(relay.address)
        await until(lambda: relay.fatal, "the error to reach the owner")
        assert isinstance(relay.fatal[0], OSError) and relay.fatal[0].errno == errno.EINVAL
        assert relay.listener.sock is None
        client.close()
    finally:
        relay.close()
        server.close()


@on_uvloop
async def test_request_and_fin_sent_while_connecting_are_both_delivered():
    hole, fillers, hole_port = _blackhole()

    async def backend(reader, writer):
        writer.write(b"got " + await reader.read())  # answers after the client's FIN
        writer.close()

    server, port = await serve(backend)
    relay = Relay([("127.0.0.1", hole_port), ("127.0.0.1", port)], connect_timeout=0.2)
    try:
        for i in range(4):
            reader, writer = await asyncio.open_connection(*relay.address)
            writer.write(b"request %d" % i)
            writer.write_eof()  # before the first (black-holed) connect times out
            assert await asyncio.wait_for(reader.read(), DEADLINE) == b"got request %d" % i
            writer.close()
        assert relay.stats.connect_failures >= 1  # the scenario did happen
    finally:
        relay.close()
        server.close()
        hole.close()
        for filler in fillers:
            filler.close()

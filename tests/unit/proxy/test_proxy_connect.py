"""The TCP relay's connection set-up on loopback: retries, ejection, timeouts, accept errors.

Runs on uvloop, as the daemon does. No sleeps: every wait is on a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
from typing import Iterator

import pytest

from support.proxy_loopback import backend_server, on_uvloop, read_all, relay_in_front_of, relay_to
from support.wait import DEADLINE, until


async def answer_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"ok")
    writer.close()


def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


@on_uvloop
async def test_refused_endpoint__retried_on_another_and_ejected():
    async with (backend_server(answer_ok) as port,
                relay_in_front_of([("127.0.0.1", port), ("127.0.0.2", _closed_port())], eject_after_failures=2)
                as relay):
        for _ in range(10):
            assert await read_all(relay.address) == b"ok"
        assert relay.stats.connect_failures == 2
        assert relay.stats.ejections == 1
        assert relay.stats.connect_giveups == 0


@contextlib.contextmanager
def _blackhole() -> Iterator[int]:
    """A port whose SYNs are dropped: listen(0) with a full accept queue, never accepting."""
    with contextlib.ExitStack() as stack:
        sock = stack.enter_context(socket.socket())
        sock.bind(("127.0.0.1", 0))
        sock.listen(0)
        port = sock.getsockname()[1]
        for _ in range(2):
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
        yield port


@on_uvloop
async def test_connect_timeout__client_reset_when_no_endpoint_answers():
    with _blackhole() as port:
        async with relay_in_front_of([("127.0.0.1", port)], connect_timeout=0.3, connect_attempts=2) as relay:
            loop = asyncio.get_running_loop()
            started = loop.time()
            reader, writer = await asyncio.open_connection(*relay.address)
            with pytest.raises(ConnectionResetError):
                await asyncio.wait_for(reader.read(), DEADLINE)
            assert loop.time() - started >= 0.29  # uvloop clock: ms resolution
            assert relay.stats.connect_failures == 1 and relay.stats.connect_giveups == 1
            writer.close()


@contextlib.asynccontextmanager
async def _relay_past_a_blackhole(handler):
    """A relay whose first endpoint never answers a SYN and whose second runs ``handler``."""
    with _blackhole() as hole_port:
        async with (backend_server(handler) as port,
                    relay_in_front_of([("127.0.0.1", hole_port), ("127.0.0.1", port)], connect_timeout=0.2)
                    as relay):
            yield relay


@on_uvloop
async def test_connect_timeout__then_another_endpoint_serves():
    async with _relay_past_a_blackhole(answer_ok) as relay:
        for _ in range(4):
            assert await read_all(relay.address) == b"ok"
        assert relay.stats.connect_giveups == 0


@on_uvloop
async def test_no_candidate__client_reset():
    async with relay_in_front_of([]) as relay:
        with pytest.raises(ConnectionResetError):
            reader, writer = await asyncio.open_connection(*relay.address)
            await asyncio.wait_for(reader.read(), DEADLINE)


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
    async with relay_to(answer_ok, accept_pause=0.05) as relay:
        relay.listener.sock = FlakyAccept(relay.listener.sock, [code])
        assert await read_all(relay.address) == b"ok"
        assert relay.listener.accept_pauses == pauses
        assert relay.fatal == []


@on_uvloop
async def test_unexpected_accept_error_propagates_and_closes_the_listener():
    async with relay_to(answer_ok) as relay:
        relay.listener.sock = FlakyAccept(relay.listener.sock, [errno.EINVAL])
        client = socket.create_connection(relay.address)
        await until(lambda: relay.fatal, "the error to reach the owner")
        assert isinstance(relay.fatal[0], OSError) and relay.fatal[0].errno == errno.EINVAL
        assert relay.listener.sock is None
        client.close()


@on_uvloop
async def test_request_and_fin_sent_while_connecting_are_both_delivered():
    async def backend(reader, writer):
        writer.write(b"got " + await reader.read())  # answers after the client's FIN
        writer.close()

    async with _relay_past_a_blackhole(backend) as relay:
        for i in range(4):
            # The FIN goes out before the first (black-holed) connect times out.
            assert await read_all(relay.address, b"request %d" % i) == b"got request %d" % i
        assert relay.stats.connect_failures >= 1  # the scenario did happen

"""The TCP relay's data path on loopback with real sockets: bytes, half-close, resets, backpressure.

Runs on uvloop, as the daemon does. No sleeps: every wait is on a condition with a deadline.
The behaviours hold on both paths of bulk bytes (``tcp_relay``): spliced here, or relayed by
the kernel through the sockmap.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import socket

import pytest
from support.proxy_loopback import LoopbackRelay, on_uvloop, read_all, relay_to, reset_connection
from support.sockmap import RELAY_PATHS, relay_path
from support.wait import DEADLINE, until


def pattern(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


async def read_exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    return await asyncio.wait_for(reader.readexactly(n), DEADLINE)


async def send_and_digest(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> bytes:
    """Send ``data`` and a FIN while reading to the other side's FIN; the sha256 of what was read."""
    async def send():
        writer.write(data)
        await writer.drain()
        writer.write_eof()

    # At once, not one after the other: both sides sending first would fill every buffer and stall.
    sending = asyncio.create_task(send())
    digest = hashlib.sha256()
    while chunk := await asyncio.wait_for(reader.read(1 << 20), DEADLINE):
        digest.update(chunk)
    await sending
    writer.close()
    return digest.digest()


@RELAY_PATHS
@on_uvloop
async def test_bulk_both_directions_arrive_byte_exact(tcp_relay):
    size = 32 << 20
    up, down = pattern(size, 1), pattern(size, 2)

    async def backend(reader, writer):
        results.append(await send_and_digest(reader, writer, down))

    results: list[bytes] = []
    async with relay_to(backend, tcp_relay=relay_path(tcp_relay)) as relay:
        reader, writer = await asyncio.open_connection(*relay.address)
        got = await send_and_digest(reader, writer, up)
        await until(lambda: results, "the backend's digest")
        assert got == hashlib.sha256(down).digest()
        assert results == [hashlib.sha256(up).digest()]
        await until(lambda: relay.stats.active == 0, "the relay to close")
        assert (relay.stats.bytes_to_backend, relay.stats.bytes_to_client) == (size, size)


@RELAY_PATHS
@on_uvloop
async def test_half_close__client_fin_keeps_the_response_direction_open(tcp_relay):
    async def backend(reader, writer):
        request = await reader.read()  # until the client's FIN
        writer.write(b"got " + request)
        await writer.drain()
        writer.close()

    async with relay_to(backend, tcp_relay=relay_path(tcp_relay)) as relay:
        assert await read_all(relay.address, b"request") == b"got request"


@RELAY_PATHS
@on_uvloop
async def test_half_close__backend_fin_keeps_the_request_direction_open(tcp_relay):
    received = asyncio.get_running_loop().create_future()

    async def backend(reader, writer):
        writer.write(b"greeting")
        writer.write_eof()  # done talking, still listening
        received.set_result(await reader.read())
        writer.close()

    async with relay_to(backend, tcp_relay=relay_path(tcp_relay)) as relay:
        reader, writer = await asyncio.open_connection(*relay.address)
        assert await asyncio.wait_for(reader.read(), DEADLINE) == b"greeting"  # EOF seen
        writer.write(b"after your FIN")
        writer.write_eof()
        assert await asyncio.wait_for(received, DEADLINE) == b"after your FIN"
        writer.close()


@RELAY_PATHS
@on_uvloop
async def test_backend_reset_mid_stream__client_gets_a_reset(tcp_relay):
    async def backend(reader, writer):
        writer.write(b"partial")
        await writer.drain()
        await reader.readexactly(4)
        reset_connection(writer)

    async with relay_to(backend, tcp_relay=relay_path(tcp_relay)) as relay:
        reader, writer = await asyncio.open_connection(*relay.address)
        assert await read_exactly(reader, 7) == b"partial"
        writer.write(b"kill")
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(), DEADLINE)
        writer.close()
        await until(lambda: relay.stats.active == 0, "the relay to close")


@RELAY_PATHS
@on_uvloop
async def test_client_reset__backend_gets_a_reset(tcp_relay):
    outcome = asyncio.get_running_loop().create_future()

    async def backend(reader, writer):
        writer.write(b"hello")
        try:
            await reader.read()
            outcome.set_result("eof")
        except ConnectionResetError:
            outcome.set_result("reset")

    async with relay_to(backend, tcp_relay=relay_path(tcp_relay)) as relay:
        reader, writer = await asyncio.open_connection(*relay.address)
        assert await read_exactly(reader, 5) == b"hello"
        reset_connection(writer)
        assert await asyncio.wait_for(outcome, DEADLINE) == "reset"


@on_uvloop
async def test_backpressure__a_client_that_does_not_read_stalls_the_backend__splice():
    total = 64 << 20
    chunk = pattern(1 << 20, 3)

    async def backend(reader, writer):
        for _ in range(total >> 20):
            writer.write(chunk)
            await writer.drain()
        writer.close()

    async with relay_to(backend, tcp_relay="splice") as relay:
        client = socket.create_connection(relay.address)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        client.setblocking(False)
        await until(lambda: relay.ctx.conns, "the connection")
        (conn,) = relay.ctx.conns

        def backend_paused() -> bool:
            down = conn.down
            return down is not None and not down.writable and down.pending >= down.cap

        await until(backend_paused, "the proxy to stop reading the backend")
        # What the proxy took is one full pipe plus socket buffers, not the stream.
        assert relay.stats.bytes_to_client < 24 << 20
        loop = asyncio.get_running_loop()
        digest = hashlib.sha256()
        received = 0
        while received < total:
            data = await asyncio.wait_for(loop.sock_recv(client, 1 << 20), DEADLINE)
            assert data, "stream ended early"
            digest.update(data)
            received += len(data)
        assert digest.digest() == hashlib.sha256(chunk * (total >> 20)).digest()
        client.close()


@on_uvloop
async def test_small_exchanges_are_copied__bulk_ones_spliced_through_reused_pipes():
    async def backend(reader, writer):
        writer.write(await reader.read())
        writer.close()

    async with relay_to(backend, tcp_relay="splice") as relay:
        for size in (10, 1000, 60_000):  # fits the copy buffer
            await _echo_once(relay, pattern(size, size))
        assert relay.ctx.pipes.created == 0
        for i in range(10):
            await _echo_once(relay, pattern(1 << 20, i))
        assert relay.ctx.pipes.created == 2  # one per direction, reused ever since


async def _echo_once(relay: LoopbackRelay, payload: bytes) -> None:
    assert await read_all(relay.address, payload) == payload
    await until(lambda: relay.stats.active == 0, "the relay to close")


@RELAY_PATHS
@on_uvloop
async def test_nagle_is_off_on_both_relayed_sockets(tcp_relay):
    """Relayed bytes must not wait for ACKs of earlier ones (the client chose its own Nagle)."""
    hold = asyncio.Event()

    async def backend(reader, writer):
        writer.write(b"hi")
        await hold.wait()
        writer.close()

    async with relay_to(backend, tcp_relay=relay_path(tcp_relay)) as relay:
        try:
            reader, writer = await asyncio.open_connection(*relay.address)
            assert await read_exactly(reader, 2) == b"hi"
            (conn,) = relay.ctx.conns
            for sock in (conn.client, conn.backend):
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            writer.close()
        finally:
            hold.set()

"""A relayed connection closed at any step stays closed: every callback after the close finds
it so (a reset storm, an abort from elsewhere), never half torn down.

Runs on uvloop, as the daemon does, with real sockets on loopback. No sleeps.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct

import pytest

from kubeport.proxy.relay.poller import EPOLLERR, EPOLLHUP, EPOLLIN, EPOLLOUT, EPOLLRDHUP
from kubeport.proxy.relay.tcp import CLOSED, RELAYING

from support.proxy_loopback import on_uvloop, relay_to
from support.wait import until

_ALL_EDGES = EPOLLIN | EPOLLOUT | EPOLLERR | EPOLLHUP | EPOLLRDHUP


def connect_and_reset(address: tuple[str, int]) -> None:
    """A handshake, then an RST (SO_LINGER 0 close), without letting the loop run in between:
    the relay accepts a connection that is already reset and connects its backend for it."""
    sock = socket.create_connection(address)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


async def hold_open(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        await reader.read()
    except ConnectionError:
        pass
    writer.close()


@on_uvloop
async def test_reset_storm__clients_reset_before_the_backend_connect_completes__no_error(caplog):
    caplog.set_level(logging.WARNING)
    async with relay_to(hold_open) as relay:
        for storm in range(1, 5):  # rounds within the listen backlog: the connects never wait for an accept
            for _ in range(50):
                connect_and_reset(relay.address)
            expected = 50 * storm
            await until(lambda expected=expected: relay.stats.total == expected and not relay.ctx.conns,
                        "every reset connection closed")
        assert relay.stats.active == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def _relaying_conn(relay):
    _, writer = await asyncio.open_connection(*relay.address)
    await until(lambda: any(c.state is RELAYING for c in relay.ctx.conns), "the connection to relay")
    (conn,) = relay.ctx.conns
    return conn, writer


@pytest.mark.parametrize("callback", [
    pytest.param(lambda conn, up: conn._on_client(_ALL_EDGES), id="client_edge"),
    pytest.param(lambda conn, up: conn._on_backend(_ALL_EDGES), id="backend_edge"),
    pytest.param(lambda conn, up: conn.connect_timed_out(), id="connect_timeout"),
    pytest.param(lambda conn, up: conn.abort(), id="abort_again"),
    pytest.param(lambda conn, up: conn.watch_client_output(), id="output_wanted"),
    pytest.param(lambda conn, up: conn.direction_done(up), id="a_direction_ended"),
    pytest.param(lambda conn, up: up.pump(), id="a_direction_pumped"),
])
@on_uvloop
async def test_every_callback_after_a_close_finds_it_closed(callback, caplog):
    caplog.set_level(logging.WARNING)
    async with relay_to(hold_open) as relay:
        conn, writer = await _relaying_conn(relay)
        up = conn.up
        conn.abort()
        assert conn.state is CLOSED and not relay.ctx.conns and relay.stats.active == 0
        callback(conn, up)
        assert conn.state is CLOSED and conn.up is None and conn.down is None
        assert relay.stats.active == 0 and not relay.ctx.conns
        writer.close()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []

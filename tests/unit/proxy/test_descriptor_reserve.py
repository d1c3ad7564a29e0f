"""The proxy's descriptors stop short of RLIMIT_NOFILE: the rest of the daemon keeps a reserve."""

from __future__ import annotations

import _socket
import asyncio
import contextlib
import errno
import os
import resource
import socket
from collections.abc import Iterator

import pytest

from kubeport.proxy.relay.pipes import PipePool
from kubeport.proxy.relay.reserve import DescriptorReserve, ceilings, no_listener_problem, reserve_for
from support.proxy_loopback import backend_server, on_uvloop, open_file_limit, read_all, relay_in_front_of, relay_to
from support.wait import DEADLINE


async def answer_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"ok")
    writer.close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    "limit, reserve",
    [
        pytest.param(256, 32, id="small_limit_the_minimum"),
        pytest.param(1024, 64, id="a_sixteenth"),
        pytest.param(65536, 1024, id="capped"),
        pytest.param(1 << 20, 1024, id="capped_large"),
    ],
)
def test_reserve_for(limit, reserve):
    assert reserve_for(limit) == reserve


class FakeLimits:
    RLIMIT_NOFILE = resource.RLIMIT_NOFILE

    def __init__(self, soft: int, hard: int) -> None:
        self.limit = (soft, hard)
        self.calls: list[tuple[int, int]] = []

    def getrlimit(self, kind):
        return self.limit

    def setrlimit(self, kind, value):
        self.calls.append(value)
        self.limit = value


def test_the_callback_runs_under_the_ceiling_and_the_limit_comes_back_even_on_error():
    limits = FakeLimits(1024, 4096)
    reserve = DescriptorReserve(limits)
    seen = []

    def callback(value):
        seen.append(limits.limit)
        raise ValueError(value)

    with pytest.raises(ValueError):
        reserve.within(callback)(1)
    assert seen == [(960, 4096)] and limits.limit == (1024, 4096)


def test_too_low_a_limit_is_left_alone():
    limits = FakeLimits(40, 40)
    reserve = DescriptorReserve(limits)
    def callback():
        return None

    assert reserve.ceiling is None and reserve.within(callback) is callback


def test_under_the_ceiling_sockets_fail_with_emfile_and_after_it_they_open():
    """The real limit: at the ceiling the proxy's socket fails, the daemon's next one opens."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    held: list[int] = []
    try:
        reserve = DescriptorReserve()
        assert reserve.ceiling == 256 - 32
        while True:  # fill every descriptor below the ceiling
            try:
                held.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                break
            if held[-1] >= reserve.ceiling:
                break
        while held and held[-1] >= reserve.ceiling:
            os.close(held.pop())
        proxy_socket = reserve.within(lambda: socket.socket())
        with pytest.raises(OSError) as raised:
            proxy_socket()
        assert raised.value.errno == 24  # EMFILE
        with socket.socket() as status_socket:  # the daemon's own, from the reserve
            assert status_socket.fileno() >= reserve.ceiling
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_nested_call_keeps_the_ceiling_and_the_outermost_raises_the_limit_back():
    """An opener (a backend socket, a pipe) called inside an accepting callback adds no setrlimit."""
    limits = FakeLimits(1024, 4096)
    reserve = DescriptorReserve(limits)
    seen = []
    inner = reserve.within(lambda: seen.append(limits.limit))

    def outer():
        inner()
        seen.append(limits.limit)

    reserve.within(outer)()
    assert seen == [(960, 4096), (960, 4096)]
    assert limits.calls == [(960, 4096), (1024, 4096)] and not reserve.lowered
    inner()  # alone: it sets the ceiling itself
    assert limits.calls[2:] == [(960, 4096), (1024, 4096)]


@contextlib.contextmanager
def taken_below(ceiling: int) -> Iterator[None]:
    """Every free descriptor below ``ceiling`` taken."""
    held: list[int] = []
    try:
        while True:
            try:
                held.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                break
            if held[-1] >= ceiling:
                break
        while held and held[-1] >= ceiling:
            os.close(held.pop())
        yield
    finally:
        for fd in held:
            os.close(fd)


@contextlib.contextmanager
def at_the_ceiling() -> Iterator[DescriptorReserve]:
    """RLIMIT_NOFILE at 256 and every descriptor below the proxy's ceiling taken."""
    with open_file_limit(256):
        reserve = DescriptorReserve()
        with taken_below(reserve.ceiling):
            yield reserve


def test_at_the_ceiling_the_pool_makes_no_pipe_and_the_daemon_still_can():
    with at_the_ceiling() as reserve:
        pool = PipePool(pipe2=reserve.within(os.pipe2))
        with pytest.raises(OSError) as raised:
            pool.get()
        assert raised.value.errno == errno.EMFILE and (pool.refused, pool.created) == (1, 0)
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)  # the daemon's own, from the reserve
        assert min(read_fd, write_fd) >= reserve.ceiling
        os.close(read_fd)
        os.close(write_fd)


@on_uvloop
async def test_at_the_ceiling_a_bulk_direction_copies_instead_of_splicing():
    """Both sockets of the relayed connection are open; no pipe can be made: the bytes still
    arrive, copied."""
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):  # the client's close may come as a reset
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    payload = os.urandom(1 << 20)
    with open_file_limit(256):
        async with relay_to(echo) as relay:
            reader, writer = await asyncio.open_connection(*relay.address)
            try:
                writer.write(b"x")
                assert await asyncio.wait_for(reader.readexactly(1), DEADLINE) == b"x"
                with taken_below(relay.ctx.reserve.ceiling):
                    writer.write(payload)
                    assert await asyncio.wait_for(reader.readexactly(len(payload)), DEADLINE) == payload
                pipes = relay.ctx.pipes
                assert pipes.refused >= 1 and pipes.created == 0
            finally:
                writer.close()


@on_uvloop
async def test_every_backend_socket_a_retried_connect_too_is_made_under_the_ceiling():
    """A refused connect is retried from its own edge, outside any accepting callback: the
    retry's socket sets the ceiling itself (one setrlimit pair per backend socket made)."""
    limits = FakeLimits(*resource.getrlimit(resource.RLIMIT_NOFILE))
    reserve = DescriptorReserve(limits)
    async with (backend_server(answer_ok) as port,
                relay_in_front_of([("127.0.0.1", port), ("127.0.0.2", closed_port())], reserve=reserve,
                                  eject_after_failures=100) as relay):
        while relay.stats.connect_failures < 2:
            assert await read_all(relay.address) == b"ok"
        sockets = relay.stats.total + relay.stats.connect_failures
        assert limits.calls == [(reserve.ceiling, limits.limit[1]), limits.limit] * sockets


def test_at_the_ceiling_no_backend_socket_is_made():
    with at_the_ceiling() as reserve:
        with pytest.raises(OSError) as raised:
            reserve.within(_socket.socket)(socket.AF_INET, socket.SOCK_STREAM, 0)
        assert raised.value.errno == errno.EMFILE


# --- listeners stop one reserve short of the connections' ceiling ------------------------------


@pytest.mark.parametrize(
    "limit, expected",
    [
        pytest.param(40, None, id="too_low_to_split"),
        pytest.param(90, (58, 58), id="no_room_for_a_second_reserve_listeners_share_the_ceiling"),
        pytest.param(256, (224, 192), id="minimum_reserve"),
        pytest.param(1200, (1125, 1050), id="a_sixteenth"),
        pytest.param(20000, (18976, 17952), id="capped"),
        pytest.param(1 << 20, ((1 << 20) - 1024, (1 << 20) - 2048), id="capped_large"),
    ],
)
def test_ceilings(limit, expected):
    assert ceilings(limit) == expected


@pytest.mark.parametrize(
    "first, count, expected",
    [
        pytest.param([], 0, None, id="none_short"),
        pytest.param(["demo/a:http/TCP on 10.96.0.1:80/TCP"], 1,
                     "1 frontend has no listener (descriptor limit 1200 reached): demo/a:http/TCP on 10.96.0.1:80/TCP",
                     id="one"),
        pytest.param(["a", "b", "c"], 3, "3 frontends have no listener (descriptor limit 1200 reached): a, b, c",
                     id="all_named"),
        pytest.param(["a", "b", "c"], 3812,
                     "3,812 frontends have no listener (descriptor limit 1200 reached): a, b, c and 3,809 more",
                     id="the_rest_counted"),
        pytest.param(["a", "b", "c", "d"], 4,
                     "4 frontends have no listener (descriptor limit 1200 reached): a, b, c and 1 more",
                     id="only_the_first_three_named"),
    ],
)
def test_no_listener_problem(first, count, expected):
    assert no_listener_problem(first, count, 1200) == expected


@pytest.mark.parametrize(
    "lowest_free, fits",
    [
        pytest.param(1049, True, id="below_the_listener_ceiling"),
        pytest.param(1050, False, id="at_it"),
        pytest.param(1 << 62, False, id="none_free"),
    ],
)
def test_a_listener_fits_below_the_listener_ceiling(lowest_free, fits):
    limits = FakeLimits(1200, 4096)
    reserve = DescriptorReserve(limits, lowest_free=lambda: lowest_free)
    assert reserve.listener_ceiling == 1050 and reserve.listener_fits() is fits
    assert limits.calls == []  # looked at, never set: threads opening files meanwhile are not refused


def test_at_the_listener_ceiling_no_listener_fits_and_connections_still_have_descriptors():
    with open_file_limit(256):
        reserve = DescriptorReserve()
        assert reserve.listener_fits()
        with taken_below(reserve.listener_ceiling):
            assert not reserve.listener_fits()
            with reserve.within(socket.socket)() as relayed:  # what the listeners left to connections
                assert reserve.listener_ceiling <= relayed.fileno() < reserve.ceiling

"""A health-check node port that failed to open (busy) is retried with backoff, not only at the next
snapshot: kube-proxy retries it on every sync (syncPeriod 30 s). Real sockets on loopback, a fake sleep."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import aiohttp
import pytest
from support.wait import until

from kubeport.endpoints.types import ServiceName
from kubeport.proxy.healthcheck.service_health import RETRY_MAX, HealthCheckServers, next_retry_delay

WEB = ServiceName("default", "web")


@pytest.mark.parametrize(
    "previous, delay",
    [
        pytest.param(None, 1.0, id="first_retry_after_1s"),
        pytest.param(1.0, 2.0, id="doubles"),
        pytest.param(8.0, 16.0, id="doubles_again"),
        pytest.param(16.0, RETRY_MAX, id="capped_at_kube_proxy_sync_period"),
        pytest.param(RETRY_MAX, RETRY_MAX, id="stays_at_the_cap"),
    ],
)
def test_next_retry_delay(previous, delay):
    assert next_retry_delay(previous) == delay


def busy_port() -> socket.socket:
    """A listener without SO_REUSEPORT on a free loopback port: the servers' bind fails."""
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    return blocker


class FakeSleep:
    """Records the delays asked for; frees the blocker after ``free_after`` of them."""

    def __init__(self, blocker: socket.socket | None = None, free_after: int = 0) -> None:
        self.delays: list[float] = []
        self._blocker = blocker
        self._free_after = free_after

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        if self._blocker is not None and len(self.delays) == self._free_after:
            self._blocker.close()
        await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def retrying(servers: HealthCheckServers, sleep: FakeSleep):
    task = asyncio.create_task(servers.keep_retrying(sleep))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
async def servers():
    hcs = HealthCheckServers(lambda: True)
    yield hcs
    await hcs.close()


async def probe(port: int) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/") as response:
        return response.status


async def test_busy_port_opens_once_freed_without_a_new_snapshot(servers):
    blocker = busy_port()
    port = blocker.getsockname()[1]
    failures = await servers.sync({port: (WEB, 1)}, ["127.0.0.1"])
    assert list(failures) == [port] and servers.failures == failures
    sleep = FakeSleep(blocker, free_after=3)
    async with retrying(servers, sleep):
        await until(lambda: port in servers.ports, "the freed port open", 5)
    assert sleep.delays == [1.0, 2.0, 4.0]
    assert servers.failures == {}
    assert await probe(port) == 200


async def test_backoff_starts_over_after_success(servers):
    first = busy_port()
    first_port = first.getsockname()[1]
    sleep = FakeSleep(first, free_after=2)
    async with retrying(servers, sleep):
        await servers.sync({first_port: (WEB, 1)}, ["127.0.0.1"])
        await until(lambda: not servers.failures, "the first port open", 5)
        second = busy_port()
        try:
            port = second.getsockname()[1]
            await servers.sync({first_port: (WEB, 1), port: (ServiceName("default", "api"), 1)}, ["127.0.0.1"])
            assert list(servers.failures) == [port]
            await until(lambda: len(sleep.delays) >= 4, "the retries to start over", 5)
        finally:
            second.close()
    assert sleep.delays[:4] == [1.0, 2.0, 1.0, 2.0]


async def test_nothing_failing_nothing_retried(servers):
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        port = probe_socket.getsockname()[1]
    sleep = FakeSleep()
    async with retrying(servers, sleep):
        assert await servers.sync({port: (WEB, 1)}, ["127.0.0.1"]) == {}
        for _ in range(20):
            await asyncio.sleep(0)
    assert sleep.delays == []


async def test_a_port_no_longer_wanted_is_not_retried(servers):
    blocker = busy_port()
    port = blocker.getsockname()[1]
    try:
        await servers.sync({port: (WEB, 1)}, ["127.0.0.1"])
        await servers.sync({}, ["127.0.0.1"])
        assert servers.failures == {}
    finally:
        blocker.close()
    assert await servers.retry_failed() == {}
    assert servers.ports == frozenset()


async def test_close_forgets_failures(servers):
    blocker = busy_port()
    try:
        await servers.sync({blocker.getsockname()[1]: (WEB, 1)}, ["127.0.0.1"])
    finally:
        blocker.close()
    await servers.close()
    assert servers.failures == {}

"""An empty bind address disables that HTTP server (kube-proxy's --healthz-bind-address /
--metrics-bind-address "Set empty to disable"); start and stop work with either or both off."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from kubeport.endpoints.types import Snapshot
from kubeport.proxy.healthcheck.proxier_health import HealthResponse
from kubeport.status import StatusServer


class View:
    def snapshot(self) -> Snapshot:
        return Snapshot(generation=1)

    def pending(self) -> list[str]:
        return []

    def problems(self) -> list[str]:
        return []

    def status(self) -> dict:
        return {}

    def proxy_health(self, path: str) -> HealthResponse:
        return HealthResponse(200, b"{}", ())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def answers(port: int, path: str) -> int | None:
    """The HTTP status of GET path on loopback, None when the port refuses."""
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}{path}") as response:
            return response.status
    except aiohttp.ClientConnectorError:
        return None


@pytest.mark.parametrize(
    "healthz_on, metrics_on",
    [
        pytest.param(True, False, id="metrics_disabled"),
        pytest.param(False, True, id="healthz_disabled"),
        pytest.param(False, False, id="both_disabled"),
    ],
)
async def test_empty_bind_address_serves_nothing_there(healthz_on, metrics_on):
    healthz, metrics = free_port(), free_port()
    server = StatusServer(View(), healthz_bind=f"127.0.0.1:{healthz}" if healthz_on else "",
                          metrics_bind=f"127.0.0.1:{metrics}" if metrics_on else "", registry=CollectorRegistry())
    await server.start()
    try:
        assert await answers(healthz, "/readyz") == (200 if healthz_on else None)
        assert await answers(metrics, "/metrics") == (200 if metrics_on else None)
    finally:
        await asyncio.wait_for(server.stop(), 5)

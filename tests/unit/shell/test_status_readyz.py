"""/readyz per-request work: the problem list is cached (O(1) per poll at any cluster size)."""

from __future__ import annotations

import json
import socket

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from kubeport.endpoints.types import Snapshot
from kubeport.proxy.healthcheck.proxier_health import HealthResponse
from kubeport.status import STATUS_SOCKET, StatusServer


class FakeView:
    def __init__(self) -> None:
        self.generation = 1
        self.pending_list: list[str] = []
        self.problem_list: list[str] = []
        self.problem_calls = 0

    def snapshot(self) -> Snapshot:
        return Snapshot(generation=self.generation)

    def pending(self) -> list[str]:
        return list(self.pending_list)

    def problems(self) -> list[str]:
        self.problem_calls += 1
        return list(self.problem_list)

    def proxy_health(self, path: str) -> HealthResponse:  # pragma: no cover - not exercised here
        raise NotImplementedError


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
async def served(tmp_path):
    """/readyz of the status socket, which carries the problem lines."""
    view, clock = FakeView(), FakeClock()
    path = tmp_path / STATUS_SOCKET
    server = StatusServer(view, healthz_bind=f"127.0.0.1:{free_port()}", metrics_bind=f"127.0.0.1:{free_port()}",
                          registry=CollectorRegistry(), problems_ttl=1.0, clock=clock, status_socket=path)
    await server.start()
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(path))) as session:

        async def readyz() -> tuple[int, dict]:
            async with session.get("http://kubeport/readyz") as response:
                return response.status, json.loads(await response.text())

        try:
            yield view, clock, readyz
        finally:
            await server.stop()


async def test_readyz_polls_reuse_the_problem_list__o1_per_request(served):
    view, clock, readyz = served
    view.problem_list = ["a.yaml: broken"]
    for _ in range(5):
        status, body = await readyz()
        assert (status, body["problems"]) == (200, ["a.yaml: broken"])
    assert view.problem_calls == 1


async def test_readyz_problems_refresh_after_the_ttl(served):
    view, clock, readyz = served
    await readyz()
    view.problem_list = ["a.yaml: broken"]  # a broken file: no new snapshot
    clock.now += 0.5
    assert (await readyz())[1]["problems"] == []
    clock.now += 0.6
    assert (await readyz())[1]["problems"] == ["a.yaml: broken"]


@pytest.mark.parametrize("change", ["generation", "pending"])
async def test_readyz_problems_refresh_at_once_when_the_state_moves(served, change):
    view, clock, readyz = served
    view.pending_list = ["proxy: first snapshot not applied"]
    assert (await readyz())[0] == 503
    view.problem_list = ["proxy: 10.96.0.1:80/TCP conflicts"]
    if change == "generation":
        view.generation += 1
    else:
        view.pending_list = []
    status, body = await readyz()
    assert body["problems"] == ["proxy: 10.96.0.1:80/TCP conflicts"]
    assert status == (503 if change == "generation" else 200)


async def test_wildcard_healthz_address_serves_both_families__go_listen_on_0_0_0_0():
    port = free_port()
    server = StatusServer(FakeView(), healthz_bind=f"0.0.0.0:{port}", metrics_bind=f"127.0.0.1:{free_port()}",
                          registry=CollectorRegistry())
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            for host in ("127.0.0.1", "[::1]"):
                async with session.get(f"http://{host}:{port}/readyz") as response:
                    assert response.status == 200, host
    finally:
        await server.stop()


async def test_healthz_and_livez_answer_any_method__as_kube_proxy():
    class View(FakeView):
        def proxy_health(self, path):
            return HealthResponse(200, b"{}")

    port = free_port()
    server = StatusServer(View(), healthz_bind=f"127.0.0.1:{port}", metrics_bind=f"127.0.0.1:{free_port()}",
                          registry=CollectorRegistry())
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            for method in ("GET", "HEAD", "POST", "OPTIONS"):
                for path in ("/healthz", "/livez"):
                    async with session.request(method, f"http://127.0.0.1:{port}{path}") as response:
                        assert response.status == 200, (method, path)
    finally:
        await server.stop()


@pytest.mark.parametrize("host", ["127.0.0.1", "lan"])
async def test_readyz_over_tcp_holds_no_problem_lines__loopback_included(host):
    """Problem lines quote values from manifests and objects: over TCP (any peer, a local user
    on loopback too) /readyz tells only whether the daemon is ready and what it waits for."""
    if host == "lan":
        host = next((a for a in _host_addresses() if not a.startswith("127.")), None)
        if host is None:
            pytest.skip("no non-loopback IPv4 address on this host")
    view = FakeView()
    view.problem_list = ['a.yaml: Service "web" is invalid: spec.ports[0].name: Invalid value: "SECRET-VALUE"']
    view.pending_list = ["source: first list not complete"]
    healthz, metrics = free_port(), free_port()
    server = StatusServer(view, healthz_bind=f"0.0.0.0:{healthz}", metrics_bind=f"0.0.0.0:{metrics}",
                          registry=CollectorRegistry())
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            answers = []
            for port in (healthz, metrics):
                async with session.get(f"http://{host}:{port}/readyz") as response:
                    answers.append((response.status, await response.text()))
            async with session.get(f"http://{host}:{metrics}/api/v1/services") as response:
                listing = response.status
    finally:
        await server.stop()
    for status, text in answers:
        assert status == 503 and json.loads(text) == {"ready": False, "pending": ["source: first list not complete"]}
    assert listing == 404  # the metrics port serves no objects


def _host_addresses() -> list[str]:
    import subprocess

    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines() if " inet " in line]

"""Listeners past the open-file limit: the frontends that fit are served, the rest are one
problem line, tried again when descriptors free up (an apply, or the proxier's timer).

A real RLIMIT_NOFILE of 256 (reserve.py: the proxy's ceiling 224, listeners' 192); VIPs are
127.0.x.y, local without adding addresses.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

import pytest
from support.proxy_loopback import apply_states, greeting, on_uvloop, open_file_limit, running_proxier, web
from support.wait import until

from kubeport.proxy import proxier as proxier_module

LIMIT = 256
SERVICES = 250


@contextlib.asynccontextmanager
async def many_services(**running) -> AsyncIterator[tuple]:
    """A proxier under the limit, its backend, and SERVICES services on their own VIPs (not applied)."""
    with open_file_limit(LIMIT):
        async with running_proxier(**running) as (proxier, _, _, backends):
            backend = await backends.tcp("a")
            yield proxier, [web(backend, name=f"svc-{i:03}", vip=vip(i)) for i in range(SERVICES)]


def vip(index: int) -> str:
    return f"127.0.{1 + index // 200}.{1 + index % 200}"


def shortage(problems: list[str]) -> str:
    [line] = [problem for problem in problems if "no listener" in problem]
    return line


@pytest.fixture
def quick_retry(monkeypatch):
    monkeypatch.setattr(proxier_module, "LISTENER_RETRY_S", 0.05)


@on_uvloop
async def test_the_first_services_are_served_the_rest_named_once_and_served_when_listeners_close(quick_retry):
    async with many_services() as (proxier, states):
            first = await apply_states(proxier, states)
            served = len(proxier.listening)
            assert 0 < served < SERVICES
            short = SERVICES - served
            assert shortage(proxier.problems) == (
                f"{short} frontends have no listener (descriptor limit {LIMIT} reached): "
                f"default/svc-{served:03}/TCP on {vip(served)}:80/TCP, "
                f"default/svc-{served + 1:03}/TCP on {vip(served + 1)}:80/TCP, "
                f"default/svc-{served + 2:03}/TCP on {vip(served + 2)}:80/TCP and {short - 3} more")
            # What fits is served, and the listeners left descriptors to relay with.
            assert await greeting(vip(0)) == "a" and await greeting(vip(served - 1)) == "a"

            # Ten services gone: their descriptors go to the first ten short of one.
            await apply_states(proxier, states[10:], previous=first)
            assert len(proxier.listening) == served
            assert shortage(proxier.problems).startswith(f"{short - 10} frontends have no listener")
            assert await greeting(vip(served + 9)) == "a"


@on_uvloop
async def test_descriptors_freed_without_a_change_are_taken_by_the_timer(quick_retry):
    async with many_services() as (proxier, states):
            held = [os.open("/dev/null", os.O_RDONLY) for _ in range(20)]  # another user of descriptors
            try:
                await apply_states(proxier, states)
            finally:
                for fd in held:
                    os.close(fd)
            served = len(proxier.listening)
            await until(lambda: len(proxier.listening) == served + 20, "the timer to open 20 more listeners")
            assert shortage(proxier.problems).startswith(f"{SERVICES - served - 20} frontends have no listener")


@on_uvloop
async def test_every_frontend_served_again_leaves_no_problem(quick_retry):
    async with many_services() as (proxier, states):
            first = await apply_states(proxier, states)
            served = len(proxier.listening)
            await apply_states(proxier, states[:served - 5], previous=first)
            assert len(proxier.listening) == served - 5
            assert not [problem for problem in proxier.problems if "no listener" in problem]

"""systemd notifications over a real NOTIFY_SOCKET datagram socket: the address forms, the
watchdog's period, the order of READY/STATUS/STOPPING, and no pings from a blocked loop."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from kubeport.lib.sdnotify import Notifier, socket_address, watchdog_period
from kubeport.systemd import SystemdNotifications


@pytest.fixture
def listener(tmp_path: Path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(5)
    yield sock, str(tmp_path / "notify")
    sock.close()


def received(sock: socket.socket, count: int) -> list[str]:
    return [sock.recv(4096).decode() for _ in range(count)]


@pytest.mark.parametrize(
    "value, address",
    [("/run/systemd/notify", "/run/systemd/notify"), ("@kubeport-test", "\0kubeport-test"), ("", None),
     ("vsock:2:1234", None), ("relative/path", None)],
)
def test_socket_address_forms(value, address):
    assert socket_address(value) == address


@pytest.mark.parametrize(
    "environ, period",
    [
        pytest.param({"WATCHDOG_USEC": "30000000"}, 15.0, id="half_of_watchdog_sec"),
        pytest.param({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "42"}, 15.0, id="this_process"),
        pytest.param({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "43"}, None, id="another_process"),
        pytest.param({"WATCHDOG_USEC": "0"}, None, id="zero_is_off"),
        pytest.param({"WATCHDOG_USEC": "soon"}, None, id="garbage_is_off"),
        pytest.param({}, None, id="unset"),
    ],
)
def test_watchdog_period(environ, period):
    assert watchdog_period(environ, 42) == period


def test_from_environment_reads_then_unsets_the_variables(listener):
    _, path = listener
    environ = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid()), "HOME": "/"}
    notifier = Notifier.from_environment(environ)
    assert (notifier.address, notifier.watchdog) == (path, 1.0)
    assert environ == {"HOME": "/"}, "relay workers must not speak for the service"


def test_without_notify_socket_nothing_is_sent():
    notifier = Notifier.from_environment({})
    assert not notifier.enabled and notifier.notify("READY=1") is False and notifier.watchdog is None


def test_an_abstract_socket_name(tmp_path):
    name = f"kubeport-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        assert Notifier(socket_address("@" + name)).notify("READY=1", "STATUS=up")
        assert sock.recv(4096) == b"READY=1\nSTATUS=up"


def test_a_missing_socket_is_counted_never_raised(tmp_path):
    notifier = Notifier(str(tmp_path / "nobody"))
    assert notifier.notify("READY=1") is False and notifier.failed == 1


def test_messages_in_order_ready_once_status_on_change_then_stopping(listener):
    sock, path = listener
    systemd = SystemdNotifications(Notifier(path), "node-a")
    systemd.readiness(["source: first list not complete", "proxy: first snapshot not applied"])
    systemd.readiness(["source: first list not complete", "proxy: first snapshot not applied"])  # unchanged
    systemd.readiness(["proxy: first snapshot not applied"])
    systemd.readiness([])
    systemd.readiness([])
    systemd.stopping("stopping")
    systemd.readiness(["shutting down"])  # after STOPPING=1: nothing more
    assert received(sock, 4) == [
        "STATUS=pending: source: first list not complete; proxy: first snapshot not applied",
        "STATUS=pending: proxy: first snapshot not applied",
        "READY=1\nSTATUS=serving node node-a",
        "STOPPING=1\nSTATUS=stopping",
    ]
    sock.settimeout(0.05)
    with pytest.raises(TimeoutError):
        sock.recv(4096)


def test_a_blocked_loop_sends_no_watchdog_pings(listener):
    sock, path = listener
    systemd = SystemdNotifications(Notifier(path, watchdog=0.02), "node-a")
    arrivals: list[float] = []
    done = threading.Event()

    def receive() -> None:
        sock.settimeout(0.1)
        while not done.is_set():
            try:
                assert sock.recv(64) == b"WATCHDOG=1"
            except TimeoutError:
                continue
            arrivals.append(time.monotonic())

    receiver = threading.Thread(target=receive)
    receiver.start()

    async def scenario() -> tuple[float, float]:
        pinging = asyncio.create_task(systemd.keep_watchdog(lambda now: True))
        while len(arrivals) < 5:
            await asyncio.sleep(0.01)
        blocked_at = time.monotonic()
        time.sleep(0.5)  # the loop stuck in a callback: the behaviour under test
        unblocked_at = time.monotonic()
        while not arrivals or arrivals[-1] < unblocked_at:
            await asyncio.sleep(0.01)
        pinging.cancel()
        return blocked_at, unblocked_at

    try:
        blocked_at, unblocked_at = asyncio.run(asyncio.wait_for(scenario(), 10))
    finally:
        done.set()
        receiver.join()
    # At most one ping already in flight as the loop blocked; none while it stayed blocked.
    assert [t for t in arrivals if blocked_at + 0.05 < t < unblocked_at] == []
    assert any(t >= unblocked_at for t in arrivals), "pings resume once the loop runs"


def test_no_pings_while_not_live(listener):
    sock, path = listener
    systemd = SystemdNotifications(Notifier(path, watchdog=0.01), "node-a")
    checks = []

    async def scenario() -> None:
        pinging = asyncio.create_task(systemd.keep_watchdog(lambda now: checks.append(now) or False))
        while len(checks) < 5:
            await asyncio.sleep(0.01)
        pinging.cancel()

    asyncio.run(scenario())
    sock.settimeout(0.05)
    with pytest.raises(TimeoutError):
        sock.recv(64)

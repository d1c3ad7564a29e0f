"""kubeport as a Type=notify systemd service: the daemon's messages on a NOTIFY_SOCKET bound
by the test, in order, and the watchdog pings stopping while the process cannot run."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from support.netns import KubeportDaemon, until_sync
from support.netns.manifests import DAEMON_ARGS
from support.netns.operating import manifests  # noqa: F401  (a fixture)

pytestmark = pytest.mark.integration


def test_ready_status_watchdog_and_stopping_in_order(topology, pods, manifests, tmp_path, monkeypatch):
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.setenv("WATCHDOG_USEC", "400000")  # WatchdogSec=400ms: a ping every 200 ms
    daemon = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS)
    messages: list[str] = []

    def receive(timeout: float) -> str | None:
        sock.settimeout(timeout)
        try:
            message = sock.recv(4096).decode()
        except TimeoutError:
            return None
        messages.append(message)
        return message

    deadline = time.monotonic() + 20
    while not any(m.startswith("READY=1") for m in messages):
        assert time.monotonic() < deadline and daemon.running, (messages, daemon.log_tail())
        receive(1.0)
    assert daemon.readyz().status == 200, "READY=1 only once /readyz answers 200"
    until_sync(lambda: receive(1.0) == "WATCHDOG=1", "a watchdog ping", 5)

    os.kill(daemon.proc.pid, signal.SIGSTOP)
    try:
        stopped_at = time.monotonic()
        while receive(0.05) is not None:  # sent before the stop took effect
            assert time.monotonic() - stopped_at < 1, "pings keep coming from a stopped process"
        assert receive(1.0) is None, "no watchdog ping while the loop cannot run"
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)
    until_sync(lambda: receive(1.0) == "WATCHDOG=1", "pings resume", 5)

    daemon.proc.send_signal(signal.SIGTERM)
    until_sync(lambda: (receive(1.0) or "").startswith("STOPPING=1"), "STOPPING=1", 10)
    assert daemon.proc.wait(timeout=15) == 0
    sock.close()

    events = [m for m in messages if m != "WATCHDOG=1"]
    ready = next(i for i, m in enumerate(events) if m.startswith("READY=1"))
    assert ready >= 1 and all(m.startswith("STATUS=pending: ") for m in events[:ready]), events
    assert events[ready] == "READY=1\nSTATUS=serving node node-a"
    assert events[-1] == "STOPPING=1\nSTATUS=stopping", events
    assert "STATUS=pending: source: first list not complete" in events[0]

"""systemd notifications over a real NOTIFY_SOCKET datagram socket: the address forms, the
watchdog's period, the order of READY/STATUS/STOPPING, no pings from a blocked loop, and the
file descriptor store (FDSTORE=1 with the descriptors attached; $LISTEN_FDS at the next start,
as sd_listen_fds(3) reads it)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kubeport.lib.sdnotify import Notifier, fd_name, fd_store_size, label_of, socket_address, watchdog_period
from kubeport.survival.sockethold import receive_with_fds
from kubeport.survival.supervisor import Supervisor
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


def received_with_fds(sock: socket.socket) -> tuple[str, list[int]]:
    data, fds = receive_with_fds(sock, 4096)
    return data.decode(), fds


@pytest.mark.parametrize("label", ["tcp/0/10.96.0.1/80", "udp/fd00::10/53", "worker-2/tcp/1/[fd00::1]/8080",
                                   "dns-udp/10.96.0.10/53"])
def test_an_fdname_is_valid_for_systemd_and_gives_the_label_back(label):
    """fdname_is_valid (src/basic/fd-util.c): printable ASCII, no ':', at most 255."""
    name = fd_name(label)
    assert ":" not in name and name.isprintable() and len(name) <= 255
    assert label_of(name) == label


@pytest.mark.parametrize("environ, size", [({}, 0), ({"FDSTORE": "65536"}, 65536), ({"FDSTORE": "0"}, 0),
                                           ({"FDSTORE": "many"}, 0)])
def test_the_store_is_used_only_when_the_unit_says_it_has_one(environ, size):
    assert fd_store_size(environ) == size


def test_held_sockets_go_to_the_store_and_leave_it_when_released(listener):
    sock, path = listener
    supervisor = Supervisor([])
    supervisor.store = Notifier(path)
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    supervisor._hold("tcp/0/10.96.0.1/80", socket.socket(fileno=os.dup(held.fileno())))
    message, fds = received_with_fds(sock)
    assert message == "FDSTORE=1\nFDNAME=tcp/0/10.96.0.1/80" and len(fds) == 1
    # The same kernel socket as the one held: what systemd keeps is the listener itself.
    stored = socket.socket(fileno=fds[0])
    assert stored.getsockname() == held.getsockname()
    # Held again (the next daemon adopted it and kept it): the old entry goes first.
    supervisor._hold("tcp/0/10.96.0.1/80", socket.socket(fileno=os.dup(held.fileno())))
    assert received_with_fds(sock) == ("FDSTOREREMOVE=1\nFDNAME=tcp/0/10.96.0.1/80", [])
    message, fds = received_with_fds(sock)
    assert message.startswith("FDSTORE=1") and len(fds) == 1
    os.close(fds[0])
    supervisor._release("tcp/0/10.96.0.1/80")
    assert received_with_fds(sock) == ("FDSTOREREMOVE=1\nFDNAME=tcp/0/10.96.0.1/80", [])
    for s in (stored, held):
        s.close()


LISTEN_CHILD = """
import json, os, socket, sys
from kubeport.lib.sdnotify import listen_fds
first, second = (os.dup(int(fd)) for fd in sys.argv[1:3])  # above 4 before 3 and 4 are taken
os.dup2(first, 3)
os.dup2(second, 4)
os.environ.update(LISTEN_PID=sys.argv[3] or str(os.getpid()), LISTEN_FDS="2",
                  LISTEN_FDNAMES="tcp/0/127.0.0.1/80:udp/127.0.0.1/53")
passed = listen_fds(os.environ, os.getpid())
inheritable = [os.get_inheritable(fd) for _, fd in passed]
kinds = [socket.socket(fileno=fd).type == socket.SOCK_STREAM for _, fd in passed]
print(json.dumps({"passed": [[name, fd, kind, inherit] for (name, fd), kind, inherit in zip(passed, kinds, inheritable)],
                  "left": sorted(k for k in os.environ if k.startswith("LISTEN_"))}))
"""


@pytest.mark.parametrize("owner", ["", "1"])
def test_listen_fds_as_systemd_passes_them__sd_listen_fds(owner):
    """Descriptors from 3 on with their names, meant for $LISTEN_PID only (another pid: a
    parent's, inherited by mistake, is not taken), the variables unset either way."""
    tcp, udp = socket.socket(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    done = subprocess.run([sys.executable, "-c", LISTEN_CHILD, str(tcp.fileno()), str(udp.fileno()), owner],
                          pass_fds=(tcp.fileno(), udp.fileno()), capture_output=True, text=True, timeout=30,
                          cwd="/")
    tcp.close()
    udp.close()
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["left"] == []
    if owner:
        assert result["passed"] == []
    else:
        assert result["passed"] == [["tcp/0/127.0.0.1/80", 3, True, False], ["udp/127.0.0.1/53", 4, False, False]]

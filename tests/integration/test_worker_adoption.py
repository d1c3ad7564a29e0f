"""Established connections outlive a crash of the control plane (`--workers 2`): the daemon is
killed with SIGKILL under a connection loop and 50 open streams, its supervisor
(`--hold-sockets`) starts it again at once, and the new daemon adopts the relay workers the
killed one left: every stream goes on echoing both ways, no connection is refused, and
`kubeport get status` says the workers were adopted. Driven in network namespaces."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support.netns import POD_ECHO_PORT, CommandFailed, KubeportDaemon, kubeport, spawn_in, until_sync
from support.netns.manifests import DAEMON_ARGS, endpoint_slice, service, write
from support.netns.operating import CLIENT_LOOP, ECHO_IP, WEB_IP, manifests  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration

STREAM_IP = "10.96.0.52"
STREAMS = Path(__file__).resolve().parents[1] / "support" / "netns" / "streams.py"
OPEN_STREAMS = 50


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def is_worker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"kubeport.relayworker" in cmdline.read()
    except OSError:
        return False


def reader(path: Path, empty: dict):
    def read() -> dict:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return empty
    return read


def add_stream_service(topology, manifests: Path) -> None:
    pod_list = [topology.pod_info(n, i) for n in "ab" for i in (1, 2)]
    echo = [{"name": "echo", "port": POD_ECHO_PORT}]
    write(manifests, "stream", service("stream", [STREAM_IP], [{"name": "echo", "port": 7000}]),
          endpoint_slice("stream-1", "stream", echo, pod_list))


def status_line(ns: str) -> str | None:
    try:
        return json.loads(kubeport(ns, "get", "status", "-o", "json"))["proxy"]["workers"]
    except (CommandFailed, ValueError, KeyError):  # not serving yet
        return None


def test_a_killed_daemon_leaves_its_workers_streams_open_and_the_next_one_adopts_them(
        topology, pods, manifests, tmp_path):
    add_stream_service(topology, manifests)
    daemon = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS,
                            "--hold-sockets", "--workers", "2")
    daemon.wait_ready()
    first = until_sync(lambda: (found := children(daemon.proc.pid)) and len(found) == 1 and found[0],
                       "the supervised daemon", 5)
    workers = until_sync(lambda: len(found := [p for p in children(first) if is_worker(p)]) == 2 and sorted(found),
                         "its two workers", 10)

    loop_status, stream_status = tmp_path / "client.json", tmp_path / "streams.json"
    client = spawn_in(topology.pod("a", 1), sys.executable, str(CLIENT_LOOP), "--tcp", f"{WEB_IP}:80",
                      "--udp", f"{ECHO_IP}:9090", "--status", str(loop_status), stdout=subprocess.PIPE, text=True)
    streams = spawn_in(topology.pod("a", 2), sys.executable, str(STREAMS), f"{STREAM_IP}:7000",
                       str(OPEN_STREAMS), "--status", str(stream_status), stdout=subprocess.PIPE, text=True)
    loop_progress = reader(loop_status, {"tcp_ok": 0, "tcp_fail": 0, "udp_ok": 0, "udp_lost": 0})
    stream_progress = reader(stream_status, {"rounds": 0, "alive": 0, "dead": 0})
    until_sync(lambda: loop_progress()["tcp_ok"] >= 30 and loop_progress()["udp_ok"] >= 30, "the client loop running",
               20)
    until_sync(lambda: stream_progress()["rounds"] >= 5, "the streams echoing", 20)
    assert stream_progress()["alive"] == OPEN_STREAMS

    os.kill(first, signal.SIGKILL)
    # The supervisor is the orphans' subreaper: its children are the workers and the new daemon.
    second = until_sync(lambda: (found := [p for p in children(daemon.proc.pid) if p not in workers])
                        and found[0] != first and found[0], "the daemon started again", 10)

    line = until_sync(lambda: (found := status_line(topology.node("a"))) and found.startswith(
        "2 relay processes, 2 adopted") and found, "the workers adopted by the new daemon", 20)
    assert not [pid for pid in children(second) if is_worker(pid)], "the new daemon started workers of its own"
    rounds = stream_progress()["rounds"]
    before = loop_progress()
    until_sync(lambda: stream_progress()["rounds"] >= rounds + 20, "the streams echoing after the restart", 20)
    until_sync(lambda: loop_progress()["tcp_ok"] >= before["tcp_ok"] + 100
               and loop_progress()["udp_ok"] >= before["udp_ok"] + 100, "connections and datagrams after the restart", 20)

    streams.send_signal(signal.SIGTERM)
    stream_counts = json.loads(streams.communicate(timeout=10)[0])
    client.send_signal(signal.SIGTERM)
    loop_counts = json.loads(client.communicate(timeout=10)[0])
    assert stream_counts["dead"] == 0 and stream_counts["alive"] == OPEN_STREAMS, stream_counts["errors"]
    assert loop_counts["tcp_fail"] == 0, loop_counts["errors"]
    assert loop_counts["udp_lost"] == 0, loop_counts["errors"]  # one UDP flow, kept by its worker
    assert all(str(pid) in line for pid in workers), line
    assert "adopted 2 relay workers of the previous daemon" in daemon.log_text()
    # The adopted workers are the new daemon's: a stop ends them as its own.
    assert daemon.stop() == 0
    assert not any(alive(pid) for pid in workers)
    print(f"\nacross the kill: {OPEN_STREAMS} streams kept ({stream_counts['rounds']} rounds), "
          f"{loop_counts['tcp_ok']} connections, none refused, {loop_counts['udp_ok']} datagrams on one flow, none lost")


def test_a_worker_that_crashes_takes_only_its_own_streams_and_is_started_again(topology, pods, manifests, tmp_path):
    add_stream_service(topology, manifests)
    daemon = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS, "--workers", "2")
    daemon.wait_ready()
    workers = until_sync(lambda: len(found := [p for p in children(daemon.proc.pid) if is_worker(p)]) == 2
                         and sorted(found), "the two workers", 10)
    stream_status = tmp_path / "streams.json"
    streams = spawn_in(topology.pod("a", 2), sys.executable, str(STREAMS), f"{STREAM_IP}:7000",
                       str(OPEN_STREAMS), "--status", str(stream_status), stdout=subprocess.PIPE, text=True)
    progress = reader(stream_status, {"rounds": 0, "alive": 0, "dead": 0})
    until_sync(lambda: progress()["rounds"] >= 5, "the streams echoing", 20)

    os.kill(workers[0], signal.SIGKILL)
    until_sync(lambda: (line := status_line(topology.node("a"))) and line.endswith("1 started again after a crash"),
               "the worker started again", 10)
    rounds = progress()["rounds"]
    until_sync(lambda: progress()["rounds"] >= rounds + 20, "the other streams echoing on", 20)
    replacement = [p for p in children(daemon.proc.pid) if is_worker(p) and p not in workers]
    streams.send_signal(signal.SIGTERM)
    counts = json.loads(streams.communicate(timeout=10)[0])
    # 50 streams over two workers: each held some (the kernel's 4-tuple hash).
    assert 0 < counts["dead"] < OPEN_STREAMS and counts["alive"] + counts["dead"] == OPEN_STREAMS, counts
    assert daemon.running and alive(workers[1]) and len(replacement) == 1
    assert "its connections are lost; starting another" in daemon.log_text()
    assert daemon.stop() == 0
    print(f"\nworker killed: {counts['dead']} of {OPEN_STREAMS} streams lost, {counts['alive']} kept")

"""The TCP relay's behaviours on both paths of bulk bytes, through the real daemons.

node-a's daemon runs ``--tcp-relay sockmap`` (bulk directions relayed by the kernel), node-b's
``--tcp-relay splice``; a client in a pod of a node goes through that node's daemon to a
stream server in pod b2. Every transfer is bulk (MiBs), so that on node-a the kernel has the
connection before the end being tested (half-close, reset, a reader that does not read).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import re
import select
import subprocess
import sys
import time

import pytest
from support.netns import (
    KubeportDaemon,
    host_privileges_missing,
    kubeport,
    python_in,
    spawn_in,
    until_sync,
    wait_for_output,
)
from support.netns.daemon import kubeport_bin
from support.netns.manifests import DAEMON_ARGS, endpoint_slice, node, service, start_daemon, write
from support.netns.operating import scrape, total

pytestmark = pytest.mark.integration

STREAM_IP, STREAM_PORT, POD_PORT = "10.96.0.60", 7300, 7301
MIB = 1 << 20
# Loading the sockmap's BPF programs needs CAP_BPF (or CAP_SYS_ADMIN) of the host: not a user
# namespace's. Without it only node-b's daemon (splice) runs, and the splice cases.
NEEDS_BPF = pytest.mark.host_privileges("loading BPF programs (the sockmap path)")
PATHS = pytest.mark.parametrize(("node_letter", "path"), [pytest.param("a", "sockmap", marks=NEEDS_BPF),
                                                          ("b", "splice")])

#: the stream server in pod b2: one line of command per connection, then the stream it names.
_SERVER = r"""
import hashlib, random, select, socket, struct, sys, threading

def pattern(n, seed):
    return random.Random(seed).randbytes(n)

def read_to_eof(conn):
    digest, n = hashlib.sha256(), 0
    while data := conn.recv(1 << 20):
        digest.update(data)
        n += len(data)
    return n, digest.hexdigest()

def serve(conn):
    line = b""
    while not line.endswith(b"\n"):
        byte = conn.recv(1)
        if not byte:  # a probe: connected and closed
            conn.close()
            return
        line += byte
    cmd, size = line.split()
    size = int(size)
    if cmd == b"upload":      # the client's FIN ends its stream; the answer follows
        n, digest = read_to_eof(conn)
        conn.sendall(f"{n} {digest}\n".encode() + pattern(size, 2))
        conn.close()
    elif cmd == b"greet":     # our FIN first; the client still talks, then ends
        conn.sendall(pattern(size, 3))
        conn.shutdown(socket.SHUT_WR)
        n, digest = read_to_eof(conn)
        print(f"after-fin {n} {digest}", flush=True)
        conn.close()
    elif cmd == b"reset":     # a reset mid-stream
        conn.sendall(pattern(size, 4))
        conn.recv(4)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
    elif cmd == b"hold":      # what the client's reset looks like here
        conn.sendall(pattern(size, 5))
        try:
            read_to_eof(conn)
            print("hold eof", flush=True)
        except ConnectionResetError:
            print("hold reset", flush=True)
    elif cmd == b"echo":      # everything back, until the client's FIN
        while data := conn.recv(1 << 20):
            conn.sendall(data)
        conn.close()
    elif cmd == b"push":      # as fast as the client takes it; says when it stalls
        chunk, sent, stalled = pattern(MIB, 6), 0, False
        conn.setblocking(False)
        while sent < size:
            try:
                sent += conn.send(chunk[sent % MIB:])  # size is whole MiBs
            except BlockingIOError:
                if not select.select([], [conn], [], 2)[1] and not stalled:
                    print(f"stalled {sent}", flush=True)
                    stalled = True
        conn.setblocking(True)
        conn.close()

MIB = 1 << 20
srv = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""

_CLIENT = r"""
import hashlib, random, socket, struct, sys
cmd, size = sys.argv[3], int(sys.argv[4])
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
sock.sendall(f"{cmd} {size}\n".encode())

def pattern(n, seed):
    return random.Random(seed).randbytes(n)

def read_exactly(n):
    digest, got = hashlib.sha256(), 0
    while got < n:
        data = sock.recv(min(1 << 20, n - got))
        assert data, f"stream ended after {got} of {n}"
        digest.update(data)
        got += len(data)
    return digest.hexdigest()

if cmd == "upload":
    sock.sendall(pattern(size, 1))
    sock.shutdown(socket.SHUT_WR)
    line = b""
    while not line.endswith(b"\n"):
        line += sock.recv(1)
    ok = read_exactly(size) == hashlib.sha256(pattern(size, 2)).hexdigest() and sock.recv(1) == b""
    print(line.decode().strip(), hashlib.sha256(pattern(size, 1)).hexdigest(), "answer", ok)
elif cmd == "greet":
    ok = read_exactly(size) == hashlib.sha256(pattern(size, 3)).hexdigest() and sock.recv(1) == b""
    tail = pattern(MIB, 7)
    sock.sendall(tail)
    sock.shutdown(socket.SHUT_WR)
    print("greeting", ok, "tail", len(tail), hashlib.sha256(tail).hexdigest())
    sock.settimeout(30)
    sock.recv(1)
elif cmd == "reset":
    read_exactly(size)
    sock.sendall(b"kill")
    try:
        data = sock.recv(100)
        print("eof" if not data else "data")
    except ConnectionResetError:
        print("reset")
elif cmd == "hold":
    read_exactly(size)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    print("reset sent")
elif cmd == "echo":      # a bulk round, then one more when the test says so
    import threading
    for seed in (8, 9):
        data = pattern(size, seed)
        # Written while the echo is read, as an echo client must: written first, the round
        # would need the whole path to buffer `size` bytes, and it buffers less.
        writer = threading.Thread(target=sock.sendall, args=(data,))
        writer.start()
        assert read_exactly(size) == hashlib.sha256(data).hexdigest(), f"round {seed}"
        writer.join()
        print(f"round {seed}", flush=True)
        if seed == 8:
            sys.stdin.readline()
    sock.shutdown(socket.SHUT_WR)
    print("closed" if sock.recv(1) == b"" else "data after FIN", flush=True)
elif cmd == "push":
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    sys.stdout.write("connected\n"); sys.stdout.flush()
    sys.stdin.readline()  # the test says when to read: after the server stalled
    print("digest", read_exactly(size) == hashlib.sha256(pattern(MIB, 6) * (size // MIB)).hexdigest())
"""
_CLIENT = _CLIENT.replace("MIB", str(MIB))


#: what the relay logs when a pause lost data in the kernel and it reset the connection (KernelRelays).
_KERNEL_DROP = re.compile(r"sockmap: pausing the \w+ dropped \d+ bytes")


def excuse_a_kernel_drop(test):
    """A transfer through the sockmap path fails when a pause lost data in the kernel, which
    the relay then reports and answers with a reset (docs/configuration.md: the delete from the
    verdict map races a run of the program, in net/core/skmsg.c). Such a failure, and only one
    whose daemon logged that drop during the test, is an expected failure (xfail); any other
    failure stands. The unit tests, whose backends cannot race a delete, cover the reset itself."""

    def drops(kwargs) -> int:
        texts = [daemon.log_text() for daemon in kwargs["cluster"][0].values()]
        if "tmp_path" in kwargs:
            texts += [log.read_text(errors="replace") for log in kwargs["tmp_path"].rglob("*.log")]
        return sum(len(_KERNEL_DROP.findall(text)) for text in texts)

    @functools.wraps(test)
    def run(**kwargs):
        if kwargs.get("path", "sockmap") != "sockmap":
            return test(**kwargs)
        before = drops(kwargs)
        try:
            return test(**kwargs)
        except Exception:
            if drops(kwargs) > before:
                pytest.xfail("a pause lost data in the kernel; the relay reset the connection")
            raise

    return run


@pytest.fixture(scope="module")
def cluster(topology, pods, tmp_path_factory):
    manifests = tmp_path_factory.mktemp("manifests")
    state = tmp_path_factory.mktemp("state")
    b2 = topology.pod_info("b", 2)
    server = spawn_in(b2.ns, sys.executable, "-I", "-c", _SERVER, str(POD_PORT), stdout=subprocess.PIPE)
    wait_for_output(server, b"ready\n", 10, "stream server")
    write(manifests, "nodes", node(topology, "a"), node(topology, "b"))
    port = {"name": "s", "port": POD_PORT}
    write(manifests, "stream", service("stream", [STREAM_IP], [{"name": "s", "port": STREAM_PORT, "targetPort": "s"}]),
          endpoint_slice("stream-1", "stream", [port], [b2]))
    daemons = {"b": start_daemon(topology, "b", manifests, state, "--tcp-relay", "splice")}
    if not host_privileges_missing():  # else the tests of node-a's daemon are skipped or deselected
        daemons["a"] = start_daemon(topology, "a", manifests, state, "--tcp-relay", "sockmap")
    for letter in daemons:
        until_sync(lambda letter=letter: _served(topology, letter), f"the stream service on node-{letter}", 15)
    yield daemons, server
    for daemon in daemons.values():
        daemon.stop()


def _served(topology, letter: str) -> bool:
    done = python_in(topology.pod(letter, 1), f"import socket; socket.create_connection(('{STREAM_IP}', "
                     f"{STREAM_PORT}), timeout=1).close()", check=False)
    return done.returncode == 0


def _client(topology, letter: str, cmd: str, size: int, timeout: float = 60) -> str:
    return python_in(topology.pod(letter, 1), _CLIENT, STREAM_IP, STREAM_PORT, cmd, size, timeout=timeout).stdout


@NEEDS_BPF
def test_each_daemon_logs_and_reports_its_path(topology, cluster):
    daemons, _ = cluster
    for letter, line in (("a", "sockmap"), ("b", "splice (chosen)")):
        status = json.loads(kubeport(topology.node(letter), "get", "status", "-o", "json"))
        assert status["proxy"]["tcpRelay"] == line
        assert f"TCP relay: {line}" in daemons[letter].log_text()


@PATHS
@excuse_a_kernel_drop
def test_upload_then_client_fin__the_answer_comes_back_byte_exact_and_counted(topology, cluster, node_letter, path):
    size = 64 * MIB
    ns = topology.node(node_letter)
    before = scrape(ns)
    out = _client(topology, node_letter, "upload", size).split()
    assert out[0] == str(size) and out[1] == out[2] == hashlib.sha256(random.Random(1).randbytes(size)).hexdigest()
    assert out[-1] == "True", out

    def counted(direction: str) -> float:
        return total(scrape(ns), f"kubeport_proxy_bytes_total{{direction={direction},service_port=demo/stream:s/TCP}}") \
            - total(before, f"kubeport_proxy_bytes_total{{direction={direction},service_port=demo/stream:s/TCP}}")

    # Counted when the connection ends: the kernel's share comes from the program's counters.
    until_sync(lambda: counted("to_backend") >= size and counted("to_client") >= size, "the bytes counted", 10)
    assert counted("to_backend") == size + len(f"upload {size}\n")
    assert counted("to_client") == size + len(out[0]) + 1 + 64 + 1


@PATHS
@excuse_a_kernel_drop
def test_backend_fin_first__the_client_still_sends_its_tail(topology, cluster, node_letter, path):
    _, server = cluster
    out = _client(topology, node_letter, "greet", 32 * MIB).split()
    assert out[:2] == ["greeting", "True"], out
    wait_for_output(server, f"after-fin {out[3]} {out[4]}".encode(), 20, "the tail at the server")


@PATHS
@excuse_a_kernel_drop
def test_backend_reset_mid_stream__the_client_gets_a_reset(topology, cluster, node_letter, path):
    assert _client(topology, node_letter, "reset", 16 * MIB).strip() == "reset"


@PATHS
@excuse_a_kernel_drop
def test_client_reset_mid_stream__the_backend_gets_a_reset(topology, cluster, node_letter, path):
    _, server = cluster
    assert _client(topology, node_letter, "hold", 16 * MIB).strip() == "reset sent"
    wait_for_output(server, b"hold reset\n", 20, "the reset at the server")


@PATHS
@excuse_a_kernel_drop
def test_a_reader_that_does_not_read_stalls_the_server__then_gets_everything(topology, cluster, node_letter, path):
    _, server = cluster
    size = 512 * MIB
    client = spawn_in(topology.pod(node_letter, 1), sys.executable, "-I", "-c", _CLIENT, STREAM_IP, str(STREAM_PORT),
                      "push", str(size), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    wait_for_output(client, b"connected\n", 10, "the pushing client")
    stalled = _stalled_at(server)
    print(f"\n{path}: the server stalled after {stalled >> 20} MiB to a reader that did not read")
    # The relay held what the socket buffers and one bounded queue hold, not the stream.
    assert stalled < 96 * MIB, f"{path}: the server sent {stalled >> 20} MiB to a reader that did not read"
    client.stdin.write(b"go\n")
    client.stdin.flush()
    wait_for_output(client, b"digest True\n", 60, "the whole stream at the reader")


def _stalled_at(server: subprocess.Popen, timeout: float = 30) -> int:
    """The server's "stalled <bytes sent>" line (read as wait_for_output reads: the raw pipe)."""
    fd, seen = server.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    while not re.search(rb"stalled (\d+)\n", seen):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"the server never stalled; it printed {seen!r}"
        if select.select([fd], [], [], remaining)[0]:
            chunk = os.read(fd, 4096)
            assert chunk, "the stream server exited"
            seen += chunk
    return int(re.search(rb"stalled (\d+)\n", seen).group(1))


def test_auto_without_cap_bpf_falls_back_to_splice_and_says_why(topology, cluster, tmp_path):
    """A node that withholds CAP_BPF (a DaemonSet without it): ``auto`` relays by splice."""
    daemons, _ = cluster
    daemons["b"].stop()
    program = ["setpriv", "--bounding-set=-bpf,-sys_admin", "--", str(kubeport_bin())]  # either allows bpf(2)
    daemon = KubeportDaemon(topology.node("b"), daemons["b"].manifests_dir, tmp_path / "state", *DAEMON_ARGS,
                            "--tcp-relay", "auto", program=program)
    daemon.wait_ready()
    line = "splice (sockmap unavailable: bpf(2): Operation not permitted (needs CAP_BPF and CAP_NET_ADMIN))"
    assert json.loads(kubeport(topology.node("b"), "get", "status", "-o", "json"))["proxy"]["tcpRelay"] == line
    assert f"TCP relay: {line}" in daemon.log_text()
    until_sync(lambda: _served(topology, "b"), "the stream service on node-b", 15)
    out = _client(topology, "b", "upload", 8 * MIB).split()
    assert out[0] == str(8 * MIB) and out[-1] == "True", out
    daemon.stop()


@NEEDS_BPF
@excuse_a_kernel_drop
def test_handover_with_workers__a_connection_in_the_kernel_lives_on_in_the_old_instance(topology, cluster, tmp_path):
    """``--workers 2``: each worker opens its own sockmap (a connection lives in one process).
    The old instance keeps its workers, and their maps, until their connections end."""
    daemons, _ = cluster
    daemons["a"].stop()
    old = KubeportDaemon(topology.node("a"), daemons["a"].manifests_dir, tmp_path / "state", *DAEMON_ARGS,
                         "--tcp-relay", "sockmap", "--workers", "2", "--shutdown-grace-period", "60s")
    old.wait_ready()
    until_sync(lambda: _served(topology, "a"), "the stream service on the old instance", 15)
    status = json.loads(kubeport(topology.node("a"), "get", "status", "-o", "json"))["proxy"]
    assert status["tcpRelay"] == "sockmap" and status["workers"].startswith("2 relay processes")
    client = spawn_in(topology.pod("a", 1), sys.executable, "-I", "-c", _CLIENT, STREAM_IP, str(STREAM_PORT),
                      "echo", str(16 * MIB), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    wait_for_output(client, b"round 8\n", 30, "the first bulk round")
    new = KubeportDaemon(topology.node("a"), daemons["a"].manifests_dir, tmp_path / "state", *DAEMON_ARGS,
                         "--tcp-relay", "sockmap", "--healthz-bind-address", "0.0.0.0:10356",
                         "--metrics-bind-address", "127.0.0.1:10349", log_path=tmp_path / "new.log")
    new.wait_ready()
    until_sync(lambda: "handing over" in old.log_text(), "the old instance handing over", 20)
    assert old.running, "the old instance left before its connection ended"
    client.stdin.write(b"go\n")
    client.stdin.flush()
    wait_for_output(client, b"round 9\n", 30, "the second round through the old instance")
    wait_for_output(client, b"closed\n", 30, "the end of the stream")
    assert old.proc.wait(timeout=30) == 0, old.log_tail()
    assert _served(topology, "a"), "the new instance serves new connections"
    new.stop()

"""The socket hold's channel: what the daemon sends its supervisor (hold, release), what it
gets back at its next start (every held socket, in batches under SCM_MAX_FD), and that a
socket handed back is the same kernel socket (its queued connection is still there)."""

from __future__ import annotations

import socket
import threading

from kubeport.lib.sockethold import BATCH, SocketHold
from kubeport.supervisor import Supervisor


def serve_supervisor(supervisor: Supervisor, chan: socket.socket, messages: int) -> threading.Thread:
    supervisor.chan = chan

    def run():
        for _ in range(messages):
            if not supervisor._message():
                return

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def start_daemon(supervisor: Supervisor, messages: int) -> tuple[SocketHold, threading.Thread]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    thread = serve_supervisor(supervisor, ours, messages)
    return SocketHold(theirs), thread


def listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock


def test_held_listeners_come_back_to_the_next_daemon_with_their_queued_connections():
    supervisor = Supervisor([])
    hold, thread = start_daemon(supervisor, messages=1 + 3 + 1)  # hello, 3 holds, 1 release
    socks = {f"tcp/0/127.0.0.1/{i}": listener() for i in range(3)}
    for label, sock in socks.items():
        hold.keep(label, sock)
    gone = next(iter(socks))
    hold.release(gone)
    thread.join(5)
    assert set(supervisor.held) == set(socks) - {gone}
    # The daemon dies: its descriptors close; a client connects meanwhile.
    label = list(socks)[1]
    port = socks[label].getsockname()[1]
    for sock in socks.values():
        sock.close()
    client = socket.create_connection(("127.0.0.1", port), timeout=2)   # queued, not refused
    nxt, thread = start_daemon(supervisor, messages=1)
    thread.join(5)
    adopted = nxt.adopt(label)
    assert adopted is not None and adopted.getsockname()[1] == port
    accepted, _ = adopted.accept()
    client.sendall(b"x")
    assert accepted.recv(1) == b"x"
    assert nxt.release_unadopted() == 1                   # the third one: nobody serves it now
    for s in (client, accepted, adopted):
        s.close()


def test_more_sockets_than_one_message_carries_come_back_in_batches():
    supervisor = Supervisor([])
    count = BATCH * 2 + 7
    udp = []
    for i in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        udp.append(sock)
        supervisor.held[f"udp/127.0.0.1/{i}"] = sock
    nxt, thread = start_daemon(supervisor, messages=1)
    thread.join(5)
    assert all(nxt.adopt(f"udp/127.0.0.1/{i}") is not None for i in range(count))
    assert nxt.adopted == count


def test_without_a_supervisor_every_call_is_a_no_op():
    hold = SocketHold(None)
    sock = listener()
    hold.keep("tcp/0/127.0.0.1/1", sock)
    hold.release("tcp/0/127.0.0.1/1")
    assert hold.adopt("tcp/0/127.0.0.1/1") is None and not hold.active
    sock.close()

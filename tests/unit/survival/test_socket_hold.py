"""The socket hold's channel: what the daemon sends its supervisor (hold, release), what it
gets back at its next start (every held socket, in batches under SCM_MAX_FD), and that a
socket handed back is the same kernel socket (its queued connection is still there); relay
workers' channels of their own, their slots, and what is closed once the daemon settled."""

from __future__ import annotations

import socket
import threading

from kubeport.survival.sockethold import BATCH, SocketHold, worker_prefix
from kubeport.survival.supervisor import Supervisor


def pump(supervisor: Supervisor, chan: socket.socket, prefix: str, messages: int) -> threading.Thread:
    """The supervisor's side of one channel, for ``messages`` messages, on a thread (the
    other side blocks on the replies to its hello)."""
    def run():
        for _ in range(messages):
            if not supervisor._message(chan, prefix):
                return

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def serve_supervisor(supervisor: Supervisor, chan: socket.socket, messages: int) -> threading.Thread:
    supervisor.chan = chan
    return pump(supervisor, chan, "", messages)


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
    # kubeport get status: held by the supervisor alone (no store beyond it)
    assert nxt.status() == {"active": True, "store": None, "heldAtStart": 2, "adopted": 1}
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


def start_worker(supervisor: Supervisor, daemon: SocketHold, daemon_chan: socket.socket, slot: int,
                 messages: int) -> tuple[SocketHold, threading.Thread]:
    """What ProxyWorkers._spawn does: a channel for the worker's slot made over the daemon's."""
    before = set(supervisor.worker_chans)
    thread = pump(supervisor, daemon_chan, "", 1)
    workers_end = daemon.channel_for_worker(slot)
    thread.join(5)
    (holders_end,) = set(supervisor.worker_chans) - before
    thread = pump(supervisor, holders_end, worker_prefix(slot), messages)
    return SocketHold(workers_end), thread


def daemon_of(supervisor: Supervisor) -> tuple[socket.socket, socket.socket, SocketHold]:
    """A daemon started by ``supervisor``: its channel's two ends, and its side of the hold."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    supervisor.chan = ours
    hello = pump(supervisor, ours, "", 1)
    daemon = SocketHold(theirs)
    hello.join(5)
    return ours, theirs, daemon


def test_a_workers_listeners_are_held_under_its_slot_for_the_worker_started_in_its_place():
    supervisor = Supervisor([])
    ours, theirs, daemon = daemon_of(supervisor)
    worker, thread = start_worker(supervisor, daemon, ours, slot=1, messages=1 + 1)  # hello, hold
    sock = listener()
    port = sock.getsockname()[1]
    worker.keep(f"tcp/0/127.0.0.1/{port}", sock)
    thread.join(5)
    assert set(supervisor.held) == {f"worker-1/tcp/0/127.0.0.1/{port}"}
    # The worker crashes: its socket stays held, and a connection waits in its queue.
    sock.close()
    worker._chan.close()
    client = socket.create_connection(("127.0.0.1", port), timeout=2)
    # The daemon's own sockets never include a worker's...
    again, thread = start_daemon(supervisor, messages=1)
    thread.join(5)
    assert again.adopt(f"tcp/0/127.0.0.1/{port}") is None
    # ...the worker started in slot 1 gets it, with the connection queued.
    successor, thread = start_worker(supervisor, daemon, ours, slot=1, messages=1)
    thread.join(5)
    adopted = successor.adopt(f"tcp/0/127.0.0.1/{port}")
    assert adopted is not None
    accepted, _ = adopted.accept()
    client.sendall(b"x")
    assert accepted.recv(1) == b"x"
    for s in (client, accepted, adopted, ours, theirs):
        s.close()


def test_settled_closes_the_sockets_of_slots_no_worker_serves_any_more():
    """From two workers to one across a restart: slot 2's sockets would take their share of
    the SO_REUSEPORT group's connections with nobody accepting them."""
    supervisor = Supervisor([])
    for slot in (1, 2):
        supervisor.held[f"worker-{slot}/udp/127.0.0.1/53"] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ours, theirs, daemon = daemon_of(supervisor)
    _worker, thread = start_worker(supervisor, daemon, ours, slot=1, messages=1)
    thread.join(5)
    settled = pump(supervisor, ours, "", 1)
    assert daemon.release_unadopted() == 0
    settled.join(5)
    assert set(supervisor.held) == {"worker-1/udp/127.0.0.1/53"}
    for s in (ours, theirs):
        s.close()


def test_a_worker_of_a_slot_still_served_by_a_live_one_is_offered_nothing():
    """An orphan of a killed daemon adopted by the next in another slot keeps its channel and
    its sockets; a new worker in the orphan's old slot must not take them."""
    supervisor = Supervisor([])
    ours, theirs, daemon = daemon_of(supervisor)
    orphan, thread = start_worker(supervisor, daemon, ours, slot=1, messages=2)
    sock = listener()
    orphan.keep("tcp/0/127.0.0.1/1", sock)
    thread.join(5)
    newcomer, thread = start_worker(supervisor, daemon, ours, slot=1, messages=1)
    thread.join(5)
    assert newcomer.adopt("tcp/0/127.0.0.1/1") is None
    assert "worker-1/tcp/0/127.0.0.1/1" in supervisor.held
    for s in (sock, ours, theirs):
        s.close()

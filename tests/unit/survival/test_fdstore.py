"""The fd-store sidecar (kubeport/survival/fdstore.py) over real Unix sockets: what the supervisor stores
and removes with systemd's messages (sd_notify(3) FDSTORE=1, FDSTOREREMOVE=1), what a
starting supervisor fetches back, and that a socket fetched back is the one stored (its
queued connection is still there)."""

from __future__ import annotations

import socket
import threading

import pytest

from kubeport.survival.fdstore import FdStore, fd_name_valid
from kubeport.lib.sdnotify import Notifier
from kubeport.survival.supervisor import STORE_CHECK_S, Supervisor


@pytest.fixture
def store(tmp_path):
    made = FdStore(tmp_path / "fd-store", maximum=4)
    yield made
    for socks in made.stored.values():
        for sock in socks:
            sock.close()
    made.notify.close()
    made.fetch.close()


def listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock


def started(store: FdStore) -> Supervisor:
    """A supervisor starting with --fd-store, served by the store as its loop would."""
    supervisor = Supervisor([], store.directory)
    serving = threading.Thread(target=store.handle_fetch)
    serving.start()
    supervisor._take_stored_sockets()
    serving.join(5)
    return supervisor


def fetched(store: FdStore, tmp_path) -> dict[str, socket.socket]:
    """What a supervisor starting with --fd-store takes back."""
    return started(store).held


@pytest.mark.parametrize("name, valid", [("tcp/0/10.96.0.1/80", True), ("a:b", False), ("", False),
                                         ("x" * 256, False), ("tab\there", False), ("worker-1/udp/fd00%3A%3A1/53", True)])
def test_names_as_systemd_takes_them__fdname_is_valid(name, valid):
    assert fd_name_valid(name) is valid


def test_stored_sockets_come_back_to_the_next_supervisor_with_their_queued_connection(store, tmp_path):
    supervisor = started(store)  # the first start: nothing stored yet
    assert supervisor.held == {} and supervisor.store is not None
    held = listener()
    port = held.getsockname()[1]
    other = listener()
    supervisor._hold("tcp/0/127.0.0.1/80", socket.socket(fileno=held.detach()))
    supervisor._hold("tcp/0/127.0.0.1/81", socket.socket(fileno=other.detach()))
    supervisor._release("tcp/0/127.0.0.1/81")
    for _ in range(3):
        store.handle_notify()
    assert set(store.stored) == {"tcp/0/127.0.0.1/80"}
    # The container ends: every descriptor of its processes closes; a client connects meanwhile.
    supervisor._close_held()
    client = socket.create_connection(("127.0.0.1", port), timeout=2)
    back = fetched(store, tmp_path)
    assert set(back) == {"tcp/0/127.0.0.1/80"}
    accepted, _ = back["tcp/0/127.0.0.1/80"].accept()
    client.sendall(b"x")
    assert accepted.recv(1) == b"x"
    for sock in (client, accepted, *back.values()):
        sock.close()


def test_the_daemon_is_told_where_its_sockets_are_kept(store):
    supervisor = started(store)
    assert supervisor._store_name() == f"the fd store in {store.directory}"
    assert Supervisor([])._store_name() is None


def test_a_full_store_keeps_what_it_has_and_refuses_the_rest(store, tmp_path):
    notifier = Notifier(str(store.directory / "notify"))
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(6)]
    for index, sock in enumerate(socks):
        assert notifier.store_fds(f"udp/127.0.0.1/{index}", [sock.fileno()])
        store.handle_notify()
    assert store.count == 4 and set(store.stored) == {f"udp/127.0.0.1/{i}" for i in range(4)}
    back = fetched(store, tmp_path)
    assert len(back) == 4
    for sock in (*socks, *back.values()):
        sock.close()
    notifier.close()


def test_a_name_systemd_would_refuse_is_not_stored(store):
    notifier = Notifier(str(store.directory / "notify"))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    notifier.store_fds("tcp/0/::1/80", [sock.fileno()])  # ':' unencoded
    store.handle_notify()
    assert store.stored == {}
    sock.close()
    notifier.close()


def test_a_supervisor_without_its_sidecar_holds_on_alone(tmp_path):
    supervisor = Supervisor([], tmp_path / "nobody")
    supervisor._take_stored_sockets()
    assert supervisor.held == {}
    held = listener()
    other = listener()
    supervisor._hold("tcp/0/127.0.0.1/80", socket.socket(fileno=held.detach()))  # the store is gone: logged
    supervisor._hold("tcp/0/127.0.0.1/81", socket.socket(fileno=other.detach()))  # ...once
    assert set(supervisor.held) == {"tcp/0/127.0.0.1/80", "tcp/0/127.0.0.1/81"}
    assert supervisor.store_failures == 2
    supervisor._close_held()


def test_a_restarted_sidecar_gets_every_held_socket_again(tmp_path):
    """The sidecar crashed and was started again by the kubelet: it starts empty, and the
    supervisor, seeing a new socket in the directory, stores what it holds once more."""
    first = FdStore(tmp_path / "fd-store")
    supervisor = started(first)
    supervisor._store_again_if_restarted()  # its store as it found it
    assert supervisor._store_identity is not None
    socks = [listener() for _ in range(2)]
    for index, sock in enumerate(socks):
        supervisor._hold(f"tcp/0/127.0.0.1/{index}", socket.socket(fileno=sock.detach()))
        first.handle_notify()
    assert first.count == 2
    for sock in (first.notify, first.fetch, *(s for socks in first.stored.values() for s in socks)):
        sock.close()
    again = FdStore(tmp_path / "fd-store")
    again.notify.settimeout(5)  # a failure, not a hang
    supervisor._store_again_if_restarted()  # within STORE_CHECK_S of the last look: not yet
    again.notify.setblocking(False)
    with pytest.raises(BlockingIOError):
        again.notify.recv(1)
    again.notify.settimeout(5)
    supervisor._store_checked_at -= STORE_CHECK_S  # the next look, STORE_CHECK_S later
    supervisor._store_again_if_restarted()
    for _ in range(2):
        again.handle_notify()
    assert set(again.stored) == {"tcp/0/127.0.0.1/0", "tcp/0/127.0.0.1/1"}
    supervisor._store_checked_at -= STORE_CHECK_S
    supervisor._store_again_if_restarted()  # the same store: nothing sent twice
    again.notify.setblocking(False)
    with pytest.raises(BlockingIOError):
        again.notify.recv(1)
    supervisor._close_held()
    for sock in (again.notify, again.fetch, *(s for socks in again.stored.values() for s in socks)):
        sock.close()

"""Relay workers outlive their parent: an orphan keeps its connections and table, waits on an
abstract socket named after the node and its pid, and the next ProxyWorkers adopts it."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket

import pytest
from support.fake_host import FakeAddresses, FakeFirewall
from support.proxy_loopback import (
    NODE,
    Backends,
    apply_states,
    echoed,
    greeted_connection,
    greeting,
    on_uvloop,
    web,
)
from support.wait import DEADLINE, until

from kubeport.endpoints.types import ServiceName
from kubeport.lib.version import __version__
from kubeport.proxy.config import ProxyConfig
from kubeport.proxy.workers import worker
from kubeport.proxy.workers.messages import (
    SAME_NODE,
    Applied,
    Apply,
    Start,
    Started,
    orphan_address,
    orphan_addresses,
    receive,
    send,
)
from kubeport.proxy.workers.parent import ProxyWorkers
from kubeport.proxy.workers.worker import SnapshotMirror

WEB, API = ServiceName("default", "web"), ServiceName("default", "api")

_HEADER = "Num       RefCount Protocol Flags    Type St Inode Path\n"


V = __version__


@pytest.mark.parametrize(("line", "found"), [
    pytest.param(f"0000: 00000002 00000000 00010000 0001 01 4711 @kubeport/node-a/worker/{V}/42",
                 [f"\0kubeport/node-a/worker/{V}/42"], id="listening"),
    pytest.param(f"0000: 00000003 00000000 00000000 0001 03 4712 @kubeport/node-a/worker/{V}/42", [],
                 id="a-connection-to-it"),
    pytest.param(f"0000: 00000002 00000000 00010000 0001 01 4713 @kubeport/node-b/worker/{V}/42", [],
                 id="another-node"),
    pytest.param("0000: 00000002 00000000 00010000 0001 01 4714 @kubeport/node-a/worker/0.0.0-other/42", [],
                 id="another-version"),
    pytest.param("0000: 00000002 00000000 00010000 0001 01 4715 @kubeport/node-a", [], id="the-node-socket"),
    pytest.param("0000: 00000002 00000000 00010000 0001 01 4716", [], id="unnamed"),
])
def test_orphan_addresses__listening_sockets_of_this_node_and_version_only(tmp_path, line, found):
    table = tmp_path / "unix"
    table.write_text(_HEADER + line + "\n")
    assert orphan_addresses("node-a", str(table)) == found
    assert orphan_address("node-a", 42) == f"\0kubeport/node-a/worker/{V}/42"


def test_snapshot_mirror__a_whole_update_drops_what_it_does_not_name():
    mirror = SnapshotMirror()
    mirror.update(True, NODE, {WEB: web(1), API: web(2, name="api")})
    adopted = mirror.update(True, NODE, {WEB: web(3)}, whole=True)
    assert set(adopted.services) == {WEB} and adopted.changed == frozenset({WEB, API})
    assert set(mirror.update(True, SAME_NODE, {}).services) == {WEB}


def _workers(node: str) -> ProxyWorkers:
    config = ProxyConfig(workers=2, seed=1, nodeport_addresses=("primary", "localhost"))
    return ProxyWorkers(config, node, addresses=FakeAddresses(["127.0.0.1", "::1"]), firewall=FakeFirewall())


def _crash(parent: ProxyWorkers) -> None:
    """What SIGKILL does to the parent's side: its channels close without a Stop."""
    for child in parent._children:
        child.reading.cancel()
        child.writer.transport.abort()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@on_uvloop
async def test_orphan_workers_keep_their_connections_and_the_next_parent_adopts_them():
    node = f"adoption-{os.getpid()}"  # abstract names are shared by every test run in this namespace
    backends = Backends()
    old = _workers(node)
    await old.start(extra_addresses=["127.0.0.53"])
    first = await apply_states(old, [web(await backends.tcp("a")),
                                     web(await backends.tcp("api"), name="api", vip="127.0.0.11")])
    reader, writer, hello = await greeted_connection("127.0.0.10")
    assert hello == b"a\n"
    pids = sorted(old.pids)
    _crash(old)
    await until(lambda: len(orphan_addresses(node)) == 2, "both workers waiting to be adopted")
    assert await echoed(reader, writer, b"while orphaned\n") == b"while orphaned\n"
    assert await greeting("127.0.0.11") == "api"  # the last table is served meanwhile
    new = _workers(node)
    try:
        await new.start(extra_addresses=["127.0.0.53"])
        assert sorted(new.pids) == pids and new.workers == 2
        assert new.worker_status.startswith("2 relay processes, 2 adopted from the previous daemon (pids ")
        assert orphan_addresses(node) == []  # adopted once: no second daemon can take them
        await apply_states(new, [web(await backends.tcp("b"))], previous=first)  # a whole view: api is gone
        assert {await greeting("127.0.0.10") for _ in range(20)} == {"b"}
        with pytest.raises(ConnectionRefusedError):
            await greeting("127.0.0.11")
        assert await echoed(reader, writer, b"adopted\n") == b"adopted\n"
    finally:
        writer.close()
        await new.stop(1.0)
        await old._local.stop()
        backends.close()
    assert not any(_alive(pid) for pid in pids)


async def _orphan(node: str, backends: Backends, **limits):
    """A worker's loop in this process, serving web on 127.0.0.10, and a connection through it;
    then its parent's end of the channel closes unannounced (the parent is killed)."""
    parent, child = socket.socketpair()
    serving = asyncio.create_task(worker.serve(child.detach(), **limits))
    reader, writer = await asyncio.open_connection(sock=parent)
    config = ProxyConfig(workers=2, seed=1, firewall=False, nodeport_addresses=("primary", "localhost"))
    await send(writer, Start(config, node, (), (), 1, False, 0))
    assert isinstance(await receive(reader), Started)
    await send(writer, Apply(1, True, NODE, {WEB: web(await backends.tcp("a"))}, ("127.0.0.1",), whole=True))
    assert isinstance(await receive(reader), Applied)
    connection = await greeted_connection("127.0.0.10")
    writer.transport.abort()
    await until(lambda: orphan_addresses(node), "the orphan waiting to be adopted")
    return serving, connection


@on_uvloop
async def test_an_orphan_ends_at_sigterm_resetting_its_connections(monkeypatch):
    """systemd ends a unit's other processes once its main one died: the restart waits for them."""
    monkeypatch.setattr(worker, "_configure_logging", lambda *_: None)
    backends = Backends()
    serving, (conn_reader, conn_writer, _) = await _orphan(f"terminated-{os.getpid()}", backends)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(serving, DEADLINE)
        with pytest.raises(ConnectionResetError):
            await conn_reader.read()
    finally:
        conn_writer.close()
        backends.close()


@on_uvloop
async def test_an_orphan_nobody_adopts_stops_accepting_and_exits_once_its_connections_end(monkeypatch):
    """The worker's own loop, in this process: its parent's end of the channel closes unannounced."""
    monkeypatch.setattr(worker, "_configure_logging", lambda *_: None)  # the test's logging stays
    node = f"unadopted-{os.getpid()}"
    backends = Backends()
    serving, (conn_reader, conn_writer, _) = await _orphan(node, backends, adoption_grace=0.3, orphan_drain=DEADLINE)
    try:
        assert await greeting("127.0.0.10") == "a"  # its last table, served meanwhile
        await until(lambda: not orphan_addresses(node), "the adoption grace over")
        await until(lambda: _refused("127.0.0.10"), "the listener closed")
        assert await echoed(conn_reader, conn_writer, b"draining\n") == b"draining\n"
        assert not serving.done()
    finally:
        conn_writer.close()
        backends.close()
    await asyncio.wait_for(serving, DEADLINE)  # its last connection ended: the worker is done


def _refused(host: str) -> bool:
    probe = socket.socket()
    try:
        return probe.connect_ex((host, 80)) == errno.ECONNREFUSED
    finally:
        probe.close()

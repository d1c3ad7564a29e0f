"""The handover socket trusts only kubeport: peers are judged by their credentials (SO_PEERCRED).

Here the other process is a child of the test's own user, distrusted by its pid (the
integration tests use a real other user, uid 65534)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from support.wait import until

from kubeport.survival import handover

SQUAT = """
import socket, sys
s = socket.socket(socket.AF_UNIX); s.bind("\\0kubeport/" + sys.argv[1]); s.listen(8)
print("bound", flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"refused\\n")
"""

KNOCK = """
import socket, sys
c = socket.socket(socket.AF_UNIX); c.connect("\\0kubeport/" + sys.argv[1])
try:
    c.sendall(b"takeover\\n")
    print(c.recv(100).decode() or "closed", flush=True)
except (BrokenPipeError, ConnectionResetError):
    print("closed", flush=True)
"""


def unique_node() -> str:
    return f"test-peer-{os.getpid()}-{id(object())}"


@pytest.fixture
def distrust(monkeypatch):
    """Distrust the processes whose pids are added to the returned set."""
    distrusted: set[int] = set()
    monkeypatch.setattr(handover, "trusted", lambda peer: peer.pid not in distrusted)
    return distrusted


async def test_a_takeover_from_an_untrusted_peer_is_closed_unread_and_is_a_problem_line(distrust):
    node = unique_node()
    left = asyncio.Event()
    instance = handover.Instance(node, left.set)
    assert await instance.claim()
    knock = await asyncio.create_subprocess_exec(sys.executable, "-c", KNOCK, node,
                                                 stdout=subprocess.PIPE)
    distrust.add(knock.pid)
    out, _ = await asyncio.wait_for(knock.communicate(), 10)
    assert out.decode().strip() == "closed"  # no "leaving"
    assert not left.is_set() and handover.abstract_name_in_use(node)
    [line] = instance.problems
    assert line.startswith(f"handover: refused 1 connection(s) to @kubeport/{node} from other users, "
                           f"the last from pid {knock.pid} (uid {os.getuid()}): only root or uid")
    instance.release()


async def test_a_squatter_on_the_name_is_reported_and_the_instance_takes_the_name_once_it_goes(distrust):
    node = unique_node()
    squatter = await asyncio.create_subprocess_exec(sys.executable, "-c", SQUAT, node, stdout=subprocess.PIPE)
    try:
        assert await asyncio.wait_for(squatter.stdout.readline(), 10) == b"bound\n"
        distrust.add(squatter.pid)
        instance = handover.Instance(node, lambda: None)
        assert not await instance.claim()
        assert not instance.predecessor and instance.squatter is not None
        assert instance.squatter.pid == squatter.pid
        [line] = instance.problems
        assert f"@kubeport/{node} is held by pid {squatter.pid}" in line and "serving beside it" in line
        assert not handover.abstract_name_in_use(node)  # a squatter serves nothing
        claiming = asyncio.create_task(instance.keep_claiming(interval=0.05))
        squatter.kill()
        await squatter.wait()
        async with asyncio.timeout(5):
            await claiming
        assert instance.squatter is None and instance.problems == []
        assert handover.abstract_name_in_use(node)
        instance.release()
    finally:
        if squatter.returncode is None:
            squatter.kill()
            await squatter.wait()


async def test_a_successor_does_not_take_refused_from_a_squatter(distrust):
    node = unique_node()
    squatter = await asyncio.create_subprocess_exec(sys.executable, "-c", SQUAT, node, stdout=subprocess.PIPE)
    try:
        assert await asyncio.wait_for(squatter.stdout.readline(), 10) == b"bound\n"
        distrust.add(squatter.pid)
        instance = handover.Instance(node, lambda: None)
        await instance.announce()  # as if the squatter came between the claim and the announcement
        assert not instance.refused and instance.squatter is not None
    finally:
        if squatter.returncode is None:
            squatter.kill()
            await squatter.wait()


async def test_holder_of_a_free_name_is_nobody():
    assert handover.holder_of(handover.instance_address(unique_node())) is None
    node = unique_node()
    instance = handover.Instance(node, lambda: None)
    assert await instance.claim()
    holder = handover.holder_of(handover.instance_address(node))
    assert holder is not None and holder.pid == os.getpid() and holder.uid == os.geteuid()
    instance.release()
    await until(lambda: handover.holder_of(handover.instance_address(node)) is None, "the name free", 5)

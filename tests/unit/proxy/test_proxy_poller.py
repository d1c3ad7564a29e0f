"""The edge-triggered poller the relays share: edges, reused descriptors, failing handlers."""

from __future__ import annotations

import asyncio
import socket

from kubeport.proxy.relay.poller import EPOLLIN, EdgePoller

from support.proxy_loopback import on_uvloop
from support.wait import until


@on_uvloop
async def test_one_edge_per_new_input__until_forgotten():
    poller = EdgePoller(asyncio.get_running_loop())
    ours, theirs = socket.socketpair()
    seen: list[int] = []
    poller.register(ours.fileno(), seen.append)
    try:
        await until(lambda: seen, "the initial writable edge")
        seen.clear()
        theirs.send(b"x")
        await until(lambda: any(e & EPOLLIN for e in seen), "an input edge")
        poller.forget(ours.fileno())
        seen.clear()
        theirs.send(b"y")
        await asyncio.sleep(0)  # one loop turn: nothing may arrive for a forgotten descriptor
        await asyncio.sleep(0)
        assert seen == []
    finally:
        poller.close()
        ours.close()
        theirs.close()


@on_uvloop
async def test_descriptor_reused_within_a_batch_gets_none_of_its_events():
    poller = EdgePoller(asyncio.get_running_loop())
    first, first_peer = socket.socketpair()
    second, second_peer = socket.socketpair()
    calls: dict[str, int] = {"first": 0, "second": 0}
    new_events: list[int] = []
    new_sockets: list[socket.socket] = []

    def on_first(events: int) -> None:
        calls["first"] += 1
        if events & EPOLLIN and not new_sockets:
            reused = second.fileno()
            poller.forget(reused)
            second.close()  # its event may still be in this batch
            fresh, fresh_peer = socket.socketpair()
            new_sockets.extend((fresh, fresh_peer))
            poller.register(fresh.fileno(), new_events.append)
            assert fresh.fileno() == reused  # the lowest free number: the old one

    poller.register(first.fileno(), on_first)
    poller.register(second.fileno(), lambda events: calls.__setitem__("second", calls["second"] + 1))
    try:
        await until(lambda: calls["first"] and calls["second"], "the initial edges")
        first_peer.send(b"x")
        second_peer.send(b"x")
        await until(lambda: new_events, "the new socket's own first edge")
        # Its own edge says writable; the old socket's input edge was not delivered to it.
        assert not any(events & EPOLLIN for events in new_events)
    finally:
        poller.close()
        for sock in (first, first_peer, second_peer, *new_sockets):
            sock.close()


@on_uvloop
async def test_a_failing_handler_does_not_cost_the_others_their_edges():
    poller = EdgePoller(asyncio.get_running_loop())
    pairs = [socket.socketpair() for _ in range(3)]
    seen: set[int] = set()

    def broken(events: int) -> None:
        raise RuntimeError("bug")

    poller.register(pairs[0][0].fileno(), broken)
    for ours, _ in pairs[1:]:
        poller.register(ours.fileno(), lambda events, fd=ours.fileno(): seen.add(fd))
    try:
        await until(lambda: len(seen) == 2, "the other handlers' edges")
    finally:
        poller.close()
        for pair in pairs:
            for sock in pair:
                sock.close()

"""Steering clients to workers by address: the cBPF program the kernel runs, checked on loopback."""

from __future__ import annotations

import select
import socket

import pytest

from kubeport.proxy.relay import steering


def group(family: int, kind: int, size: int) -> list[socket.socket]:
    host = "127.0.0.1" if family == socket.AF_INET else "::1"
    members, port = [], 0
    for _ in range(size):
        sock = socket.socket(family, kind)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        port = sock.getsockname()[1]
        if kind == socket.SOCK_STREAM:
            sock.listen()
        members.append(sock)
    return members


def landing(members: list[socket.socket], source: str) -> int:
    """Which member (in bind order, the group's order) receives a client from ``source``."""
    family, kind = members[0].family, members[0].type
    client = socket.socket(family, kind)
    try:
        client.bind((source, 0))
        address = members[0].getsockname()[:2]
        if kind == socket.SOCK_DGRAM:
            client.sendto(b"x", address)
        else:
            client.connect(address)
        ready, _, _ = select.select(members, [], [], 5.0)
        assert ready, "nothing arrived"
        if kind == socket.SOCK_DGRAM:
            ready[0].recvfrom(16)
        else:
            ready[0].accept()[0].close()
        return members.index(ready[0])
    finally:
        client.close()


@pytest.mark.parametrize("kind", [pytest.param(socket.SOCK_STREAM, id="tcp__syn_steered_by_ip_header"),
                                  pytest.param(socket.SOCK_DGRAM, id="udp__datagram_steered_by_ip_header")])
def test_same_client_address__same_worker__affinity_across_workers(kind):
    """SO_ATTACH_REUSEPORT_CBPF (socket(7)) picks the worker from the client's address."""
    members = group(socket.AF_INET, kind, 3)
    try:
        steering.attach(members[0], 4, 3)
        sources = [f"127.0.0.{i}" for i in range(2, 14)]
        seen = {source: {landing(members, source) for _ in range(3)} for source in sources}
        assert all(len(workers) == 1 for workers in seen.values())  # every connection of a client: one worker
        assert {source: workers.pop() for source, workers in seen.items()} == {
            source: steering.worker_for(source, 3) for source in sources
        }
        assert len({steering.worker_for(s, 3) for s in sources}) > 1  # and clients are spread
    finally:
        for sock in members:
            sock.close()


def test_ipv6_program_is_accepted_and_steers():
    members = group(socket.AF_INET6, socket.SOCK_STREAM, 2)
    try:
        steering.attach(members[1], 6, 2)
        assert landing(members, "::1") == steering.worker_for("::1", 2)
        steering.detach(members[0])  # back to the 4-tuple hash: still served
        landing(members, "::1")
    finally:
        for sock in members:
            sock.close()


@pytest.mark.parametrize(("family", "length"), [pytest.param(4, 5, id="ipv4__one_load"),
                                                pytest.param(6, 14, id="ipv6__four_words_folded")])
def test_program_shape(family, length):
    program = steering.client_hash_program(family, 4)
    assert len(program) == length and program[-2] == (0x94, 0, 0, 4) and program[-1][0] == 0x16

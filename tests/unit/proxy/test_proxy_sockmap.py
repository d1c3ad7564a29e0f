"""The sockmap path: the verdict program as assembled, loaded by this kernel, and the relay
behaviours on connections the kernel relays (bulk first, so the program has them).

Runs on uvloop, on loopback, with real sockets. Loading needs root (CAP_BPF, CAP_NET_ADMIN):
skipped without it, a failure under CI=true.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import socket
import struct
import time

import pytest
from support.proxy_loopback import on_uvloop, relay_to, reset_connection
from support.sockmap import require_sockmap
from support.wait import DEADLINE, until

from kubeport.proxy.config import ProxyConfig, ProxyConfigError
from kubeport.proxy.relay import sockmap
from kubeport.proxy.relay.sockmap import Insn, SockmapUnavailable, decode, encode, open_sockmap, verdict_program

PEERS, COUNTS = 7, 9

#: the program for peers=7, counts=9, one instruction a row: (code, dst, src, off, imm).
EXPECTED = [
    (0xBF, 6, 1, 0, 0),     # r6 = r1 (skb)
    (0x61, 2, 6, 0, 0),     # r2 = skb->len
    (0x55, 2, 0, 2, 0),     # if r2 != 0 goto +2
    (0xB7, 0, 0, 0, 0),     # r0 = SK_DROP (a FIN without data)
    (0x95, 0, 0, 0, 0),     # exit
    (0x85, 0, 0, 0, 46),    # call bpf_get_socket_cookie
    (0x7B, 10, 0, -8, 0),   # *(u64 *)(r10 - 8) = r0
    (0x18, 1, 1, 0, COUNTS),  # r1 = map fd (BPF_PSEUDO_MAP_FD)
    (0x00, 0, 0, 0, 0),     # second half of the 64-bit load
    (0xBF, 2, 10, 0, 0),    # r2 = r10
    (0x07, 2, 0, 0, -8),    # r2 += -8
    (0x85, 0, 0, 0, 1),     # call bpf_map_lookup_elem
    (0x15, 0, 0, 4, 0),     # if r0 == 0 goto +4
    (0x61, 1, 6, 0, 0),     # r1 = skb->len
    (0x79, 2, 0, 0, 0),     # r2 = *(u64 *)(r0 + 0)
    (0x0F, 2, 1, 0, 0),     # r2 += r1
    (0x7B, 0, 2, 0, 0),     # *(u64 *)(r0 + 0) = r2
    (0xBF, 1, 6, 0, 0),     # r1 = skb
    (0x18, 2, 1, 0, PEERS),  # r2 = peers map
    (0x00, 0, 0, 0, 0),
    (0xBF, 3, 10, 0, 0),    # r3 = r10
    (0x07, 3, 0, 0, -8),    # r3 += -8 (&cookie)
    (0xB7, 4, 0, 0, 0),     # r4 = 0: the peer's egress
    (0x85, 0, 0, 0, 72),    # call bpf_sk_redirect_hash
    (0x95, 0, 0, 0, 0),     # exit
]


def test_the_verdict_program_decodes_to_the_expected_instructions():
    assert decode(encode(verdict_program(PEERS, COUNTS))) == [Insn(*row) for row in EXPECTED]


def test_encoding__registers_share_one_byte_and_offsets_are_signed():
    assert encode([Insn(0x7B, 10, 0, -8, 0)]) == bytes([0x7B, 0x0A]) + struct.pack("<hi", -8, 0)
    assert encode([Insn(0x18, 1, 1, 0, 5)])[1] == 0x11


def test_the_program_loads_and_attaches_on_this_kernel():
    require_sockmap()
    maps = sockmap.Sockmap(16)
    try:
        assert maps.program > 0
    finally:
        maps.close()


# A map the kernel refuses for its size (EINVAL): without the host's CAP_BPF, bpf(2) says EPERM first.
KERNEL_REFUSES_THE_MAP = pytest.mark.host_privileges("bpf(2) reaching the map's checks (CAP_BPF of the host)")


@pytest.mark.parametrize(("mode", "capacity", "line"), [
    ("splice", 16, "splice (chosen)"),
    pytest.param("auto", 0, "splice (sockmap unavailable: bpf(2): Invalid argument)", marks=KERNEL_REFUSES_THE_MAP),
])
def test_open_sockmap__splice_chosen_or_fallen_back_to(mode, capacity, line):
    assert open_sockmap(mode, capacity) == (None, line)


@KERNEL_REFUSES_THE_MAP
def test_open_sockmap__sockmap_demanded_and_refused_is_an_error():
    with pytest.raises(SockmapUnavailable, match="Invalid argument"):
        open_sockmap("sockmap", 0)


def test_open_sockmap__auto_uses_it_where_it_loads():
    require_sockmap()
    maps, line = open_sockmap("auto", 16)
    maps.close()
    assert line == "sockmap"


def test_config__tcp_relay_is_one_of_three():
    with pytest.raises(ProxyConfigError, match="tcp_relay: must be auto, sockmap or splice, got 'kernel'"):
        ProxyConfig(tcp_relay="kernel")


# --- the relay on the sockmap path ---------------------------------------------------------

BULK = 4 << 20


def pattern(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


async def read_exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    return await asyncio.wait_for(reader.readexactly(n), DEADLINE)


def sockmap_relay(backend, **config):
    require_sockmap()
    return relay_to(backend, tcp_relay="sockmap", **config)


async def in_kernel(relay, directions: int) -> None:
    await until(lambda: relay.ctx.kernel.taken >= directions, f"{directions} directions in the kernel")


@on_uvloop
async def test_bulk_both_ways_byte_exact_and_counted():
    size = 32 << 20
    up, down = pattern(size, 1), pattern(size, 2)
    results: list[bytes] = []

    async def backend(reader, writer):
        writer.write(down)
        data = await asyncio.wait_for(reader.readexactly(size), DEADLINE)
        await writer.drain()
        results.append(hashlib.sha256(data).digest())
        writer.close()

    async with sockmap_relay(backend) as relay:
        reader, writer = await asyncio.open_connection(*relay.address)
        writer.write(up)
        got = await read_exactly(reader, size)
        await until(lambda: results, "the backend's digest")
        assert hashlib.sha256(got).digest() == hashlib.sha256(down).digest()
        assert results == [hashlib.sha256(up).digest()]
        assert await asyncio.wait_for(reader.read(), DEADLINE) == b""
        writer.close()
        await until(lambda: relay.stats.active == 0, "the relay to close")
        assert relay.ctx.kernel.taken == 2
        assert (relay.stats.bytes_to_backend, relay.stats.bytes_to_client) == (size, size)


@on_uvloop
async def test_half_close__client_fin_after_bulk__the_response_still_arrives():
    request = pattern(BULK, 3)

    async def backend(reader, writer):
        got = await reader.read()  # until the client's FIN, passed on by the relay
        writer.write(b"got %d" % len(got) + hashlib.sha256(got).digest())
        await writer.drain()
        writer.close()

    async with sockmap_relay(backend) as relay:
        reader, writer = await asyncio.open_connection(*relay.address)
        writer.write(request)
        await in_kernel(relay, 1)
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), DEADLINE)
        assert answer == b"got %d" % BULK + hashlib.sha256(request).digest()
        writer.close()
        await until(lambda: relay.stats.active == 0, "the relay to close")
        assert relay.stats.bytes_to_backend == BULK


@on_uvloop
async def test_half_close__backend_fin_after_bulk__the_request_still_arrives():
    greeting = pattern(BULK, 4)
    received = asyncio.get_running_loop().create_future()

    async def backend(reader, writer):
        writer.write(greeting)
        writer.write_eof()  # done talking, still listening
        received.set_result(await reader.read())
        writer.close()

    async with sockmap_relay(backend) as relay:
        reader, writer = await asyncio.open_connection(*relay.address)
        assert await asyncio.wait_for(reader.read(), DEADLINE) == greeting  # then the EOF
        assert relay.ctx.kernel.taken >= 1
        writer.write(b"after your FIN")
        writer.write_eof()
        assert await asyncio.wait_for(received, DEADLINE) == b"after your FIN"
        writer.close()


@on_uvloop
async def test_backend_reset_after_bulk__the_client_gets_a_reset():
    async def backend(reader, writer):
        writer.write(pattern(BULK, 5))
        await writer.drain()
        await reader.readexactly(4)
        reset_connection(writer)

    async with sockmap_relay(backend) as relay:
        reader, writer = await asyncio.open_connection(*relay.address)
        await read_exactly(reader, BULK)
        assert relay.ctx.kernel.taken >= 1
        writer.write(b"kill")
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(), DEADLINE)
        writer.close()
        await until(lambda: relay.stats.active == 0, "the relay to close")


@on_uvloop
async def test_client_reset_after_bulk__the_backend_gets_a_reset():
    outcome = asyncio.get_running_loop().create_future()

    async def backend(reader, writer):
        writer.write(pattern(BULK, 6))
        try:
            await reader.read()
            outcome.set_result("eof")
        except ConnectionResetError:
            outcome.set_result("reset")

    async with sockmap_relay(backend) as relay:
        reader, writer = await asyncio.open_connection(*relay.address)
        await read_exactly(reader, BULK)
        assert relay.ctx.kernel.taken >= 1
        reset_connection(writer)
        assert await asyncio.wait_for(outcome, DEADLINE) == "reset"


@on_uvloop
async def test_slow_reader__the_kernel_queue_stays_bounded_and_nothing_is_lost():
    """Unchecked, the psock queue of a destination that does not read grows without limit
    (850 MB in 3 s on 6.18): the sweep pauses the source instead."""
    total = 256 << 20
    chunk = pattern(1 << 20, 7)

    async def backend(reader, writer):
        for _ in range(total >> 20):
            writer.write(chunk)
            await writer.drain()
            await asyncio.sleep(0)  # the relay shares this loop: let it sweep (a yield, not a wait)
        writer.close()

    async with sockmap_relay(backend) as relay:
        client = socket.create_connection(relay.address)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        client.setblocking(False)
        await until(lambda: relay.ctx.kernel.pauses, "the kernel relay to pause the backend")
        (conn,) = relay.ctx.conns
        down = conn.down
        taken = relay.ctx.kernel.sockmap.counted(down.cookie)
        # Paused: what the kernel took is the limit, one sweep of arrivals and socket buffers.
        await until(lambda: relay.ctx.kernel.sockmap.counted(down.cookie) == taken or None,
                    "the count to stand still")
        print(f"taken while paused: {taken >> 20} MiB")
        assert taken < 48 << 20
        loop = asyncio.get_running_loop()
        digest = hashlib.sha256()
        received = 0
        while received < total:
            data = await asyncio.wait_for(loop.sock_recv(client, 1 << 20), DEADLINE)
            assert data, "stream ended early"
            digest.update(data)
            received += len(data)
        assert digest.digest() == hashlib.sha256(chunk * (total >> 20)).digest()
        client.close()
        await until(lambda: relay.stats.active == 0, "the relay to close")
        assert relay.stats.bytes_to_client == total


class _Overcounting:
    """The relay's sockmap, reporting 100 bytes more for each direction than its program
    counted: bytes the kernel took and then lost on the way to the destination."""

    def __init__(self, real) -> None:
        self.real = real

    def __getattr__(self, name):
        return getattr(self.real, name)

    def counted(self, src_cookie: int) -> int:
        return self.real.counted(src_cookie) + 100

    def all_counted(self) -> dict[int, int]:
        return {key: count + 100 for key, count in self.real.all_counted().items()}


@on_uvloop
async def test_counted_bytes_that_never_arrive__the_connection_is_reset_not_hung():
    async def backend(reader, writer):
        writer.write(pattern(BULK, 10))
        await writer.drain()
        writer.close()  # the FIN: the direction ends once its destination has every counted byte

    async with sockmap_relay(backend) as relay:
        kernel = relay.ctx.kernel
        kernel.sockmap = _Overcounting(kernel.sockmap)
        kernel.lost_after = 0.2
        reader, writer = await asyncio.open_connection(*relay.address)
        received = 0
        with pytest.raises(ConnectionResetError):
            while data := await asyncio.wait_for(reader.read(1 << 20), DEADLINE):
                received += len(data)
        assert received <= BULK
        assert kernel.lost == 1
        writer.close()
        await until(lambda: relay.stats.active == 0, "the relay to close")


class _Undercounting(_Overcounting):
    """Reports 100 bytes fewer than the program counted: bytes the kernel took off the source
    without running the program on them, as a pause can (KernelRelays)."""

    def counted(self, src_cookie: int) -> int:
        return self.real.counted(src_cookie) - 100

    def all_counted(self) -> dict[int, int]:
        return {key: count - 100 for key, count in self.real.all_counted().items()}


@on_uvloop
async def test_a_pause_that_dropped_bytes__the_connection_is_reset_not_spliced_with_a_hole():
    chunk = pattern(1 << 20, 11)

    async def backend(reader, writer):
        for _ in range(64):
            writer.write(chunk)
            await writer.drain()
            await asyncio.sleep(0)
        writer.close()

    async with sockmap_relay(backend) as relay:
        kernel = relay.ctx.kernel
        kernel.sockmap = _Undercounting(kernel.sockmap)
        client = socket.create_connection(relay.address)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        client.setblocking(False)
        await until(lambda: kernel.pauses, "the kernel relay to pause the backend")
        loop = asyncio.get_running_loop()
        with pytest.raises(ConnectionResetError):
            while await asyncio.wait_for(loop.sock_recv(client, 1 << 20), DEADLINE):
                pass
        assert kernel.lost == 1
        client.close()
        await until(lambda: relay.stats.active == 0, "the relay to close")


@pytest.mark.parametrize("in_sockmap", [False, True])
def test_bytes_consumed_is_what_left_the_receive_queue(in_sockmap):
    """copied_seq, read even where SIOCINQ answers for the psock (a socket in a sockmap)."""
    if in_sockmap:
        require_sockmap()
    server = socket.create_server(("127.0.0.1", 0))
    sender = socket.create_connection(server.getsockname())
    receiver, _ = server.accept()
    maps = sockmap.Sockmap(16) if in_sockmap else None
    try:
        if maps:
            maps.link(sockmap.cookie(sender), receiver.fileno())  # receiver: a peer, as a destination is
        sender.sendall(b"x" * 5000)
        assert receiver.recv(1000, socket.MSG_WAITALL) == b"x" * 1000
        deadline = time.monotonic() + DEADLINE
        while sockmap._queued(receiver) < 4000:  # loopback: the rest is there, or about to be
            assert time.monotonic() < deadline, "the rest of the bytes to arrive"
        assert sockmap.bytes_consumed(receiver) == 1000
        sender.shutdown(socket.SHUT_WR)
        assert receiver.recv(8192, socket.MSG_WAITALL) == b"x" * 4000
        assert sockmap.bytes_consumed(receiver) in (5000, 5001)  # the FIN: see bytes_consumed
    finally:
        if maps:
            maps.close()
        for sock in (sender, receiver, server):
            sock.close()


@on_uvloop
async def test_small_exchanges_stay_here__only_bulk_goes_to_the_kernel():
    async def backend(reader, writer):
        writer.write(await reader.read())
        writer.close()

    async with sockmap_relay(backend) as relay:
        for size in (10, 1000, 60_000):
            assert await _echo(relay.address, pattern(size, size)) == pattern(size, size)
        assert relay.ctx.kernel.taken == 0
        payload = pattern(BULK, 8)
        assert await _echo(relay.address, payload) == payload
        assert relay.ctx.kernel.taken >= 1
        assert relay.ctx.pipes.created <= 1  # at most the direction whose source was never emptied


async def _echo(address, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(*address)
    writer.write(payload)
    writer.write_eof()
    try:
        return await asyncio.wait_for(reader.read(), DEADLINE)
    finally:
        writer.close()


def test_one_batch_lookup_reads_every_directions_count():
    require_sockmap()
    maps = sockmap.Sockmap(1024)
    listener = socket.create_server(("127.0.0.1", 0))
    held = []
    try:
        cookies = set()
        for _ in range(300):
            client = socket.create_connection(listener.getsockname())
            accepted, _ = listener.accept()
            held += [client, accepted]
            maps.link(sockmap.cookie(client), accepted.fileno())
            cookies.add(sockmap.cookie(client))
        assert maps.all_counted() == dict.fromkeys(cookies, 0)
    finally:
        for sock in held:
            sock.close()
        listener.close()
        maps.close()


@on_uvloop
async def test_bytes_the_kernel_relays_are_counted_while_the_connection_is_open():
    size = 8 << 20
    hold = asyncio.Event()

    async def backend(reader, writer):
        writer.write(pattern(size, 9))
        await writer.drain()
        await hold.wait()
        writer.close()

    async with sockmap_relay(backend) as relay:
        try:
            reader, writer = await asyncio.open_connection(*relay.address)
            await read_exactly(reader, size)
            assert relay.ctx.kernel.taken >= 1
            await until(lambda: relay.stats.bytes_to_client == size, "the counter to catch up (one sweep)")
            assert relay.stats.active == 1
            writer.close()
        finally:
            hold.set()

"""Asking one upstream one question over UDP, and the query sent upstream.

UDP: one connected socket per upstream (:class:`UdpChannel`), queries multiplexed by random
ID, answers matched by ID and question; an ICMP error fails every query waiting on it at
once. TCP, on reused connections: :mod:`.upstream_tcp`. No timeouts here: the caller bounds
every ask.
"""

from __future__ import annotations

import asyncio
import secrets

from kubeport.dns.wire import CD, HEADER, RD, opt_record

Upstream = tuple[str, int]


def upstream_query(query_id: int, question: bytes, *, do: bool, cd: bool, udp_size: int) -> bytes:
    header = HEADER.pack(query_id, RD | (CD if cd else 0), 1, 0, 0, 1)
    return header + question + opt_record(udp_size, do)


class UdpChannel(asyncio.DatagramProtocol):
    """A connected UDP socket to one upstream; answers matched by ID and question."""

    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None
        self.pending: dict[int, tuple[bytes, asyncio.Future[bytes]]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: object) -> None:
        if len(data) < 12:
            return
        held = self.pending.get((data[0] << 8) | data[1])
        if held is None:
            return
        question, future = held
        if data[12 : 12 + len(question)].lower() == question.lower() and not future.done():
            future.set_result(data)

    def error_received(self, exc: Exception) -> None:
        # ICMP port unreachable and the like: fail every waiting query now, not at the timeout.
        for _, future in self.pending.values():
            if not future.done():
                future.set_exception(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.error_received(exc or ConnectionError("upstream socket closed"))

    async def ask(self, question: bytes, *, do: bool, cd: bool, udp_size: int) -> bytes:
        query_id = secrets.randbits(16)
        while query_id in self.pending:
            query_id = secrets.randbits(16)
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.pending[query_id] = (question, future)
        try:
            if self.transport is None:
                raise ConnectionError("upstream socket closed")
            self.transport.sendto(upstream_query(query_id, question, do=do, cd=cd, udp_size=udp_size))
            return await future
        finally:
            del self.pending[query_id]


async def open_udp_channel(upstream: Upstream) -> UdpChannel:
    _, channel = await asyncio.get_running_loop().create_datagram_endpoint(UdpChannel, remote_addr=upstream)
    return channel


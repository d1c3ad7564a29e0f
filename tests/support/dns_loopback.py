"""A DNS port on loopback for the forwarder's tests, answering as a test says."""

from __future__ import annotations

import asyncio
from typing import Callable


class LoopbackDnsPort:
    """UDP and TCP on one 127.0.0.1 port, each query answered by ``reply(proto, packet)``
    (None: no answer): the serving half of the tests' fake upstreams."""

    def __init__(self, reply: Callable[[str, bytes], bytes | None]):
        self._reply = reply
        self.port = 0
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        reply = self._reply

        class Udp(asyncio.DatagramProtocol):
            def connection_made(self, transport):
                self.transport = transport

            def datagram_received(self, data, addr):
                answer = reply("udp", data)
                if answer is not None:
                    self.transport.sendto(answer, addr)

        async def tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    size = int.from_bytes(await reader.readexactly(2), "big")
                    answer = reply("tcp", await reader.readexactly(size))
                    if answer is not None:
                        writer.write(len(answer).to_bytes(2, "big") + answer)
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()

        for _ in range(20):  # a free UDP port may be taken for TCP: try another
            self._udp, _ = await loop.create_datagram_endpoint(Udp, local_addr=("127.0.0.1", 0))
            self.port = self._udp.get_extra_info("sockname")[1]
            try:
                self._tcp = await asyncio.start_server(tcp, "127.0.0.1", self.port)
                return
            except OSError:
                self._udp.close()
        raise RuntimeError("no port free for both UDP and TCP")

    async def stop(self) -> None:
        self._udp.close()
        self._tcp.close()
        await self._tcp.wait_closed()

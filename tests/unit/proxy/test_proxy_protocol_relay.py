"""The PROXY protocol v2 header through a Proxier on loopback: a backend reads the header and
says what it parsed; a service without the annotation sends none; switching the annotation
takes effect for the next connection."""

from __future__ import annotations

import asyncio
import ipaddress
import struct

from support.proxy_loopback import apply_states, on_uvloop, running_proxier, web
from support.wait import DEADLINE

SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
VIP = "127.0.0.47"  # a VIP of these tests only


async def _parsing_backend(servers: list) -> int:
    """Answers "<source> <destination>" from the header, or "none" and the first bytes without one."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await reader.readexactly(16)
            if first[:12] != SIGNATURE:
                writer.write(b"none " + first + b"\n")
            else:
                assert first[12] == 0x21, first
                (length,) = struct.unpack(">H", first[14:16])
                body = await reader.readexactly(length)
                size = {0x11: 4, 0x21: 16}[first[13]]
                src, dst = ipaddress.ip_address(body[:size]), ipaddress.ip_address(body[size:2 * size])
                sport, dport = struct.unpack(">HH", body[2 * size:2 * size + 4])
                request = await reader.readline()
                writer.write(f"{src}:{sport} {dst}:{dport} ".encode() + request)
            await writer.drain()
            await reader.read()  # the client closes first: no TIME_WAIT left on the frontend's address
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    servers.append(server)
    return server.sockets[0].getsockname()[1]


async def _ask(host: str, port_: int) -> tuple[str, str]:
    """(what the backend answered, the client's own address as host:port)."""
    reader, writer = await asyncio.open_connection(host, port_)
    try:
        client = "{}:{}".format(*writer.get_extra_info("sockname"))
        writer.write(b"0123456789abcdef\n")
        return (await asyncio.wait_for(reader.readline(), DEADLINE)).decode().strip(), client
    finally:
        writer.close()


@on_uvloop
async def test_the_backend_reads_client_and_dialled_address():
    async with running_proxier() as (proxier, _, _, backends):
        backend = await _parsing_backend(backends.servers)
        await apply_states(proxier, [web(backend, vip=VIP, node_port=30480, proxy_protocol=True)])
        answer, client = await _ask(VIP, 80)
        assert answer == f"{client} {VIP}:80 0123456789abcdef"
        answer, client = await _ask("127.0.0.1", 30480)  # a NodePort: the node address dialled
        assert answer == f"{client} 127.0.0.1:30480 0123456789abcdef"


@on_uvloop
async def test_without_the_annotation_no_header__and_a_switch_applies_to_new_connections():
    async with running_proxier() as (proxier, _, _, backends):
        backend = await _parsing_backend(backends.servers)
        first = await apply_states(proxier, [web(backend, vip=VIP)])
        assert (await _ask(VIP, 80))[0] == "none 0123456789abcdef"
        await apply_states(proxier, [web(backend, vip=VIP, proxy_protocol=True)], previous=first)
        answer, client = await _ask(VIP, 80)
        assert answer == f"{client} {VIP}:80 0123456789abcdef"

"""The DNS server on real loopback sockets, asked by real `dig`, forwarding to a fake
upstream on another loopback port. Nothing leaves 127.0.0.1."""

from __future__ import annotations

import asyncio
import random
import re
import shutil
import socket
import struct
import time
from dataclasses import dataclass

import pytest
from dnslib import QTYPE, RCODE, RR, SOA, A, DNSRecord

from kubeport.dns.config import DnsConfig
from kubeport.dns.server import DnsServer

from support.api import cluster_state, endpoint_slice, service, to_model
from support.dns_loopback import LoopbackDnsPort
from support.wait import until
from support.zonetext import header_only, question

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("dig") is None, reason="dig (bind9-dnsutils) is not installed"),
]

HTTP = [{"name": "http", "port": 80}]
CLUSTER = [
    service("web", clusterIP="10.96.0.20", clusterIPs=["10.96.0.20", "fd00:10:96::20"], ports=HTTP),
    endpoint_slice("web", ports=HTTP, endpoints=["10.244.0.5"]),
    service("big", clusterIP="None", ports=HTTP),
    endpoint_slice("big", ports=HTTP, endpoints=[f"10.244.{i // 250 + 1}.{i % 250 + 1}" for i in range(300)]),
    service("ext", type="ExternalName", externalName="www.example.test"),
]
WEB = "web.default.svc.cluster.local"


class FakeUpstream:
    """A tiny authoritative server for example.test on UDP and TCP of one loopback port."""

    def __init__(self, records: dict[str, list[str]], *, tc_over_udp: frozenset[str] = frozenset()):
        self.records = records
        self.tc_over_udp = tc_over_udp
        self.queries: list[tuple[str, str]] = []
        self.port = 0
        self._serving = LoopbackDnsPort(lambda proto, packet: self.reply(packet, proto))

    def reply(self, packet: bytes, proto: str) -> bytes:
        request = DNSRecord.parse(packet)
        name = str(request.q.qname).rstrip(".").lower()
        self.queries.append((proto, name))
        reply = request.reply()
        if proto == "udp" and name in self.tc_over_udp:
            reply.header.tc = 1
            return bytes(reply.pack())
        if name in self.records:
            for address in self.records[name] if request.q.qtype == QTYPE.A else ():
                reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(address), ttl=300))
        else:
            reply.header.rcode = RCODE.NXDOMAIN
        if not reply.rr:
            reply.add_auth(RR("example.test.", QTYPE.SOA, ttl=60, rdata=SOA(
                "ns.example.test.", "admin.example.test.", (1, 7200, 1800, 86400, 60))))
        return bytes(reply.pack())

    async def start(self) -> None:
        await self._serving.start()
        self.port = self._serving.port

    async def stop(self) -> None:
        await self._serving.stop()


@dataclass
class Dig:
    status: str
    flags: set[str]
    answer: list[str]
    output: str


async def dig(port: int, *args: str) -> Dig:
    process = await asyncio.create_subprocess_exec(
        "dig", "@127.0.0.1", "-p", str(port), "+time=3", "+tries=1", "+noall", "+comments", "+answer", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output = (await asyncio.wait_for(process.communicate(), 30))[0].decode()
    status = re.findall(r"status: (\w+)", output)
    flags = re.findall(r";; flags: ([a-z ]+);", output)
    answer = [" ".join(line.split()) for line in output.splitlines() if line and not line.startswith(";")]
    return Dig(status[-1] if status else "", set(flags[-1].split()) if flags else set(), answer, output)


async def start_server(upstream_ports: list[int], objects=CLUSTER, **config) -> tuple[DnsServer, object]:
    server = DnsServer(DnsConfig(addresses=("127.0.0.1",), port=0,
                                 upstreams=tuple(("127.0.0.1", p) for p in upstream_ports), **config))
    await server.start()
    state = cluster_state(objects)
    server.apply(state.commit())
    return server, state


@pytest.fixture
async def upstream():
    fake = FakeUpstream({"www.example.test": ["203.0.113.7"],
                         "big.example.test": [f"203.0.113.{i}" for i in range(1, 101)]},
                        tc_over_udp=frozenset({"big.example.test"}))
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def dns(upstream):
    server, state = await start_server([upstream.port])
    server.state = state
    yield server
    await server.stop()


@pytest.mark.parametrize("args, expected", [
    pytest.param([WEB, "A"], [f"{WEB}. 5 IN A 10.96.0.20"], id="a"),
    pytest.param([WEB, "AAAA"], [f"{WEB}. 5 IN AAAA fd00:10:96::20"], id="aaaa"),
    pytest.param([f"_http._tcp.{WEB}", "SRV"], [f"_http._tcp.{WEB}. 5 IN SRV 0 50 80 {WEB}."], id="srv"),
    pytest.param(["-x", "10.96.0.20"], [f"20.0.96.10.in-addr.arpa. 5 IN PTR {WEB}."], id="ptr"),
    pytest.param(["-x", "10.244.0.5"], [f"5.0.244.10.in-addr.arpa. 5 IN PTR 10-244-0-5.{WEB}."], id="ptr_endpoint"),
    pytest.param(["ext.default.svc.cluster.local", "CNAME"],
                 ["ext.default.svc.cluster.local. 5 IN CNAME www.example.test."], id="cname"),
    pytest.param(["dns-version.cluster.local", "TXT"], ['dns-version.cluster.local. 28800 IN TXT "1.1.0"'], id="txt"),
    pytest.param(["+tcp", WEB, "A"], [f"{WEB}. 5 IN A 10.96.0.20"], id="a_over_tcp"),
    pytest.param(["+tcp", f"_http._tcp.{WEB}", "SRV"], [f"_http._tcp.{WEB}. 5 IN SRV 0 50 80 {WEB}."],
                 id="srv_over_tcp"),
    pytest.param(["+tcp", "-x", "10.96.0.20"], [f"20.0.96.10.in-addr.arpa. 5 IN PTR {WEB}."], id="ptr_over_tcp"),
])
async def test_dig_record_families(dns: DnsServer, args: list[str], expected: list[str]) -> None:
    result = await dig(dns.port, *args)
    assert result.status == "NOERROR" and "aa" in result.flags, result.output
    assert result.answer == expected


async def test_nxdomain(dns: DnsServer) -> None:
    result = await dig(dns.port, "nope.default.svc.cluster.local", "A")
    assert result.status == "NXDOMAIN" and result.answer == []


async def test_headless_with_300_endpoints_truncates_over_udp_and_succeeds_over_tcp(dns: DnsServer) -> None:
    name = "big.default.svc.cluster.local"
    udp = await dig(dns.port, "+ignore", "+noedns", name, "A")
    assert "tc" in udp.flags and 0 < len(udp.answer) < 300, udp.output
    assert len((await dig(dns.port, "+tcp", name, "A")).answer) == 300
    retried = await dig(dns.port, name, "A")  # dig retries over TCP on TC by itself
    assert len(retried.answer) == 300 and "Truncated, retrying in TCP mode" in retried.output


async def test_external_names_are_forwarded_and_cached(dns: DnsServer, upstream: FakeUpstream) -> None:
    first = await dig(dns.port, "www.example.test", "A")
    assert first.status == "NOERROR" and first.answer == ["www.example.test. 300 IN A 203.0.113.7"]
    asked = len(upstream.queries)
    again = await dig(dns.port, "www.example.test", "A")
    assert again.answer[0].startswith("www.example.test. ") and again.answer[0].endswith(" IN A 203.0.113.7")
    assert len(upstream.queries) == asked  # from the cache
    assert dns.stats.cache_hits["success"] == 1
    assert len(dns.answerer.forwarded) == 1  # kept encoded: the repeat was not even parsed
    over_tcp = await dig(dns.port, "+tcp", "www.example.test", "A")
    assert over_tcp.answer[0].endswith(" IN A 203.0.113.7") and len(upstream.queries) == asked
    missing = await dig(dns.port, "nothing.example.test", "A")
    assert missing.status == "NXDOMAIN"


async def test_externalname_target_resolved_upstream(dns: DnsServer) -> None:
    result = await dig(dns.port, "ext.default.svc.cluster.local", "A")
    assert result.status == "NOERROR"
    assert result.answer == ["ext.default.svc.cluster.local. 5 IN CNAME www.example.test.",
                             "www.example.test. 300 IN A 203.0.113.7"]


async def test_upstream_truncation_is_retried_over_tcp(dns: DnsServer, upstream: FakeUpstream) -> None:
    # asked over UDP (a query over TCP goes upstream over TCP at once); dig retries over TCP
    result = await dig(dns.port, "big.example.test", "A")
    assert len(result.answer) == 100
    assert ("udp", "big.example.test") in upstream.queries and ("tcp", "big.example.test") in upstream.queries


def _unused_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def test_failover_to_the_next_upstream(upstream: FakeUpstream) -> None:
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # bound, never answers: a timeout
    silent.bind(("127.0.0.1", 0))
    try:
        server, _ = await start_server([_unused_udp_port(), silent.getsockname()[1], upstream.port],
                                       upstream_timeout=0.3)
        try:
            # CoreDNS policy random: each query tries the three in a random order, the refusing
            # one left at once, the silent one after its timeout; so at most one timeout each
            result = await dig(server.port, "www.example.test", "A")
            assert result.answer == ["www.example.test. 300 IN A 203.0.113.7"]
            assert sum(server.stats.forward_timeouts.values()) <= 1
            missing = await dig(server.port, "nothing.example.test", "A")
            assert missing.status == "NXDOMAIN" and sum(server.stats.forward_timeouts.values()) <= 2
        finally:
            await server.stop()
    finally:
        silent.close()


async def test_servfail_when_every_upstream_fails() -> None:
    server, _ = await start_server([_unused_udp_port()], upstream_timeout=0.3)
    try:
        assert (await dig(server.port, "www.example.test", "A")).status == "SERVFAIL"
    finally:
        await server.stop()


async def test_malformed_packets_keep_the_server_answering(dns: DnsServer) -> None:
    rng = random.Random(7)
    packets = [b"\x12", b"\x12\x34\x01\x00\x00\x01",  # no header: dropped
               struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + b"\xc0\x0c\x00\x01\x00\x01",  # pointer loop
               struct.pack("!HHHHHH", 0x1235, 0x0100, 0, 0, 0, 0),  # qdcount 0
               struct.pack("!HHHHHH", 0x1236, 0x0100, 2, 0, 0, 0) + b"\x00\x00\x01\x00\x01" * 2]  # qdcount 2
    for _ in range(50):
        packet = bytearray(rng.randbytes(rng.randrange(12, 300)))
        packet[2] &= 0x07
        packets.append(bytes(packet))
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.setblocking(False)
        client.connect(("127.0.0.1", dns.port))
        for packet in packets:
            await loop.sock_sendall(client, packet)
            if len(packet) < 12:
                continue
            reply = await asyncio.wait_for(loop.sock_recv(client, 65535), 5)
            query_id, flags, rcode, _ = header_only(reply)
            assert query_id == struct.unpack("!H", packet[:2])[0] and flags & 0x8000
            if packet in packets[2:5]:
                assert rcode == "FORMERR"
    assert (await dig(dns.port, WEB, "A")).answer == [f"{WEB}. 5 IN A 10.96.0.20"]


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    size = int.from_bytes(await asyncio.wait_for(reader.readexactly(2), 5), "big")
    return await asyncio.wait_for(reader.readexactly(size), 5)


async def test_tcp_pipelining__rfc7766(dns: DnsServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", dns.port)
    names = [WEB, "www.example.test", "nope.default.svc.cluster.local"]
    writer.write(b"".join(len(q).to_bytes(2, "big") + q for q in
                          (question(name, query_id=100 + i) for i, name in enumerate(names))))
    replies = {header_only(frame)[0]: header_only(frame)[2] for frame in
               [await _read_frame(reader) for _ in names]}
    assert replies == {100: "NOERROR", 101: "NOERROR", 102: "NXDOMAIN"}
    writer.close()


async def test_tcp_idle_connections_are_closed(upstream: FakeUpstream) -> None:
    server, _ = await start_server([upstream.port], tcp_idle_timeout=0.3)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(len(q := question(WEB)).to_bytes(2, "big") + q)
        assert header_only(await _read_frame(reader))[2] == "NOERROR"
        started = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # EOF: the server closed it
        assert time.monotonic() - started < 3
        writer.close()
    finally:
        await server.stop()


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), 5) == b""
    except ConnectionResetError:
        return True  # aborted: a reset is as good as an EOF


async def _answered(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
    writer.write(len(q := question(WEB)).to_bytes(2, "big") + q)
    return header_only(await _read_frame(reader))[2]


async def test_tcp_connection_cap__none_idle__the_new_one_is_closed(upstream: FakeUpstream) -> None:
    server, _ = await start_server([upstream.port], max_tcp_connections=2, tcp_read_timeout=30)
    try:
        held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
        for _, held_writer in held:
            held_writer.write(b"\x00")  # a message begun: not idle
        await until(lambda: all(c.buffer for c in server._connections), "both messages begun")
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        assert await _closed_by_server(reader)
        assert server.stats.tcp_rejected == 1
        for _, held_writer in held:
            held_writer.close()
        writer.close()
    finally:
        await server.stop()


async def test_tcp_connection_cap__the_connection_idle_longest_makes_room(upstream: FakeUpstream) -> None:
    server, _ = await start_server([upstream.port], max_tcp_connections=2, tcp_read_timeout=30)
    try:
        oldest = await asyncio.open_connection("127.0.0.1", server.port)
        newer = await asyncio.open_connection("127.0.0.1", server.port)
        assert await _answered(*newer) == "NOERROR"  # its activity is the latest
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        assert await _closed_by_server(oldest[0])
        assert await _answered(reader, writer) == "NOERROR"
        assert await _answered(*newer) == "NOERROR"
        assert (server.stats.tcp_evicted, server.stats.tcp_rejected) == (1, 0)
        for _, open_writer in (oldest, newer, (reader, writer)):
            open_writer.close()
    finally:
        await server.stop()


async def test_tcp_connections_per_client_address_are_capped__none_idle__the_new_one_is_closed(
        upstream: FakeUpstream) -> None:
    server, _ = await start_server([upstream.port], max_tcp_connections_per_client=2, tcp_read_timeout=30)
    try:
        held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
        for _, held_writer in held:
            held_writer.write(b"\x00")  # a message begun: not idle
        await until(lambda: all(c.buffer for c in server._connections), "both messages begun")
        third = await asyncio.open_connection("127.0.0.1", server.port)
        assert await _closed_by_server(third[0])
        other = await asyncio.open_connection("127.0.0.1", server.port, local_addr=("127.0.0.2", 0))
        assert await _answered(*other) == "NOERROR"  # another address has its own share
        assert (server.stats.tcp_evicted, server.stats.tcp_rejected) == (0, 1)
        for _, open_writer in (*held, third, other):
            open_writer.close()
    finally:
        await server.stop()


async def test_tcp_connections_per_client__its_own_connection_idle_longest_makes_room(upstream: FakeUpstream) -> None:
    """A pod holding its whole share idle still gets its next TCP query answered."""
    server, _ = await start_server([upstream.port], max_tcp_connections_per_client=2, tcp_read_timeout=30)
    try:
        oldest = await asyncio.open_connection("127.0.0.1", server.port)
        newer = await asyncio.open_connection("127.0.0.1", server.port)
        assert await _answered(*newer) == "NOERROR"  # its activity is the latest
        other = await asyncio.open_connection("127.0.0.1", server.port, local_addr=("127.0.0.2", 0))
        await until(lambda: len(server._connections) == 3, "three connections open")
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        assert await _answered(reader, writer) == "NOERROR"
        assert await _closed_by_server(oldest[0])
        assert await _answered(*newer) == "NOERROR"
        assert await _answered(*other) == "NOERROR"  # another client's idle one is not its to take
        assert (server.stats.tcp_evicted, server.stats.tcp_rejected) == (1, 0)
        for _, open_writer in (oldest, newer, other, (reader, writer)):
            open_writer.close()
    finally:
        await server.stop()


@pytest.mark.parametrize("sent", [
    pytest.param(b"", id="nothing_after_the_connect"),
    pytest.param(b"\x00\x21\x12", id="a_message_begun"),
])
async def test_tcp_message_not_whole_within_the_read_deadline__closed(upstream: FakeUpstream, sent: bytes) -> None:
    server, _ = await start_server([upstream.port], tcp_read_timeout=0.3)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(sent)
        started = time.monotonic()
        assert await _closed_by_server(reader)
        assert time.monotonic() - started < 3
        assert server.stats.tcp_read_timeouts == 1
        writer.close()
    finally:
        await server.stop()


async def test_tcp_trickling_client_is_closed_though_each_byte_is_activity(upstream: FakeUpstream) -> None:
    """One byte every 0.1 s keeps the idle timer fresh; the read deadline still ends it."""
    server, _ = await start_server([upstream.port], tcp_read_timeout=0.5, tcp_idle_timeout=10)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        assert await _answered(reader, writer) == "NOERROR"
        frame = len(q := question(WEB)).to_bytes(2, "big") + q
        started = time.monotonic()
        closed = asyncio.ensure_future(_closed_by_server(reader))
        for byte in frame:
            if closed.done():
                break
            writer.write(bytes((byte,)))
            await asyncio.wait([closed], timeout=0.1)  # the trickle's pace, not a wait for a state
        assert await closed
        assert time.monotonic() - started < 3
        writer.close()
    finally:
        await server.stop()


async def test_changes_are_answered_at_once(dns: DnsServer) -> None:
    assert (await dig(dns.port, WEB, "A")).answer == [f"{WEB}. 5 IN A 10.96.0.20"]
    dns.state.upsert(to_model(service("web", clusterIP="10.96.0.21", ports=HTTP)))
    snapshot = dns.state.commit()
    started = time.perf_counter()
    dns.apply(snapshot)
    result = await dig(dns.port, WEB, "A")
    elapsed = time.perf_counter() - started
    assert result.answer == [f"{WEB}. 5 IN A 10.96.0.21"]
    print(f"\nfreshness through dig (includes starting dig): {elapsed * 1000:.1f} ms")


async def test_stop_closes_the_listeners(upstream: FakeUpstream) -> None:
    server, _ = await start_server([upstream.port])
    port = server.port
    await server.stop()
    with pytest.raises(OSError):
        await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)


async def test_lame_duck_keeps_answering_until_it_ends(upstream: FakeUpstream) -> None:
    server, _ = await start_server([upstream.port])
    stopping = asyncio.create_task(server.stop(lame_duck=1.0))
    try:
        assert (await dig(server.port, WEB, "A")).answer == [f"{WEB}. 5 IN A 10.96.0.20"]
    finally:
        await stopping
    assert (await dig(server.port, "+time=1", WEB, "A")).status == ""  # nobody answers any more


async def test_forwarded_answer_keeps_the_query_letter_case(dns: DnsServer) -> None:
    result = await dig(dns.port, "WWW.Example.TEST", "A")
    assert result.answer == ["WWW.Example.TEST. 300 IN A 203.0.113.7"]


async def test_query_over_tcp_is_forwarded_over_tcp__forward_transport(dns: DnsServer, upstream: FakeUpstream) -> None:
    """CoreDNS forward uses the transport the query arrived on (plugin/pkg/proxy/connect.go Connect)."""
    result = await dig(dns.port, "+tcp", "api.example.test", "A")
    assert result.status == "NXDOMAIN"
    assert [proto for proto, name in upstream.queries if name == "api.example.test"] == ["tcp"]


async def test_headless_answers_turn_between_queries__coredns_loadbalance(dns: DnsServer) -> None:
    """CoreDNS plugin/loadbalance/loadbalance.go roundRobin shuffles the address records of each reply."""
    name = "big.default.svc.cluster.local"
    over_tcp = [await dig(dns.port, "+tcp", name, "A") for _ in range(3)]
    assert len({result.answer[0] for result in over_tcp}) == 3
    assert all(sorted(result.answer) == sorted(over_tcp[0].answer) for result in over_tcp)
    over_udp = [await dig(dns.port, "+ignore", "+noedns", name, "A") for _ in range(3)]
    assert len({result.answer[0] for result in over_udp}) == 3 and all("tc" in r.flags for r in over_udp)


async def test_one_lost_upstream_packet_is_retried_not_servfail__forward_deadline() -> None:
    """CoreDNS forward asks again after read_timeout until its 5 s deadline (plugin/forward/forward.go
    ServeDNS)."""
    fake = FakeUpstream({"www.example.test": ["203.0.113.7"]})
    lost: list[bytes] = []

    class Lossy(asyncio.DatagramProtocol):
        def connection_made(self, transport):
            self.transport = transport

        def datagram_received(self, data, addr):
            reply = fake.reply(data, "udp")
            if not lost and fake.queries[-1][1] == "www.example.test":
                lost.append(data)  # the first query for the name never gets its answer
                return
            self.transport.sendto(reply, addr)

    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(Lossy, local_addr=("127.0.0.1", 0))
    try:
        server, _ = await start_server([transport.get_extra_info("sockname")[1]], upstream_timeout=0.3)
        try:
            result = await dig(server.port, "www.example.test", "A")
            assert result.status == "NOERROR" and result.answer == ["www.example.test. 300 IN A 203.0.113.7"]
            assert lost and sum(server.stats.forward_timeouts.values()) == 1
        finally:
            await server.stop()
    finally:
        transport.close()

"""The UDP drain loops: every queued datagram answered in one readiness event (up to the batch
cap), malformed packets dropped or answered without stopping the loop, send failures
counted, forwards answered later to the right client; kept answers (cluster and relayed,
TTLs aged) served by the batched loop as Answerer.answer serves them, counted once each.
The portable loop runs on a fake socket; the recvmmsg/sendmmsg loop on real sockets on
127.0.0.1 and ::1."""

from __future__ import annotations

import socket
import struct
from collections import deque

import pytest
from dnslib import QTYPE, RR, A, DNSRecord

from kubeport.dns import batch_io
from kubeport.dns.answer import Answerer, Forward
from kubeport.dns.config import DnsConfig
from kubeport.dns.forward.forwarder import Forwarder, UpstreamCache, without_opt
from kubeport.dns.records import RecordIndex
from kubeport.dns.stats import DnsStats
from kubeport.dns.udp import BatchedUdpListener, UdpListener, bind_udp, udp_listener

from support.api import endpoint_slice, service, snapshot_of
from support.zonetext import header_only, question, read_reply

WEB = "web.default.svc.cluster.local."
BIG = "big.default.svc.cluster.local."
CLIENT = ("10.0.0.7", 40000)
HTTP = [{"name": "http", "port": 80}]


def make_answerer(stats: DnsStats | None = None) -> Answerer:
    objects = [
        service("web", clusterIP="10.96.0.20", ports=HTTP),
        service("big", clusterIP="None", ports=HTTP),
        endpoint_slice("big", ports=HTTP, endpoints=[f"10.244.{i // 250 + 1}.{i % 250 + 1}" for i in range(300)]),
    ]
    return Answerer(DnsConfig(upstreams=()), RecordIndex.build(snapshot_of(objects), now=1), stats)


class FakeSocket:
    def __init__(self, datagrams: list[tuple[bytes, tuple]], *, send_error: OSError | None = None,
                 receive_error: OSError | None = None):
        self.inbox = deque(datagrams)
        self.sent: list[tuple[bytes, tuple]] = []
        self.send_error = send_error
        self.receive_error = receive_error

    def recvfrom(self, size: int) -> tuple[bytes, tuple]:
        if self.receive_error is not None:
            raise self.receive_error
        if not self.inbox:
            raise BlockingIOError
        return self.inbox.popleft()

    def sendto(self, data: bytes, address: tuple) -> int:
        if self.send_error is not None:
            raise self.send_error
        self.sent.append((data, address))
        return len(data)


class Forwards:
    def __init__(self) -> None:
        self.calls: list[tuple[Forward, object]] = []

    def __call__(self, forward: Forward, send) -> None:
        self.calls.append((forward, send))


def portable(datagrams, **kwargs) -> tuple[UdpListener, FakeSocket, Forwards, DnsStats]:
    sock = FakeSocket(datagrams, **{k: v for k, v in kwargs.items() if k.endswith("_error")})
    stats, forwards = DnsStats(), Forwards()
    listener = UdpListener(sock, make_answerer(stats), forwards, stats, **{k: v for k, v in kwargs.items()
                                                                       if k == "batch"})
    return listener, sock, forwards, stats


def test_drain_answers_everything_queued_then_stops_at_eagain() -> None:
    listener, sock, _, _ = portable([(question(WEB, query_id=i), (CLIENT[0], 40000 + i)) for i in range(5)])
    assert listener.drain() == 5
    assert [(read_reply(data).id, address[1]) for data, address in sock.sent] == [(i, 40000 + i) for i in range(5)]
    assert listener.drain() == 0


def test_drain_stops_at_the_batch_cap_the_rest_waits_for_the_next_event() -> None:
    listener, sock, _, _ = portable([(question(WEB), CLIENT)] * 5, batch=2)
    assert (listener.drain(), listener.drain(), listener.drain(), listener.drain()) == (2, 2, 1, 0)
    assert len(sock.sent) == 5


@pytest.mark.parametrize("packet, answered", [
    pytest.param(b"", False, id="empty_dropped"),
    pytest.param(b"\x12\x34\x01\x00", False, id="short_header_dropped"),
    pytest.param(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x05ab", True, id="cut_question_formerr"),
    pytest.param(b"\x12\x34\x81\x00" + bytes(8), False, id="response_dropped"),
])
def test_malformed_packets_do_not_stop_the_loop(packet: bytes, answered: bool) -> None:
    listener, sock, _, stats = portable([(packet, CLIENT), (question(WEB, query_id=77), CLIENT)])
    assert listener.drain() == 2
    replies = [data for data, _ in sock.sent]
    assert read_reply(replies[-1]).id == 77
    assert len(replies) == 1 + answered and stats.dropped == (not answered)
    if answered:
        assert header_only(replies[0])[2] == "FORMERR"


def test_a_refused_send_is_counted_and_the_loop_goes_on() -> None:
    listener, _, _, stats = portable([(question(WEB), CLIENT)] * 3, send_error=BlockingIOError())
    assert listener.drain() == 3 and stats.send_failed == 3


def test_a_receive_error_ends_the_batch_without_raising() -> None:
    listener, _, _, _ = portable([], receive_error=ConnectionRefusedError())
    assert listener.drain() == 0


def test_a_forward_is_answered_later_to_its_client_unless_closed() -> None:
    listener, sock, forwards, _ = portable([(question("www.example.com."), CLIENT)])
    listener.drain()
    (forward, send), = forwards.calls
    assert forward.labels == (b"www", b"example", b"com") and sock.sent == []
    send(b"answer")
    assert sock.sent == [(b"answer", CLIENT)]
    listener.closed = True
    send(b"late")
    assert len(sock.sent) == 1


# --- recvmmsg/sendmmsg on real sockets -----------------------------------------------------------

needs_mmsg = pytest.mark.skipif(not batch_io.available(), reason="recvmmsg/sendmmsg need 64-bit Linux")


class Loopback:
    def __init__(self, host: str = "127.0.0.1", slots: int = 64, batch: int = 128):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.server = bind_udp(host, 0, family)
        self.stats, self.forwards = DnsStats(), Forwards()
        self.listener = BatchedUdpListener(self.server, make_answerer(self.stats), self.forwards, self.stats,
                                           slots=slots, batch=batch)
        self.clients = [socket.socket(family, socket.SOCK_DGRAM) for _ in range(2)]
        for client in self.clients:
            client.bind((host, 0))
            client.settimeout(2)

    def send(self, client: int, packet: bytes) -> None:
        self.clients[client].sendto(packet, self.server.getsockname())

    def replies(self, client: int, count: int) -> list[bytes]:
        return [self.clients[client].recv(65535) for _ in range(count)]

    def close(self) -> None:
        for sock in (self.server, *self.clients):
            sock.close()


@pytest.fixture
def loopback():
    rig = Loopback()
    yield rig
    rig.close()


@needs_mmsg
def test_batched_replies_reach_each_client_with_its_id(loopback: Loopback) -> None:
    for i in range(10):
        loopback.send(i % 2, question(WEB, query_id=i))
    assert loopback.listener.drain() == 10
    assert sorted(read_reply(r).id for r in loopback.replies(0, 5)) == [0, 2, 4, 6, 8]
    assert sorted(read_reply(r).id for r in loopback.replies(1, 5)) == [1, 3, 5, 7, 9]


@needs_mmsg
def test_batched_drain_reads_several_batches_up_to_the_cap() -> None:
    rig = Loopback(slots=8, batch=20)
    try:
        for i in range(30):
            rig.send(0, question(WEB, query_id=i))
        assert (rig.listener.drain(), rig.listener.drain(), rig.listener.drain()) == (24, 6, 0)
        assert sorted(read_reply(r).id for r in rig.replies(0, 30)) == list(range(30))
    finally:
        rig.close()


@needs_mmsg
def test_oversized_query__formerr_as_miekg__and_the_next_answered(loopback: Loopback) -> None:
    loopback.send(0, question(WEB, query_id=1) + bytes(batch_io.SLOT_SIZE))
    loopback.send(0, question(WEB, query_id=2))
    assert loopback.listener.drain() == 2
    first, second = loopback.replies(0, 2)
    assert header_only(first)[:1] == (1,) and header_only(first)[2] == "FORMERR"
    assert read_reply(second).id == 2
    assert (loopback.stats.oversized, loopback.stats.dropped) == (1, 0)


@needs_mmsg
def test_oversized_response__dropped(loopback: Loopback) -> None:
    response = bytearray(question(WEB, query_id=1) + bytes(batch_io.SLOT_SIZE))
    response[2] |= 0x80
    loopback.send(0, bytes(response))
    loopback.send(0, question(WEB, query_id=2))
    assert loopback.listener.drain() == 2
    assert read_reply(loopback.replies(0, 1)[0]).id == 2
    assert (loopback.stats.oversized, loopback.stats.dropped) == (0, 1)


def test_oversized_query__formerr_on_the_portable_loop_too() -> None:
    listener, sock, _, stats = portable([(question(WEB, query_id=9) + bytes(batch_io.SLOT_SIZE), CLIENT)])
    assert listener.drain() == 1
    assert header_only(sock.sent[0][0])[2] == "FORMERR" and stats.oversized == 1


@needs_mmsg
def test_reply_bigger_than_a_slot_goes_out_whole(loopback: Loopback) -> None:
    loopback.send(0, question(BIG, query_id=5, edns=65000))
    loopback.send(0, question(WEB, query_id=6))
    loopback.listener.drain()
    replies = {read_reply(r).id: r for r in loopback.replies(0, 2)}
    assert len(replies[5]) > batch_io.SLOT_SIZE and read_reply(replies[5]).records == 300
    assert read_reply(replies[6]).answer == (f"{WEB[:-1]}. 5 IN A 10.96.0.20",)


@needs_mmsg
def test_batched_forward_is_answered_to_the_sender_address(loopback: Loopback) -> None:
    loopback.send(1, question("www.example.com."))
    loopback.listener.drain()
    (_, send), = loopback.forwards.calls
    send(b"later")
    assert loopback.replies(1, 1) == [b"later"]


@needs_mmsg
def test_batched_over_ipv6_loopback() -> None:
    try:
        rig = Loopback("::1")
    except OSError as error:
        pytest.skip(f"no IPv6 loopback: {error}")
    try:
        rig.send(0, question(WEB, query_id=3))
        rig.send(1, question("www.example.com."))
        assert rig.listener.drain() == 2
        assert read_reply(rig.replies(0, 1)[0]).id == 3
        (_, send), = rig.forwards.calls
        send(b"v6")
        assert rig.replies(1, 1) == [b"v6"]
    finally:
        rig.close()


@pytest.mark.parametrize("name, expected", [
    pytest.param(struct.pack("=H", socket.AF_INET) + struct.pack("!H", 5353) + socket.inet_aton("10.1.2.3")
                 + bytes(8), ("10.1.2.3", 5353), id="ipv4"),
    pytest.param(struct.pack("=H", socket.AF_INET6) + struct.pack("!HI", 53, 7)
                 + socket.inet_pton(socket.AF_INET6, "fd00::1") + struct.pack("=I", 2), ("fd00::1", 53, 7, 2),
                 id="ipv6"),
])
def test_received_sockaddr_as_a_sendto_address(name: bytes, expected: tuple) -> None:
    assert batch_io.address_of(name) == expected


def test_the_batched_listener_is_chosen_where_available() -> None:
    sock = bind_udp("127.0.0.1", 0, socket.AF_INET)
    try:
        listener = udp_listener(sock, make_answerer(), Forwards(), DnsStats())
        assert isinstance(listener, BatchedUdpListener) == batch_io.available()
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1 and not sock.getblocking()
    finally:
        sock.close()


@needs_mmsg
@pytest.mark.parametrize("results, failed, calls", [
    pytest.param([5], 0, [(0, 5)], id="all_sent_in_one_call"),
    pytest.param([2, 2], 1, [(0, 5), (3, 2)], id="one_refused_the_rest_still_sent"),
    pytest.param([-1, -1, 3], 2, [(0, 5), (1, 4), (2, 3)], id="first_ones_refused"),
    pytest.param([-1, -1, -1, -1, -1], 5, [(0, 5), (1, 4), (2, 3), (3, 2), (4, 1)], id="all_refused"),
])
def test_sendmmsg_skips_a_refused_reply_and_sends_the_rest(results: list[int], failed: int,
                                                            calls: list[tuple[int, int]]) -> None:
    sock = bind_udp("127.0.0.1", 0, socket.AF_INET)
    try:
        seen: list[tuple[int, int]] = []
        addresses: list[int] = []

        def fake_sendmmsg(fd: int, address: int, count: int, flags: int) -> int:
            addresses.append(address)
            seen.append((count, results[len(seen)]))
            return results[len(seen) - 1]

        io = batch_io.BatchIO(sock.fileno(), 8, sendmmsg=fake_sendmmsg)
        assert io.send(5) == failed
        # Each call starts where the previous one stopped: after the sent replies and the refused one.
        starts = [(address - addresses[0]) // batch_io.MMSGHDR_SIZE for address in addresses]
        assert list(zip(starts, (count for count, _ in seen))) == calls
    finally:
        sock.close()


def test_a_failing_answer_costs_only_its_own_query() -> None:
    listener, sock, _, stats = portable([(question(WEB, query_id=1), CLIENT), (question(WEB, query_id=2), CLIENT)])
    answer = listener.answerer.answer
    calls = []

    def flaky(packet: bytes, tcp: bool = False):
        calls.append(packet)
        if len(calls) == 1:
            raise RuntimeError("bug")
        return answer(packet, tcp)

    listener.answerer.answer = flaky  # type: ignore[method-assign]
    assert listener.drain() == 2
    assert [read_reply(data).id for data, _ in sock.sent] == [2] and stats.dropped == 1


@needs_mmsg
@pytest.mark.parametrize("step", ["cached", "build"])
def test_batched_failing_answer_costs_only_its_own_query(loopback: Loopback, step: str) -> None:
    original = getattr(loopback.listener.answerer, step)

    def flaky(packet: bytes, tcp: bool = False):
        if packet[:2] == b"\x00\x01":
            raise RuntimeError("bug")
        return original(packet, tcp)

    setattr(loopback.listener.answerer, step, flaky)
    loopback.send(0, question(WEB, query_id=1))
    loopback.send(0, question(WEB, query_id=2))
    assert loopback.listener.drain() == 2
    assert read_reply(loopback.replies(0, 1)[0]).id == 2 and loopback.stats.dropped == 1


@needs_mmsg
def test_batched_replies_after_a_gap_reach_their_own_clients(loopback: Loopback) -> None:
    """A query without a reply in the batch (a forward, an oversized response) moves the
    replies after it to other headers; each still reaches its client with its ID, built or
    kept, and the next batch is answered from the headers as set up."""
    loopback.send(0, question(WEB, query_id=1))  # built, then kept
    loopback.send(1, question("www.example.com."))  # forwarded: no reply in the batch
    loopback.send(1, question(WEB, query_id=3))
    oversized_response = bytearray(question(WEB, query_id=4) + bytes(batch_io.SLOT_SIZE))
    oversized_response[2] |= 0x80
    loopback.send(0, bytes(oversized_response))  # dropped
    loopback.send(0, question(f"big.{WEB.split('.', 1)[1]}", query_id=5, edns=65000))  # bigger than a slot
    loopback.send(1, question(WEB, query_id=6))
    assert loopback.listener.drain() == 6
    first = [read_reply(r) for r in loopback.replies(0, 2)]
    assert [r.id for r in first] == [1, 5] and first[1].records == 300
    assert [read_reply(r).id for r in loopback.replies(1, 2)] == [3, 6]
    assert not loopback.listener.io.moved
    for i in range(4):
        loopback.send(i % 2, question(WEB, query_id=10 + i))
    assert loopback.listener.drain() == 4
    assert sorted(read_reply(r).id for r in loopback.replies(0, 2) + loopback.replies(1, 2)) == [10, 11, 12, 13]
    assert loopback.stats.dropped == 1 and loopback.stats.send_failed == 0


# --- the batched listener's own serving of kept answers ---------------------------------------------


@needs_mmsg
def test_batched_kept_answers_are_the_replies_answer_gives_counted_once_each(loopback: Loopback) -> None:
    plain, edns = question(WEB, query_id=1), question(WEB, query_id=2, edns=1232)
    expected = {1: make_answerer().answer(plain), 2: make_answerer().answer(edns)}
    for packet in (plain, edns):  # built, then kept
        loopback.send(0, packet)
    loopback.listener.drain()
    loopback.replies(0, 2)
    for i in range(3, 13):  # served kept: plain ones by the loop, EDNS ones through Answerer.cached
        loopback.send(0, question(WEB, query_id=i, edns=1232 if i % 2 else None))
    assert loopback.listener.drain() == 10
    for reply in loopback.replies(0, 10):
        query_id = header_only(reply)[0]
        assert reply[2:] == expected[2 if query_id % 2 else 1][2:]
    stats = loopback.stats
    assert stats.requests == {("udp", "A"): 12} and stats.responses == {"NOERROR": 12}
    assert stats.answer_cache_hits == 10 and stats.answer_cache_misses == 2
    assert sum(stats.sizes.values()) == 12


@needs_mmsg
def test_batched_query_equal_to_a_kept_edns_key_is_not_served_its_answer(loopback: Loopback) -> None:
    """Without its ID, a canonical EDNS query's key reads as header, question and 6 bytes of
    its OPT: a packet of exactly those bytes has ARCOUNT 1 and a cut record, FORMERR."""
    edns = question(WEB, query_id=1, edns=1232)
    loopback.send(0, edns)
    loopback.listener.drain()
    loopback.replies(0, 1)
    end = edns.find(b"\x00", 12) + 5
    lookalike = b"\x00\x07" + edns[2:end] + edns[end + 3 : end + 9]
    assert lookalike[2:] in loopback.listener.answerer.cache.entries
    loopback.send(0, lookalike)
    loopback.listener.drain()
    assert header_only(loopback.replies(0, 1)[0])[::2] == (7, "FORMERR")


@needs_mmsg
@pytest.mark.parametrize("packet, answered", [
    pytest.param(b"", False, id="empty_dropped"),
    pytest.param(b"\x12\x34\x01\x00", False, id="short_header_dropped"),
    pytest.param(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x05ab", True, id="cut_question_formerr"),
    pytest.param(b"\x12\x34\x81\x00" + bytes(8), False, id="response_dropped"),
])
def test_batched_malformed_packets_do_not_stop_the_batch(loopback: Loopback, packet: bytes, answered: bool) -> None:
    loopback.send(0, question(WEB, query_id=76))  # kept: the one after the bad packet is served kept
    loopback.listener.drain()
    loopback.replies(0, 1)
    loopback.send(0, packet)
    loopback.send(0, question(WEB, query_id=77))
    assert loopback.listener.drain() == 2
    replies = loopback.replies(0, 1 + answered)
    assert read_reply(replies[-1]).id == 77
    assert loopback.stats.dropped == (not answered)
    if answered:
        assert header_only(replies[0])[2] == "FORMERR"


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def kept_upstream_answer(answerer: Answerer, name: str, addresses: list[str], now: float, ttl: int = 300) -> None:
    """An upstream answer in the upstream cache, relayed once: kept encoded for the next query."""
    forward = answerer.answer(question(name))
    assert isinstance(forward, Forward)
    upstream = DNSRecord.question(name, "A").reply()
    for address in addresses:
        upstream.add_answer(RR(name, QTYPE.A, rdata=A(address), ttl=ttl))
    cache = UpstreamCache(10, max_ttl=3600, max_negative_ttl=1800)
    key = Forwarder.cache_key(forward.question, do=False, cd=False)
    cache.put(key, *without_opt(bytes(upstream.pack())), now=now)
    stored = cache.lookup(key, now)
    assert stored is not None
    answerer.relay_stored(forward, stored, now)


@needs_mmsg
def test_batched_kept_upstream_answer_ages_by_whole_seconds_and_ends_with_its_ttl() -> None:
    rig = Loopback()
    clock = Clock()
    answerer = Answerer(DnsConfig(upstreams=()), make_answerer().index, rig.stats, clock=clock)
    rig.listener.answerer = answerer
    try:
        kept_upstream_answer(answerer, "www.example.com.", ["203.0.113.1"], clock.now)

        def ttls(count: int) -> list[str]:
            for i in range(count):
                rig.send(0, question("www.example.com.", query_id=i))
            assert rig.listener.drain() == count
            replies = sorted(rig.replies(0, count), key=lambda reply: header_only(reply)[0])
            return [read_reply(reply).answer[0].split()[1] for reply in replies]

        assert ttls(3) == ["300"] * 3
        clock.now += 1.5  # the next second: aged once, then served as aged
        assert ttls(3) == ["299"] * 3
        clock.now += 0.4
        assert ttls(2) == ["299"] * 2
        clock.now += 298.1  # the upstream answer's end: asked upstream again
        rig.send(0, question("www.example.com.", query_id=9))
        rig.listener.drain()
        assert len(rig.forwards.calls) == 1
        assert rig.stats.cache_hits == {"success": 8}
    finally:
        rig.close()


@needs_mmsg
def test_batched_kept_upstream_answer_with_several_addresses_turns_per_reply() -> None:
    rig = Loopback()
    clock = Clock()
    answerer = Answerer(DnsConfig(upstreams=()), make_answerer().index, rig.stats, clock=clock)
    rig.listener.answerer = answerer
    try:
        kept_upstream_answer(answerer, "www.example.com.", ["203.0.113.1", "203.0.113.2"], clock.now)
        for i in range(4):
            rig.send(0, question("www.example.com.", query_id=i))
        assert rig.listener.drain() == 4
        replies = sorted(rig.replies(0, 4), key=lambda reply: header_only(reply)[0])
        firsts = [read_reply(reply).answer[0].split()[-1] for reply in replies]
        assert sorted(set(firsts)) == ["203.0.113.1", "203.0.113.2"] and firsts[0] != firsts[1]
    finally:
        rig.close()

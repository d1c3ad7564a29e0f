"""The sk_lookup program: its key's encoding and instructions, the kernel's verifier on it, and
traffic steered by it to one TCP listener and one UDP socket.

Traffic runs only in a network namespace each scenario makes for itself: this file, run as a
script by ``in_new_netns``, unshares its network namespace first (checking it left the
test's), brings ``lo`` up, makes 10.96.0.0/16 and fd00:96::/64 local and attaches the
program there; it prints what it saw as JSON, which the test checks.

The kernel parts need root of the host (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN for the
namespace): marked host_privileges; where the kernel still refuses they are skipped, and fail
under CI=true.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import ipaddress
import json
import os
import select
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import IN_CI

from kubeport.proxy.relay import sklookup
from kubeport.proxy.relay.sklookup import (
    KEY_SIZE,
    SkLookup,
    decode_route_key,
    route_key,
    sk_lookup_program,
    sk_lookup_supported,
)
from kubeport.proxy.relay.sockmap import Insn, decode, encode

TCP, UDP = socket.IPPROTO_TCP, socket.IPPROTO_UDP
HERE = Path(__file__).resolve()
TESTS = HERE.parents[2]
IP_RECVORIGDSTADDR, IPV6_RECVORIGDSTADDR = 20, 74
ROUTES = 200

# --- encodings (pure) --------------------------------------------------------------------------


def port_bytes(port: int) -> bytes:
    return port.to_bytes(2, sys.byteorder)


@pytest.mark.parametrize(("address", "port", "protocol", "key"), [
    ("10.96.0.10", 53, UDP, bytes([10, 96, 0, 10]) + bytes(12) + port_bytes(53) + bytes([17, 2])),
    ("10.96.0.1", 443, TCP, bytes([10, 96, 0, 1]) + bytes(12) + port_bytes(443) + bytes([6, 2])),
    (ipaddress.IPv4Address("127.0.0.1"), 65535, 132, bytes([127, 0, 0, 1]) + bytes(12) + b"\xff\xff" + bytes([132, 2])),
    ("fd00:96::1", 80, TCP,
     bytes.fromhex("fd000096000000000000000000000001") + port_bytes(80) + bytes([6, 10])),
])
def test_route_key__address_in_network_order_then_host_order_port_protocol_and_family(address, port, protocol, key):
    assert route_key(address, port, protocol) == key
    assert len(key) == KEY_SIZE
    assert decode_route_key(key) == (str(ipaddress.ip_address(address)), port, protocol)


def test_route_key__the_family_tells_an_ipv4_address_from_the_ipv6_one_of_the_same_bytes():
    four, six = route_key("10.96.0.1", 80, TCP), route_key("a60:1::", 80, TCP)
    assert four[:19] == six[:19] and four != six
    assert decode_route_key(six) == ("a60:1::", 80, TCP)


@pytest.mark.parametrize(("args", "message"), [
    (("10.0.0.1", 0, TCP), "port out of range: 0"),
    (("10.0.0.1", 65536, TCP), "port out of range: 65536"),
    (("10.0.0.1", 80, 256), "protocol out of range: 256"),
    (("10.0.0.300", 80, TCP), "does not appear to be an IPv4 or IPv6 address"),
])
def test_route_key__refuses_what_it_cannot_encode(args, message):
    with pytest.raises(ValueError, match=message):
        route_key(*args)


# --- the program (pure) ------------------------------------------------------------------------

DESTINATIONS, SOCKETS = 7, 9


def test_the_program_calls_lookup_lookup_assign_release_and_always_returns_sk_pass():
    program = decode(encode(sk_lookup_program(DESTINATIONS, SOCKETS)))
    calls = [insn.imm for insn in program if insn.code == 0x85]
    assert calls == [1, 1, 124, 86]  # map_lookup_elem twice, sk_assign, sk_release
    maps = [insn.imm for insn in program if insn.code == 0x18]
    assert maps == [DESTINATIONS, SOCKETS]
    exits = [i for i, insn in enumerate(program) if insn.code == 0x95]
    assert len(exits) == 1 and program[exits[0] - 1] == Insn(0xB7, 0, 0, 0, 1)  # r0 = SK_PASS
    for i, insn in enumerate(program):  # every jump lands inside the program
        if insn.code in (0x15, 0x55, 0x05):
            assert 0 <= i + 1 + insn.off < len(program)


def test_the_program_builds_the_key_from_the_context_fields():
    program = sk_lookup_program(DESTINATIONS, SOCKETS)
    loads = [insn.off for insn in program if insn.code == 0x61 and insn.src == 6]
    # local_port, protocol, family, local_ip6[0..3], local_ip4 (offsetof in struct bpf_sk_lookup)
    assert loads == [60, 12, 8, 44, 48, 52, 56, 40]
    stores = {(insn.code, insn.off) for insn in program if insn.dst == 10 and insn.code in (0x63, 0x6B, 0x73)}
    assert stores >= {(0x6B, -8), (0x73, -6), (0x73, -5), (0x63, -24), (0x63, -12), (0x63, -28)}


# --- the kernel --------------------------------------------------------------------------------

KERNEL = pytest.mark.host_privileges("BPF sk_lookup programs and network namespaces")


def require_sklookup() -> None:
    """Skip where the program cannot be loaded; under CI=true fail instead."""
    if why := sk_lookup_supported():
        if IN_CI:
            pytest.fail(f"sk_lookup cannot run under CI=true: {why}")
        pytest.skip(f"no sk_lookup program here: {why}")


@KERNEL
def test_sk_lookup_supported__says_none_where_the_program_loads():
    require_sklookup()
    assert sk_lookup_supported() is None


@KERNEL
def test_the_verifier_refuses_the_program_without_its_sk_release():
    require_sklookup()
    with contextlib.closing(SkLookup.create(4, 2)) as lookup:
        program = sk_lookup_program(lookup.destinations, lookup.sockets)
        release = next(i for i, insn in enumerate(program) if insn.code == 0x85 and insn.imm == 86)
        program[release] = Insn(0xB7, 0, 0, 0, 0)  # the call made "r0 = 0": the socket's reference leaks
        with pytest.raises(sklookup.ProgramRejected, match="[Uu]nreleased reference"):
            sklookup.load_program(program)


@KERNEL
def test_routes_written_listed_and_removed():
    require_sklookup()
    with contextlib.closing(SkLookup.create(16, 4)) as lookup:
        lookup.route("10.96.0.1", 80, TCP, 0)
        lookup.route("fd00:96::1", 53, UDP, 1)
        lookup.route("10.96.0.1", 80, UDP, 1)
        lookup.route("10.96.0.1", 80, TCP, 3)  # rewritten
        assert lookup.routes() == {("10.96.0.1", 80, TCP): 3, ("fd00:96::1", 53, UDP): 1, ("10.96.0.1", 80, UDP): 1}
        assert lookup.unroute("10.96.0.1", 80, TCP) is True
        assert lookup.unroute("10.96.0.1", 80, TCP) is False
        lookup.route_many([("10.96.1.1", 1000 + i, TCP, i % 4) for i in range(10)])
        assert len(lookup.routes()) == 12
        assert lookup.routes()[("10.96.1.1", 1009, TCP)] == 1


@KERNEL
def test_the_routes_map_refuses_more_than_its_capacity():
    require_sklookup()
    with contextlib.closing(SkLookup.create(4, 1)) as lookup:
        for port in range(1, 5):
            lookup.route("10.96.0.1", port, TCP, 0)
        with pytest.raises(OSError) as raised:
            lookup.route("10.96.0.1", 5, TCP, 0)
        assert raised.value.errno == errno.E2BIG


@KERNEL
def test_50000_routes_from_python():
    """What the module's docstring reports, kept honest: 50,000 routes, one by one and batched."""
    require_sklookup()
    entries = [(ipaddress.IPv4Address(0x0A600000 + i // 8), 1 + i % 8, TCP if i % 2 else UDP, i % 4)
               for i in range(50_000)]
    with contextlib.closing(SkLookup.create(50_000, 4)) as lookup:
        started = time.perf_counter()
        for address, port, protocol, index in entries:
            lookup.route(address, port, protocol, index)
        one_by_one = time.perf_counter() - started
        assert len(lookup.routes()) == 50_000
    with contextlib.closing(SkLookup.create(50_000, 4)) as lookup:
        started = time.perf_counter()
        lookup.route_many(entries)
        batched = time.perf_counter() - started
        assert len(lookup.routes()) == 50_000
    print(f"50,000 routes: {one_by_one:.3f} s one by one, {batched:.3f} s batched")
    assert one_by_one < 30 and batched < 30


@KERNEL
def test_sockets_by_index_read_back_as_their_cookies_and_adopt_checks_what_it_takes():
    require_sklookup()
    with contextlib.closing(SkLookup.create(4, 2)) as lookup, socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        lookup.add_socket(1, listener)
        cookie = struct.unpack("Q", listener.getsockopt(socket.SOL_SOCKET, 57, 8))[0]  # SO_COOKIE
        assert (lookup.socket_cookie(0), lookup.socket_cookie(1)) == (None, cookie)
        lookup.remove_socket(1)
        assert lookup.socket_cookie(1) is None
        lookup.route("10.96.0.1", 80, TCP, 1)
        adopted = SkLookup.adopt({name: os.dup(fd) for name, fd in lookup.fds().items()})
        with contextlib.closing(adopted):
            assert adopted.routes() == {("10.96.0.1", 80, TCP): 1}
        swapped = {**lookup.fds(), "sockets": lookup.destinations}
        with pytest.raises(ValueError, match="sockets: map type 1"):
            SkLookup.adopt(swapped)


@KERNEL
def test_a_tcp_socket_that_never_listened_does_not_enter_the_sockmap():
    """``sock_map_sk_state_allowed`` (net/core/sock_map.c) takes TCP sockets established or
    listening; a socket in TCP_CLOSE is refused."""
    require_sklookup()
    with contextlib.closing(SkLookup.create(4, 2)) as lookup, socket.socket() as unbound:
        with pytest.raises(OSError) as raised:
            lookup.add_socket(0, unbound)
        assert raised.value.errno == errno.EOPNOTSUPP


def in_new_netns(scenario: str, **args) -> dict:
    """Run ``scenario`` in this file as a script in a network namespace of its own: its JSON answer."""
    require_sklookup()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    host_netns = os.stat("/proc/self/ns/net").st_ino
    done = subprocess.run([sys.executable, str(HERE), scenario, json.dumps({**args, "host_netns": host_netns})],
                          capture_output=True, text=True, timeout=120, env=env)
    if done.returncode != 0:
        pytest.fail(f"scenario {scenario} failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout)


def routed_addresses(family: int, count: int) -> list[tuple[str, int]]:
    """``count`` distinct (address, port): 10.96.x.y or fd00:96::x:y, ports 1000 up."""
    if family == 4:
        return [(f"10.96.{i // 100}.{i % 100 + 1}", 1000 + i) for i in range(count)]
    return [(str(ipaddress.IPv6Address(f"fd00:96::{i // 100:x}:{i % 100 + 1:x}")), 1000 + i) for i in range(count)]


@KERNEL
@pytest.mark.parametrize("family", [4, 6])
def test_connects_to_200_routes_land_on_one_listener_which_sees_the_dialled_address(family):
    seen = in_new_netns("tcp", family=family)
    targets = [list(target) for target in routed_addresses(family, ROUTES)]
    assert seen["accepted_locally"] == targets  # getsockname() of each accepted socket
    assert seen["dialled_by_client"] == targets  # the client's getpeername(): nothing rewritten
    assert seen["listener"][1] not in {port for _, port in targets}
    assert seen["unrouted"] == errno.ECONNREFUSED
    assert seen["udp_routed_to_the_listener"] == errno.ECONNREFUSED  # assign refused: the stack's lookup
    assert seen["after_unroute"] == errno.ECONNREFUSED
    assert seen["rerouted"] == targets[0]
    assert seen["listener_itself"] is True  # its own address and port still reach it


@KERNEL
@pytest.mark.parametrize("family", [4, 6])
def test_datagrams_to_200_routes_reach_one_udp_socket_with_their_original_destination(family):
    seen = in_new_netns("udp", family=family)
    targets = [list(target) for target in routed_addresses(family, ROUTES)]
    assert seen["received"] == [[f"{host} {port}", host, port] for host, port in targets]
    assert seen["socket_name"][0] == ("127.0.0.1" if family == 4 else "::1")  # its own, not the dialled
    assert seen["unrouted"] == errno.ECONNREFUSED  # ICMP port unreachable, as without the program
    assert seen["after_unroute"] == errno.ECONNREFUSED
    assert seen["reply_from"] == seen["socket_name"]  # a reply leaves from the socket's own address and port


@KERNEL
def test_descriptors_stay_the_same_whatever_the_number_of_routes():
    seen = in_new_netns("descriptors", counts=[0, ROUTES, 20_000])
    assert len(set(seen["descriptors"])) == 1, seen["descriptors"]
    assert seen["sampled"] == seen["expected"]


@KERNEL
def test_a_listener_in_a_reuseport_group_stands_for_its_group():
    seen = in_new_netns("reuseport", connects=64)
    assert sum(seen["accepted"]) == 64
    assert all(seen["accepted"]), seen  # both members got connections


@KERNEL
def test_ipv4_reaches_an_ipv6_listener_only_when_it_is_bound_to_the_wildcard():
    """``bpf_sk_assign`` takes an AF_INET6 socket for IPv4 when it is not IPV6_V6ONLY, and a bind
    to a specific IPv6 address sets that flag (``__inet6_bind``, net/ipv6/af_inet6.c)."""
    seen = in_new_netns("dual_stack")
    assert seen["wildcard"] == ["::ffff:10.96.0.7", 80]
    assert seen["loopback"] == errno.ECONNREFUSED


@KERNEL
def test_an_adopted_lookup_keeps_the_program_attached_and_closing_its_link_detaches():
    seen = in_new_netns("adopt")
    assert seen["through_adopted"] == ["10.96.0.1", 80]
    assert seen["after_detach"] == errno.ECONNREFUSED


# --- the scenarios, run in the child ------------------------------------------------------------

CLONE_NEWNET = 0x40000000


def enter_new_netns(host_netns: int) -> int:
    """unshare(CLONE_NEWNET), checked; lo up, the test's ranges local; the program's fd for attach."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
    if os.stat("/proc/self/ns/net").st_ino == host_netns:
        raise RuntimeError("still in the test's network namespace")
    for command in (["ip", "link", "set", "lo", "up"],
                    ["ip", "route", "add", "local", "10.96.0.0/16", "dev", "lo"],
                    ["ip", "-6", "route", "add", "local", "fd00:96::/64", "dev", "lo"]):
        subprocess.run(command, check=True)
    return os.open("/proc/self/ns/net", os.O_RDONLY)


def attached(netns: int, capacity: int = 1024) -> SkLookup:
    lookup = SkLookup.create(capacity, 8)
    lookup.attach(netns)
    return lookup


def loopback(family: int) -> tuple[int, str]:
    return (socket.AF_INET, "127.0.0.1") if family == 4 else (socket.AF_INET6, "::1")


def connect_errno(family: int, kind: int, target: tuple[str, int]) -> list | int:
    """The peer's (address, port) of a connect to target, or the errno; for UDP, a datagram
    sent and the error a receive then reports."""
    with socket.socket(loopback(family)[0], kind) as sock:
        sock.settimeout(2)
        try:
            sock.connect(target)
            if kind == socket.SOCK_DGRAM:
                sock.send(b"x")
                sock.recv(16)
            return list(sock.getpeername()[:2])
        except OSError as exc:
            return exc.errno


def scenario_tcp(netns: int, family: int) -> dict:
    af, host = loopback(family)
    lookup = attached(netns)
    listener = socket.socket(af)
    listener.bind((host, 0))
    listener.listen(1024)
    lookup.add_socket(0, listener)
    targets = routed_addresses(family, ROUTES)
    for address, port in targets:
        lookup.route(address, port, TCP, 0)
    lookup.route(*targets[0], UDP, 0)
    accepted, dialled = [], []
    for target in targets:
        with socket.create_connection(target, timeout=2) as client:
            dialled.append(list(client.getpeername()[:2]))
            conn, _ = listener.accept()
            with conn:
                accepted.append(list(conn.getsockname()[:2]))
    unrouted = (("10.96.250.1" if family == 4 else "fd00:96::fa:1"), 1000)
    seen = {
        "listener": list(listener.getsockname()[:2]),
        "accepted_locally": accepted,
        "dialled_by_client": dialled,
        "unrouted": connect_errno(family, socket.SOCK_STREAM, unrouted),
    }
    lookup.unroute(*targets[0], TCP)
    seen["udp_routed_to_the_listener"] = connect_errno(family, socket.SOCK_DGRAM, targets[0])
    seen["after_unroute"] = connect_errno(family, socket.SOCK_STREAM, targets[0])
    lookup.route(*targets[0], TCP, 0)
    seen["rerouted"] = connect_errno(family, socket.SOCK_STREAM, targets[0])
    listener.accept()[0].close()
    with socket.create_connection(listener.getsockname()[:2], timeout=2):
        listener.accept()[0].close()
        seen["listener_itself"] = True
    return seen


def original_destination(ancillary) -> tuple[str, int]:
    for level, kind, data in ancillary:
        if (level, kind) == (socket.IPPROTO_IP, IP_RECVORIGDSTADDR):
            port, packed = struct.unpack_from("!2xH4s", data)
            return str(ipaddress.IPv4Address(packed)), port
        if (level, kind) == (socket.IPPROTO_IPV6, IPV6_RECVORIGDSTADDR):
            port, packed = struct.unpack_from("!2xH4x16s", data)
            return str(ipaddress.IPv6Address(packed)), port
    raise AssertionError(f"no original destination in {ancillary}")


def scenario_udp(netns: int, family: int) -> dict:
    af, host = loopback(family)
    lookup = attached(netns)
    server = socket.socket(af, socket.SOCK_DGRAM)
    server.bind((host, 0))
    if family == 4:
        server.setsockopt(socket.IPPROTO_IP, IP_RECVORIGDSTADDR, 1)
    else:
        server.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVORIGDSTADDR, 1)
    server.settimeout(2)
    lookup.add_socket(0, server)
    targets = routed_addresses(family, ROUTES)
    for address, port in targets:
        lookup.route(address, port, UDP, 0)
    received = []
    with socket.socket(af, socket.SOCK_DGRAM) as client:
        client.settimeout(2)
        for address, port in targets:
            client.sendto(f"{address} {port}".encode(), (address, port))
            data, ancillary, _, sender = server.recvmsg(256, 256)
            received.append([data.decode(), *original_destination(ancillary)])
        server.sendto(b"reply", sender)
        _, reply_from = client.recvfrom(16)
    unrouted = (("10.96.250.1" if family == 4 else "fd00:96::fa:1"), 1000)
    seen = {
        "received": received,
        "socket_name": list(server.getsockname()[:2]),
        "reply_from": list(reply_from[:2]),
        "unrouted": connect_errno(family, socket.SOCK_DGRAM, unrouted),
    }
    lookup.unroute(*targets[0], UDP)
    seen["after_unroute"] = connect_errno(family, socket.SOCK_DGRAM, targets[0])
    return seen


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def scenario_descriptors(netns: int, counts: list[int]) -> dict:
    lookup = attached(netns, capacity=max(counts))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    lookup.add_socket(0, listener)
    targets = routed_addresses(4, max(counts))
    descriptors, done = [], 0
    for count in counts:
        for address, port in targets[done:count]:
            lookup.route(address, port % 65535 + 1, TCP, 0)
        done = count
        descriptors.append(open_descriptors())
    sampled, expected = [], []
    for address, port in targets[:: max(1, len(targets) // 20)]:
        with socket.create_connection((address, port % 65535 + 1), timeout=2):
            conn, _ = listener.accept()
            with conn:
                sampled.append(list(conn.getsockname()))
        expected.append([address, port % 65535 + 1])
    return {"descriptors": descriptors, "sampled": sampled, "expected": expected}


def scenario_reuseport(netns: int, connects: int) -> dict:
    lookup = attached(netns)
    members = []
    for _ in range(2):
        member = socket.socket()
        member.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        member.bind(("127.0.0.1", members[0].getsockname()[1] if members else 0))
        member.listen(connects)
        member.setblocking(False)
        members.append(member)
    lookup.add_socket(0, members[0])
    lookup.route("10.96.0.1", 80, TCP, 0)
    clients = [socket.create_connection(("10.96.0.1", 80), timeout=2) for _ in range(connects)]
    accepted = [0, 0]
    deadline = time.monotonic() + 5
    while sum(accepted) < connects and time.monotonic() < deadline:
        ready, _, _ = select.select(members, [], [], 0.5)
        for member in ready:
            with contextlib.suppress(BlockingIOError):
                member.accept()[0].close()
                accepted[members.index(member)] += 1
    for client in clients:
        client.close()
    return {"accepted": accepted}


def scenario_dual_stack(netns: int) -> dict:
    lookup = attached(netns)
    seen = {}
    for index, (name, host) in enumerate([("wildcard", "::"), ("loopback", "::1")]):
        listener = socket.socket(socket.AF_INET6)
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        listener.bind((host, 0))
        listener.listen(8)
        lookup.add_socket(index, listener)
        lookup.route(f"10.96.0.{7 + index}", 80, TCP, index)
        try:
            with socket.create_connection((f"10.96.0.{7 + index}", 80), timeout=2):
                conn, _ = listener.accept()
                with conn:
                    seen[name] = list(conn.getsockname()[:2])
        except OSError as exc:
            seen[name] = exc.errno
    return seen


def scenario_adopt(netns: int) -> dict:
    first = attached(netns)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    first.add_socket(0, listener)
    adopted = SkLookup.adopt({name: os.dup(fd) for name, fd in first.fds().items()})
    first.close()  # the link lives on in the adopted descriptor
    adopted.route("10.96.0.1", 80, TCP, 0)
    seen = {"through_adopted": connect_errno(4, socket.SOCK_STREAM, ("10.96.0.1", 80))}
    listener.accept()[0].close()
    adopted.detach()
    seen["after_detach"] = connect_errno(4, socket.SOCK_STREAM, ("10.96.0.1", 80))
    return seen


if __name__ == "__main__":
    arguments = json.loads(sys.argv[2])
    netns_fd = enter_new_netns(arguments.pop("host_netns"))
    print(json.dumps(globals()[f"scenario_{sys.argv[1]}"](netns_fd, **arguments)))

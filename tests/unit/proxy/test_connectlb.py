"""Connect-time load balancing: the maps' encodings, the connect4 program as assembled, the
kernel's verifier on it, and connects of a child process in a cgroup v2 directory of the
test's own with the program attached (loopback only).

The kernel parts need root of the host (CAP_BPF, CAP_NET_ADMIN, cgroups): marked
host_privileges; where they have them and still cannot load or attach, they are skipped,
but fail under CI=true.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import socket
import subprocess
import sys
import time

import pytest
from conftest import IN_CI

from kubeport.proxy.connectlb import maps, programs
from kubeport.proxy.connectlb.maps import (
    ConnectMaps,
    allocate_slots,
    backend_key,
    backend_value,
    decode_backend_value,
    decode_service_value,
    service_key,
    service_value,
)
from kubeport.proxy.connectlb.programs import cgroup2_mounts, connect4_program, load_program, resolve
from kubeport.proxy.relay.sockmap import Insn, decode, encode

TCP, UDP = socket.IPPROTO_TCP, socket.IPPROTO_UDP
LITTLE = sys.byteorder == "little"

# --- encodings (pure) --------------------------------------------------------------------------


@pytest.mark.parametrize(("address", "port", "protocol", "key"), [
    ("10.96.0.10", 53, UDP, bytes([10, 96, 0, 10, 0, 53, 17, 0])),
    ("10.96.0.1", 443, TCP, bytes([10, 96, 0, 1, 0x01, 0xBB, 6, 0])),
    (ipaddress.IPv4Address("127.0.0.240"), 65535, 132, bytes([127, 0, 0, 240, 0xFF, 0xFF, 132, 0])),
])
def test_service_key__address_and_port_in_network_order_then_protocol_and_padding(address, port, protocol, key):
    assert service_key(address, port, protocol) == key


@pytest.mark.parametrize(("args", "message"), [
    (("10.0.0.1", 0, TCP), "port out of range: 0"),
    (("10.0.0.1", 65536, TCP), "port out of range: 65536"),
    (("10.0.0.1", 80, 256), "protocol out of range: 256"),
    (("fd00::1", 80, TCP), "Expected 4 octets"),
])
def test_service_key__refuses_what_it_cannot_encode(args, message):
    with pytest.raises(ValueError, match=message):
        service_key(*args)


@pytest.mark.parametrize(("count", "base"), [(0, 0), (3, 7), (1, 2**32 - 1)])
def test_service_value__count_then_slot_base_in_host_order(count, base):
    value = service_value(count, base)
    assert len(value) == maps.SERVICE_VALUE_SIZE
    assert value == count.to_bytes(4, sys.byteorder) + base.to_bytes(4, sys.byteorder)
    assert decode_service_value(value) == (count, base)


def test_service_value__out_of_range():
    with pytest.raises(ValueError):
        service_value(2**32, 0)


@pytest.mark.parametrize(("slot", "key"), [
    (0, b"\0\0\0\0"),
    (1, (1).to_bytes(4, sys.byteorder)),
    (2**32 + 5, (5).to_bytes(4, sys.byteorder)),  # slots wrap as the program's 32-bit add does
])
def test_backend_key__a_u32_in_host_order(slot, key):
    assert backend_key(slot) == key


@pytest.mark.parametrize(("address", "port", "value"), [
    ("10.244.1.7", 8080, bytes([10, 244, 1, 7, 0x1F, 0x90, 0, 0])),
    ("127.0.0.1", 1, bytes([127, 0, 0, 1, 0, 1, 0, 0])),
])
def test_backend_value__address_and_port_in_network_order_then_padding(address, port, value):
    assert backend_value(address, port) == value
    assert decode_backend_value(value) == (address, port)


@pytest.mark.parametrize(("used", "count", "start", "base"), [
    (set(), 3, 0, 0),
    ({0, 1}, 2, 0, 2),
    ({2}, 2, 1, 3),              # 1 is free, 2 is not: the range starts after 2
    ({5}, 0, 5, 5),              # no slots: any base
    (set(), 2, 2**32 - 1, 2**32 - 1),  # wraps: slots 2**32-1 and 0
    ({0}, 2, 2**32 - 1, 1),
])
def test_allocate_slots__the_first_free_range_from_start(used, count, start, base):
    assert allocate_slots(used, count, start) == base


# --- the program (pure) ------------------------------------------------------------------------

SERVICES, BACKENDS = 7, 9

#: the program for services=7, backends=9, one instruction a row: (code, dst, src, off, imm).
EXPECTED = [
    (0xBF, 6, 1, 0, 0),      # r6 = r1 (ctx)
    (0x61, 2, 6, 4, 0),      # r2 = ctx->user_ip4
    (0x63, 10, 2, -8, 0),    # *(u32 *)(r10 - 8) = r2
    (0x61, 2, 6, 24, 0),     # r2 = ctx->user_port
    (0x6B, 10, 2, -4, 0),    # *(u16 *)(r10 - 4) = r2
    (0x61, 2, 6, 36, 0),     # r2 = ctx->protocol
    (0x73, 10, 2, -2, 0),    # *(u8 *)(r10 - 2) = r2
    (0x72, 10, 0, -1, 0),    # *(u8 *)(r10 - 1) = 0
    (0x18, 1, 1, 0, SERVICES),  # r1 = services map
    (0x00, 0, 0, 0, 0),
    (0xBF, 2, 10, 0, 0),     # r2 = r10
    (0x07, 2, 0, 0, -8),     # r2 += -8
    (0x85, 0, 0, 0, 1),      # call bpf_map_lookup_elem
    (0x15, 0, 0, 17, 0),     # if r0 == 0 goto proceed
    (0x61, 7, 0, 0, 0),      # r7 = count
    (0x15, 7, 0, 17, 0),     # if r7 == 0 goto reject
    (0x61, 8, 0, 4, 0),      # r8 = slot base
    (0x85, 0, 0, 0, 7),      # call bpf_get_prandom_u32
    (0x9C, 0, 7, 0, 0),      # w0 %= w7
    (0x0C, 0, 8, 0, 0),      # w0 += w8
    (0x63, 10, 0, -12, 0),   # *(u32 *)(r10 - 12) = r0
    (0x18, 1, 1, 0, BACKENDS),  # r1 = backends map
    (0x00, 0, 0, 0, 0),
    (0xBF, 2, 10, 0, 0),     # r2 = r10
    (0x07, 2, 0, 0, -12),    # r2 += -12
    (0x85, 0, 0, 0, 1),      # call bpf_map_lookup_elem
    (0x15, 0, 0, 6, 0),      # if r0 == 0 goto reject
    (0x61, 2, 0, 0, 0),      # r2 = backend address
    (0x63, 6, 2, 4, 0),      # ctx->user_ip4 = r2
    (0x69, 2, 0, 4, 0),      # r2 = backend port (u16)
    (0x63, 6, 2, 24, 0),     # ctx->user_port = r2
    (0xB7, 0, 0, 0, 1),      # proceed: r0 = 1
    (0x95, 0, 0, 0, 0),      # exit
    (0xB7, 1, 0, 0, -111),   # reject: r1 = -ECONNREFUSED
    (0x85, 0, 0, 0, 187),    # call bpf_set_retval
    (0xB7, 0, 0, 0, 0),      # r0 = 0
    (0x95, 0, 0, 0, 0),      # exit
]


def test_the_connect4_program_decodes_to_the_expected_instructions():
    assert decode(encode(connect4_program(SERVICES, BACKENDS))) == [Insn(*row) for row in EXPECTED]


def test_the_connect4_program__without_an_errno_a_refusal_is_return_0_alone():
    program = connect4_program(SERVICES, BACKENDS, refuse_errno=None)
    assert [tuple(insn) for insn in program] == EXPECTED[:33] + EXPECTED[35:]


@pytest.mark.parametrize(("items", "offsets"), [
    ([Insn(0x15, off="end"), Insn(0xB7), "end", Insn(0x95)], [1, 0, 0]),
    (["top", Insn(0xB7), Insn(0x05, off="top")], [0, -2]),
    ([Insn(0x15, off="next"), "next", Insn(0x95)], [0, 0]),
])
def test_resolve__labels_become_relative_offsets(items, offsets):
    assert [insn.off for insn in resolve(items)] == offsets


HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


@pytest.mark.parametrize(("mountinfo", "found"), [
    (HYBRID, ["/sys/fs/cgroup/unified"]),
    ("30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n", ["/sys/fs/cgroup"]),
    ("30 23 0:26 / /mnt/my\\040cg rw master:1 - cgroup2 none rw\n", ["/mnt/my cg"]),
    (HYBRID.splitlines()[1] + "\n", []),
])
def test_cgroup2_mounts__from_mountinfo(mountinfo, found):
    assert [str(path) for path in cgroup2_mounts(mountinfo)] == found


# --- the kernel --------------------------------------------------------------------------------

KERNEL = pytest.mark.host_privileges("BPF programs attached to a cgroup of the host")


def require_connectlb() -> None:
    """Skip where the program cannot be loaded or attached; under CI=true fail instead."""
    try:
        with contextlib.closing(ConnectMaps(4)) as lb:
            fd, _ = load_program(connect4_program(lb.services.fd, lb.backends.fd))
            os.close(fd)
        if programs.cgroup2_mount() is None:
            raise OSError(errno.ENOENT, "no cgroup v2 hierarchy mounted")
    except OSError as exc:
        if IN_CI:
            pytest.fail(f"connect-time load balancing cannot run under CI=true: {exc}")
        pytest.skip(f"no connect4 program here: {exc}")


@contextlib.contextmanager
def attached(prog_fd: int):
    """A fresh cgroup v2 directory with the program attached; detached and removed, always."""
    path = programs.cgroup2_mount() / f"kubeport-test-connectlb-{os.getpid()}-{time.monotonic_ns()}"
    path.mkdir()
    try:
        cgroup_fd = programs.open_cgroup(path)
        try:
            programs.attach(cgroup_fd, prog_fd)
            try:
                yield path
            finally:
                programs.detach(cgroup_fd, prog_fd)
        finally:
            os.close(cgroup_fd)
    finally:
        path.rmdir()


#: run in the child: joins the cgroup first (a socket belongs to its creator's cgroup), then
#: connects to each target and says what it got: the peer's address, or the errno.
CHILD = r"""
import json, os, socket, sys
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as procs:
    procs.write(str(os.getpid()))
results = []
for kind, host, port in json.loads(sys.argv[2]):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
    sock.settimeout(5)
    try:
        sock.connect((host, port))
        sock.send(b"ping")
        results.append(list(sock.getpeername()))
    except OSError as exc:
        results.append(exc.errno)
    finally:
        sock.close()
print(json.dumps(results))
"""


def connect_from(cgroup, targets: list[tuple[str, str, int]]) -> list:
    done = subprocess.run([sys.executable, "-c", CHILD, str(cgroup), json.dumps(targets)],
                          capture_output=True, text=True, timeout=30, check=True)
    return [tuple(found) if isinstance(found, list) else found for found in json.loads(done.stdout)]


def listener(address: str, kind: str = "tcp") -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
    sock.bind((address, 0))
    if kind == "tcp":
        sock.listen(64)
    sock.settimeout(5)
    return sock


def port_of(sock: socket.socket) -> int:
    return sock.getsockname()[1]


def free_port(address: str) -> int:
    """A port nothing listens on at ``address`` (bound and let go)."""
    with socket.socket() as sock:
        sock.bind((address, 0))
        return port_of(sock)


VIP = "127.0.0.240"


@pytest.fixture(scope="module")
def lb():
    """The maps and the program (refusing with ECONNREFUSED), attached to a cgroup of this module's."""
    require_connectlb()
    with contextlib.ExitStack() as stack:
        lb = stack.enter_context(contextlib.closing(ConnectMaps(64)))
        prog_fd, _ = load_program(connect4_program(lb.services.fd, lb.backends.fd))
        stack.callback(os.close, prog_fd)
        cgroup = stack.enter_context(attached(prog_fd))
        yield lb, cgroup


@KERNEL
@pytest.mark.parametrize("refuse_errno", [errno.ECONNREFUSED, None])
def test_the_verifier_accepts_the_program(refuse_errno):
    require_connectlb()
    with contextlib.closing(ConnectMaps(4)) as lb:
        fd, log = load_program(connect4_program(lb.services.fd, lb.backends.fd, refuse_errno),
                               log_level=programs.BPF_LOG_LEVEL1 | programs.BPF_LOG_STATS)
        os.close(fd)
    assert "processed" in log


@KERNEL
def test_the_verifier_refuses_a_backend_used_unchecked_and_its_log_says_why():
    require_connectlb()
    with contextlib.closing(ConnectMaps(4)) as lb:
        program = connect4_program(lb.services.fd, lb.backends.fd)
        assert program[26] == Insn(0x15, 0, 0, 6, 0)
        program[26] = Insn(0x05)  # the backend's NULL check made a "goto +0"
        with pytest.raises(programs.ProgramRejected, match="map_value_or_null"):
            load_program(program)


@KERNEL
def test_connect_maps__a_service_port_written_rewritten_and_removed():
    require_connectlb()
    with contextlib.closing(ConnectMaps(8)) as lb:
        lb.set_service(VIP, 80, TCP, [("10.0.0.1", 8080), ("10.0.0.2", 8081)])
        count, base = decode_service_value(lb.services.lookup(service_key(VIP, 80, TCP)))
        assert count == 2
        assert [decode_backend_value(lb.backends.lookup(backend_key(base + i))) for i in range(2)] == [
            ("10.0.0.1", 8080), ("10.0.0.2", 8081)]
        lb.set_service(VIP, 80, TCP, [("10.0.0.3", 9090)])
        assert lb.backends.lookup(backend_key(base)) is None  # the old range freed
        count, new_base = decode_service_value(lb.services.lookup(service_key(VIP, 80, TCP)))
        assert (count, decode_backend_value(lb.backends.lookup(backend_key(new_base)))) == (1, ("10.0.0.3", 9090))
        assert lb.services.lookup(service_key(VIP, 80, UDP)) is None
        lb.remove_service(VIP, 80, TCP)
        assert lb.services.lookup(service_key(VIP, 80, TCP)) is None
        assert lb.backends.lookup(backend_key(new_base)) is None


@KERNEL
def test_a_connect_to_a_service_port_reaches_its_endpoint(lb):
    maps_, cgroup = lb
    with listener("127.0.0.1") as backend:
        vip_port = free_port(VIP)
        maps_.set_service(VIP, vip_port, TCP, [("127.0.0.1", port_of(backend))])
        assert connect_from(cgroup, [("tcp", VIP, vip_port)]) == [("127.0.0.1", port_of(backend))]
        conn, _ = backend.accept()
        with conn:
            conn.settimeout(5)
            assert conn.recv(4) == b"ping"


@KERNEL
def test_connects_are_spread_over_the_endpoints(lb):
    maps_, cgroup = lb
    with listener("127.0.0.1") as one, listener("127.0.0.1") as two:
        vip_port = free_port(VIP)
        maps_.set_service(VIP, vip_port, TCP, [("127.0.0.1", port_of(one)), ("127.0.0.1", port_of(two))])
        peers = connect_from(cgroup, [("tcp", VIP, vip_port)] * 40)
        assert set(peers) == {("127.0.0.1", port_of(one)), ("127.0.0.1", port_of(two))}


@KERNEL
def test_a_service_port_without_endpoints_refuses_the_connect_at_once(lb):
    """ECONNREFUSED from the program, not from the stack: something listens at the VIP's port."""
    maps_, cgroup = lb
    with listener(VIP) as there:
        maps_.set_service(VIP, port_of(there), TCP, [])
        started = time.monotonic()
        assert connect_from(cgroup, [("tcp", VIP, port_of(there))]) == [errno.ECONNREFUSED]
        assert time.monotonic() - started < 10  # no SYN retries (a child's start included)
        maps_.remove_service(VIP, port_of(there), TCP)
        assert connect_from(cgroup, [("tcp", VIP, port_of(there))]) == [(VIP, port_of(there))]


@KERNEL
def test_without_set_retval_a_refusal_is_eperm():
    require_connectlb()
    with contextlib.closing(ConnectMaps(4)) as lb, listener(VIP) as there:
        lb.set_service(VIP, port_of(there), TCP, [])
        prog_fd, _ = load_program(connect4_program(lb.services.fd, lb.backends.fd, refuse_errno=None))
        try:
            with attached(prog_fd) as cgroup:
                assert connect_from(cgroup, [("tcp", VIP, port_of(there))]) == [errno.EPERM]
        finally:
            os.close(prog_fd)


@KERNEL
def test_addresses_and_protocols_not_in_the_map_are_untouched(lb):
    maps_, cgroup = lb
    with listener("127.0.0.1") as backend, listener("127.0.0.1") as direct, listener(VIP, "udp") as vip_udp:
        vip_port = port_of(vip_udp)
        maps_.set_service(VIP, vip_port, TCP, [("127.0.0.1", port_of(backend))])
        assert connect_from(cgroup, [
            ("tcp", "127.0.0.1", port_of(direct)),  # another address
            ("udp", VIP, vip_port),                 # the same address and port, UDP
        ]) == [("127.0.0.1", port_of(direct)), (VIP, vip_port)]
        assert vip_udp.recv(16) == b"ping"


@KERNEL
def test_a_connected_udp_socket_is_sent_to_the_endpoint(lb):
    maps_, cgroup = lb
    with listener("127.0.0.1", "udp") as backend:
        vip_port = free_port(VIP)
        maps_.set_service(VIP, vip_port, UDP, [("127.0.0.1", port_of(backend))])
        assert connect_from(cgroup, [("udp", VIP, vip_port)]) == [("127.0.0.1", port_of(backend))]
        assert backend.recv(16) == b"ping"

"""Connect-time load balancing without a kernel: the maps' encodings and layouts, and the
programs as assembled (which maps each hook reads, its helpers, its context accesses). The
kernel's side is in test_connectlb_hooks.py."""

from __future__ import annotations

import errno
import ipaddress
import socket
import sys

import pytest

from kubeport.proxy.connectlb import maps
from kubeport.proxy.connectlb.maps import (
    LAYOUTS,
    affinity_key,
    allocate_slots,
    backend_key,
    backend_value,
    decode_affinity_value,
    decode_backend_value,
    decode_service_key,
    decode_service_value,
    member_key,
    revnat_key,
    service_key,
    service_value,
)
from kubeport.proxy.connectlb.programs import (
    HOOKS,
    build_program,
    cgroup2_mounts,
    forward_program,
    resolve,
    reverse_program,
)
from kubeport.proxy.relay.sockmap import Insn, decode, encode

TCP, UDP = socket.IPPROTO_TCP, socket.IPPROTO_UDP
HOST = sys.byteorder


def u32(value: int) -> bytes:
    return value.to_bytes(4, HOST)


# --- encodings (pure) --------------------------------------------------------------------------

V6 = bytes.fromhex("fd000000000000000000000000000240")


@pytest.mark.parametrize(("address", "port", "protocol", "key"), [
    ("10.96.0.10", 53, UDP, bytes([10, 96, 0, 10, 0, 53, 17, 0])),
    ("10.96.0.1", 443, TCP, bytes([10, 96, 0, 1, 0x01, 0xBB, 6, 0])),
    (ipaddress.IPv4Address("127.0.0.240"), 65535, 132, bytes([127, 0, 0, 240, 0xFF, 0xFF, 132, 0])),
    ("fd00::240", 80, TCP, V6 + bytes([0, 80, 6, 0])),
    (ipaddress.IPv6Address("fd00::240"), 53, UDP, V6 + bytes([0, 53, 17, 0])),
])
def test_service_key__address_and_port_in_network_order_then_protocol_and_padding(address, port, protocol, key):
    assert service_key(address, port, protocol) == key
    assert decode_service_key(key) == (str(address), port, protocol)


@pytest.mark.parametrize(("args", "message"), [
    (("10.0.0.1", 0, TCP), "port out of range: 0"),
    (("10.0.0.1", 65536, TCP), "port out of range: 65536"),
    (("10.0.0.1", 80, 256), "protocol out of range: 256"),
    (("::ffff:10.0.0.1", 80, TCP), "IPv4-mapped IPv6 address"),
    (("fd00::1%eth0", 80, TCP), "IPv6 address with a zone"),
])
def test_service_key__refuses_what_it_cannot_encode(args, message):
    with pytest.raises(ValueError, match=message):
        service_key(*args)


@pytest.mark.parametrize(("args", "value"), [
    ((0, 0), u32(0) + u32(0) + u32(0) + u32(0)),
    ((3, 7), u32(3) + u32(7) + u32(0) + u32(0)),
    ((1, 2**32 - 1, 10800, 42), u32(1) + u32(2**32 - 1) + u32(10800) + u32(42)),
])
def test_service_value__count_base_timeout_id_in_host_order(args, value):
    assert service_value(*args) == value
    assert len(value) == maps.SERVICE_VALUE_SIZE
    assert tuple(decode_service_value(value)) == args + (0,) * (4 - len(args))


@pytest.mark.parametrize("args", [(2**32, 0), (0, -1), (1, 0, 2**32), (1, 0, 0, 2**32)])
def test_service_value__out_of_range(args):
    with pytest.raises(ValueError, match="out of range"):
        service_value(*args)


@pytest.mark.parametrize(("slot", "key"), [
    (0, b"\0\0\0\0"),
    (1, u32(1)),
    (2**32 + 5, u32(5)),  # slots wrap as the program's 32-bit add does
])
def test_backend_key__a_u32_in_host_order(slot, key):
    assert backend_key(slot) == key


@pytest.mark.parametrize(("address", "port", "value"), [
    ("10.244.1.7", 8080, bytes([10, 244, 1, 7, 0x1F, 0x90, 0, 0])),
    ("127.0.0.1", 1, bytes([127, 0, 0, 1, 0, 1, 0, 0])),
    ("fd00::240", 8080, V6 + bytes([0x1F, 0x90, 0, 0])),
])
def test_backend_value__address_and_port_in_network_order_then_padding(address, port, value):
    assert backend_value(address, port) == value
    assert decode_backend_value(value) == (address, port)


@pytest.mark.parametrize(("args", "key"), [
    ((7, "10.0.0.1", 80), u32(7) + bytes([0, 80, 0, 0, 10, 0, 0, 1])),
    ((2**32 - 1, "fd00::240", 443), u32(2**32 - 1) + bytes([1, 0xBB, 0, 0]) + V6),
])
def test_member_key__id_port_padding_address(args, key):
    assert member_key(*args) == key


def test_affinity_key__netns_cookie_id_padding():
    assert affinity_key(0x1122334455667788, 9) == (0x1122334455667788).to_bytes(8, HOST) + u32(9) + u32(0)


@pytest.mark.parametrize(("value", "decoded"), [
    ((5).to_bytes(8, HOST) + bytes([10, 0, 0, 1]) + bytes(12) + bytes([0, 80]) + bytes(6), (5, "10.0.0.1", 80)),
    ((6).to_bytes(8, HOST) + V6 + bytes([0x1F, 0x90]) + bytes(6), (6, "fd00::240", 8080)),
])
def test_decode_affinity_value__time_address_port(value, decoded):
    assert len(value) == maps.AFFINITY_VALUE_SIZE
    assert decode_affinity_value(value) == decoded


@pytest.mark.parametrize(("args", "key"), [
    ((1, "127.0.0.1", 80), (1).to_bytes(8, HOST) + bytes([127, 0, 0, 1, 0, 80, 0, 0])),
    ((2, "fd00::240", 80), (2).to_bytes(8, HOST) + V6 + bytes([0, 80, 0, 0])),
])
def test_revnat_key__socket_cookie_address_port_padding(args, key):
    assert revnat_key(*args) == key


@pytest.mark.parametrize(("name", "key_size", "value_size", "lru"), [
    ("services4", 8, 16, False), ("services6", 20, 16, False),
    ("backends4", 4, 8, False), ("backends6", 4, 20, False),
    ("members4", 12, 4, False), ("members6", 24, 4, False),
    ("affinity", 16, 32, True),
    ("revnat4", 16, 8, True), ("revnat6", 28, 20, True),
    ("connects4", 8, 8, False), ("connects6", 20, 8, False),
])
def test_the_map_layouts(name, key_size, value_size, lru):
    assert LAYOUTS[name] == (maps.BPF_MAP_TYPE_LRU_HASH if lru else maps.BPF_MAP_TYPE_HASH, key_size, value_size)


def test_the_map_layouts__no_other_map():
    assert len(LAYOUTS) == 11


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


# --- the programs (pure) -----------------------------------------------------------------------

#: map name -> a made-up fd, for the programs as assembled without a kernel
FAKE_FDS = {name: 100 + i for i, name in enumerate(LAYOUTS)}


class FakeMaps:
    def fds(self):
        return dict(FAKE_FDS)


def maps_used(program: list[Insn]) -> set[str]:
    by_fd = {fd: name for name, fd in FAKE_FDS.items()}
    return {by_fd[insn.imm] for insn in program if insn.code == 0x18 and insn.src == 1}


def helpers_called(program: list[Insn]) -> list[int]:
    return [insn.imm for insn in program if insn.code == 0x85]


def test_hooks__names_and_attach_types():
    assert HOOKS == (("connect4", 10), ("connect6", 11), ("sendmsg4", 14), ("sendmsg6", 15),
                     ("recvmsg4", 19), ("recvmsg6", 20), ("getpeername4", 29), ("getpeername6", 30))


@pytest.mark.parametrize(("hook", "used"), [
    ("connect4", {"services4", "backends4", "members4", "affinity", "revnat4", "connects4"}),
    ("connect6", {"services6", "backends6", "members6", "affinity", "revnat6", "connects6"}),
    ("sendmsg4", {"services4", "backends4", "members4", "affinity", "revnat4"}),  # not counted
    ("sendmsg6", {"services6", "backends6", "members6", "affinity", "revnat6"}),
    ("recvmsg4", {"revnat4"}),
    ("recvmsg6", {"revnat6"}),
    ("getpeername4", {"revnat4"}),
    ("getpeername6", {"revnat6"}),
])
def test_each_hook_reads_the_maps_of_its_family(hook, used):
    assert maps_used(build_program(hook, FakeMaps())) == used


def test_build_program__an_unknown_hook():
    with pytest.raises(ValueError, match="no such hook: bind4"):
        build_program("bind4", FakeMaps())


@pytest.mark.parametrize("family", [4, 6])
def test_the_forward_program__helpers_in_order(family):
    # lookup services; netns cookie, lookup affinity, ktime, lookup members; prandom, lookup backends,
    # ktime, update affinity; socket cookie, update revnat; lookup connects; set_retval
    assert helpers_called(forward_program(family, FAKE_FDS, count=True)) == [
        1, 122, 1, 5, 1, 7, 1, 5, 2, 46, 2, 1, 187]
    assert helpers_called(forward_program(family, FAKE_FDS, count=False, refuse_errno=None)) == [
        1, 122, 1, 5, 1, 7, 1, 5, 2, 46, 2]


@pytest.mark.parametrize("family", [4, 6])
def test_the_forward_program__a_refusal_sets_the_errno_and_returns_0(family):
    program = forward_program(family, FAKE_FDS, count=True)
    assert program[-4:] == [Insn(0xB7, 1, imm=-errno.ECONNREFUSED), Insn(0x85, imm=187), Insn(0xB7, 0, imm=0),
                            Insn(0x95)]
    assert program[-6:-4] == [Insn(0xB7, 0, imm=1), Insn(0x95)]  # proceed
    assert forward_program(family, FAKE_FDS, count=True, refuse_errno=None)[-4:] == program[-6:-4] + program[-2:]


def test_the_forward_program__the_counter_is_an_atomic_add():
    program = forward_program(4, FAKE_FDS, count=True)
    assert Insn(0xDB, 0, 1, 0, 0) in program  # lock *(u64 *)(r0 + 0) += r1
    assert Insn(0xDB, 0, 1, 0, 0) not in forward_program(4, FAKE_FDS, count=False)


@pytest.mark.parametrize(("family", "address_loads"), [(4, [28, 4]), (6, [8, 12, 16, 20])])
def test_the_forward_program__the_key_from_user_ip_user_port_protocol(family, address_loads):
    """IPv4: the socket's family first (an AF_INET6 socket's mapped address is not translated)."""
    program = forward_program(family, FAKE_FDS, count=True)
    ctx_loads = [insn.off for insn in program if insn.code == 0x61 and insn.src == 6]
    assert ctx_loads == [36, *address_loads, 24, 36]
    ctx_stores = [insn.off for insn in program if insn.code == 0x63 and insn.dst == 6]
    assert ctx_stores == [*address_loads[-4 if family == 6 else -1:], 24]  # the rewrite, once, at the end


#: the recvmsg4/getpeername4 program for revnat4=7, one instruction a row: (code, dst, src, off, imm).
REVERSE4 = [
    (0xBF, 6, 1, 0, 0),      # r6 = r1 (ctx)
    (0x85, 0, 0, 0, 46),     # call bpf_get_socket_cookie(ctx)
    (0x7B, 10, 0, -32, 0),   # *(u64 *)(r10 - 32) = r0
    (0x61, 2, 6, 4, 0),      # r2 = ctx->user_ip4
    (0x63, 10, 2, -24, 0),   # *(u32 *)(r10 - 24) = r2
    (0x61, 2, 6, 24, 0),     # r2 = ctx->user_port
    (0x6B, 10, 2, -20, 0),   # *(u16 *)(r10 - 20) = r2
    (0x6A, 10, 0, -18, 0),   # *(u16 *)(r10 - 18) = 0
    (0x18, 1, 1, 0, 7),      # r1 = revnat4
    (0x00, 0, 0, 0, 0),
    (0xBF, 2, 10, 0, 0),     # r2 = r10
    (0x07, 2, 0, 0, -32),    # r2 += -32
    (0x85, 0, 0, 0, 1),      # call bpf_map_lookup_elem
    (0x15, 0, 0, 5, 0),      # if r0 == 0 goto done
    (0xBF, 7, 0, 0, 0),      # r7 = r0
    (0x61, 2, 7, 0, 0),      # r2 = service address
    (0x63, 6, 2, 4, 0),      # ctx->user_ip4 = r2
    (0x69, 2, 7, 4, 0),      # r2 = service port (u16)
    (0x63, 6, 2, 24, 0),     # ctx->user_port = r2
    (0xB7, 0, 0, 0, 1),      # done: r0 = 1
    (0x95, 0, 0, 0, 0),      # exit
]


def test_the_reverse4_program_decodes_to_the_expected_instructions():
    assert decode(encode(reverse_program(4, 7))) == [Insn(*row) for row in REVERSE4]


def test_the_reverse6_program__four_words_each_way():
    program = reverse_program(6, 7)
    assert [insn.off for insn in program if insn.code == 0x61 and insn.src == 6] == [8, 12, 16, 20, 24]
    assert [insn.off for insn in program if insn.code == 0x63 and insn.dst == 6] == [8, 12, 16, 20, 24]
    assert program[-2:] == [Insn(0xB7, 0, imm=1), Insn(0x95)]  # always 1


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

"""The cgroup sock_addr programs of connect-time load balancing: a connect or send to a Service
port goes to one of its endpoints, and the socket sees the Service address in return.

Python decides which endpoints a Service port may use on this node and writes them into the
maps (maps.py); the programs, run by the kernel for every socket whose cgroup (v2) has them
attached, only pick among them. Eight hooks (``HOOKS``), assembled here per family:

* ``connect4``/``connect6`` (TCP and connected UDP: ``inet_dgram_connect`` -> ``pre_connect``
  runs the hook too) and ``sendmsg4``/``sendmsg6`` (unconnected UDP, ``udp_sendmsg`` /
  ``udpv6_sendmsg`` with a destination) translate forward, ``forward_program``:

  - not TCP or UDP (SCTP, UDP-Lite, ...), or no ``services`` entry for (``user_ip``,
    ``user_port``, ``protocol``): return 1, the socket proceeds as addressed;
  - an entry with count 0 (no usable endpoint): refused. ``bpf_set_retval``
    (BPF_FUNC_set_retval, kernel 5.18+; ``cgroup_common_func_proto`` in kernel/bpf/cgroup.c
    allows it for connect and sendmsg, not for recvmsg and getpeername) sets ECONNREFUSED and
    the program returns 0. Returning 0 alone gives EPERM: ``bpf_prog_run_array_cg`` turns a 0
    into -EPERM unless the program set an error retval. Cilium's ``cil_sock4_connect`` refuses
    with -EHOSTUNREACH (``svc->count == 0``). A sendto() is refused the same way: ECONNREFUSED
    (``udp_sendmsg`` returns the hook's error, net/ipv4/udp.c);
  - ClientIP affinity (the entry's timeout > 0): the ``affinity`` entry of (netns cookie,
    service-port id), used while younger than the timeout and while ``members`` still holds
    its endpoint for the id; a use refreshes its time, as kube-proxy does. Else, or without
    affinity: slot = base + bpf_get_prandom_u32() % count, its ``backends`` entry (a slot
    without one, the maps out of step, is refused as above, as Cilium's
    REASON_LB_NO_BACKEND_SLOT), and with affinity the choice is remembered;
  - ``revnat`` gets (socket cookie, endpoint) -> Service address and port; connect adds 1 to
    the service port's ``connects`` entry (atomically: connects of several CPUs at once);
    ``user_ip``/``user_port`` become the endpoint's; return 1.

* ``recvmsg4``/``recvmsg6`` (``udp_recvmsg``: the source of a datagram read with an address)
  and ``getpeername4``/``getpeername6`` (``inet_getname``/``inet6_getname`` with peer) translate
  back, ``reverse_program``: a ``revnat`` entry of (socket cookie, ``user_ip``, ``user_port``)
  replaces them by the Service's; without one they are left alone. These hooks must return 1
  (``check_return_code`` in kernel/bpf/verifier.c allows them only 1).

IPv6: ``user_ip6`` is read and written as four u32 words. An IPv4-mapped address
(::ffff:a.b.c.d) on an AF_INET6 socket is never translated, a difference from Cilium, which
translates it through its IPv4 maps. connect() gives it to the v6 hook (``tcp_v6_pre_connect``,
``udpv6_pre_connect``), where maps.py refuses such service addresses, so the ``services6``
lookup misses; an unconnected sendto() goes through ``udp_sendmsg`` and the *v4* hook
(``udpv6_sendmsg``, net/ipv6/udp.c), while the reply's source reaches the v6 recvmsg hook as
the mapped address: the v4 programs leave sockets whose ``family`` is not AF_INET alone, so
the way out is not translated when the way back could not be.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from kubeport.proxy.connectlb import pins
from kubeport.proxy.relay.sockmap import (
    ADD64_IMM,
    BPF_PROG_ATTACH,
    BPF_PROG_LOAD,
    BPF_PSEUDO_MAP_FD,
    CALL,
    EXIT,
    JEQ_IMM,
    JNE_IMM,
    LD_IMM64,
    LDX_DW,
    LDX_W,
    MOV64_IMM,
    MOV64_REG,
    R0,
    R1,
    R2,
    R3,
    R4,
    R6,
    R10,
    STX_DW,
    BPF_FUNC_get_socket_cookie,
    BPF_FUNC_map_lookup_elem,
    Insn,
    bpf,
    encode,
)

if TYPE_CHECKING:
    from kubeport.proxy.connectlb.maps import ConnectMaps

# bpf(2) command, program and attach types (enum bpf_attach_type), flags and helpers
# (enum bpf_func_id / __BPF_FUNC_MAPPER), include/uapi/linux/bpf.h.
BPF_PROG_DETACH = 9
BPF_PROG_TYPE_CGROUP_SOCK_ADDR = 18
BPF_CGROUP_INET4_CONNECT, BPF_CGROUP_INET6_CONNECT = 10, 11
BPF_CGROUP_UDP4_SENDMSG, BPF_CGROUP_UDP6_SENDMSG = 14, 15
BPF_CGROUP_UDP4_RECVMSG, BPF_CGROUP_UDP6_RECVMSG = 19, 20
BPF_CGROUP_INET4_GETPEERNAME, BPF_CGROUP_INET6_GETPEERNAME = 29, 30
BPF_F_ALLOW_MULTI = 2  # beside the programs of other owners, on this cgroup and its ancestors
BPF_FUNC_map_update_elem = 2
BPF_FUNC_ktime_get_ns = 5
BPF_FUNC_get_prandom_u32 = 7
BPF_FUNC_get_netns_cookie = 122
BPF_FUNC_set_retval = 187
BPF_LOG_LEVEL1, BPF_LOG_STATS = 1, 4
BPF_ANY = 0

#: (hook name, attach type), the names the maps' users and pins know them by.
HOOKS: tuple[tuple[str, int], ...] = (
    ("connect4", BPF_CGROUP_INET4_CONNECT),
    ("connect6", BPF_CGROUP_INET6_CONNECT),
    ("sendmsg4", BPF_CGROUP_UDP4_SENDMSG),
    ("sendmsg6", BPF_CGROUP_UDP6_SENDMSG),
    ("recvmsg4", BPF_CGROUP_UDP4_RECVMSG),
    ("recvmsg6", BPF_CGROUP_UDP6_RECVMSG),
    ("getpeername4", BPF_CGROUP_INET4_GETPEERNAME),
    ("getpeername6", BPF_CGROUP_INET6_GETPEERNAME),
)

# offsetof(struct bpf_sock_addr, ...) (include/uapi/linux/bpf.h: user_family u32 at 0, user_ip4
# at 4, user_ip6[4] at 8, user_port at 24, family 28, type 32, protocol 36). user_ip4, each
# user_ip6 word and user_port allow 4-byte reads and writes (``sock_addr_is_valid_access``,
# net/core/filter.c), protocol 4-byte reads; addresses are in network byte order, the port in
# the low 16 bits of user_port as the sockaddr's sin_port is in memory. ``family`` is the
# socket's (sk->sk_family), not the address's.
USER_IP4, USER_IP6, USER_PORT, FAMILY, PROTOCOL = 4, 8, 24, 28, 36
AF_INET = 2
USER_IP = {4: USER_IP4, 6: USER_IP6}
ADDRESS_SIZE = {4: 4, 6: 16}
IPPROTO_TCP, IPPROTO_UDP = 6, 17

# Opcodes the sockmap program does not use (include/uapi/linux/bpf_common.h, bpf.h).
LDX_H = 0x69  # BPF_LDX | BPF_MEM | BPF_H
STX_W = 0x63  # BPF_STX | BPF_MEM | BPF_W
STX_H = 0x6B  # BPF_STX | BPF_MEM | BPF_H
STX_B = 0x73  # BPF_STX | BPF_MEM | BPF_B
ST_B = 0x72  # BPF_ST | BPF_MEM | BPF_B (an immediate)
ST_H = 0x6A  # BPF_ST | BPF_MEM | BPF_H
ST_W = 0x62  # BPF_ST | BPF_MEM | BPF_W
ST_DW = 0x7A  # BPF_ST | BPF_MEM | BPF_DW
MOD32_REG = 0x9C  # BPF_ALU | BPF_MOD | BPF_X
ADD32_REG = 0x0C  # BPF_ALU | BPF_ADD | BPF_X
SUB64_REG = 0x1F  # BPF_ALU64 | BPF_SUB | BPF_X
MUL64_IMM = 0x27  # BPF_ALU64 | BPF_MUL | BPF_K
JGE_REG = 0x3D  # BPF_JMP | BPF_JGE | BPF_X (unsigned)
JA = 0x05  # BPF_JMP | BPF_JA
ATOMIC_DW = 0xDB  # BPF_STX | BPF_ATOMIC | BPF_DW, imm BPF_ADD (0): lock *(u64 *)(dst + off) += src
BPF_ADD = 0x00
R7, R8, R9 = 7, 8, 9

SYS_REJECT, SYS_PROCEED = 0, 1  # Cilium's names for a cgroup sock_addr program's verdicts
NSEC_PER_SEC = 1_000_000_000

# The forward programs' stack (offsets from r10; every access naturally aligned, which the
# verifier demands of the stack, ``check_ptr_alignment``). A: the address size, 4 or 16.
SVC_KEY = -24      # services/connects key: address A, port 2, protocol 1, padding 1 (to -5)
SLOT = -28         # backends key: u32
AFF_KEY = -48      # affinity key: netns cookie u64, id u32, padding u32
AFF_VALUE = -80    # affinity value: time u64, address 16 at -72, port at -56, padding -54..-49;
CHOSEN = -72       # ... whose address and port are also the endpoint chosen, both ways
CHOSEN_PORT = -56
MEMBER_KEY = -112  # members key: id u32, port 2 at -108, padding 2, address A at -104
REVNAT_KEY = -144  # revnat key: socket cookie u64, address A at -136, port 2, padding 2
REVNAT_VALUE = -168  # revnat value: address A, port 2, padding 2
SVC_VALUE = -184   # the services value copied: count u32, base u32 at -180, timeout -176, id -172
# The services value is copied at once: an update of a preallocated hash map entry recycles
# the old element (``htab_map_update_elem``, kernel/bpf/hashtab.c), so a pointer into it may
# see another entry's value later in the program.


def _map(reg: int, map_fd: int) -> list[Insn]:
    return [Insn(LD_IMM64, reg, BPF_PSEUDO_MAP_FD, 0, map_fd), Insn(0)]


def _copy_words(dst: int, dst_off: int, src: int, src_off: int, words: int) -> list[Insn]:
    """``words`` u32 from src + src_off to dst + dst_off, through r2."""
    out = []
    for i in range(words):
        out += [Insn(LDX_W, R2, src, src_off + 4 * i), Insn(STX_W, dst, R2, dst_off + 4 * i)]
    return out


def _stack_ptr(reg: int, off: int) -> list[Insn]:
    return [Insn(MOV64_REG, reg, R10), Insn(ADD64_IMM, reg, imm=off)]


def resolve(items: list[Insn | str]) -> list[Insn]:
    """Instructions with labels (strings) among them and jumps whose ``off`` names a label ->
    instructions with relative offsets. Pure."""
    labels: dict[str, int] = {}
    program: list[Insn] = []
    for item in items:
        if isinstance(item, str):
            labels[item] = len(program)
        else:
            program.append(item)
    return [insn._replace(off=labels[insn.off] - i - 1) if isinstance(insn.off, str) else insn
            for i, insn in enumerate(program)]


def forward_program(family: int, fds: Mapping[str, int], *, count: bool,
                    refuse_errno: int | None = errno.ECONNREFUSED) -> list[Insn]:
    """connect (``count``: add to ``connects``) or sendmsg for ``family`` over the maps named in
    ``fds`` (maps.py). ``refuse_errno`` None: a refusal is the kernel's EPERM (no
    bpf_set_retval call)."""
    a, words = ADDRESS_SIZE[family], ADDRESS_SIZE[family] // 4
    user_ip = USER_IP[family]
    refuse = [Insn(MOV64_IMM, R1, imm=-refuse_errno), Insn(CALL, imm=BPF_FUNC_set_retval)] if refuse_errno else []
    counting = [
        *_map(R1, fds[f"connects{family}"]),
        *_stack_ptr(R2, SVC_KEY),
        Insn(CALL, imm=BPF_FUNC_map_lookup_elem),       # r0 = &connects[key] or NULL
        Insn(JEQ_IMM, R0, off="rewrite", imm=0),        # removed meanwhile: not counted
        Insn(MOV64_IMM, R1, imm=1),
        Insn(ATOMIC_DW, R0, R1, 0, BPF_ADD),            # lock *(u64 *)r0 += 1
    ] if count else []
    return resolve([
        Insn(MOV64_REG, R6, R1),                        # r6 = ctx
        Insn(LDX_W, R2, R6, PROTOCOL),
        Insn(JEQ_IMM, R2, off="translate", imm=IPPROTO_TCP),
        Insn(JNE_IMM, R2, off="proceed", imm=IPPROTO_UDP),  # only TCP and UDP are translated
        "translate",
        *([Insn(LDX_W, R2, R6, FAMILY),                 # an AF_INET6 socket's IPv4-mapped destination
           Insn(JNE_IMM, R2, off="proceed", imm=AF_INET)] if family == 4 else []),
        *_copy_words(R10, SVC_KEY, R6, user_ip, words),  # the services key: address,
        Insn(LDX_W, R2, R6, USER_PORT),
        Insn(STX_H, R10, R2, SVC_KEY + a),              #   port (network order, the low 16 bits)
        Insn(LDX_W, R2, R6, PROTOCOL),
        Insn(STX_B, R10, R2, SVC_KEY + a + 2),          #   protocol
        Insn(ST_B, R10, off=SVC_KEY + a + 3, imm=0),    #   padding
        *_map(R1, fds[f"services{family}"]),
        *_stack_ptr(R2, SVC_KEY),
        Insn(CALL, imm=BPF_FUNC_map_lookup_elem),       # r0 = &services[key] or NULL
        Insn(JEQ_IMM, R0, off="proceed", imm=0),        # not a Service port: untouched
        Insn(LDX_DW, R2, R0, 0),                        # the value copied (count, base; timeout, id)
        Insn(STX_DW, R10, R2, SVC_VALUE),
        Insn(LDX_DW, R2, R0, 8),
        Insn(STX_DW, R10, R2, SVC_VALUE + 8),
        Insn(LDX_W, R2, R10, SVC_VALUE),
        Insn(JEQ_IMM, R2, off="reject", imm=0),         # count 0: no usable endpoint
        Insn(ST_DW, R10, off=AFF_KEY, imm=0),           # the affinity key initialised for the verifier
        Insn(ST_DW, R10, off=AFF_KEY + 8, imm=0),
        Insn(LDX_W, R2, R10, SVC_VALUE + 8),
        Insn(JEQ_IMM, R2, off="pick", imm=0),           # no affinity
        # -- affinity: (netns cookie, id) -> endpoint, used while fresh and still a member --
        Insn(MOV64_REG, R1, R6),
        Insn(CALL, imm=BPF_FUNC_get_netns_cookie),      # the socket's network namespace
        Insn(STX_DW, R10, R0, AFF_KEY),
        Insn(LDX_W, R2, R10, SVC_VALUE + 12),
        Insn(STX_W, R10, R2, AFF_KEY + 8),              # id (the padding is 0 already)
        *_map(R1, fds["affinity"]),
        *_stack_ptr(R2, AFF_KEY),
        Insn(CALL, imm=BPF_FUNC_map_lookup_elem),
        Insn(JEQ_IMM, R0, off="pick", imm=0),
        Insn(MOV64_REG, R9, R0),                        # r9 = &affinity[key]
        Insn(CALL, imm=BPF_FUNC_ktime_get_ns),
        Insn(STX_DW, R10, R0, AFF_VALUE),               # now
        Insn(LDX_DW, R2, R9, 0),
        Insn(SUB64_REG, R0, R2),                        # age = now - last use
        Insn(LDX_W, R3, R10, SVC_VALUE + 8),
        Insn(MUL64_IMM, R3, imm=NSEC_PER_SEC),          # timeout in ns (a u32 of seconds: no overflow)
        Insn(JGE_REG, R0, R3, off="pick"),              # expired (or a time from the future)
        Insn(LDX_W, R2, R10, SVC_VALUE + 12),           # the members key: id,
        Insn(STX_W, R10, R2, MEMBER_KEY),
        Insn(LDX_H, R2, R9, 24),                        #   port,
        Insn(STX_H, R10, R2, MEMBER_KEY + 4),
        Insn(ST_H, R10, off=MEMBER_KEY + 6, imm=0),     #   padding,
        *_copy_words(R10, MEMBER_KEY + 8, R9, 8, words),  # address
        *_map(R1, fds[f"members{family}"]),
        *_stack_ptr(R2, MEMBER_KEY),
        Insn(CALL, imm=BPF_FUNC_map_lookup_elem),
        Insn(JEQ_IMM, R0, off="pick", imm=0),           # the endpoint left the service port
        Insn(LDX_DW, R2, R10, AFF_VALUE),
        Insn(STX_DW, R9, R2, 0),                        # refreshed: last use = now
        *_copy_words(R10, CHOSEN, R9, 8, words),        # the endpoint chosen
        Insn(LDX_H, R2, R9, 24),
        Insn(STX_H, R10, R2, CHOSEN_PORT),
        Insn(JA, off="chosen"),
        # -- a slot at random --
        "pick",
        Insn(CALL, imm=BPF_FUNC_get_prandom_u32),
        Insn(LDX_W, R2, R10, SVC_VALUE),
        Insn(MOD32_REG, R0, R2),                        # w0 %= count (not 0: checked above)
        Insn(LDX_W, R2, R10, SVC_VALUE + 4),
        Insn(ADD32_REG, R0, R2),                        # w0 += base (modulo 2**32)
        Insn(STX_W, R10, R0, SLOT),
        *_map(R1, fds[f"backends{family}"]),
        *_stack_ptr(R2, SLOT),
        Insn(CALL, imm=BPF_FUNC_map_lookup_elem),       # r0 = &backends[slot] or NULL
        Insn(JEQ_IMM, R0, off="reject", imm=0),         # the maps out of step
        Insn(MOV64_REG, R9, R0),
        *_copy_words(R10, CHOSEN, R9, 0, words),
        Insn(LDX_H, R2, R9, a),
        Insn(STX_H, R10, R2, CHOSEN_PORT),
        Insn(LDX_W, R2, R10, SVC_VALUE + 8),
        Insn(JEQ_IMM, R2, off="chosen", imm=0),         # no affinity to remember
        Insn(CALL, imm=BPF_FUNC_ktime_get_ns),
        Insn(STX_DW, R10, R0, AFF_VALUE),
        *[Insn(ST_W, R10, off=CHOSEN + 4 * i, imm=0) for i in range(words, 4)],  # an IPv4 address: 12 zeros
        Insn(ST_H, R10, off=CHOSEN_PORT + 2, imm=0),
        Insn(ST_W, R10, off=CHOSEN_PORT + 4, imm=0),
        *_map(R1, fds["affinity"]),
        *_stack_ptr(R2, AFF_KEY),
        *_stack_ptr(R3, AFF_VALUE),
        Insn(MOV64_IMM, R4, imm=BPF_ANY),
        Insn(CALL, imm=BPF_FUNC_map_update_elem),       # full LRU: the oldest entry goes
        # -- the reverse entry, the counter, the rewrite --
        "chosen",
        Insn(MOV64_REG, R1, R6),
        Insn(CALL, imm=BPF_FUNC_get_socket_cookie),     # bpf_get_socket_cookie_sock_addr: ctx->sk's
        Insn(STX_DW, R10, R0, REVNAT_KEY),
        *_copy_words(R10, REVNAT_KEY + 8, R10, CHOSEN, words),
        Insn(LDX_H, R2, R10, CHOSEN_PORT),
        Insn(STX_H, R10, R2, REVNAT_KEY + 8 + a),
        Insn(ST_H, R10, off=REVNAT_KEY + 10 + a, imm=0),
        *_copy_words(R10, REVNAT_VALUE, R10, SVC_KEY, words),  # the Service's address
        Insn(LDX_H, R2, R10, SVC_KEY + a),
        Insn(STX_H, R10, R2, REVNAT_VALUE + a),         # and port
        Insn(ST_H, R10, off=REVNAT_VALUE + a + 2, imm=0),
        *_map(R1, fds[f"revnat{family}"]),
        *_stack_ptr(R2, REVNAT_KEY),
        *_stack_ptr(R3, REVNAT_VALUE),
        Insn(MOV64_IMM, R4, imm=BPF_ANY),
        Insn(CALL, imm=BPF_FUNC_map_update_elem),       # a failure only costs the reverse view
        *counting,
        "rewrite",
        *_copy_words(R6, user_ip, R10, CHOSEN, words),  # ctx->user_ip = the endpoint's address
        Insn(LDX_H, R2, R10, CHOSEN_PORT),
        Insn(STX_W, R6, R2, USER_PORT),                 # ctx->user_port = the endpoint's port
        "proceed",
        Insn(MOV64_IMM, R0, imm=SYS_PROCEED),
        Insn(EXIT),
        "reject",
        *refuse,                                        # bpf_set_retval(-errno)
        Insn(MOV64_IMM, R0, imm=SYS_REJECT),
        Insn(EXIT),
    ])


def reverse_program(family: int, revnat_fd: int) -> list[Insn]:
    """recvmsg or getpeername for ``family``: the endpoint's address and port back to the
    Service's when the socket's ``revnat`` has them; always return 1."""
    a, words = ADDRESS_SIZE[family], ADDRESS_SIZE[family] // 4
    user_ip = USER_IP[family]
    key = -32  # socket cookie u64, address A at -24, port 2, padding 2 (to -5 at most)
    return resolve([
        Insn(MOV64_REG, R6, R1),                        # r6 = ctx
        Insn(CALL, imm=BPF_FUNC_get_socket_cookie),     # r1 is still ctx
        Insn(STX_DW, R10, R0, key),
        *_copy_words(R10, key + 8, R6, user_ip, words),
        Insn(LDX_W, R2, R6, USER_PORT),
        Insn(STX_H, R10, R2, key + 8 + a),
        Insn(ST_H, R10, off=key + 10 + a, imm=0),
        *_map(R1, revnat_fd),
        *_stack_ptr(R2, key),
        Insn(CALL, imm=BPF_FUNC_map_lookup_elem),
        Insn(JEQ_IMM, R0, off="done", imm=0),           # not translated by this socket's connect/send
        Insn(MOV64_REG, R7, R0),
        *_copy_words(R6, user_ip, R7, 0, words),
        Insn(LDX_H, R2, R7, a),
        Insn(STX_W, R6, R2, USER_PORT),
        "done",
        Insn(MOV64_IMM, R0, imm=1),
        Insn(EXIT),
    ])


def connect4_program(fds: Mapping[str, int], refuse_errno: int | None = errno.ECONNREFUSED) -> list[Insn]:
    return forward_program(4, fds, count=True, refuse_errno=refuse_errno)


def build_program(hook: str, maps: ConnectMaps) -> list[Insn]:
    """The program of a hook of ``HOOKS`` over ``maps``."""
    fds = maps.fds()
    kind, family = hook[:-1], int(hook[-1])
    if kind == "connect":
        return forward_program(family, fds, count=True)
    if kind == "sendmsg":
        return forward_program(family, fds, count=False)
    if kind in ("recvmsg", "getpeername"):
        return reverse_program(family, fds[f"revnat{family}"])
    raise ValueError(f"no such hook: {hook}")


def load_programs(maps: ConnectMaps) -> dict[str, int]:
    """Every hook's program loaded: hook name -> program fd. When one is refused, those loaded
    are closed and ProgramRejected (with the verifier's log) raised."""
    loaded: dict[str, int] = {}
    try:
        for hook, attach_type in HOOKS:
            loaded[hook], _ = load_program(build_program(hook, maps), attach_type, f"kp_{hook}")  # 15 chars at most
    except BaseException:
        for fd in loaded.values():
            os.close(fd)
        raise
    return loaded


class ProgramRejected(OSError):
    """BPF_PROG_LOAD refused the program; the message carries the verifier's log."""


def load_program(program: list[Insn], attach_type: int = BPF_CGROUP_INET4_CONNECT,
                 name: str = "kubeport_conn4", log_level: int = BPF_LOG_LEVEL1,
                 prog_type: int = BPF_PROG_TYPE_CGROUP_SOCK_ADDR) -> tuple[int, str]:
    """BPF_PROG_LOAD as ``prog_type`` (a cgroup sock_addr program unless told) for its expected
    ``attach_type``: (fd, the verifier's log).

    Raises ProgramRejected (an OSError with the kernel's errno) with the log when refused."""
    code = encode(program)
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    log_buf = ctypes.create_string_buffer(1 << 16)
    # prog_type, insn_cnt, insns, license, log_level, log_size, log_buf, kern_version, prog_flags,
    # prog_name[16], prog_ifindex, expected_attach_type (offset 68)
    attr = struct.pack(
        "<IIQQIIQII16sII", prog_type, len(program), ctypes.addressof(insns),
        ctypes.addressof(license_), log_level, len(log_buf), ctypes.addressof(log_buf), 0, 0,
        name.encode()[:15], 0, attach_type,
    )
    # The verifier gives up with EAGAIN when a signal is pending; libbpf retries it 5 times.
    for attempt in range(5):
        try:
            fd = bpf(BPF_PROG_LOAD, attr)
        except OSError as exc:
            if exc.errno == errno.EAGAIN and attempt < 4:
                continue
            verifier = log_buf.value.decode(errors="replace").strip()
            raise ProgramRejected(exc.errno, f"{exc.strerror}{': ' + verifier if verifier else ''}") from None
        return fd, log_buf.value.decode(errors="replace")
    raise AssertionError("unreachable")


def attach(cgroup_fd: int, prog_fd: int, attach_type: int = BPF_CGROUP_INET4_CONNECT,
           flags: int = BPF_F_ALLOW_MULTI) -> None:
    """BPF_PROG_ATTACH to the cgroup v2 directory open as ``cgroup_fd``."""
    bpf(BPF_PROG_ATTACH, struct.pack("<IIII", cgroup_fd, prog_fd, attach_type, flags))


def detach(cgroup_fd: int, prog_fd: int, attach_type: int = BPF_CGROUP_INET4_CONNECT) -> None:
    """BPF_PROG_DETACH of this program (a BPF_F_ALLOW_MULTI attachment is named by its program)."""
    bpf(BPF_PROG_DETACH, struct.pack("<III", cgroup_fd, prog_fd, attach_type))


def cgroup2_mounts(mountinfo: str) -> list[Path]:
    """The mount points of the cgroup v2 hierarchy in /proc/self/mountinfo's text. Pure."""
    return pins.mounts_of(mountinfo, "cgroup2")


def cgroup2_mount() -> Path | None:
    """Where this process sees the cgroup v2 hierarchy (/sys/fs/cgroup, or beside v1
    controllers /sys/fs/cgroup/unified), None without one."""
    mounts = cgroup2_mounts(Path("/proc/self/mountinfo").read_text())
    return mounts[0] if mounts else None

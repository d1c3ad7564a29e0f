"""The BPF_CGROUP_INET4_CONNECT program: a connect to a Service port goes to one of its endpoints.

Python decides which endpoints a Service port may use on this node and writes them into the
maps (maps.py); the program, run by the kernel at every connect() of a socket whose cgroup
(v2) has it attached, only picks among them:

* no ``services`` entry for (``user_ip4``, ``user_port``, ``protocol``): return 1, the connect
  proceeds as addressed;
* an entry with count 0 (no usable endpoint): the connect is refused. ``bpf_set_retval``
  (BPF_FUNC_set_retval, kernel 5.18+, allowed for the connect hooks by
  ``cgroup_common_func_proto`` in kernel/bpf/cgroup.c) sets the errno, ECONNREFUSED by
  default, and the program returns 0. Returning 0 alone makes connect() fail with EPERM:
  ``bpf_prog_run_array_cg`` turns a 0 into -EPERM unless the program set an error retval.
  Cilium's ``cil_sock4_connect`` does the same with -EHOSTUNREACH (``svc->count == 0``);
* else slot = base + bpf_get_prandom_u32() % count, its ``backends`` entry replaces
  ``user_ip4`` and ``user_port``, return 1. A slot without an entry (the maps out of step) is
  refused as above: Cilium refuses it too (REASON_LB_NO_BACKEND_SLOT).

The connect hook runs for TCP and for connected UDP sockets (``inet_dgram_connect`` ->
``pre_connect``) alike; the protocol in the key keeps them apart. Unconnected UDP (sendmsg4),
recvmsg4 and getpeername4 (the reverse translation) are not here yet.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import struct
from pathlib import Path

from kubeport.proxy.relay.sockmap import (
    ADD64_IMM,
    BPF_PROG_ATTACH,
    BPF_PROG_LOAD,
    BPF_PSEUDO_MAP_FD,
    CALL,
    EXIT,
    JEQ_IMM,
    LD_IMM64,
    LDX_W,
    MOV64_IMM,
    MOV64_REG,
    R0,
    R1,
    R2,
    R6,
    R10,
    BPF_FUNC_map_lookup_elem,
    Insn,
    bpf,
    encode,
)

# bpf(2) command, program and attach types, flags and helpers (include/uapi/linux/bpf.h, 6.1).
BPF_PROG_DETACH = 9
BPF_PROG_TYPE_CGROUP_SOCK_ADDR = 18
BPF_CGROUP_INET4_CONNECT = 10
BPF_F_ALLOW_MULTI = 2  # beside the programs of other owners, on this cgroup and its ancestors
BPF_FUNC_get_prandom_u32 = 7
BPF_FUNC_set_retval = 187
BPF_LOG_LEVEL1, BPF_LOG_STATS = 1, 4

# offsetof(struct bpf_sock_addr, ...) (include/uapi/linux/bpf.h: user_family u32 at 0, user_ip4
# at 4, user_ip6[4] at 8, user_port at 24, family 28, type 32, protocol 36). user_ip4 and
# user_port allow 4-byte reads and writes, protocol 4-byte reads; both addresses are in network
# byte order, the port in the low 16 bits of user_port as the sockaddr's sin_port is in memory.
USER_IP4, USER_PORT, PROTOCOL = 4, 24, 36

# Opcodes the sockmap program does not use (include/uapi/linux/bpf_common.h, bpf.h).
LDX_H = 0x69  # BPF_LDX | BPF_MEM | BPF_H
STX_W = 0x63  # BPF_STX | BPF_MEM | BPF_W
STX_H = 0x6B  # BPF_STX | BPF_MEM | BPF_H
STX_B = 0x73  # BPF_STX | BPF_MEM | BPF_B
ST_B = 0x72  # BPF_ST | BPF_MEM | BPF_B (an immediate)
MOD32_REG = 0x9C  # BPF_ALU | BPF_MOD | BPF_X
ADD32_REG = 0x0C  # BPF_ALU | BPF_ADD | BPF_X
R7, R8 = 7, 8

SYS_REJECT, SYS_PROCEED = 0, 1  # Cilium's names for a cgroup sock_addr program's verdicts


def _map(reg: int, map_fd: int) -> list[Insn]:
    return [Insn(LD_IMM64, reg, BPF_PSEUDO_MAP_FD, 0, map_fd), Insn(0)]


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


def connect4_program(services_fd: int, backends_fd: int, refuse_errno: int | None = errno.ECONNREFUSED) -> list[Insn]:
    """The connect4 program over the two maps (maps.py). ``refuse_errno`` None: a refused
    connect fails with the kernel's EPERM (no bpf_set_retval call)."""
    refuse = [Insn(MOV64_IMM, R1, imm=-refuse_errno), Insn(CALL, imm=BPF_FUNC_set_retval)] if refuse_errno else []
    return resolve([
        Insn(MOV64_REG, R6, R1),                        # r6 = ctx
        Insn(LDX_W, R2, R6, USER_IP4),                  # the services key on the stack at r10-8:
        Insn(STX_W, R10, R2, -8),                       #   address (network order)
        Insn(LDX_W, R2, R6, USER_PORT),
        Insn(STX_H, R10, R2, -4),                       #   port (network order, the low 16 bits)
        Insn(LDX_W, R2, R6, PROTOCOL),
        Insn(STX_B, R10, R2, -2),                       #   protocol
        Insn(ST_B, R10, off=-1, imm=0),                 #   padding
        *_map(R1, services_fd),
        Insn(MOV64_REG, R2, R10),
        Insn(ADD64_IMM, R2, imm=-8),
        Insn(CALL, imm=BPF_FUNC_map_lookup_elem),       # r0 = &services[key] or NULL
        Insn(JEQ_IMM, R0, off="proceed", imm=0),        # not a Service port: untouched
        Insn(LDX_W, R7, R0, 0),                         # r7 = count
        Insn(JEQ_IMM, R7, off="reject", imm=0),         # no usable endpoint
        Insn(LDX_W, R8, R0, 4),                         # r8 = slot base
        Insn(CALL, imm=BPF_FUNC_get_prandom_u32),
        Insn(MOD32_REG, R0, R7),                        # w0 %= count
        Insn(ADD32_REG, R0, R8),                        # w0 += base (modulo 2**32)
        Insn(STX_W, R10, R0, -12),                      # the backends key at r10-12
        *_map(R1, backends_fd),
        Insn(MOV64_REG, R2, R10),
        Insn(ADD64_IMM, R2, imm=-12),
        Insn(CALL, imm=BPF_FUNC_map_lookup_elem),       # r0 = &backends[slot] or NULL
        Insn(JEQ_IMM, R0, off="reject", imm=0),         # the maps out of step
        Insn(LDX_W, R2, R0, 0),
        Insn(STX_W, R6, R2, USER_IP4),                  # ctx->user_ip4 = backend address
        Insn(LDX_H, R2, R0, 4),
        Insn(STX_W, R6, R2, USER_PORT),                 # ctx->user_port = backend port
        "proceed",
        Insn(MOV64_IMM, R0, imm=SYS_PROCEED),
        Insn(EXIT),
        "reject",
        *refuse,                                        # bpf_set_retval(-errno)
        Insn(MOV64_IMM, R0, imm=SYS_REJECT),
        Insn(EXIT),
    ])


class ProgramRejected(OSError):
    """BPF_PROG_LOAD refused the program; the message carries the verifier's log."""


def load_program(program: list[Insn], attach_type: int = BPF_CGROUP_INET4_CONNECT,
                 name: str = "kubeport_conn4", log_level: int = BPF_LOG_LEVEL1) -> tuple[int, str]:
    """BPF_PROG_LOAD as BPF_PROG_TYPE_CGROUP_SOCK_ADDR for ``attach_type``: (fd, the verifier's log).

    Raises ProgramRejected (an OSError with the kernel's errno) with the log when refused."""
    code = encode(program)
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    log_buf = ctypes.create_string_buffer(1 << 16)
    # prog_type, insn_cnt, insns, license, log_level, log_size, log_buf, kern_version, prog_flags,
    # prog_name[16], prog_ifindex, expected_attach_type (offset 68)
    attr = struct.pack(
        "<IIQQIIQII16sII", BPF_PROG_TYPE_CGROUP_SOCK_ADDR, len(program), ctypes.addressof(insns),
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
    """The mount points of the cgroup v2 hierarchy in /proc/self/mountinfo's text. Pure.

    A line: ``id parent major:minor root mount-point options [optional...] - fstype source super``;
    the mount point escapes space, tab, newline and backslash as octal."""
    found = []
    for line in mountinfo.splitlines():
        fields, _, tail = line.partition(" - ")
        if tail.split(" ", 1)[0] == "cgroup2":
            point = fields.split(" ")[4]
            found.append(Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point)))
    return found


def cgroup2_mount() -> Path | None:
    """Where this process sees the cgroup v2 hierarchy (/sys/fs/cgroup, or beside v1
    controllers /sys/fs/cgroup/unified), None without one."""
    mounts = cgroup2_mounts(Path("/proc/self/mountinfo").read_text())
    return mounts[0] if mounts else None


def open_cgroup(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)

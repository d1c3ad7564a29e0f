"""Which worker gets a client: a classic BPF program on the SO_REUSEPORT group.

With several relay processes (workers/parent.py) sharing a frontend, the kernel picks the
socket by a hash of the 4-tuple, so two connections of one client usually land in
different processes, each with its own ClientIP affinity table. For service ports
with session affinity, a cBPF program attached to the group (SO_ATTACH_REUSEPORT_CBPF)
picks the socket by a hash of the client's *address* only, so one client always
reaches the same worker and its affinity table.

What the program sees: the packet with its data pointer past the transport header
(for UDP the payload, for a TCP SYN nothing at all), so the source address is read
through the negative offset SKF_NET_OFF, which addresses the network header. The
returned index selects ``socks[index]`` of the group; an index beyond the group
falls back to the 4-tuple hash.
"""

from __future__ import annotations

import ctypes
import socket
import struct

SO_ATTACH_REUSEPORT_CBPF = 51
SO_DETACH_REUSEPORT_BPF = 68
_SKF_NET_OFF = -0x100000
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_TAX = 0x07  # BPF_MISC | BPF_TAX
_XOR_X = 0xAC  # BPF_ALU | BPF_XOR | BPF_X
_MUL_K = 0x24  # BPF_ALU | BPF_MUL | BPF_K
_RSH_K = 0x74  # BPF_ALU | BPF_RSH | BPF_K
_MOD_K = 0x94  # BPF_ALU | BPF_MOD | BPF_K
_RET_A = 0x16  # BPF_RET | BPF_A
_GOLDEN = 0x9E3779B1  # Fibonacci hashing: consecutive addresses spread over the workers


def _net(offset: int) -> int:
    return (_SKF_NET_OFF + offset) & 0xFFFFFFFF


def client_hash_program(family: int, groups: int) -> list[tuple[int, int, int, int]]:
    """The instructions (code, jt, jf, k): hash the source address, modulo ``groups``."""
    if groups < 1:
        raise ValueError("groups must be >= 1")
    if family == 4:
        load = [(_LD_W_ABS, 0, 0, _net(12))]  # IPv4 saddr
    else:
        load = [(_LD_W_ABS, 0, 0, _net(8))]  # IPv6 saddr: four words, xor-folded
        for offset in (12, 16, 20):
            load += [(_TAX, 0, 0, 0), (_LD_W_ABS, 0, 0, _net(offset)), (_XOR_X, 0, 0, 0)]
    return load + [(_MUL_K, 0, 0, _GOLDEN), (_RSH_K, 0, 0, 16), (_MOD_K, 0, 0, groups), (_RET_A, 0, 0, 0)]


def worker_for(address: str, groups: int) -> int:
    """What the program computes, in Python (for tests and logs)."""
    packed = socket.inet_pton(socket.AF_INET6 if ":" in address else socket.AF_INET, address)
    value = 0
    for (word,) in struct.iter_unpack("!I", packed):
        value ^= word
    return (((value * _GOLDEN) & 0xFFFFFFFF) >> 16) % groups


def attach(sock: socket.socket, family: int, groups: int) -> None:
    """Steer ``sock``'s reuseport group by client address (raises OSError if the kernel refuses)."""
    program = client_hash_program(family, groups)
    filters = (ctypes.c_ubyte * (8 * len(program))).from_buffer_copy(
        b"".join(struct.pack("HBBI", *instruction) for instruction in program)
    )
    fprog = struct.pack("HL", len(program), ctypes.addressof(filters))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)


def detach(sock: socket.socket) -> None:
    """Back to the kernel's 4-tuple hash (ENOENT when nothing was attached is fine)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_REUSEPORT_BPF, 0)
    except OSError:
        pass

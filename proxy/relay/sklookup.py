"""One socket for many Service addresses: a BPF sk_lookup program picks the receiving socket.

A BPF_PROG_TYPE_SK_LOOKUP program attached to a network namespace (BPF_LINK_CREATE with the
netns's fd, kernel 5.9+) runs when the transport layer looks for the socket of an incoming TCP
SYN or UDP datagram, before the listening/bound socket tables (``inet_lookup_run_sk_lookup`` in
net/ipv4/inet_hashtables.c, ``udp4_lookup_run_bpf`` in net/ipv4/udp.c, their IPv6 twins). The
program here looks the packet's destination up and hands it to a socket kept in a sockmap, so
one listener serves any number of (address, port) pairs and a node's descriptors no longer grow
with its Services.

Maps:

* ``destinations`` (hash, not preallocated): key of KEY_SIZE (20) bytes ->
  u32 socket index (host order). The key:

  ====== ==== ===============================================================
  offset size
  ====== ==== ===============================================================
  0      16   local address, network order: IPv6 as is; IPv4 as its 4 bytes then 12 zero bytes
  16     2    local port, HOST order (``bpf_sk_lookup.local_port`` is host order)
  18     1    IP protocol (6 TCP, 17 UDP)
  19     1    address family of the packet (2 AF_INET, 10 AF_INET6): the family tells
              10.96.0.1 from the IPv6 address a60:1:: its first bytes would spell
  ====== ==== ===============================================================

* ``sockets`` (sockmap): u32 index -> socket (written with the socket's fd; read back from user
  space as the socket's cookie, the value being 8 bytes wide).

The program: look the key up; on a hit take ``sockets[index]`` (a referenced socket:
the verifier makes the program release it), ``bpf_sk_assign(ctx, sk, 0)``, ``bpf_sk_release``,
return SK_PASS. A miss, an empty slot or a socket ``bpf_sk_assign`` refuses all return SK_PASS
with nothing assigned: the kernel's own lookup proceeds, so a port with a socket of its own
still works and an address:port without one is refused as before (TCP RST, ECONNREFUSED; UDP
ICMP port unreachable). The program never drops.

What the kernel asks of the sockets (``bpf_sk_lookup_assign`` in net/core/filter.c,
``sock_map_sk_state_allowed`` in net/core/sock_map.c):

* TCP: a listener (TCP_LISTEN) to enter the sockmap and to be assigned. Its bound address and
  port do not matter: no check compares them with the packet's. ``accept()`` gives sockets
  whose ``getsockname()`` is the dialled address and port (the request is built from the SYN).
* UDP: bound (hashed) to enter the sockmap, unconnected (TCP_CLOSE) to be assigned. Its
  ``getsockname()`` stays its own bound address; the dialled address and port come with each
  datagram through IP_RECVORIGDSTADDR (IPV6_RECVORIGDSTADDR), read from the packet's headers.
  Replies leave from the socket's bound port: a reply from the dialled port needs a socket bound
  to it (IP_TRANSPARENT or IP_FREEBIND) or the sender's source chosen another way.
* A UDP socket connected enters the sockmap but is never assigned (ESOCKTNOSUPPORT); a TCP
  socket that never listened does not enter (EOPNOTSUPP), nor does an unbound UDP socket.
* The socket's protocol must be the packet's (else EPROTOTYPE) and its family the packet's,
  or AF_INET6 without IPV6_V6ONLY for IPv4 packets (else EAFNOSUPPORT). A bind to a specific
  IPv6 address sets IPV6_V6ONLY (``__inet6_bind``, net/ipv6/af_inet6.c): one AF_INET6 socket
  serves both families only bound to ``::``, where it also takes its port on every address;
  else one socket a family. A route to a socket that refuses the packet only makes the assign
  fail, and the stack's own lookup proceed.
* SO_REUSEPORT: with flags 0 an assigned socket in a reuseport group stands for its group: the
  kernel picks among the group's sockets by the packet's hash, or by the group's
  SO_ATTACH_REUSEPORT_(C|E)BPF program (``inet_lookup_run_sk_lookup`` -> ``lookup_reuseport``).
  Workers sharing a listener with SO_REUSEPORT keep sharing it.

Other owners' programs on the same netns (up to 64, kernel/bpf/net_namespace.c) all run, in
attach order: the socket selected last wins (a program selects over an earlier choice only with
BPF_SK_LOOKUP_F_REPLACE, else EEXIST), and one program's SK_DROP drops the packet unless some
program selected a socket (``BPF_PROG_SK_LOOKUP_RUN_ARRAY``, include/linux/filter.h).

Measured (Linux 6.18, 2 vCPUs of an AMD EPYC, Python 3.11): routing 50,000 (address, port,
protocol) entries takes 0.31-0.37 s with ``route`` (one BPF_MAP_UPDATE_ELEM each, about 7 us an
entry, the addresses given as ``ipaddress`` objects; 0.52-0.61 s from strings, which
``route_key`` parses), 0.12-0.17 s with ``route_many`` (BPF_MAP_UPDATE_BATCH, Linux 5.6+; the
keys' encoding is most of it). Reading the 50,000 back with ``routes()`` takes 0.2 s.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import os
import socket
import struct
from pathlib import Path

from kubeport.proxy.connectlb import programs
from kubeport.proxy.connectlb.programs import ProgramRejected, resolve  # noqa: F401 - load_program raises it
from kubeport.proxy.relay.sockmap import (
    ADD64_IMM,
    BPF_F_NO_PREALLOC,
    BPF_MAP_CREATE,
    BPF_MAP_DELETE_ELEM,
    BPF_MAP_LOOKUP_BATCH,
    BPF_MAP_LOOKUP_ELEM,
    BPF_MAP_TYPE_HASH,
    BPF_MAP_UPDATE_ELEM,
    BPF_PSEUDO_MAP_FD,
    CALL,
    EXIT,
    JEQ_IMM,
    JNE_IMM,
    LD_IMM64,
    LDX_W,
    MOV64_IMM,
    MOV64_REG,
    R0,
    R1,
    R2,
    R3,
    R6,
    R10,
    STX_DW,
    BPF_FUNC_map_lookup_elem,
    Insn,
    bpf,
)

# bpf(2) commands, types and helpers (include/uapi/linux/bpf.h).
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_MAP_UPDATE_BATCH = 26
BPF_LINK_CREATE = 28
BPF_MAP_TYPE_SOCKMAP = 15
BPF_PROG_TYPE_SK_LOOKUP = 30
BPF_SK_LOOKUP = 36
BPF_FUNC_sk_release, BPF_FUNC_sk_assign = 86, 124
SK_PASS = 1

# offsetof(struct bpf_sk_lookup, ...): sk (8 bytes) at 0, family 8, protocol 12, remote_ip4 16,
# remote_ip6[4] 20, remote_port (be16 and 16 bits of padding) 36, local_ip4 40, local_ip6[4] 44,
# local_port 60, ingress_ifindex 64. ``sk_lookup_is_valid_access`` (net/core/filter.c) allows
# 4-byte reads of all of them (narrower ones too).
FAMILY, PROTOCOL, LOCAL_IP4, LOCAL_IP6, LOCAL_PORT = 8, 12, 40, 44, 60

JA = 0x05  # BPF_JMP | BPF_JA
STX_W = 0x63  # BPF_STX | BPF_MEM | BPF_W
STX_H = 0x6B  # BPF_STX | BPF_MEM | BPF_H
STX_B = 0x73  # BPF_STX | BPF_MEM | BPF_B
R7 = 7

KEY_SIZE = 20
#: entries a BPF_MAP_LOOKUP_BATCH may return: more than any hash bucket holds (ENOSPC otherwise)
_BATCH = 4096
_KEY_AT = -24  # the key on the program's stack: r10-24 .. r10-5, zeroed through r10-1
_INDEX_AT = -28  # the sockmap key


def _map(reg: int, map_fd: int) -> list[Insn]:
    return [Insn(LD_IMM64, reg, BPF_PSEUDO_MAP_FD, 0, map_fd), Insn(0)]


def sk_lookup_program(destinations_fd: int, sockets_fd: int) -> list[Insn]:
    """The program over the two maps (see the module's docstring)."""
    return resolve([
        Insn(MOV64_REG, R6, R1),                        # r6 = ctx
        Insn(MOV64_IMM, R2, imm=0),                     # the key's 24 bytes zeroed: the verifier
        Insn(STX_DW, R10, R2, _KEY_AT),                 #   refuses a map key read from
        Insn(STX_DW, R10, R2, _KEY_AT + 8),             #   uninitialised stack, and IPv4 keys
        Insn(STX_DW, R10, R2, _KEY_AT + 16),            #   need their 12 zero bytes
        Insn(LDX_W, R2, R6, LOCAL_PORT),
        Insn(STX_H, R10, R2, _KEY_AT + 16),             # port (host order)
        Insn(LDX_W, R2, R6, PROTOCOL),
        Insn(STX_B, R10, R2, _KEY_AT + 18),             # protocol
        Insn(LDX_W, R2, R6, FAMILY),
        Insn(STX_B, R10, R2, _KEY_AT + 19),             # family
        Insn(JNE_IMM, R2, off="ipv4", imm=socket.AF_INET6),
        *[insn for word in range(4) for insn in (      # IPv6: the 16 bytes, as 4 words
            Insn(LDX_W, R3, R6, LOCAL_IP6 + 4 * word),
            Insn(STX_W, R10, R3, _KEY_AT + 4 * word))],
        Insn(JA, off="lookup"),
        "ipv4",
        Insn(LDX_W, R3, R6, LOCAL_IP4),
        Insn(STX_W, R10, R3, _KEY_AT),                  # IPv4: 4 bytes, then the zeros
        "lookup",
        *_map(R1, destinations_fd),
        Insn(MOV64_REG, R2, R10),
        Insn(ADD64_IMM, R2, imm=_KEY_AT),
        Insn(CALL, imm=BPF_FUNC_map_lookup_elem),       # r0 = &destinations[key] or NULL
        Insn(JEQ_IMM, R0, off="pass", imm=0),           # not routed: the kernel's own lookup
        Insn(LDX_W, R2, R0, 0),
        Insn(STX_W, R10, R2, _INDEX_AT),
        *_map(R1, sockets_fd),
        Insn(MOV64_REG, R2, R10),
        Insn(ADD64_IMM, R2, imm=_INDEX_AT),
        Insn(CALL, imm=BPF_FUNC_map_lookup_elem),       # r0 = a referenced socket or NULL
        Insn(JEQ_IMM, R0, off="pass", imm=0),           # an empty slot
        Insn(MOV64_REG, R7, R0),
        Insn(MOV64_REG, R1, R6),
        Insn(MOV64_REG, R2, R7),
        Insn(MOV64_IMM, R3, imm=0),                     # flags 0: a reuseport group stays one
        Insn(CALL, imm=BPF_FUNC_sk_assign),             # an error leaves nothing assigned
        Insn(MOV64_REG, R1, R7),
        Insn(CALL, imm=BPF_FUNC_sk_release),
        "pass",
        Insn(MOV64_IMM, R0, imm=SK_PASS),
        Insn(EXIT),
    ])


def route_key(address, port: int, protocol: int) -> bytes:
    """The ``destinations`` key (KEY_SIZE bytes). Pure; ValueError for what it cannot encode."""
    ip = address if isinstance(address, (ipaddress.IPv4Address, ipaddress.IPv6Address)) \
        else ipaddress.ip_address(address)
    if not 0 < port < 65536:
        raise ValueError(f"port out of range: {port}")
    if not 0 <= protocol < 256:
        raise ValueError(f"protocol out of range: {protocol}")
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return ip.packed.ljust(16, b"\0") + struct.pack("=HBB", port, protocol, family)


def decode_route_key(key: bytes) -> tuple[str, int, int]:
    """(address, port, protocol) of a ``destinations`` key. Pure."""
    port, protocol, family = struct.unpack_from("=HBB", key, 16)
    ip = ipaddress.IPv6Address(key[:16]) if family == socket.AF_INET6 else ipaddress.IPv4Address(key[:4])
    return str(ip), port, protocol


def load_program(program: list[Insn], name: str = "kubeport_sklk") -> int:
    """BPF_PROG_LOAD as BPF_PROG_TYPE_SK_LOOKUP (expected attach type BPF_SK_LOOKUP, which
    ``bpf_prog_load_check_attach`` requires); ProgramRejected with the verifier's log."""
    fd, _log = programs.load_program(program, BPF_SK_LOOKUP, name, prog_type=BPF_PROG_TYPE_SK_LOOKUP)
    return fd


def _map_create(map_type: int, key_size: int, value_size: int, entries: int, flags: int = 0) -> int:
    return bpf(BPF_MAP_CREATE, struct.pack("<IIIII", map_type, key_size, value_size, entries, flags))


def _info(fd: int, size: int) -> bytes:
    """BPF_OBJ_GET_INFO_BY_FD: the first ``size`` bytes of a map's or program's info."""
    info = ctypes.create_string_buffer(size)
    bpf(BPF_OBJ_GET_INFO_BY_FD, struct.pack("<IIQ", fd, size, ctypes.addressof(info)))
    return info.raw


def _in_user_namespace() -> bool:
    try:
        return Path("/proc/self/uid_map").read_text().split() != ["0", "0", "4294967295"]
    except OSError:
        return False


def _why(exc: OSError) -> str:
    if exc.errno == errno.EPERM:
        if _in_user_namespace():
            return "in a user namespace: BPF programs need CAP_BPF and CAP_NET_ADMIN of the initial one"
        return f"bpf(2): {exc.strerror} (needs CAP_BPF and CAP_NET_ADMIN)"
    if exc.errno == errno.EINVAL:
        return f"bpf(2): {exc.strerror} (sk_lookup programs need Linux 5.9 or later)"
    return f"bpf(2): {exc.strerror}"


def sk_lookup_supported() -> str | None:
    """None when this process can load the program, else why not. Loads it once over two
    small maps and closes everything: nothing is attached."""
    try:
        lookup = SkLookup.create(capacity=1, sockets=1)
    except OSError as exc:
        return _why(exc)
    lookup.close()
    return None


class SkLookup:
    """The two maps, the program, and once attached the link that holds it on a netns."""

    def __init__(self, destinations: int, sockets: int, program: int, link: int | None = None) -> None:
        self.destinations, self.sockets, self.program, self.link = destinations, sockets, program, link
        self._key = ctypes.create_string_buffer(KEY_SIZE)
        self._index = ctypes.c_uint32()
        self._value64 = ctypes.c_uint64()
        self._update_attr = struct.pack("<IIQQQ", destinations, 0, ctypes.addressof(self._key),
                                        ctypes.addressof(self._index), 0)
        self._delete_attr = struct.pack("<IIQ", destinations, 0, ctypes.addressof(self._key))

    @classmethod
    def create(cls, capacity: int = 65536, sockets: int = 64) -> SkLookup:
        """Maps for ``capacity`` routes and ``sockets`` socket slots, and the program loaded
        (OSError, or ProgramRejected with the verifier's log, when the kernel refuses)."""
        fds: list[int] = []
        try:
            # Not preallocated: a hash map would otherwise hold all ``capacity`` entries from the start.
            fds.append(_map_create(BPF_MAP_TYPE_HASH, KEY_SIZE, 4, capacity, BPF_F_NO_PREALLOC))
            # An 8-byte value: a user-space lookup answers with the socket's cookie.
            fds.append(_map_create(BPF_MAP_TYPE_SOCKMAP, 4, 8, sockets))
            fds.append(load_program(sk_lookup_program(fds[0], fds[1])))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        return cls(*fds)

    @classmethod
    def adopt(cls, fds: dict[str, int]) -> SkLookup:
        """Take over the descriptors of ``fds()`` (passed on by a predecessor, or opened from
        pins); ValueError when they are not what this module made. The link, when there is one,
        keeps the program attached throughout."""
        destinations, sockets, program = fds["destinations"], fds["sockets"], fds["program"]
        d_type, _, d_key, d_value = struct.unpack("<IIII", _info(destinations, 16))
        s_type, _, s_key, s_value = struct.unpack("<IIII", _info(sockets, 16))
        (p_type,) = struct.unpack("<I", _info(program, 4))
        if (d_type, d_key, d_value) != (BPF_MAP_TYPE_HASH, KEY_SIZE, 4):
            raise ValueError(f"destinations: map type {d_type}, key {d_key}, value {d_value} bytes")
        if (s_type, s_key, s_value) != (BPF_MAP_TYPE_SOCKMAP, 4, 8):
            raise ValueError(f"sockets: map type {s_type}, key {s_key}, value {s_value} bytes")
        if p_type != BPF_PROG_TYPE_SK_LOOKUP:
            raise ValueError(f"program: type {p_type}, not sk_lookup")
        return cls(destinations, sockets, program, fds.get("link"))

    def fds(self) -> dict[str, int]:
        """name -> descriptor: what ``adopt`` takes."""
        found = {"destinations": self.destinations, "sockets": self.sockets, "program": self.program}
        if self.link is not None:
            found["link"] = self.link
        return found

    def attach(self, netns_fd: int) -> int:
        """BPF_LINK_CREATE on the network namespace open as ``netns_fd`` (/proc/<pid>/ns/net):
        the link's fd, kept; the program runs until ``detach`` or ``close`` closes it."""
        if self.link is not None:
            raise ValueError("already attached")
        self.link = bpf(BPF_LINK_CREATE, struct.pack("<IIII", self.program, netns_fd, BPF_SK_LOOKUP, 0))
        return self.link

    def detach(self) -> None:
        if self.link is not None:
            os.close(self.link)
            self.link = None

    def add_socket(self, index: int, sock) -> None:
        """``sockets[index]`` = ``sock`` (a socket or its fd): a TCP listener or a bound UDP socket."""
        fd = sock if isinstance(sock, int) else sock.fileno()
        key, value = ctypes.c_uint32(index), ctypes.c_uint64(fd)
        bpf(BPF_MAP_UPDATE_ELEM, struct.pack("<IIQQQ", self.sockets, 0, ctypes.addressof(key),
                                             ctypes.addressof(value), 0))

    def remove_socket(self, index: int) -> None:
        key = ctypes.c_uint32(index)
        try:
            bpf(BPF_MAP_DELETE_ELEM, struct.pack("<IIQ", self.sockets, 0, ctypes.addressof(key)))
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise

    def socket_cookie(self, index: int) -> int | None:
        """The SO_COOKIE of the socket at ``index``, None for an empty slot."""
        key = ctypes.c_uint32(index)
        try:
            bpf(BPF_MAP_LOOKUP_ELEM, struct.pack("<IIQQ", self.sockets, 0, ctypes.addressof(key),
                                                 ctypes.addressof(self._value64)))
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise
        return self._value64.value

    def route(self, address, port: int, protocol: int, index: int) -> None:
        """Packets to (address, port, protocol) go to ``sockets[index]`` (OSError E2BIG when full)."""
        self._key.raw = route_key(address, port, protocol)
        self._index.value = index
        bpf(BPF_MAP_UPDATE_ELEM, self._update_attr)

    def route_many(self, routes: list[tuple[object, int, int, int]]) -> None:
        """Many (address, port, protocol, index) at once: BPF_MAP_UPDATE_BATCH (Linux 5.6+)."""
        if not routes:
            return
        keys = b"".join(route_key(address, port, protocol) for address, port, protocol, _ in routes)
        values = struct.pack(f"={len(routes)}I", *(index for *_, index in routes))
        keys_buf = ctypes.create_string_buffer(keys, len(keys))
        values_buf = ctypes.create_string_buffer(values, len(values))
        done = 0
        while done < len(routes):
            attr = ctypes.create_string_buffer(struct.pack(
                "<QQQQIIQQ", 0, 0, ctypes.addressof(keys_buf) + done * KEY_SIZE,
                ctypes.addressof(values_buf) + done * 4, len(routes) - done, self.destinations, 0, 0), 128)
            try:
                bpf(BPF_MAP_UPDATE_BATCH, b"", attr)
            except OSError:
                done += struct.unpack_from("<I", attr, 32)[0]  # the count written back: what went in
                raise
            done += struct.unpack_from("<I", attr, 32)[0]

    def unroute(self, address, port: int, protocol: int) -> bool:
        """Forget a route; False when there was none. Takes effect for the next packet."""
        self._key.raw = route_key(address, port, protocol)
        try:
            bpf(BPF_MAP_DELETE_ELEM, self._delete_attr)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise
        return True

    def routes(self) -> dict[tuple[str, int, int], int]:
        """Every route in the kernel's map: (address, port, protocol) -> socket index, read with
        BPF_MAP_LOOKUP_BATCH (Linux 5.6+) a few thousand at a time."""
        found: dict[tuple[str, int, int], int] = {}
        chunk = _BATCH
        keys = ctypes.create_string_buffer(chunk * KEY_SIZE)
        values = (ctypes.c_uint32 * chunk)()
        token = (ctypes.c_uint32 * 2)()  # in and out: a hash map's bucket index
        token_p = ctypes.addressof(token)
        attr = ctypes.create_string_buffer(128)
        in_batch = 0  # NULL: from the first bucket
        while True:
            request = struct.pack("<QQQQIIQQ", in_batch, token_p + 4, ctypes.addressof(keys),
                                  ctypes.addressof(values), chunk, self.destinations, 0, 0)
            done = False
            try:
                bpf(BPF_MAP_LOOKUP_BATCH, request, attr)
            except OSError as exc:
                if exc.errno != errno.ENOENT:  # ENOENT: the last batch (it may still hold entries)
                    raise
                done = True
            (count,) = struct.unpack_from("<I", attr, 32)
            raw = keys.raw
            for i in range(count):
                found[decode_route_key(raw[i * KEY_SIZE:(i + 1) * KEY_SIZE])] = values[i]
            if done or not count:
                return found
            token[0] = token[1]
            in_batch = token_p

    def close(self) -> None:
        """Detach (close the link) and close the maps and the program."""
        for name in ("link", "program", "sockets", "destinations"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)

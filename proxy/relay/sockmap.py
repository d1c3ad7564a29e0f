"""In-kernel relaying of established TCP connections: a BPF sockhash and an sk_skb verdict program.

Once a direction of a relayed connection turns bulk (tcp.py), its source socket goes into
the ``verdict`` sockhash, whose stream-verdict program redirects every received skb to the
egress of the peer socket (``bpf_sk_redirect_hash``, net/core/filter.c); the bytes no
longer pass through this process. Python keeps accept, endpoint choice, retries,
accounting and the end of the connection.

Maps (all keyed by the source socket's cookie, ``SO_COOKIE`` here and
``bpf_get_socket_cookie`` in the program):

* ``peers`` (sockhash, no program): cookie(src) -> dst. Filled before ``verdict``, so the
  program never runs on a socket whose peer is missing (a failed redirect drops the skb).
* ``verdict`` (sockhash, the program attached as BPF_SK_SKB_STREAM_VERDICT): cookie(src) -> src.
* ``counts`` (hash): cookie(src) -> bytes the program has seen from src.

What the kernel does not do, seen on 6.18 and read in net/core/skmsg.c:

* Backpressure. ``sk_psock_verdict_recv`` takes each skb off the source's receive queue
  (which uncharges it, so the TCP window stays open) and ``sk_psock_skb_redirect`` appends
  it to the peer psock's ``ingress_skb`` list, which has no limit: with a reader that does
  not read, the kernel accepts without bound. The relay bounds it: when the bytes counted by the
  program run more than ``limit`` ahead of what the destination socket has taken
  (``tcpi_bytes_acked`` + SIOCOUTQ), the source leaves ``verdict`` (``pause``): its data
  stays in its own receive queue, whose TCP window closes; once the peer has every counted
  byte the direction is spliced by the relay (re-inserting the source corrupted streams,
  see kernel_relays.py ``KernelRelays``). The check is a sweep, so the bound is ``limit`` plus what
  arrives in one sweep interval, and depends on the event loop running the sweep on time.
* Data already queued when a socket enters ``verdict`` waits for the next segment
  (``sk_psock_start_verdict`` only replaces ``sk_data_ready``); SO_RCVLOWAT runs
  ``tcp_data_ready`` at once (``tcp_set_rcvlowat``), which makes the program read it.
* FIN: the source's FIN wakes its poll waiters (EPOLLRDHUP) while redirected bytes may
  still wait in the peer's psock queue; the relay passes the FIN on
  (``shutdown(SHUT_WR)``) only once the destination has taken every counted byte.
  A FIN without data reaches the program as an empty skb, which it drops (see
  ``verdict_program``). A reset is an error on either socket, passed on with SO_LINGER 0.
* Partly read skbs. ``tcp_read_skb`` hands the program whole skbs from the head of the
  receive queue, whatever an earlier ``recv`` took of the first one (the bytes already relayed are
  sent again). The relay inserts a source only right after a read that
  emptied its queue (direction.py).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import socket
import struct
import sys
import termios
from typing import NamedTuple

SO_COOKIE = 57
_BPF_SYSCALL = {"x86_64": 321, "aarch64": 280, "riscv64": 280, "armv7l": 386, "ppc64le": 361, "s390x": 351}

# bpf(2) commands, map, program and attach types (include/uapi/linux/bpf.h).
BPF_MAP_CREATE, BPF_MAP_LOOKUP_ELEM, BPF_MAP_UPDATE_ELEM, BPF_MAP_DELETE_ELEM = 0, 1, 2, 3
BPF_PROG_LOAD, BPF_PROG_ATTACH = 5, 8
BPF_MAP_LOOKUP_BATCH = 24
BPF_MAP_TYPE_HASH, BPF_MAP_TYPE_SOCKHASH = 1, 18
BPF_F_NO_PREALLOC = 1
BPF_PROG_TYPE_SK_SKB = 14
BPF_SK_SKB_STREAM_VERDICT = 5
BPF_FUNC_map_lookup_elem, BPF_FUNC_get_socket_cookie, BPF_FUNC_sk_redirect_hash = 1, 46, 72
BPF_PSEUDO_MAP_FD = 1

# Opcodes (include/uapi/linux/bpf_common.h, bpf.h).
MOV64_REG = 0xBF  # BPF_ALU64 | BPF_MOV | BPF_X
MOV64_IMM = 0xB7  # BPF_ALU64 | BPF_MOV | BPF_K
ADD64_IMM = 0x07  # BPF_ALU64 | BPF_ADD | BPF_K
ADD64_REG = 0x0F  # BPF_ALU64 | BPF_ADD | BPF_X
LD_IMM64 = 0x18  # BPF_LD | BPF_IMM | BPF_DW (two slots)
LDX_W = 0x61  # BPF_LDX | BPF_MEM | BPF_W
LDX_DW = 0x79  # BPF_LDX | BPF_MEM | BPF_DW
STX_DW = 0x7B  # BPF_STX | BPF_MEM | BPF_DW
JEQ_IMM = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JNE_IMM = 0x55  # BPF_JMP | BPF_JNE | BPF_K
CALL = 0x85  # BPF_JMP | BPF_CALL
EXIT = 0x95  # BPF_JMP | BPF_EXIT
R0, R1, R2, R3, R4, R6, R10 = 0, 1, 2, 3, 4, 6, 10
SK_DROP = 0
_SKB_LEN = 0  # offsetof(struct __sk_buff, len)


class Insn(NamedTuple):
    code: int
    dst: int = 0
    src: int = 0
    off: int = 0
    imm: int = 0


def _load_map(reg: int, map_fd: int) -> list[Insn]:
    return [Insn(LD_IMM64, reg, BPF_PSEUDO_MAP_FD, 0, map_fd), Insn(0)]


def verdict_program(peers_fd: int, counts_fd: int) -> list[Insn]:
    """counts[cookie] += skb->len; return bpf_sk_redirect_hash(skb, peers, &cookie, 0) (egress).

    A FIN without data reaches the program as an skb of length 0: redirected, the peer's
    psock would send 0 bytes, which ``sk_psock_backlog`` reports as EPIPE on the peer
    (net/core/skmsg.c). It is dropped instead: the FIN itself was taken when it was queued.
    """
    return [
        Insn(MOV64_REG, R6, R1),                      # r6 = skb
        Insn(LDX_W, R2, R6, _SKB_LEN),                # r1 stays the context for the first call
        Insn(JNE_IMM, R2, off=2, imm=0),
        Insn(MOV64_IMM, R0, imm=SK_DROP),
        Insn(EXIT),
        Insn(CALL, imm=BPF_FUNC_get_socket_cookie),   # r0 = cookie(skb->sk)
        Insn(STX_DW, R10, R0, -8),                    # key on the stack
        *_load_map(R1, counts_fd),
        Insn(MOV64_REG, R2, R10),
        Insn(ADD64_IMM, R2, imm=-8),
        Insn(CALL, imm=BPF_FUNC_map_lookup_elem),     # r0 = &counts[cookie] or NULL
        Insn(JEQ_IMM, R0, off=4, imm=0),
        Insn(LDX_W, R1, R6, _SKB_LEN),                # the verdict of one socket runs under its lock:
        Insn(LDX_DW, R2, R0, 0),                      # a plain add is enough
        Insn(ADD64_REG, R2, R1),
        Insn(STX_DW, R0, R2, 0),
        Insn(MOV64_REG, R1, R6),
        *_load_map(R2, peers_fd),
        Insn(MOV64_REG, R3, R10),
        Insn(ADD64_IMM, R3, imm=-8),
        Insn(MOV64_IMM, R4, imm=0),                   # flags 0: the peer's egress
        Insn(CALL, imm=BPF_FUNC_sk_redirect_hash),    # SK_PASS with the redirect set, or SK_DROP
        Insn(EXIT),
    ]


def encode(program: list[Insn]) -> bytes:
    return b"".join(struct.pack("<BBhi", i.code, (i.src << 4) | i.dst, i.off, i.imm) for i in program)


def decode(data: bytes) -> list[Insn]:
    out = []
    for code, regs, off, imm in struct.iter_unpack("<BBhi", data):
        out.append(Insn(code, regs & 0xF, regs >> 4, off, imm))
    return out


class SockmapUnavailable(Exception):
    """The kernel or the process's privileges do not allow in-kernel relaying; the message says why."""


_libc = ctypes.CDLL(None, use_errno=True)
ATTR_SIZE = 128


def bpf(cmd: int, attr: bytes, buf=None) -> int:
    """bpf(2) with ``attr`` (in ``buf`` when given, where the kernel's answers can be read back);
    OSError with the kernel's errno. Shared with proxy/connectlb."""
    number = _BPF_SYSCALL.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"bpf(2): unknown syscall number on {platform.machine()}")
    if buf is None:
        buf = ctypes.create_string_buffer(attr, ATTR_SIZE)
    else:
        ctypes.memmove(buf, attr, len(attr))
    result = _libc.syscall(number, cmd, buf, ATTR_SIZE)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def _map_create(map_type: int, key_size: int, value_size: int, entries: int, flags: int = 0) -> int:
    return bpf(BPF_MAP_CREATE, struct.pack("<IIIII", map_type, key_size, value_size, entries, flags))


def load_program(program: list[Insn]) -> int:
    """BPF_PROG_LOAD as BPF_PROG_TYPE_SK_SKB; the verifier's log is in the error when refused."""
    code = encode(program)
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")  # sk_redirect_hash is a GPL-only helper
    log_buf = ctypes.create_string_buffer(16384)
    attr = struct.pack(
        "<IIQQIIQII16sII", BPF_PROG_TYPE_SK_SKB, len(program), ctypes.addressof(insns),
        ctypes.addressof(license_), 1, len(log_buf), ctypes.addressof(log_buf), 0, 0, b"kubeport_relay", 0, 0,
    )
    # The verifier gives up with EAGAIN when a signal is pending; libbpf retries it 5 times.
    for _ in range(4):
        try:
            return bpf(BPF_PROG_LOAD, attr)
        except OSError as exc:
            if exc.errno != errno.EAGAIN:
                break
    try:
        return bpf(BPF_PROG_LOAD, attr)
    except OSError as exc:
        verifier = log_buf.value.decode(errors="replace").strip()
        raise OSError(exc.errno, f"{exc.strerror}{': ' + verifier if verifier else ''}") from None


def cookie(sock) -> int:
    return struct.unpack("Q", sock.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8))[0]


_TCP_INFO_BYTES_ACKED = 120  # offsetof(struct tcp_info, tcpi_bytes_acked)
_TCP_INFO_SIZE = 136  # through tcpi_bytes_received


def bytes_written(sock) -> int:
    """Bytes written into ``sock`` so far, SYN included for an active open: acked + still queued."""
    return bytes_acked(sock) + send_queue(sock)


def bytes_acked(sock) -> int:
    return _tcp_info_u64(sock, _TCP_INFO_BYTES_ACKED)


def _tcp_info_u64(sock, offset: int) -> int:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
    return struct.unpack_from("Q", info, offset)[0]


_TCP_INFO_BYTES_RECEIVED = 128  # offsetof(struct tcp_info, tcpi_bytes_received)


def bytes_consumed(sock) -> int | None:
    """Bytes taken off ``sock``'s receive queue so far (``copied_seq``): received in order less
    what is still queued. None when data kept arriving between the reads.

    ``tcp_eat_skb`` advances copied_seq for every skb the verdict path takes, whatever the
    verdict, so this less the program's count is what the kernel took without running the
    program on it. tcpi_bytes_received counts a received FIN too, the queue does not: one more.
    """
    for _ in range(4):
        before = _tcp_info_u64(sock, _TCP_INFO_BYTES_RECEIVED)
        queued = _queued(sock)
        if _tcp_info_u64(sock, _TCP_INFO_BYTES_RECEIVED) == before:
            return before - queued
    return None


def _queued(sock) -> int:
    """``rcv_nxt - copied_seq`` from a 1-byte MSG_PEEK's TCP_INQ message: SIOCINQ will not do, for
    ``tcp_bpf_ioctl`` answers it with the psock's queue once the socket is in a sockmap."""
    sock.setsockopt(socket.IPPROTO_TCP, TCP_INQ, 1)
    try:
        _, ancillary, _, _ = sock.recvmsg(1, _INQ_SPACE, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return 0
    for level, kind, data in ancillary:
        if level == socket.IPPROTO_TCP and kind == TCP_INQ:
            return int.from_bytes(data[:4], sys.byteorder)
    return 0


TCP_INQ = 36  # also TCP_CM_INQ, the control message's type
_INQ_SPACE = socket.CMSG_SPACE(4)


def send_queue(sock) -> int:
    """SIOCOUTQ: bytes written into ``sock`` that its peer has not acknowledged."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]


#: SO_RCVLOWAT while a pause waits for the program's runs to end: large against what arrives
#: meanwhile, small enough that ``tcp_set_rcvlowat`` does not grow the receive buffer
#: much for it (it makes room for the low-water mark).
HOLD_LOWAT = 4 << 20


class Sockmap:
    """The three maps and the program of one relay process (a connection lives in one process)."""

    def __init__(self, capacity: int = 65536) -> None:
        self._fds: list[int] = []
        try:
            self.peers = self._keep(_map_create(BPF_MAP_TYPE_SOCKHASH, 8, 4, capacity))
            self.verdict = self._keep(_map_create(BPF_MAP_TYPE_SOCKHASH, 8, 4, capacity))
            # Not preallocated: a hash map would otherwise hold all ``capacity`` entries from the start.
            self.counts = self._keep(_map_create(BPF_MAP_TYPE_HASH, 8, 8, capacity, BPF_F_NO_PREALLOC))
            self.program = self._keep(load_program(verdict_program(self.peers, self.counts)))
            bpf(BPF_PROG_ATTACH, struct.pack("<IIII", self.verdict, self.program, BPF_SK_SKB_STREAM_VERDICT, 0))
        except OSError as exc:
            self.close()
            needs = " (needs CAP_BPF and CAP_NET_ADMIN)" if exc.errno == errno.EPERM else ""
            raise SockmapUnavailable(f"bpf(2): {exc.strerror}{needs}") from None
        self._key = ctypes.c_uint64()
        self._value32 = ctypes.c_uint32()
        self._value64 = ctypes.c_uint64()
        self._key_p = ctypes.addressof(self._key)
        self._capacity = capacity
        self._batch_keys = (ctypes.c_uint64 * capacity)()
        self._batch_values = (ctypes.c_uint64 * capacity)()
        self._batch_token = (ctypes.c_uint32 * 2)()  # in and out: a hash map's bucket index
        self._batch_attr = ctypes.create_string_buffer(ATTR_SIZE)

    def _keep(self, fd: int) -> int:
        self._fds.append(fd)
        return fd

    def _update(self, map_fd: int, key: int, value: ctypes._SimpleCData) -> None:
        self._key.value = key
        bpf(BPF_MAP_UPDATE_ELEM, struct.pack("<IIQQQ", map_fd, 0, self._key_p, ctypes.addressof(value), 0))

    def _delete(self, map_fd: int, key: int) -> None:
        self._key.value = key
        try:
            bpf(BPF_MAP_DELETE_ELEM, struct.pack("<IIQ", map_fd, 0, self._key_p))
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise

    def link(self, src_cookie: int, dst_fd: int) -> None:
        """counts and peers for one direction (raises OSError: map full, socket type refused)."""
        self._value64.value = 0
        self._update(self.counts, src_cookie, self._value64)
        self._value32.value = dst_fd
        self._update(self.peers, src_cookie, self._value32)

    def start(self, src_cookie: int, src) -> None:
        """The program takes over src's input; what is queued already is read at once (SO_RCVLOWAT)."""
        self._value32.value = src.fileno()
        self._update(self.verdict, src_cookie, self._value32)
        src.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)

    def hold(self, src) -> None:
        """The first step of a pause: new data no longer wakes the program (``tcp_data_ready``
        calls ``sk_data_ready`` only once SO_RCVLOWAT bytes wait, or under memory pressure, or
        at the FIN), so that a moment later none of its runs overlaps ``pause``."""
        src.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, HOLD_LOWAT)

    def pause(self, src_cookie: int, src) -> None:
        """src's input stays in its receive queue (its TCP window closes); the program no longer reads it."""
        self._delete(self.verdict, src_cookie)
        src.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)  # the relay's own reads wake at once

    def counted(self, src_cookie: int) -> int:
        self._key.value = src_cookie
        bpf(BPF_MAP_LOOKUP_ELEM, struct.pack("<IIQQ", self.counts, 0, self._key_p, ctypes.addressof(self._value64)))
        return self._value64.value

    def all_counted(self) -> dict[int, int]:
        """Every direction's count with one BPF_MAP_LOOKUP_BATCH: a sweep costs one system call,
        however many connections the kernel relays."""
        found: dict[int, int] = {}
        keys, values, token = self._batch_keys, self._batch_values, self._batch_token
        token_p = ctypes.addressof(token)
        in_batch = 0  # NULL: from the first bucket
        while True:
            attr = struct.pack("<QQQQIIQQ", in_batch, token_p + 4, ctypes.addressof(keys), ctypes.addressof(values),
                               self._capacity, self.counts, 0, 0)
            done = False
            try:
                bpf(BPF_MAP_LOOKUP_BATCH, attr, self._batch_attr)
            except OSError as exc:
                if exc.errno != errno.ENOENT:  # ENOENT: the last batch (it may still hold entries)
                    raise
                done = True
            (count,) = struct.unpack_from("<I", self._batch_attr, 32)
            found.update(zip(keys[:count], values[:count]))
            if done or not count:
                return found
            token[0] = token[1]
            in_batch = token_p

    def unlink(self, src_cookie: int) -> None:
        """Forget a direction's count (the sockets leave the sockhashes when they are closed)."""
        try:
            self._delete(self.counts, src_cookie)
        except OSError:
            pass

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


def open_sockmap(mode: str, capacity: int = 65536) -> tuple[Sockmap | None, str]:
    """The sockmap for ``--tcp-relay`` ``mode`` (auto, sockmap, splice) and the line saying which path is used.

    ``sockmap`` raises SockmapUnavailable when it cannot be had; ``auto`` falls back to splice.
    """
    if mode == "splice":
        return None, "splice (chosen)"
    try:
        return Sockmap(capacity), "sockmap"
    except SockmapUnavailable as exc:
        if mode == "sockmap":
            raise
        return None, f"splice (sockmap unavailable: {exc})"

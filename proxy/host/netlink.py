"""The few rtnetlink requests the proxy makes, encoded by hand: batches of local routes (the
VIPs), a route dump, an address dump, a link lookup.

pyroute2 takes several times as long to encode a netlink request as the kernel needs to
apply it, and a cold start adds one per ClusterIP. The messages are three fixed attributes;
encoding them here and sending them in batches, one ack per message, leaves the kernel's
work as most of an add. The dump and the link lookup are a few fixed structs too, done here
as well: pyroute2's dump builds an object per attribute of every address. The address and
link events (address_events.py) only need their message types, read here too.

pyroute2 is the tests' reference decoder (test_proxy_netlink_batch.py): the daemon does not
import it, because its package imports every netlink family it knows (IPDB, NDB with sqlite3,
nl80211, ...), which costs start time and resident memory for a job of a dozen lines.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass
from typing import Iterable

RTM_NEWLINK = 16
RTM_GETLINK = 18
RTM_DELLINK = 17
RTM_NEWADDR = 20
RTM_DELADDR = 21
RTM_GETADDR = 22
RTM_NEWROUTE = 24
RTM_DELROUTE = 25
RTM_GETROUTE = 26
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
IFA_ADDRESS = 1
IFA_LOCAL = 2
IFA_PROTO = 11
IFLA_IFNAME = 3
IFF_UP = 0x1
RTA_DST = 1
RTA_OIF = 4
RTA_TABLE = 15
RT_TABLE_LOCAL = 255
RT_SCOPE_HOST = 254
RT_SCOPE_NOWHERE = 255  # in a removal: any scope
RTN_LOCAL = 2

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_RTATTR = struct.Struct("=HH")
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
_U32 = struct.Struct("=I")
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
_ERRNO = struct.Struct("=i")
#: messages sent before their acks are read: keeps the acks well inside the socket buffer.
BATCH = 256


@dataclass(frozen=True, slots=True)
class RouteOp:
    """Add or remove the local route of one host address (/32, /128) in table local."""

    add: bool
    address: str


def _attribute(kind: int, payload: bytes) -> bytes:
    length = _RTATTR.size + len(payload)
    return _RTATTR.pack(length, kind) + payload + b"\0" * (-length % 4)


def encode_route(op: RouteOp, index: int, proto: int, sequence: int) -> bytes:
    """One RTM_NEWROUTE/RTM_DELROUTE: ``local <address>/32|128 dev <index> table local proto
    <proto>``. A removal names the protocol, so the kernel removes only a route of ours."""
    v6 = ":" in op.address
    family = socket.AF_INET6 if v6 else socket.AF_INET
    scope = RT_SCOPE_HOST if op.add else RT_SCOPE_NOWHERE
    body = _RTMSG.pack(family, 128 if v6 else 32, 0, 0, RT_TABLE_LOCAL, proto, scope, RTN_LOCAL, 0)
    body += _attribute(RTA_DST, socket.inet_pton(family, op.address))
    body += _attribute(RTA_OIF, _U32.pack(index))
    if op.add:
        kind, msg_flags = RTM_NEWROUTE, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    else:
        kind, msg_flags = RTM_DELROUTE, NLM_F_REQUEST | NLM_F_ACK
    return _HEADER.pack(_HEADER.size + len(body), kind, msg_flags, sequence, 0) + body


def apply(ops: Iterable[RouteOp], index: int, proto: int) -> dict[str, int]:
    """Send the operations, in order; returns {address: errno} for those the kernel refused
    (an address named twice, removed then added, reports the last refusal)."""
    pending = list(ops)
    failures: dict[str, int] = {}
    if not pending:
        return failures
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.bind((0, 0))
        for start in range(0, len(pending), BATCH):
            chunk = pending[start:start + BATCH]
            by_sequence = {start + i + 1: op.address for i, op in enumerate(chunk)}
            sock.sendall(b"".join(encode_route(op, index, proto, seq) for seq, op in
                                  zip(by_sequence, chunk)))
            failures.update(_read_acks(sock, by_sequence))
    return failures


def _read_acks(sock: socket.socket, by_sequence: dict[int, str]) -> dict[str, int]:
    failures: dict[str, int] = {}
    waiting = set(by_sequence)
    while waiting:
        data = sock.recv(1 << 16)
        for kind, sequence, offset, _ in _each_message(data):
            if kind == NLMSG_ERROR and sequence in waiting:
                (code,) = _ERRNO.unpack_from(data, offset + _HEADER.size)
                waiting.discard(sequence)
                if code:
                    failures[by_sequence[sequence]] = -code
    return failures


def message_types(data: bytes) -> list[int]:
    """The type of each netlink message in one datagram read (a malformed one raises OSError)."""
    return [kind for kind, _, _, _ in _each_message(data)]


def _each_message(data: bytes):
    """(type, sequence, offset, length) of each netlink message in one datagram read."""
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, _, sequence, _ = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size:
            raise OSError(errno.EPROTO, "malformed netlink reply")
        yield kind, sequence, offset, length
        offset += (length + 3) & ~3


# --- links and the address dump --------------------------------------------------------------


class LinkNotFound(LookupError):
    pass


def _socket() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    sock.bind((0, 0))
    return sock


def _request(kind: int, flags: int, body: bytes, sequence: int = 1) -> bytes:
    return _HEADER.pack(_HEADER.size + len(body), kind, NLM_F_REQUEST | flags, sequence, 0) + body


def _messages(sock: socket.socket, sequence: int):
    """(type, payload) of each reply to ``sequence`` until its ack or NLMSG_DONE; errors raise."""
    while True:
        data = sock.recv(1 << 16)
        for kind, seq, offset, length in _each_message(data):
            payload = data[offset + _HEADER.size:offset + length]
            if seq != sequence:
                continue
            if kind == NLMSG_DONE:
                return
            if kind == NLMSG_ERROR:
                (code,) = _ERRNO.unpack_from(payload)
                if code:
                    raise OSError(-code, os.strerror(-code))
                return
            yield kind, payload


def attributes(payload: bytes, offset: int) -> dict[int, bytes]:
    """The route attributes from ``offset`` on, by type (the last of a repeated type wins)."""
    found: dict[int, bytes] = {}
    while offset + _RTATTR.size <= len(payload):
        length, kind = _RTATTR.unpack_from(payload, offset)
        if length < _RTATTR.size:
            break
        found[kind & 0x3FFF] = payload[offset + _RTATTR.size:offset + length]  # without NLA_F_ flags
        offset += (length + 3) & ~3
    return found


def link_index(name: str) -> int:
    """The index of link ``name``; LinkNotFound when there is none."""
    body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + _attribute(IFLA_IFNAME, name.encode() + b"\0")
    with _socket() as sock:
        sock.sendall(_request(RTM_GETLINK, 0, body))
        try:
            for kind, payload in _messages(sock, 1):
                if kind == RTM_NEWLINK:
                    return _IFINFOMSG.unpack_from(payload)[2]
        except OSError as exc:
            if exc.errno in (errno.ENODEV, errno.ENOENT, errno.EINVAL):
                raise LinkNotFound(name) from None
            raise
    raise LinkNotFound(name)


def set_link_up(index: int) -> None:
    body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, IFF_UP, IFF_UP)
    with _socket() as sock:
        sock.sendall(_request(RTM_NEWLINK, NLM_F_ACK, body))
        for _ in _messages(sock, 1):
            pass


def parse_address(payload: bytes) -> tuple[str, int, int | None] | None:
    """(address, link index, IFA_PROTO or None) of one RTM_NEWADDR; None if it carries no address."""
    family, _, _, _, index = _IFADDRMSG.unpack_from(payload)
    attrs = attributes(payload, _IFADDRMSG.size)
    # IFA_LOCAL is this node's side of a point-to-point link (IFA_ADDRESS is then the peer).
    packed = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)
    if packed is None or family not in (socket.AF_INET, socket.AF_INET6):
        return None
    if family == socket.AF_INET:
        address = socket.inet_ntop(family, packed)
    else:
        address = str(ipaddress.IPv6Address(packed))  # the text the rest of kubeport uses
    proto = attrs.get(IFA_PROTO)
    return address, index, proto[0] if proto else None


def dump_addresses() -> list[tuple[str, int, int | None]]:
    """(address, link index, IFA_PROTO or None) of every address on every link."""
    body = _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
    found = []
    with _socket() as sock:
        sock.sendall(_request(RTM_GETADDR, NLM_F_DUMP, body))
        for kind, payload in _messages(sock, 1):
            if kind == RTM_NEWADDR and (entry := parse_address(payload)) is not None:
                found.append(entry)
    return found


def parse_local_route(payload: bytes) -> tuple[str, int, int] | None:
    """(address, output link index, protocol) of one RTM_NEWROUTE for a host address in
    table local of type local; None for any other route."""
    family, dst_len, _, _, table, proto, _, kind, _ = _RTMSG.unpack_from(payload)
    if kind != RTN_LOCAL or family not in (socket.AF_INET, socket.AF_INET6):
        return None
    attrs = attributes(payload, _RTMSG.size)
    if RTA_TABLE in attrs:
        table = _U32.unpack(attrs[RTA_TABLE])[0]
    packed = attrs.get(RTA_DST)
    if table != RT_TABLE_LOCAL or packed is None or dst_len != len(packed) * 8:
        return None
    if family == socket.AF_INET:
        address = socket.inet_ntop(family, packed)
    else:
        address = str(ipaddress.IPv6Address(packed))
    oif = attrs.get(RTA_OIF)
    return address, _U32.unpack(oif)[0] if oif else 0, proto


def dump_local_routes() -> list[tuple[str, int, int]]:
    """(address, link index, protocol) of every host route of type local in table local, both
    families: the node's own addresses (protocol kernel) and the VIPs."""
    found = []
    with _socket() as sock:
        for sequence, family in ((1, socket.AF_INET), (2, socket.AF_INET6)):
            body = _RTMSG.pack(family, 0, 0, 0, RT_TABLE_LOCAL, 0, 0, 0, 0)
            sock.sendall(_request(RTM_GETROUTE, NLM_F_DUMP, body, sequence))
            for kind, payload in _messages(sock, sequence):
                if kind == RTM_NEWROUTE and (entry := parse_local_route(payload)) is not None:
                    found.append(entry)
    return found

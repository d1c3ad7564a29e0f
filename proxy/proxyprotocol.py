"""The PROXY protocol v2 header a backend may ask for (annotation kubeport.io/proxy-protocol: "v2").

HAProxy's "The PROXY protocol Versions 1 & 2" (doc/proxy-protocol.txt), section 2.2: the
12-byte signature, the version and command byte (0x21: version 2, PROXY), the family and
transport byte (0x11: TCP over IPv4, 0x21: TCP over IPv6), the length of what follows
(big-endian), then the source address, the destination address, the source port and the
destination port, all in network byte order. No TLVs.

The source is the client; the destination is the address and port the client dialled (the
ClusterIP, externalIP or LB IP, or the node's address for a NodePort), which the accepted
socket's ``getsockname()`` gives, a captured externalIP's included (IP_TRANSPARENT).

:func:`header_v2` is pure; :func:`send_header` writes it on a just-connected backend socket.
"""

from __future__ import annotations

import socket
import struct

#: the v2 signature (section 2.2): \r\n\r\n\0\r\nQUIT\n
SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
#: version 2 (high nibble), command PROXY (low nibble)
VERSION_PROXY = 0x21
#: address family (high nibble) and transport (low nibble): AF_INET or AF_INET6, STREAM
TCP_OVER_IPV4 = 0x11
TCP_OVER_IPV6 = 0x21

_IPV4_BLOCK = struct.Struct("!4s4sHH")  # 12 bytes
_IPV6_BLOCK = struct.Struct("!16s16sHH")  # 36 bytes
_PREFIX = struct.Struct("!12sBBH")
_MAPPED = b"\x00" * 10 + b"\xff\xff"


def _packed(ip: str) -> bytes:
    """4 bytes for an IPv4 address, 16 for an IPv6 one (a link-local's ``%scope`` dropped)."""
    if ":" in ip:
        return socket.inet_pton(socket.AF_INET6, ip.partition("%")[0])
    return socket.inet_pton(socket.AF_INET, ip)


def _as_ipv6(packed: bytes) -> bytes:
    return packed if len(packed) == 16 else _MAPPED + packed


def _as_ipv4(packed: bytes) -> bytes | None:
    """The IPv4 address of a 4-byte or an IPv4-mapped IPv6 address; None otherwise."""
    if len(packed) == 4:
        return packed
    if packed[:12] == _MAPPED:
        return packed[12:]
    return None


def header_v2(client: tuple, service: tuple) -> bytes:
    """The header for a TCP connection from ``client`` to ``service``.

    Both are socket addresses as the socket module returns them: ``(ip, port)`` or
    ``(ip, port, flowinfo, scope_id)``. An IPv4-mapped IPv6 pair (a dual-stack socket) is
    written as IPv4 when both ends are IPv4; otherwise as IPv6, an IPv4 end mapped.
    """
    source, destination = _packed(client[0]), _packed(service[0])
    source4, destination4 = _as_ipv4(source), _as_ipv4(destination)
    if source4 is not None and destination4 is not None:
        block = _IPV4_BLOCK.pack(source4, destination4, client[1], service[1])
        family = TCP_OVER_IPV4
    else:
        block = _IPV6_BLOCK.pack(_as_ipv6(source), _as_ipv6(destination), client[1], service[1])
        family = TCP_OVER_IPV6
    return _PREFIX.pack(SIGNATURE, VERSION_PROXY, family, len(block)) + block


def send_header(client_sock, backend_sock, client_addr: tuple) -> None:
    """Write the header for ``client_addr`` -> ``client_sock.getsockname()`` on ``backend_sock``.

    One ``send``: the backend socket was just connected and its send buffer is empty, so the
    whole header (at most 52 bytes) goes at once or the connection is broken; a short send
    raises ``OSError`` like a failed one.
    """
    header = header_v2(client_addr, client_sock.getsockname())
    sent = backend_sock.send(header)
    if sent != len(header):
        raise OSError(f"PROXY protocol header: {sent} of {len(header)} bytes sent")

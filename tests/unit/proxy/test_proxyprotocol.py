"""PROXY protocol v2 headers, byte for byte from HAProxy's proxy-protocol.txt section 2.2."""

from __future__ import annotations

import ipaddress
import struct

import pytest

from kubeport.proxy.proxyprotocol import header_v2, send_header

# Written out from the spec, not from the module: signature, 0x21 (v2, PROXY), family byte, length.
SIG = bytes([0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A])
V4 = SIG + bytes([0x21, 0x11, 0x00, 0x0C])  # TCP over IPv4, 12 bytes follow
V6 = SIG + bytes([0x21, 0x21, 0x00, 0x24])  # TCP over IPv6, 36 bytes follow
MAPPED = bytes(10) + b"\xff\xff"

CASES = [
    pytest.param(
        ("10.244.1.7", 51234), ("10.96.0.10", 80),
        V4 + bytes([10, 244, 1, 7]) + bytes([10, 96, 0, 10]) + bytes([0xC8, 0x22]) + bytes([0x00, 0x50]),
        id="ipv4",
    ),
    pytest.param(
        ("192.168.1.2", 1), ("192.168.1.3", 65535),
        V4 + bytes([192, 168, 1, 2, 192, 168, 1, 3, 0x00, 0x01, 0xFF, 0xFF]),
        id="ipv4-port-bounds",
    ),
    pytest.param(
        ("fd00::2", 40000, 0, 0), ("fd00:10:96::a", 443, 0, 0),
        V6
        + bytes([0xFD, 0x00] + [0] * 13 + [0x02])
        + bytes([0xFD, 0x00, 0x00, 0x10, 0x00, 0x96] + [0] * 9 + [0x0A])
        + bytes([0x9C, 0x40, 0x01, 0xBB]),
        id="ipv6",
    ),
    pytest.param(
        ("fe80::1%lo", 5000, 0, 1), ("fe80::2%lo", 8080, 0, 1),
        V6 + bytes([0xFE, 0x80] + [0] * 13 + [1]) + bytes([0xFE, 0x80] + [0] * 13 + [2])
        + bytes([0x13, 0x88, 0x1F, 0x90]),
        id="ipv6-scoped",
    ),
    pytest.param(
        ("::ffff:10.0.0.5", 1234, 0, 0), ("::ffff:10.96.0.1", 80, 0, 0),
        V4 + bytes([10, 0, 0, 5, 10, 96, 0, 1, 0x04, 0xD2, 0x00, 0x50]),
        id="both-mapped-as-ipv4",
    ),
    pytest.param(
        ("::ffff:10.0.0.5", 1234, 0, 0), ("fd00::1", 80, 0, 0),
        V6 + MAPPED + bytes([10, 0, 0, 5]) + bytes([0xFD, 0x00] + [0] * 13 + [1]) + bytes([0x04, 0xD2, 0x00, 0x50]),
        id="client-mapped-only-as-ipv6",
    ),
    pytest.param(
        ("fd00::5", 1234, 0, 0), ("::ffff:192.0.2.1", 30080, 0, 0),
        V6 + bytes([0xFD, 0x00] + [0] * 13 + [5]) + MAPPED + bytes([192, 0, 2, 1]) + bytes([0x04, 0xD2, 0x75, 0x80]),
        id="service-mapped-only-as-ipv6",
    ),
]


@pytest.mark.parametrize(("client", "service", "expected"), CASES)
def test_header_bytes(client, service, expected):
    assert header_v2(client, service) == expected


def _parse(data: bytes) -> tuple[tuple[str, int], tuple[str, int], int]:
    """A reader independent of the module: (source, destination, header length)."""
    assert data[:12] == b"\r\n\r\n\x00\r\nQUIT\n"
    assert data[12] >> 4 == 2 and data[12] & 0xF == 1  # version 2, PROXY
    family, transport = data[13] >> 4, data[13] & 0xF
    assert transport == 1  # STREAM
    (length,) = struct.unpack(">H", data[14:16])
    body = data[16:16 + length]
    size = {1: 4, 2: 16}[family]
    assert length == 2 * size + 4
    src = ipaddress.ip_address(body[:size])
    dst = ipaddress.ip_address(body[size:2 * size])
    sport, dport = struct.unpack(">HH", body[2 * size:2 * size + 4])
    return (str(src), sport), (str(dst), dport), 16 + length


@pytest.mark.parametrize(
    ("client", "service", "source", "destination"),
    [
        (("10.1.2.3", 999), ("10.96.5.5", 53), ("10.1.2.3", 999), ("10.96.5.5", 53)),
        (("2001:db8::7", 1000, 0, 0), ("2001:db8:1::1", 8443, 0, 0), ("2001:db8::7", 1000), ("2001:db8:1::1", 8443)),
        (("::ffff:127.0.0.1", 4242, 0, 0), ("::ffff:127.0.0.2", 80, 0, 0), ("127.0.0.1", 4242), ("127.0.0.2", 80)),
        (("::ffff:127.0.0.1", 4242, 0, 0), ("::1", 80, 0, 0), ("::ffff:7f00:1", 4242), ("::1", 80)),
    ],
)
def test_header_parses_back(client, service, source, destination):
    header = header_v2(client, service)
    assert _parse(header + b"GET / HTTP/1.1\r\n") == (source, destination, len(header))


class _Sock:
    def __init__(self, name=None, accept=None):
        self.name, self.accept, self.sent = name, accept, []

    def getsockname(self):
        return self.name

    def send(self, data):
        self.sent.append(data)
        return len(data) if self.accept is None else self.accept


def test_send_header_is_one_send_of_the_whole_header():
    client, backend = _Sock(name=("10.96.0.1", 80)), _Sock()
    send_header(client, backend, ("10.0.0.9", 5555))
    assert backend.sent == [header_v2(("10.0.0.9", 5555), ("10.96.0.1", 80))]


def test_a_short_send_raises():
    with pytest.raises(OSError, match="10 of 28"):
        send_header(_Sock(name=("10.96.0.1", 80)), _Sock(accept=10), ("10.0.0.9", 5555))

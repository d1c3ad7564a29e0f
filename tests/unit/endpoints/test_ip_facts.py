"""The cached IP facts behind validation and conversion: the fast IPv4 path must agree with
the exact ``ipaddress`` path (Go's net.ParseIP reading, ValidateNonSpecialIP)."""

from __future__ import annotations

import ipaddress
import random

import pytest

from kubeport.endpoints import convert, names


def exact(value: str) -> tuple | None:
    """What the ``ipaddress`` path says, with no fast path."""
    ip = names.parse_ip(value)
    if ip is None:
        return None
    return ("IPv4" if ip.version == 4 else "IPv6", str(ip), tuple(names._special_problems(value, ip)))


@pytest.mark.parametrize(
    "value, family, canonical, problem",
    [
        ("10.0.0.1", "IPv4", "10.0.0.1", None),
        ("0.0.0.0", "IPv4", "0.0.0.0", "may not be unspecified (0.0.0.0)"),
        ("127.3.2.1", "IPv4", "127.3.2.1", "may not be in the loopback range (127.0.0.0/8, ::1/128)"),
        ("169.254.9.9", "IPv4", "169.254.9.9", "may not be in the link-local range (169.254.0.0/16, fe80::/10)"),
        ("224.0.0.251", "IPv4", "224.0.0.251",
         "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)"),
        ("239.1.2.3", "IPv4", "239.1.2.3", "may not be in the multicast range (224.0.0.0/4, ff00::/8)"),
        ("::ffff:10.0.0.1", "IPv4", "10.0.0.1", None),
        ("fd00::0001", "IPv6", "fd00::1", None),
        ("ff02::fb", "IPv6", "ff02::fb", "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)"),
    ],
    ids=["plain", "unspecified", "loopback", "link_local", "link_local_multicast", "multicast",
         "ipv4_mapped_is_ipv4__go_parseip", "ipv6_canonical_text", "ipv6_link_local_multicast"],
)
def test_ip_facts(value, family, canonical, problem):
    facts = names.ip_facts(value)
    assert (facts.family, facts.canonical) == (family, canonical)
    assert list(facts.problems) == ([problem] if problem else [])
    assert tuple(facts) == exact(value)


@pytest.mark.parametrize("value", ["010.0.0.1", "1.2.3", "1.2.3.4 ", "1.2.3.256", "1.2.3.4%eth0", "", "web", "1.2.3.4\0"],
                         ids=["leading_zero", "three_parts", "trailing_space", "octet_too_big", "zone", "empty",
                              "name", "nul"])
def test_not_an_ip__go_parseip(value):
    assert names.ip_facts(value) is None and exact(value) is None
    assert names.is_valid_ip(value) != []


def test_fast_path_agrees_with_ipaddress_on_random_and_boundary_ipv4():
    rng = random.Random(7)
    values = [str(ipaddress.IPv4Address(rng.getrandbits(32))) for _ in range(20000)]
    values += [f"{a}.{b}.0.1" for a in (0, 126, 127, 128, 168, 169, 170, 223, 224, 225, 239, 240, 255)
               for b in (0, 1, 253, 254, 255)]
    assert [n for n in values if tuple(names.ip_facts(n)) != exact(n)] == []


@pytest.mark.parametrize("value, expected", [("10.0.0.1", "10.0.0.1"), ("fd00::0001", "fd00::1"),
                                             ("::ffff:10.0.0.1", "::ffff:a00:1"), ("not-an-ip", "not-an-ip")],
                         ids=["canonical_kept", "ipv6_shortened", "ipv4_mapped_keeps_its_family", "not_an_ip"])
def test_canonical_ip(value, expected):
    assert convert.canonical_ip(value) == expected

"""Name and address checks, with the API server's messages.

Each ``is_*`` function returns the list of problems (empty when valid), like
``k8s.io/apimachinery/pkg/util/validation``; callers wrap them into field errors.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
from typing import NamedTuple

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
DNS1035_LABEL_MAX = 63
PORT_NAME_MAX = 15

_DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT = _DNS1123_LABEL_FMT + "(\\." + _DNS1123_LABEL_FMT + ")*"
_DNS1035_LABEL_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?"

_DNS1123_LABEL = re.compile(_DNS1123_LABEL_FMT)
_DNS1123_SUBDOMAIN = re.compile(_DNS1123_SUBDOMAIN_FMT)
_DNS1035_LABEL = re.compile(_DNS1035_LABEL_FMT)
_PORT_NAME_CHARSET = re.compile("[-a-z0-9]+")
_ONE_LETTER = re.compile("[a-z]")

_DNS1123_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character"
)
_DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character"
)
_DNS1035_LABEL_MSG = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
    "start with an alphabetic character, and end with an alphanumeric character"
)


def regex_error(message: str, fmt: str, *examples: str) -> str:
    """apimachinery's RegexError, double space before "or" included."""
    if not examples:
        return f"{message} (regex used for validation is '{fmt}')"
    shown = " or ".join(f"'{example}', " for example in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{fmt}')"


def max_len_error(length: int) -> str:
    return f"must be no more than {length} characters"


def inclusive_range_error(lo: int, hi: int) -> str:
    return f"must be between {lo} and {hi}, inclusive"


def is_dns1123_label(value: str) -> list[str]:
    errors = []
    if len(value) > DNS1123_LABEL_MAX:
        errors.append(max_len_error(DNS1123_LABEL_MAX))
    if not _DNS1123_LABEL.fullmatch(value):
        if _DNS1123_SUBDOMAIN.fullmatch(value):
            errors.append("must not contain dots")
        else:
            errors.append(regex_error(_DNS1123_LABEL_MSG, _DNS1123_LABEL_FMT, "my-name", "123-abc"))
    return errors


def is_dns1123_subdomain(value: str) -> list[str]:
    errors = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        errors.append(max_len_error(DNS1123_SUBDOMAIN_MAX))
    if not _DNS1123_SUBDOMAIN.fullmatch(value):
        errors.append(regex_error(_DNS1123_SUBDOMAIN_MSG, _DNS1123_SUBDOMAIN_FMT, "example.com"))
    return errors


def is_dns1035_label(value: str) -> list[str]:
    errors = []
    if len(value) > DNS1035_LABEL_MAX:
        errors.append(max_len_error(DNS1035_LABEL_MAX))
    if not _DNS1035_LABEL.fullmatch(value):
        errors.append(regex_error(_DNS1035_LABEL_MSG, _DNS1035_LABEL_FMT, "my-name", "abc-123"))
    return errors


def is_fully_qualified_domain_name(value: str) -> list[str]:
    """IsFullyQualifiedDomainName: a subdomain of at least two labels, trailing dot allowed."""
    name = value[:-1] if value.endswith(".") else value
    errors = is_dns1123_subdomain(name)
    if errors:
        return [",".join(errors)]
    if len(name.split(".")) < 2:
        return ["should be a domain with at least two segments separated by dots"]
    return []


def is_valid_port_name(value: str) -> list[str]:
    """IANA_SVC_NAME (RFC 6335) as the API server checks it (IsValidPortName)."""
    errors = []
    if len(value) > PORT_NAME_MAX:
        errors.append(max_len_error(PORT_NAME_MAX))
    if not _PORT_NAME_CHARSET.fullmatch(value):
        errors.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if not _ONE_LETTER.search(value):
        errors.append("must contain at least one letter (a-z)")
    if "--" in value:
        errors.append("must not contain consecutive hyphens")
    if value and (value[0] == "-" or value[-1] == "-"):
        errors.append("must not begin or end with a hyphen")
    return errors


def is_valid_port_num(port: int) -> list[str]:
    if 1 <= port <= 65535:
        return []
    return [inclusive_range_error(1, 65535)]


def parse_ip(value: str) -> IPAddress | None:
    """An IP as Go's net.ParseIP reads it: no zone suffix; IPv4-mapped IPv6 is IPv4."""
    if "%" in value:
        return None
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


class IPFacts(NamedTuple):
    """What validation and conversion ask of one IP text, worked out once."""

    family: str  # "IPv4" | "IPv6"
    #: ``str(parse_ip(value))``: the canonical text (IPv4-mapped IPv6 as IPv4)
    canonical: str
    #: :func:`non_special_ip_problems`
    problems: tuple[str, ...]


_pton, _ntop, _AF_INET = socket.inet_pton, socket.inet_ntop, socket.AF_INET
_new_facts = tuple.__new__
#: First octets of the IPv4 ranges :func:`_ipv4_problems` refuses (0/8 only for 0.0.0.0).
_SPECIAL_FIRST_OCTETS = frozenset({0, 127, 169, *range(224, 240)})


@functools.lru_cache(maxsize=4096)
def ip_facts(value: str) -> IPFacts | None:
    """The facts of an IP text, or None when :func:`parse_ip` refuses it.

    Cached: an endpoint address is checked by validation and then converted, a few calls
    apart. A canonical dotted quad (``inet_ntop(inet_pton(v)) == v``) skips ``ipaddress``,
    which costs several microseconds per address at 100,000 endpoints; anything else takes
    the exact ``ipaddress`` path.
    """
    try:
        packed = _pton(_AF_INET, value)
    except (OSError, ValueError):  # ValueError: an embedded NUL
        packed = None
    if packed is not None and _ntop(_AF_INET, packed) == value:
        problems = () if packed[0] not in _SPECIAL_FIRST_OCTETS else _ipv4_problems(value, packed)
        return _new_facts(IPFacts, ("IPv4", value, problems))  # skips NamedTuple's Python __new__
    ip = parse_ip(value)
    if ip is None:
        return None
    return IPFacts("IPv4" if ip.version == 4 else "IPv6", str(ip), tuple(_special_problems(value, ip)))


def ip_family(value: str) -> str | None:
    """"IPv4", "IPv6", or None when not an IP."""
    facts = ip_facts(value)
    return None if facts is None else facts.family


def is_valid_ip(value: str) -> list[str]:
    if ip_facts(value) is None:
        return ["must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"]
    return []


def is_valid_cidr(value: str) -> list[str]:
    try:
        ipaddress.ip_network(value.strip(), strict=False)
    except ValueError:
        return ["must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"]
    return []


def is_canonical_cidr(value: str) -> list[str]:
    """IsValidCIDR of k8s.io/apimachinery ``pkg/util/validation/ip.go`` for new fields (a
    ServiceCIDR's): a valid CIDR, written as the network (no host bits set) in canonical form."""
    problems = is_valid_cidr(value)
    if problems:
        return problems
    network = ipaddress.ip_network(value.strip(), strict=False)
    if value != str(network):
        return [f'must be in canonical form ("{network}")']
    return []


_LINK_LOCAL_MULTICAST = (ipaddress.ip_network("224.0.0.0/24"), ipaddress.ip_network("ff02::/16"))
_UNSPECIFIED = "may not be unspecified ({})"
_LOOPBACK = "may not be in the loopback range (127.0.0.0/8, ::1/128)"
_LINK_LOCAL = "may not be in the link-local range (169.254.0.0/16, fe80::/10)"
_LINK_LOCAL_MULTICAST_MSG = "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)"
_MULTICAST = "may not be in the multicast range (224.0.0.0/4, ff00::/8)"


def _is_link_local_multicast(ip: IPAddress) -> bool:
    if ip.version == 4:
        return ip in _LINK_LOCAL_MULTICAST[0]
    # Go's IsLinkLocalMulticast: ff?2::/16, any flags nibble, scope 2.
    packed = ip.packed
    return packed[0] == 0xFF and packed[1] & 0x0F == 0x02


def _special_problems(value: str, ip: IPAddress) -> list[str]:
    problems = []
    if ip.is_unspecified:
        problems.append(_UNSPECIFIED.format(value))
    if ip.is_loopback:
        problems.append(_LOOPBACK)
    if ip.is_link_local:
        problems.append(_LINK_LOCAL)
    if _is_link_local_multicast(ip):
        problems.append(_LINK_LOCAL_MULTICAST_MSG)
    elif ip.is_multicast:
        problems.append(_MULTICAST)
    return problems


def _ipv4_problems(value: str, packed: bytes) -> tuple[str, ...]:
    """:func:`_special_problems` of an IPv4 address from its 4 bytes (the same ranges)."""
    first = packed[0]
    if first == 0 and packed == b"\0\0\0\0":
        return (_UNSPECIFIED.format(value),)
    if first == 127:
        return (_LOOPBACK,)
    if first == 169 and packed[1] == 254:
        return (_LINK_LOCAL,)
    if first & 0xF0 == 0xE0:
        link_local = first == 224 and packed[1] == 0 and packed[2] == 0
        return (_LINK_LOCAL_MULTICAST_MSG if link_local else _MULTICAST,)
    return ()


def non_special_ip_problems(value: str) -> list[str]:
    """ValidateNonSpecialIP (endpoints, externalIPs), plus every multicast address.

    The API server refuses only link-local multicast; an endpoint or external IP in
    any multicast range cannot be connected to either, so kubeport refuses all of them.
    """
    facts = ip_facts(value)
    if facts is None:
        return ["must be a valid IP address"]
    return list(facts.problems)

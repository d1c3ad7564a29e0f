"""Query names -> requests, and the names the records carry. Pure.

Mirrors CoreDNS ``plugin/kubernetes/parse.go`` (labels read from the right after the zone
is stripped) and ``endpointHostname``/``ExtractAddressFromReverse``. Labels arrive
lowercased (:attr:`kubeport.dns.wire.Query.lower_labels`); comparisons are therefore
case-insensitive while the answer keeps the query's spelling.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import Enum

SVC = "svc"
POD = "pod"
REVERSE_ZONES = (("in-addr", "arpa"), ("ip6", "arpa"))


class Zone(Enum):
    CLUSTER = "cluster"
    REVERSE = "reverse"
    OTHER = "other"


def classify(labels: tuple[str, ...], zone: tuple[str, ...],
             reverse_zones: tuple[tuple[str, ...], ...] = REVERSE_ZONES) -> Zone:
    """Which zone a (lowercased) name belongs to; the longest match wins, like CoreDNS."""
    if labels[len(labels) - len(zone) :] == zone:
        return Zone.CLUSTER
    if served_zone(labels, reverse_zones) is not None:
        return Zone.REVERSE
    return Zone.OTHER


def served_zone(labels: tuple[str, ...], zones: tuple[tuple[str, ...], ...]) -> tuple[str, ...] | None:
    """The longest of ``zones`` that holds the (lowercased) name (CoreDNS plugin.Zones.Matches);
    the root zone ``()`` holds every name."""
    found: tuple[str, ...] | None = None
    for zone in zones:
        if (not zone or labels[len(labels) - len(zone) :] == zone) and (found is None or len(zone) > len(found)):
            found = zone
    return found


class ZoneError(ValueError):
    """A zone given in the configuration is neither a domain name nor a CIDR."""


def zone_labels(text: str) -> tuple[tuple[str, ...], ...]:
    """A zone as CoreDNS's ``plugin.Host(zone).NormalizeExact`` reads it: a domain name (lowercased
    labels, ``.`` the root) or a CIDR, which stands for the reverse zones that cover it, cut at the
    next octet (IPv4) or nibble (IPv6) boundary: ``10.96.0.0/12`` is ``96.10.in-addr.arpa`` to
    ``111.10.in-addr.arpa``."""
    text = text.strip()
    if "/" in text:
        try:
            network = ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise ZoneError(f"{text!r} is not a CIDR") from None
        step = 8 if network.version == 4 else 4
        prefix = -(-network.prefixlen // step) * step
        zones = []
        for subnet in network.subnets(new_prefix=prefix):
            pointer = subnet.network_address.reverse_pointer.split(".")
            kept = prefix // step
            zones.append(tuple(pointer[len(pointer) - 2 - kept :]))
        return tuple(zones)
    name = text.rstrip(".").lower()
    if not name:
        return ((),)
    labels = tuple(name.split("."))
    if any(not label or len(label) > 63 for label in labels):
        raise ZoneError(f"{text!r} is not a domain name")
    return (labels,)


class InvalidName(Exception):
    """CoreDNS's errInvalidRequest: the name cannot exist in the zone (NXDOMAIN)."""


@dataclass(frozen=True, slots=True)
class Request:
    """CoreDNS's recordRequest. Empty strings mean "not given"; an empty port or protocol
    (a bare name, or a ``_`` label) matches every port (CoreDNS ``match``)."""

    pod_or_svc: str = ""
    namespace: str = ""
    service: str = ""
    endpoint: str = ""
    port: str = ""
    protocol: str = ""


APEX = Request()


def parse_request(base: tuple[str, ...]) -> Request:
    """The labels left of the zone -> a Request (CoreDNS parseRequest).

    ``()``, ``svc``, ``pod`` are the apex or empty non-terminals (NODATA); one label
    more than ``_port._proto.<svc>.<ns>.svc`` is too long (InvalidName -> NXDOMAIN).
    """
    if not base or base == (SVC,) or base == (POD,):
        return APEX
    pod_or_svc = base[-1]
    if pod_or_svc not in (SVC, POD):
        raise InvalidName(f"second label from the zone is {pod_or_svc!r}, not svc or pod")
    rest = base[:-1]
    if len(rest) == 1:
        return Request(pod_or_svc, rest[0])
    if len(rest) == 2:
        return Request(pod_or_svc, rest[1], rest[0])
    if len(rest) == 3:
        return Request(pod_or_svc, rest[2], rest[1], endpoint=rest[0])
    if len(rest) == 4:
        return Request(pod_or_svc, rest[3], rest[2], port=_strip_underscore(rest[0]),
                       protocol=_strip_underscore(rest[1]))
    raise InvalidName(f"{len(base)} labels below the zone is too long")


def _strip_underscore(label: str) -> str:
    return label[1:] if label.startswith("_") else label


def match(wanted: str, actual: str) -> bool:
    """CoreDNS ``match``: an empty wanted value is a wildcard; otherwise case-insensitive."""
    return not wanted or wanted == actual.lower()


def reverse_address(labels: tuple[str, ...]) -> str | None:
    """The canonical IP a full reverse name stands for (4 labels or 32 nibbles), else None."""
    if labels[-2:] == ("in-addr", "arpa"):
        octets = labels[:-2]
        if len(octets) != 4:
            return None
        text = ".".join(reversed(octets))
    elif labels[-2:] == ("ip6", "arpa"):
        nibbles = labels[:-2]
        if len(nibbles) != 32 or any(len(n) != 1 for n in nibbles):
            return None
        digits = "".join(reversed(nibbles))
        text = ":".join(digits[i : i + 4] for i in range(0, 32, 4))
    else:
        return None
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def reverse_name_labels(address: str) -> tuple[str, ...]:
    """The reverse-zone labels of an IP (for tests and PTR owner names)."""
    return tuple(ipaddress.ip_address(address).reverse_pointer.split("."))


def dashed_address(address: str) -> str:
    """CoreDNS's endpoint name for an address without hostname: separators become ``-``;
    a trailing ``-`` (an IPv6 address ending in ``::``) gets a ``0`` (CoreDNS v1.12.3)."""
    dashed = address.replace(".", "-").replace(":", "-")
    return dashed + "0" if dashed.endswith("-") else dashed


def endpoint_name(address: str, hostname: str | None, pod_name: str | None, endpoint_pod_names: bool) -> str:
    """CoreDNS ``endpointHostname``: hostname, else (endpoint_pod_names) the pod name when it
    fits a label (< 64 characters), else the dashed address."""
    if hostname:
        return hostname.lower()
    if endpoint_pod_names and pod_name and len(pod_name) < 64:
        return pod_name.lower()
    return dashed_address(address)


def pod_address(label: str) -> str:
    """CoreDNS findPods: ``a-b-c-d`` -> ``a.b.c.d`` (exactly three dashes, no ``--``),
    otherwise every ``-`` becomes ``:`` (IPv6). Not validated here."""
    if label.count("-") == 3 and "--" not in label:
        return label.replace("-", ".")
    return label.replace("-", ":")

"""Value types of the configuration file, parsed as kube-proxy reads them: Go durations, CIDRs
(``ADDRESS/PREFIX-LENGTH``), ``LOW-HIGH`` port ranges and ``HOST:PORT`` bind addresses.
Each parser raises ValueError naming the value and what is wrong with it."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

from kubeport.lib.durations import Duration, format_duration, parse_duration  # noqa: F401 - config.* names

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_cidr(text: Any) -> IPNetwork:
    """ADDRESS/PREFIX-LENGTH (Go's net.ParseCIDR shape) -> the network; ValueError naming the
    value and what is wrong with it.

    Host bits are an error, not silently masked (kube-apiserver's ParseCIDR masks
    ``10.96.0.1/12`` to ``10.96.0.0/12``): the message names the network meant.
    """
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not a CIDR like 10.96.0.0/12")
    address, slash, prefix = text.strip().partition("/")
    if not slash:
        raise ValueError(f"{text!r} is not a CIDR: no /PREFIX-LENGTH (e.g. 10.96.0.0/12)")
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise ValueError(f"{text!r} is not a CIDR: {address!r} is not an IP address") from None
    if not (prefix.isascii() and prefix.isdigit()) or int(prefix) > ip.max_prefixlen:
        raise ValueError(f"{text!r} is not a CIDR: the prefix length must be 0-{ip.max_prefixlen} "
                         f"for IPv{ip.version}")
    network = ipaddress.ip_network(f"{ip}/{int(prefix)}", strict=False)
    if network.network_address != ip:
        raise ValueError(f"{text!r} has host bits set: the network is {network}")
    return network


def _cidr_list(value: Any) -> Any:
    # kube-proxy's clusterCIDR is a comma-separated string; a YAML list is accepted too.
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list):
        return [cidr if isinstance(cidr, IPNetwork) else parse_cidr(cidr) for cidr in value]
    return value


CIDRList = Annotated[
    list[IPNetwork],
    BeforeValidator(_cidr_list),
    PlainSerializer(lambda nets: ",".join(str(n) for n in nets), return_type=str),
]


def _port_range(value: Any) -> Any:
    if isinstance(value, str):
        low, sep, high = value.partition("-")
        if not sep or not low.strip().isdigit() or not high.strip().isdigit():
            raise ValueError(f"{value!r} is not LOW-HIGH")
        return (int(low), int(high))
    return value


PortRange = Annotated[
    tuple[int, int],
    BeforeValidator(_port_range),
    PlainSerializer(lambda r: f"{r[0]}-{r[1]}", return_type=str),
]


def append_port_if_needed(value: str, port: int) -> str:
    """kube-proxy's AppendPortIfNeeded: a bare IP gets the default port ('::' -> '[::]:port')."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return value  # HOST:PORT already, or invalid: split_host_port says which
    return f"{ip}:{port}" if ip.version == 4 else f"[{ip}]:{port}"


def split_host_port(value: str) -> tuple[str, int]:
    """'0.0.0.0:10256' / '[::]:10256' -> (host, port); ValueError naming the value."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{value!r}: {host!r} is not an IP address") from None
    return host, int(port)

"""Query-name parsing and the names records carry (CoreDNS parse.go, endpointHostname,
ExtractAddressFromReverse, findPods)."""

from __future__ import annotations

import pytest

from kubeport.dns.names import (
    APEX,
    InvalidName,
    Request,
    Zone,
    classify,
    dashed_address,
    endpoint_name,
    parse_request,
    pod_address,
    reverse_address,
)

ZONE = ("cluster", "local")


@pytest.mark.parametrize("base, expected", [
    pytest.param((), APEX, id="apex"),
    pytest.param(("svc",), APEX, id="svc_empty_non_terminal"),
    pytest.param(("pod",), APEX, id="pod_empty_non_terminal"),
    pytest.param(("ns1", "svc"), Request("svc", "ns1"), id="namespace_node"),
    pytest.param(("web", "ns1", "svc"), Request("svc", "ns1", "web"), id="service"),
    pytest.param(("ep", "web", "ns1", "svc"), Request("svc", "ns1", "web", endpoint="ep"), id="endpoint"),
    pytest.param(("_http", "_tcp", "web", "ns1", "svc"), Request("svc", "ns1", "web", port="http", protocol="tcp"),
                 id="port_proto_underscores_stripped"),
    pytest.param(("http", "tcp", "web", "ns1", "svc"), Request("svc", "ns1", "web", port="http", protocol="tcp"),
                 id="port_proto_without_underscores"),
    pytest.param(("_", "_tcp", "web", "ns1", "svc"), Request("svc", "ns1", "web", port="", protocol="tcp"),
                 id="underscore_alone_is_wildcard"),
    pytest.param(("__x", "_tcp", "web", "ns1", "svc"), Request("svc", "ns1", "web", port="_x", protocol="tcp"),
                 id="only_one_underscore_stripped"),
    pytest.param(("1-2-3-4", "ns1", "pod"), Request("pod", "ns1", "1-2-3-4"), id="pod"),
])
def test_parse_request(base: tuple[str, ...], expected: Request) -> None:
    """CoreDNS plugin/kubernetes/parse.go parseRequest, stripUnderscore."""
    assert parse_request(base) == expected


@pytest.mark.parametrize("base", [
    pytest.param(("foo",), id="second_label_not_svc_or_pod"),
    pytest.param(("web", "ns1", "svcs"), id="typo_in_svc"),
    pytest.param(("a", "b", "c", "web", "ns1", "svc"), id="too_long"),
])
def test_invalid_names(base: tuple[str, ...]) -> None:
    """CoreDNS plugin/kubernetes/parse.go parseRequest: errInvalidRequest."""
    with pytest.raises(InvalidName):
        parse_request(base)


@pytest.mark.parametrize("labels, zone", [
    pytest.param(("web", "ns", "svc", "cluster", "local"), Zone.CLUSTER, id="cluster"),
    pytest.param(("cluster", "local"), Zone.CLUSTER, id="apex"),
    pytest.param(("local",), Zone.OTHER, id="parent_of_zone"),
    pytest.param(("xcluster", "local"), Zone.OTHER, id="label_suffix_is_not_the_zone"),
    pytest.param(("1", "0", "96", "10", "in-addr", "arpa"), Zone.REVERSE, id="in_addr_arpa"),
    pytest.param(("ip6", "arpa"), Zone.REVERSE, id="ip6_arpa"),
    pytest.param(("example", "com"), Zone.OTHER, id="other"),
    pytest.param((), Zone.OTHER, id="root"),
])
def test_classify(labels: tuple[str, ...], zone: Zone) -> None:
    assert classify(labels, ZONE) is zone


@pytest.mark.parametrize("labels, address", [
    pytest.param(("20", "0", "96", "10", "in-addr", "arpa"), "10.96.0.20", id="ipv4"),
    pytest.param(tuple("0" * 31) + ("ip6", "arpa"), None, id="ipv6_31_nibbles"),
    pytest.param(tuple(reversed("fd00001000960000000000000000" + "0013")) + ("ip6", "arpa"), "fd00:10:96::13",
                 id="ipv6_32_nibbles_canonical"),
    pytest.param(("0", "96", "10", "in-addr", "arpa"), None, id="ipv4_partial"),
    pytest.param(("300", "0", "96", "10", "in-addr", "arpa"), None, id="ipv4_octet_out_of_range"),
    pytest.param(("01", "0", "96", "10", "in-addr", "arpa"), None, id="ipv4_leading_zero"),
    pytest.param(tuple("g" * 32) + ("ip6", "arpa"), None, id="ipv6_not_hex"),
])
def test_reverse_address(labels: tuple[str, ...], address: str | None) -> None:
    """CoreDNS plugin/pkg/dnsutil ExtractAddressFromReverse: a full address or none."""
    assert reverse_address(labels) == address


@pytest.mark.parametrize("address, dashed", [
    pytest.param("172.0.0.2", "172-0-0-2", id="ipv4"),
    pytest.param("5678:abcd::1", "5678-abcd--1", id="ipv6"),
    pytest.param("2001:db8::", "2001-db8--0", id="ipv6_trailing_dash_gets_zero__coredns1123"),
])
def test_dashed_address(address: str, dashed: str) -> None:
    """CoreDNS plugin/kubernetes/kubernetes.go endpointHostname: the address with dashes."""
    assert dashed_address(address) == dashed


@pytest.mark.parametrize("hostname, pod, pod_names, name", [
    pytest.param("web-0", "pod-a", True, "web-0", id="hostname_wins"),
    pytest.param(None, "pod-a", True, "pod-a", id="pod_name_with_option"),
    pytest.param(None, "pod-a", False, "10-0-0-1", id="pod_name_needs_option"),
    pytest.param(None, "p" * 63, True, "p" * 63, id="pod_name_of_63_chars"),
    pytest.param(None, "p" * 64, True, "10-0-0-1", id="pod_name_of_64_chars_too_long"),
    pytest.param(None, None, True, "10-0-0-1", id="no_pod"),
])
def test_endpoint_name(hostname: str | None, pod: str | None, pod_names: bool, name: str) -> None:
    """CoreDNS plugin/kubernetes/kubernetes.go endpointHostname, with endpoint_pod_names."""
    assert endpoint_name("10.0.0.1", hostname, pod, pod_names) == name


@pytest.mark.parametrize("label, address", [
    pytest.param("10-244-0-5", "10.244.0.5", id="ipv4"),
    pytest.param("fd00--1", "fd00::1", id="ipv6"),
    pytest.param("1-2-3--4", "1:2:3::4", id="double_dash_is_ipv6"),
])
def test_pod_address(label: str, address: str) -> None:
    """CoreDNS plugin/kubernetes/kubernetes.go findPods: the label back to an address."""
    assert pod_address(label) == address

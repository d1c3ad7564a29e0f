"""--nodeport-addresses: which node addresses carry NodePorts (reference E.1, KEP-6032 keywords)."""

from __future__ import annotations

import pytest

from kubeport.proxy.config import ProxyConfig, ProxyConfigError
from kubeport.proxy.nodeports import parse_nodeport_addresses, select_nodeport_addresses

PRIMARY = ("192.168.1.10", "fd00:1::10")
INTERFACES = (
    "127.0.0.1", "::1", "192.168.1.10", "192.168.1.11", "10.0.0.5", "fd00:1::10", "fe80::1", "10.96.0.20",
)


@pytest.mark.parametrize(
    ("spec", "primary", "expected"),
    [
        pytest.param("primary", PRIMARY, ["192.168.1.10", "fd00:1::10"], id="primary__node_internal_ips__e1"),
        # kube-proxy expands `primary` to CIDRs, then a family without a CIDR matches all (E.1).
        pytest.param("primary", ("192.168.1.10",), ["192.168.1.10", "fd00:1::10"],
                     id="primary__family_without_node_ip_matches_all__e1"),
        pytest.param("primary", (), ["10.0.0.5", "192.168.1.10", "192.168.1.11", "fd00:1::10"],
                     id="primary__no_node_object__every_address__e1"),
        pytest.param("primary", ("127.0.0.1", "fd00:1::10"), ["10.0.0.5", "192.168.1.10", "192.168.1.11",
                                                               "fd00:1::10"],
                     id="primary__loopback_node_ip_excluded__family_matches_all__e1"),
        pytest.param("primary", ("192.168.9.9", "fd00:1::10"), ["fd00:1::10"],
                     id="primary__node_ip_not_on_any_link__none_in_that_family__e1"),
        pytest.param("localhost", PRIMARY, ["127.0.0.1", "::1"], id="localhost__loopback_cidrs__kep6032"),
        pytest.param("all", PRIMARY,
                     ["10.0.0.5", "192.168.1.10", "192.168.1.11", "fd00:1::10"],
                     id="all__every_local_address_but_loopback_link_local_and_vips__kep6032"),
        pytest.param("all,localhost", PRIMARY,
                     ["10.0.0.5", "127.0.0.1", "192.168.1.10", "192.168.1.11", "::1", "fd00:1::10"],
                     id="all_and_localhost__loopback_only_when_named__kep6032"),
        pytest.param("127.0.0.1/32", PRIMARY, ["127.0.0.1", "fd00:1::10"],
                     id="loopback_cidr__names_loopback__ipv6_falls_back_to_match_all_without_it"),
        pytest.param("192.168.1.0/24", PRIMARY, ["192.168.1.10", "192.168.1.11", "fd00:1::10"],
                     id="cidrs_only__family_without_cidr_matches_all__e1"),
        pytest.param("192.168.1.0/24,fd00:1::/64", PRIMARY, ["192.168.1.10", "192.168.1.11", "fd00:1::10"],
                     id="cidrs_both_families"),
        pytest.param("0.0.0.0/0,fd00:1::/64", PRIMARY,
                     ["10.0.0.5", "192.168.1.10", "192.168.1.11", "fd00:1::10"],
                     id="zero_cidr__family_matches_all_but_loopback__e1"),
        pytest.param("primary,localhost", PRIMARY, ["127.0.0.1", "192.168.1.10", "::1", "fd00:1::10"],
                     id="primary_combined_with_localhost__kep6032"),
        pytest.param(["primary", "10.0.0.0/8"], ("192.168.1.10",), ["10.0.0.5", "192.168.1.10"],
                     id="primary_combined_with_cidr__list_form"),
    ],
)
def test_select_nodeport_addresses(spec, primary, expected):
    assert list(select_nodeport_addresses(spec, primary, INTERFACES, exclude=("10.96.0.20",))) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param("primary,,all", "empty entry", id="empty_entry"),
        pytest.param("eth0", "'eth0' is neither a CIDR nor one of primary, localhost, all", id="unknown_word"),
        pytest.param("10.0.0.0/33", "'10.0.0.0/33' is neither a CIDR", id="bad_cidr"),
    ],
)
def test_invalid_specs_name_the_token(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_nodeport_addresses(spec)
    with pytest.raises(ProxyConfigError, match="nodeport_addresses"):
        ProxyConfig(nodeport_addresses=(spec,))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        pytest.param({"cluster_cidrs": ("10.244.0.0/33",)}, "cluster_cidrs: invalid CIDR", id="cluster_cidr"),
        pytest.param({"connect_timeout": 0}, "connect_timeout: must be greater than 0", id="connect_timeout"),
        pytest.param({"udp_max_flows": 0}, "udp_max_flows: must be an integer >= 1", id="udp_max_flows"),
        pytest.param({"endpoint_grace_period": -1}, "endpoint_grace_period", id="grace"),
        pytest.param({"vip_interface": ""}, "vip_interface", id="vip_interface"),
    ],
)
def test_config_errors_name_the_field(fields, message):
    with pytest.raises(ProxyConfigError, match=message):
        ProxyConfig(**fields)

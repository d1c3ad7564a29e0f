"""--nodeport-addresses: which node addresses carry NodePorts (kube-proxy's
pkg/proxy/util/nodeport_addresses.go NewNodePortAddresses; the keywords of KEP-6032)."""

from __future__ import annotations

import pytest

from kubeport.proxy.config import ProxyConfig, ProxyConfigError
from kubeport.proxy.nodeports import nodeport_selection, parse_nodeport_addresses, select_nodeport_addresses

PRIMARY = ("192.168.1.10", "fd00:1::10")
INTERFACES = (
    "127.0.0.1", "::1", "192.168.1.10", "192.168.1.11", "10.0.0.5", "fd00:1::10", "fe80::1", "10.96.0.20",
)


@pytest.mark.parametrize(
    ("spec", "primary", "expected"),
    [
        pytest.param("primary", PRIMARY, ["192.168.1.10", "fd00:1::10"], id="primary__node_internal_ips"),
        # kube-proxy expands `primary` to CIDRs, then a family without a CIDR matches all
        # (NewNodePortAddresses).
        pytest.param("primary", ("192.168.1.10",), ["192.168.1.10", "fd00:1::10"],
                     id="primary__family_without_node_ip_matches_all"),
        pytest.param("primary", (), ["10.0.0.5", "192.168.1.10", "192.168.1.11", "fd00:1::10"],
                     id="primary__no_node_object__every_address"),
        pytest.param("primary", ("127.0.0.1", "fd00:1::10"), ["10.0.0.5", "192.168.1.10", "192.168.1.11",
                                                               "fd00:1::10"],
                     id="primary__loopback_node_ip_excluded__family_matches_all"),
        pytest.param("primary", ("192.168.9.9", "fd00:1::10"), ["fd00:1::10"],
                     id="primary__node_ip_not_on_any_link__none_in_that_family"),
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
                     id="cidrs_only__family_without_cidr_matches_all"),
        pytest.param("192.168.1.0/24,fd00:1::/64", PRIMARY, ["192.168.1.10", "192.168.1.11", "fd00:1::10"],
                     id="cidrs_both_families"),
        pytest.param("0.0.0.0/0,fd00:1::/64", PRIMARY,
                     ["10.0.0.5", "192.168.1.10", "192.168.1.11", "fd00:1::10"],
                     id="zero_cidr__family_matches_all_but_loopback"),
        pytest.param("primary,localhost", PRIMARY, ["127.0.0.1", "192.168.1.10", "::1", "fd00:1::10"],
                     id="primary_combined_with_localhost__kep6032"),
        pytest.param(["primary", "10.0.0.0/8"], ("192.168.1.10",), ["10.0.0.5", "192.168.1.10"],
                     id="primary_combined_with_cidr__list_form"),
    ],
)
def test_select_nodeport_addresses(spec, primary, expected):
    """pkg/proxy/util/nodeport_addresses.go NewNodePortAddresses; `primary` per KEP-3866."""
    assert list(select_nodeport_addresses(spec, primary, INTERFACES, exclude=("10.96.0.20",))) == expected


V4_ONLY = ("127.0.0.1", "::1", "192.168.1.10", "fe80::1")


@pytest.mark.parametrize(
    ("spec", "primary", "interfaces", "health_check", "unmatched"),
    [
        pytest.param("primary", PRIMARY, INTERFACES, ("192.168.1.10", "fd00:1::10"), {},
                     id="primary__each_matched_node_ip"),
        pytest.param("primary", (), INTERFACES, ("0.0.0.0", "::"), {},
                     id="primary_without_node_object__match_all__wildcard"),
        pytest.param("primary", ("192.168.1.10",), INTERFACES, ("192.168.1.10", "::"), {},
                     id="primary_v4_only__ipv6_falls_back_to_match_all__wildcard_there"),
        pytest.param("all", PRIMARY, INTERFACES, ("0.0.0.0", "::"), {}, id="all__wildcards__kep6032"),
        pytest.param("all", PRIMARY, V4_ONLY, ("0.0.0.0",), {},
                     id="match_all_family_without_an_address_here__nothing__not_an_error"),
        pytest.param("0.0.0.0/0,fd00:1::/64", PRIMARY, INTERFACES, ("0.0.0.0", "fd00:1::10"), {},
                     id="zero_cidr_makes_one_family_match_all"),
        pytest.param("localhost", PRIMARY, INTERFACES, ("127.0.0.1", "::1"), {},
                     id="localhost__loopback_addresses_not_wildcard__kep6032"),
        pytest.param("10.9.0.0/16", PRIMARY, INTERFACES, ("::",), {4: ["10.9.0.0/16"]},
                     id="cidr_matching_nothing__no_ipv4_health_check_ports__logged"),
        pytest.param("10.9.0.0/16,fd09::/64", PRIMARY, INTERFACES, (), {4: ["10.9.0.0/16"], 6: ["fd09::/64"]},
                     id="cidrs_matching_nothing_in_both_families__no_health_check_ports_at_all"),
        pytest.param("primary", ("192.168.9.9", "fd00:1::10"), INTERFACES, ("fd00:1::10",),
                     {4: ["192.168.9.9/32"]}, id="primary_node_ip_not_on_any_link__none_in_that_family"),
        pytest.param("localhost", ("10.0.0.5",), ("127.0.0.1", "10.0.0.5"), ("127.0.0.1",), {},
                     id="localhost_on_a_host_without_ipv6__no_ipv6_error__kep6032"),
        pytest.param("primary,localhost", ("10.0.0.5",), ("127.0.0.1", "10.0.0.5"), ("10.0.0.5", "127.0.0.1"), {},
                     id="primary_and_localhost_without_ipv6__no_error"),
    ],
)
def test_health_check_addresses_and_unmatched_families(spec, primary, interfaces, health_check, unmatched):
    """Health-check node ports on the matched node IPs, the wildcard for a match-all family
    (pkg/proxy/healthcheck/service_health.go, over nodeport_addresses.go)."""
    selection = nodeport_selection(spec, primary, interfaces, exclude=("10.96.0.20",))
    assert selection.health_check_addresses == health_check
    assert {family: [str(n) for n in cidrs] for family, cidrs in selection.unmatched} == unmatched
    problems = selection.problems(spec)
    assert len(problems) == len(unmatched)
    for problem, family in zip(problems, sorted(unmatched)):
        assert f"nodePortAddresses {spec!r}: no local IPv{family} address in" in problem
        assert f"no NodePorts and no health-check node ports on IPv{family}" in problem


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

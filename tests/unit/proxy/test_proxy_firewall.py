"""nftables rules (DROP, loadBalancerSourceRanges): the rendered batches (pure) and the fake."""

from __future__ import annotations

import pytest

from kubeport.proxy.host.nftables import (
    CAPTURE_CHAINS, NO_VIPS, RULES, VIP_RULES, NftFirewall, Vips, render_changes, render_setup,
)
from kubeport.proxy.table import Frontend

from support.fake_host import FakeFirewall

CIP = Frontend("10.96.0.20", 80, "TCP")
NP6 = Frontend("fd00:1::10", 30053, "UDP")
LB = Frontend("198.51.100.9", 80, "TCP")
LB6 = Frontend("2001:db8::9", 443, "TCP")

HOOK = ("add chain inet kubeport input { type filter hook input priority filter - 5; policy accept; }\n"
        + "".join(f"add rule inet kubeport input {rule}\n" for rule in RULES))
UNHOOK = "flush chain inet kubeport input\ndelete chain inet kubeport input\n"


def test_setup_replaces_leftovers_atomically_and_marks_pod_cidrs_local():
    script = render_setup(["10.244.0.0/16", "fd00:10:244::/56"])
    lines = script.splitlines()
    assert lines[:3] == ["table inet kubeport {}", "delete table inet kubeport", "table inet kubeport {"]
    assert "  set local4 { type ipv4_addr; flags interval; elements = { 10.244.0.0/16 }; }" in lines
    assert "  set local6 { type ipv6_addr; flags interval; elements = { fd00:10:244::/56 }; }" in lines
    assert "hook" not in script  # nothing to drop: no hook, no cost per received packet


@pytest.mark.parametrize(("service_cidrs", "forward"), [
    pytest.param(["10.96.0.0/12", "fd00:10:96::/112"], True, id="service_cidrs__forward_hook_drops"),
    pytest.param([], False, id="no_service_cidrs__no_forward_hook"),
])
def test_setup_drops_what_is_routed_to_unallocated_cluster_ips(service_cidrs, forward):
    """As kube-proxy's pkg/proxy/nftables/proxier.go does in its cluster-ips-check chain."""
    lines = render_setup([], service_cidrs=service_cidrs).splitlines()
    assert ("  set services4 { type ipv4_addr; flags interval; elements = { 10.96.0.0/12 }; }" in lines) is forward
    assert ("  set services6 { type ipv6_addr; flags interval; elements = { fd00:10:96::/112 }; }" in lines) is forward
    assert ("    type filter hook forward priority filter - 5; policy accept;" in lines) is forward
    assert ("    ip daddr @services4 drop" in lines) is forward and ("    ip6 daddr @services6 drop" in lines) is forward
    assert "hook input" not in "\n".join(lines)  # the input hook still waits for something to drop


EXT = Frontend("192.168.60.10", 80, "TCP")
EXT_REFUSED = Frontend("192.168.60.11", 53, "UDP")
MARK = 0x100000
CAPTURE_HOOK = "".join(
    f"add chain inet kubeport {name} {{ {hook} }}\n"
    + "".join(f"add rule inet kubeport {name} {rule.format(mark=MARK)}\n" for rule in rules)
    for name, hook, rules in CAPTURE_CHAINS)
CAPTURE_UNHOOK = "".join(f"flush chain inet kubeport {name}\ndelete chain inet kubeport {name}\n"
                         for name, _, _ in CAPTURE_CHAINS)


def test_setup_captures_external_ports__marked_when_served_rejected_when_refused():
    script = render_setup([], captured={EXT: True, EXT_REFUSED: False}, mark=MARK)
    assert "set capture4 { type ipv4_addr . inet_proto . inet_service; elements = { 192.168.60.10 . tcp . 80 }; }" in script
    assert "set reject4 { type ipv4_addr . inet_proto . inet_service; elements = { 192.168.60.11 . udp . 53 }; }" in script
    assert "    type filter hook prerouting priority mangle; policy accept;" in script.splitlines()
    assert "ip daddr . meta l4proto . th dport @capture4 meta mark set meta mark | 0x00100000" in script
    assert "    type route hook output priority mangle; policy accept;" in script.splitlines()
    assert "ip daddr . meta l4proto . th dport @reject4 reject" in script
    assert "hook prerouting" not in render_setup([], mark=MARK)  # nothing captured: no cost per packet


@pytest.mark.parametrize(("current", "desired", "expected"), [
    pytest.param({}, {EXT: True}, "add element inet kubeport capture4 { 192.168.60.10 . tcp . 80 }\n" + CAPTURE_HOOK,
                 id="first_capture_hooks_the_chains"),
    pytest.param({EXT: True}, {EXT: False},
                 "delete element inet kubeport capture4 { 192.168.60.10 . tcp . 80 }\n"
                 "add element inet kubeport reject4 { 192.168.60.10 . tcp . 80 }\n",
                 id="endpoints_gone__served_to_refused"),
    pytest.param({EXT: True, EXT_REFUSED: False}, {EXT_REFUSED: False},
                 "delete element inet kubeport capture4 { 192.168.60.10 . tcp . 80 }\n", id="one_left__still_hooked"),
    pytest.param({EXT_REFUSED: False}, {}, "delete element inet kubeport reject4 { 192.168.60.11 . udp . 53 }\n"
                 + CAPTURE_UNHOOK, id="last_gone_unhooks"),
])
def test_changes_capture(current, desired, expected):
    assert render_changes({}, {}, current_captured=current, desired_captured=desired, mark=MARK) == expected


def test_setup_hooks_the_chain_when_something_is_dropped():
    lines = render_setup(["10.244.0.0/16"], {CIP: False}).splitlines()
    assert "    type filter hook input priority filter - 5; policy accept;" in lines
    assert any("@dropext4 ip saddr != @local4 fib saddr type != local drop" in line for line in lines)
    assert any(line.strip() == "ip daddr . meta l4proto . th dport @drop4 drop" for line in lines)
    assert any(line.strip() == "ip daddr . meta l4proto . th dport @fw4 "
               "ip daddr . meta l4proto . th dport . ip saddr != @fwallow4 drop" for line in lines)


def test_setup_carries_the_current_elements__a_successor_replaces_the_table_without_a_gap():
    script = render_setup([], {CIP: False, NP6: True}, {LB: ("203.0.113.0/24", "198.51.100.9/32")})
    assert "  set drop4 { type ipv4_addr . inet_proto . inet_service; elements = { 10.96.0.20 . tcp . 80 }; }" in script
    assert "elements = { fd00:1::10 . udp . 30053 }" in script
    assert "set fw4 { type ipv4_addr . inet_proto . inet_service; elements = { 198.51.100.9 . tcp . 80 }; }" in script
    assert ("set fwallow4 { type ipv4_addr . inet_proto . inet_service . ipv4_addr; flags interval; elements = { "
            "198.51.100.9 . tcp . 80 . 203.0.113.0/24, 198.51.100.9 . tcp . 80 . 198.51.100.9 }; }") in script
    assert script.count("delete table inet kubeport") == 1  # one transaction: never an empty table


@pytest.mark.parametrize(
    ("current", "desired", "expected"),
    [
        pytest.param({}, {LB: ("203.0.113.0/24",)},
                     "add element inet kubeport fwallow4 { 198.51.100.9 . tcp . 80 . 203.0.113.0/24 }\n"
                     "add element inet kubeport fw4 { 198.51.100.9 . tcp . 80 }\n" + HOOK,
                     id="ranges_appear__frontend_restricted"),
        pytest.param({LB: ("203.0.113.0/24",)}, {},
                     "delete element inet kubeport fwallow4 { 198.51.100.9 . tcp . 80 . 203.0.113.0/24 }\n"
                     "delete element inet kubeport fw4 { 198.51.100.9 . tcp . 80 }\n" + UNHOOK,
                     id="ranges_removed__open_again"),
        pytest.param({LB: ("203.0.113.0/24", "10.0.0.0/8")}, {LB: ("10.0.0.0/8", "192.0.2.7/32")},
                     "delete element inet kubeport fwallow4 { 198.51.100.9 . tcp . 80 . 203.0.113.0/24 }\n"
                     "add element inet kubeport fwallow4 { 198.51.100.9 . tcp . 80 . 192.0.2.7 }\n",
                     id="ranges_changed__only_the_difference"),
        pytest.param({}, {LB6: ("2001:db8:1::/48",)},
                     "add element inet kubeport fwallow6 { 2001:db8::9 . tcp . 443 . 2001:db8:1::/48 }\n"
                     "add element inet kubeport fw6 { 2001:db8::9 . tcp . 443 }\n" + HOOK,
                     id="ipv6_vip__v6_sets"),
        pytest.param({LB: ("10.0.0.0/8",)}, {LB: ("10.0.0.0/8",)}, "", id="unchanged__no_batch"),
    ],
)
def test_render_changes__source_ranges(current, desired, expected):
    assert render_changes({}, {}, current, desired) == expected


@pytest.mark.parametrize(
    ("current", "desired", "expected"),
    [
        pytest.param({}, {}, "", id="nothing_to_do__no_batch"),
        pytest.param({}, {CIP: False}, "add element inet kubeport drop4 { 10.96.0.20 . tcp . 80 }\n" + HOOK,
                     id="itp_local_drop__every_client__chain_hooked"),
        pytest.param({}, {NP6: True}, "add element inet kubeport dropext6 { fd00:1::10 . udp . 30053 }\n" + HOOK,
                     id="etp_local_drop__external_clients_only"),
        pytest.param({CIP: False}, {}, "delete element inet kubeport drop4 { 10.96.0.20 . tcp . 80 }\n" + UNHOOK,
                     id="local_endpoint_back__element_removed__chain_unhooked"),
        pytest.param({CIP: False}, {CIP: False, NP6: True},
                     "add element inet kubeport dropext6 { fd00:1::10 . udp . 30053 }\n",
                     id="second_drop__chain_already_hooked"),
        pytest.param({CIP: False}, {CIP: True},
                     "delete element inet kubeport drop4 { 10.96.0.20 . tcp . 80 }\n"
                     "add element inet kubeport dropext4 { 10.96.0.20 . tcp . 80 }\n",
                     id="scope_changes__moves_between_sets"),
        pytest.param({CIP: False, NP6: True}, {CIP: False, NP6: True}, "", id="unchanged__no_batch"),
    ],
)
def test_render_changes__only_the_difference(current, desired, expected):
    assert render_changes(current, desired) == expected


async def test_fake_firewall_records_real_changes_only():
    fake = FakeFirewall()
    await fake.start(["10.244.0.0/16"])
    await fake.sync({CIP: False})
    await fake.sync({CIP: False}, {LB: ("10.0.0.0/8",)})
    await fake.sync({})
    assert fake.syncs == [{CIP: False}, {}]
    assert fake.allowed == {}


@pytest.mark.parametrize("release", [pytest.param(True, id="shutdown__table_removed"),
                                     pytest.param(False, id="handover__table_left_to_the_successor")])
async def test_fake_firewall_stop(release):
    fake = FakeFirewall()
    await fake.start([])
    await fake.sync({CIP: False}, {LB: ("10.0.0.0/8",)})
    await fake.stop(release=release)
    assert fake.released is release
    assert (fake.drops == {}) is release


def test_chain_stays_hooked_while_source_ranges_remain():
    ranges = {LB: ("10.0.0.0/8",)}
    assert render_changes({CIP: False}, {}, ranges, ranges) == (
        "delete element inet kubeport drop4 { 10.96.0.20 . tcp . 80 }\n")


# --- a VIP answers only its service ports ----------------------------------------------------

CIP_DNS = Frontend("10.96.0.10", 53, "UDP")
CIP6 = Frontend("fd00:10:96::20", 443, "TCP")
VIP_HOOK = ("add chain inet kubeport vips { type filter hook input priority filter - 5; policy accept; }\n"
            + "".join(f"add rule inet kubeport vips {rule}\n" for rule in VIP_RULES))
VIP_UNHOOK = "flush chain inet kubeport vips\ndelete chain inet kubeport vips\n"


def test_setup_rejects_the_ports_a_vip_does_not_serve():
    vips = Vips(frozenset({"10.96.0.20", "10.96.0.10", "fd00:10:96::20"}), frozenset({CIP, CIP_DNS, CIP6}))
    lines = render_setup([], vips=vips).splitlines()
    assert "  set vips4 { type ipv4_addr; elements = { 10.96.0.10, 10.96.0.20 }; }" in lines
    assert "  set vips6 { type ipv6_addr; elements = { fd00:10:96::20 }; }" in lines
    assert ("  set vipports4 { type ipv4_addr . inet_proto . inet_service;"
            " elements = { 10.96.0.10 . udp . 53, 10.96.0.20 . tcp . 80 }; }") in lines
    assert "  set vipports6 { type ipv6_addr . inet_proto . inet_service; elements = { fd00:10:96::20 . tcp . 443 }; }" in lines
    chain = lines.index("  chain vips {")
    assert lines[chain + 1:chain + 7] == ["    type filter hook input priority filter - 5; policy accept;",
                                          *(f"    {rule}" for rule in VIP_RULES), "  }"]
    # Only a new flow is looked up: kube-proxy's "ct state new" jump to cluster-ips-check
    # (pkg/proxy/nftables/proxier.go nftablesJumpChains).
    assert VIP_RULES[1] == "ct state != new accept"
    reject = lines.index("  chain vip_reject {")
    assert lines[reject + 1:reject + 4] == ["    meta l4proto tcp reject with tcp reset", "    reject", "  }"]


def test_setup_without_vips__no_input_hook_but_the_reject_chain_is_there_to_jump_to():
    script = render_setup([])
    assert "hook input" not in script
    assert "  chain vip_reject {" in script.splitlines()


@pytest.mark.parametrize(("current", "desired", "expected"), [
    pytest.param(NO_VIPS, Vips(frozenset({"10.96.0.20"}), frozenset({CIP})),
                 "add element inet kubeport vips4 { 10.96.0.20 }\n"
                 "add element inet kubeport vipports4 { 10.96.0.20 . tcp . 80 }\n" + VIP_HOOK,
                 id="first_vip__elements_then_the_hook"),
    pytest.param(Vips(frozenset({"10.96.0.20"}), frozenset({CIP})),
                 Vips(frozenset({"10.96.0.20"}), frozenset({CIP, Frontend("10.96.0.20", 443, "TCP")})),
                 "add element inet kubeport vipports4 { 10.96.0.20 . tcp . 443 }\n",
                 id="a_port_more__one_element"),
    pytest.param(Vips(frozenset({"10.96.0.20", "fd00:10:96::20"}), frozenset({CIP, CIP6})),
                 Vips(frozenset({"10.96.0.20"}), frozenset({CIP})),
                 "delete element inet kubeport vips6 { fd00:10:96::20 }\n"
                 "delete element inet kubeport vipports6 { fd00:10:96::20 . tcp . 443 }\n",
                 id="a_vip_gone__its_address_and_ports"),
    pytest.param(Vips(frozenset({"10.96.0.20"}), frozenset({CIP})), NO_VIPS,
                 "delete element inet kubeport vips4 { 10.96.0.20 }\n"
                 "delete element inet kubeport vipports4 { 10.96.0.20 . tcp . 80 }\n" + VIP_UNHOOK,
                 id="last_vip__unhooked"),
    pytest.param(Vips(frozenset({"10.96.0.20"}), frozenset({CIP})), Vips(frozenset({"10.96.0.20"}), frozenset({CIP})),
                 "", id="unchanged__nothing"),
])
def test_render_changes__vip_ports(current, desired, expected):
    assert render_changes({}, {}, current_vips=current, desired_vips=desired) == expected


async def test_nft_firewall_sends_only_the_changed_vip_elements():
    scripts: list[str] = []

    async def run(script: str) -> None:
        scripts.append(script)

    firewall = NftFirewall(nft="sh", run=run)  # any program on PATH: start only checks it is there
    firewall.enabled = True
    first = Vips(frozenset({"10.96.0.20"}), frozenset({CIP}))
    await firewall.sync({}, vips=first)
    await firewall.sync({}, vips=first)
    await firewall.sync({}, vips=Vips(frozenset({"10.96.0.20"}), frozenset({CIP, CIP_DNS})))
    assert len(scripts) == 2 and scripts[0].startswith("table inet kubeport {}\ndelete table inet kubeport\n")
    assert scripts[1] == "add element inet kubeport vipports4 { 10.96.0.10 . udp . 53 }\n"


@pytest.mark.parametrize(("service_cidrs", "expected4"), [
    pytest.param(["10.96.0.0/28", "10.97.0.0/24"], "10.96.0.0/28, 10.97.0.0/24", id="apart"),
    pytest.param(["10.96.0.0/12", "10.96.0.0/24"], "10.96.0.0/12", id="contained__merged"),
    pytest.param(["10.96.0.0/25", "10.96.0.128/25"], "10.96.0.0/24", id="adjacent__merged"),
])
def test_service_ranges_are_merged__nft_refuses_overlapping_interval_elements(service_cidrs, expected4):
    lines = render_setup([], service_cidrs=service_cidrs).splitlines()
    assert f"  set services4 {{ type ipv4_addr; flags interval; elements = {{ {expected4} }}; }}" in lines


async def test_service_ranges_changed__the_next_sync_writes_the_table_whole():
    scripts: list[str] = []

    async def run(script: str) -> None:
        scripts.append(script)

    firewall = NftFirewall(nft="sh", run=run)
    firewall.enabled = True  # as start() leaves it, without its policy routing
    assert firewall.set_service_cidrs(["10.96.0.0/28"]) is True
    await firewall.sync({CIP: False})
    assert firewall.set_service_cidrs(["10.96.0.0/28"]) is False  # the same: nothing to write
    await firewall.sync({CIP: False})
    assert len(scripts) == 1
    assert firewall.set_service_cidrs(["10.96.0.0/28", "10.97.0.0/24"]) is True
    await firewall.sync({CIP: False})
    assert len(scripts) == 2 and scripts[1].startswith("table inet kubeport {}\ndelete table inet kubeport\n")
    assert "elements = { 10.96.0.0/28, 10.97.0.0/24 }" in scripts[1]

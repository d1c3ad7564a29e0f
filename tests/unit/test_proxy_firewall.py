"""nftables DROP rules: the rendered batches (pure) and the fake the Proxier tests use."""

from __future__ import annotations

import pytest

from kubeport.proxy.firewall import FakeFirewall, render_changes, render_setup
from kubeport.proxy.table import Frontend

CIP = Frontend("10.96.0.20", 80, "TCP")
NP6 = Frontend("fd00:1::10", 30053, "UDP")


def test_setup_replaces_leftovers_atomically_and_marks_pod_cidrs_local():
    script = render_setup(["10.244.0.0/16", "fd00:10:244::/56"])
    lines = script.splitlines()
    assert lines[:3] == ["table inet kubeport {}", "delete table inet kubeport", "table inet kubeport {"]
    assert "  set local4 { type ipv4_addr; flags interval; elements = { 10.244.0.0/16 }; }" in lines
    assert "  set local6 { type ipv6_addr; flags interval; elements = { fd00:10:244::/56 }; }" in lines
    assert any("@dropext4 ip saddr != @local4 fib saddr type != local drop" in line for line in lines)
    assert any(line.strip() == "ip daddr . meta l4proto . th dport @drop4 drop" for line in lines)


@pytest.mark.parametrize(
    ("current", "desired", "expected"),
    [
        pytest.param({}, {}, "", id="nothing_to_do__no_batch"),
        pytest.param({}, {CIP: False}, "add element inet kubeport drop4 { 10.96.0.20 . tcp . 80 }\n",
                     id="itp_local_drop__every_client"),
        pytest.param({}, {NP6: True}, "add element inet kubeport dropext6 { fd00:1::10 . udp . 30053 }\n",
                     id="etp_local_drop__external_clients_only"),
        pytest.param({CIP: False}, {}, "delete element inet kubeport drop4 { 10.96.0.20 . tcp . 80 }\n",
                     id="local_endpoint_back__element_removed"),
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
    await fake.sync({CIP: False})
    await fake.sync({})
    assert fake.syncs == [{CIP: False}, {}]

"""The tables that take replies to a client's address back to the relay (proxy/host/replies.py)."""

import json

import pytest

from kubeport.proxy.host.replies import (
    Bridge,
    ClientReplies,
    parse_links,
    render_changes,
    render_bridge_setup,
    render_inet_setup,
    teardown_script,
)

#: `ip -details -json address show` of a node of the test topology, trimmed to what is read
IP_JSON = json.dumps([
    {"ifname": "lo", "address": "00:00:00:00:00:00", "linkinfo": None,
     "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8, "scope": "host"},
                   {"family": "inet6", "local": "::1", "prefixlen": 128, "scope": "host"}]},
    {"ifname": "eth0", "address": "7a:1c:00:00:00:01", "linkinfo": {"info_kind": "veth"},
     "addr_info": [{"family": "inet", "local": "192.168.50.11", "prefixlen": 24, "scope": "global"},
                   {"family": "inet6", "local": "fd00:50::11", "prefixlen": 64, "scope": "global"}]},
    {"ifname": "br0", "address": "d2:35:a3:a8:00:2b", "linkinfo": {"info_kind": "bridge"},
     "addr_info": [{"family": "inet", "local": "10.244.1.1", "prefixlen": 24, "scope": "global"},
                   {"family": "inet6", "local": "fd00:10:244:1::1", "prefixlen": 64, "scope": "global"},
                   {"family": "inet6", "local": "fe80::1", "prefixlen": 64, "scope": "link"}]},
    {"ifname": "br-empty", "address": "d2:35:a3:a8:00:2c", "linkinfo": {"info_kind": "bridge"}, "addr_info": []},
    {"ifname": "vip", "address": "aa:00:00:00:00:01", "linkinfo": {"info_kind": "veth"},
     "addr_info": [{"family": "inet", "local": "10.96.0.1", "prefixlen": 32, "scope": "global"}]},
])
BR0 = Bridge("br0", "d2:35:a3:a8:00:2b", ("10.244.1.1/24", "fd00:10:244:1::1/64", "fe80::1/64"))


def test_parse_links__subnets_of_every_link_and_the_bridges_that_have_one():
    links = parse_links(IP_JSON)
    assert links.networks == ("192.168.50.11/24", "fd00:50::11/64", "10.244.1.1/24", "fd00:10:244:1::1/64",
                              "fe80::1/64")
    assert links.bridges == (BR0,)
    assert parse_links("") == parse_links("[]")


def test_render_setup__each_table_replaced_whole():
    lines = render_inet_setup(0x100000).splitlines()
    assert lines[:3] == ["table inet kubeport_replies {}", "delete table inet kubeport_replies",
                         "table inet kubeport_replies {"]
    assert "    ct state new socket transparent 1 ct mark set ct mark | 0x100000" in lines
    assert "    ct mark & 0x100000 == 0x100000 meta mark set meta mark | 0x100000" in lines
    lines = render_bridge_setup([BR0], [("10.244.1.12", "tcp", 8080), ("fd00:10:244:1::12", "udp", 9090)]).splitlines()
    assert lines[:3] == ["table bridge kubeport {}", "delete table bridge kubeport", "table bridge kubeport {"]
    assert ("  set endpoints4 { type ipv4_addr . inet_proto . inet_service; "
            "elements = { 10.244.1.12 . tcp . 8080 }; }") in lines
    assert ("  set endpoints6 { type ipv6_addr . inet_proto . inet_service; "
            "elements = { fd00:10:244:1::12 . udp . 9090 }; }") in lines
    assert ("    ip daddr { 10.244.1.0/24 } ip saddr . meta l4proto . th sport @endpoints4 "
            "ether daddr set d2:35:a3:a8:00:2b meta pkttype set host") in lines
    assert ("    ip6 daddr { fd00:10:244:1::/64, fe80::/64 } ip6 saddr . meta l4proto . th sport @endpoints6 "
            "ether daddr set d2:35:a3:a8:00:2b meta pkttype set host") in lines


def test_render_setup__no_bridge_no_rule_empty_sets():
    script = render_bridge_setup([], [])
    assert "ether daddr set" not in script and "elements" not in script


@pytest.mark.parametrize("current, desired, expected", [
    (set(), set(), ""),
    (set(), {("10.244.1.12", "tcp", 8080)}, "add element bridge kubeport endpoints4 { 10.244.1.12 . tcp . 8080 }\n"),
    ({("fd00::1", "udp", 53)}, set(), "delete element bridge kubeport endpoints6 { fd00::1 . udp . 53 }\n"),
])
def test_render_changes(current, desired, expected):
    assert render_changes(frozenset(current), frozenset(desired)) == expected


def test_teardown_removes_both_tables_even_if_one_is_missing():
    assert teardown_script() == ("table inet kubeport_replies {}\ndelete table inet kubeport_replies\n"
                                 "table bridge kubeport {}\ndelete table bridge kubeport\n")


def test_only_endpoints_on_a_bridge_subnet_are_in_the_set_and_counted_per_frontend():
    replies = ClientReplies()
    replies.set_bridges((BR0,))
    here, there = ("10.244.1.12", "tcp", 8080), ("10.244.2.11", "tcp", 8080)
    replies.account([], [here, here, there])  # two frontends use `here`
    assert replies._desired() == {here}
    replies.account([here], [])
    assert replies._desired() == {here}
    replies.account([here], [])
    assert replies._desired() == frozenset()


@pytest.mark.parametrize("predecessor", [True, False], ids=["a predecessor's table", "no table"])
def test_start_keeps_a_predecessors_bridge_table_until_the_first_sync(monkeypatch, predecessor):
    """An unsynced successor knows no endpoint: rewriting the bridge table at start would cut
    the replies of the same-bridge flows its predecessor still relays."""
    import asyncio

    from kubeport.proxy.host import replies as module

    scripts: list[str] = []

    async def nft(script: str) -> None:
        scripts.append(script)

    async def nothing() -> None:
        return None

    async def exists(table: str) -> bool:
        return predecessor

    monkeypatch.setattr(module, "_nft", nft)
    monkeypatch.setattr(module, "_table_exists", exists)
    monkeypatch.setattr(module.capture, "set_up", nothing)
    monkeypatch.setattr(module, "transparent_allowed", lambda: None)
    monkeypatch.setattr(module.shutil, "which", lambda name: f"/usr/sbin/{name}")
    replies = ClientReplies()

    async def run() -> None:
        await replies.start(parse_links(IP_JSON))
        written_at_start = [s for s in scripts if "bridge kubeport" in s]
        assert bool(written_at_start) is not predecessor
        replies.account([], [("10.244.1.12", "tcp", 8080)])
        await replies.sync()
        assert "10.244.1.12 . tcp . 8080" in scripts[-1]
        assert scripts[-1].startswith("table bridge kubeport {}") is predecessor  # whole, or one element added

    asyncio.run(run())
    assert replies.enabled and replies.bridge_problem is None


def test_a_node_without_bridges_counts_nothing_and_new_bridges_ask_for_a_recount():
    replies = ClientReplies()
    here = ("10.244.1.12", "tcp", 8080)
    replies.account([], iter([here]))
    assert replies._desired() == frozenset() and not replies.needs_recount
    replies.set_bridges((BR0,))
    assert replies.needs_recount
    replies.recount([here, ("10.244.2.11", "udp", 9090), ("fd00:10:244:1::12", "udp", 9090)])
    assert replies._desired() == {here, ("fd00:10:244:1::12", "udp", 9090)} and not replies.needs_recount

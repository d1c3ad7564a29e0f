"""The hand-encoded RTM_NEWROUTE/RTM_DELROUTE messages decode to what pyroute2 would send,
and a route dump parses back."""

from __future__ import annotations

import socket
import struct

import pytest
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from kubeport.proxy.host import netlink
from kubeport.proxy.host.netlink import RouteOp


def test_nothing_to_do_opens_no_socket():
    assert netlink.apply([], index=1, proto=0x6B) == {}


@pytest.mark.parametrize(
    "op, family, dst_len, kind, scope, flags",
    [
        pytest.param(RouteOp(True, "10.96.0.20"), socket.AF_INET, 32, netlink.RTM_NEWROUTE,
                     netlink.RT_SCOPE_HOST, 0x605, id="add_ipv4__create_excl"),
        pytest.param(RouteOp(True, "fd00:10:96::20"), socket.AF_INET6, 128, netlink.RTM_NEWROUTE,
                     netlink.RT_SCOPE_HOST, 0x605, id="add_ipv6"),
        pytest.param(RouteOp(False, "10.96.0.20"), socket.AF_INET, 32, netlink.RTM_DELROUTE,
                     netlink.RT_SCOPE_NOWHERE, 0x5, id="delete_ipv4__any_scope_ours_only"),
    ],
)
def test_route_message_is_a_local_host_route_in_table_local_with_our_protocol(op, family, dst_len, kind,
                                                                                scope, flags):
    """ip route add local <VIP>/32 dev <link 3> table local proto 0x6b"""
    msg = rtmsg(netlink.encode_route(op, index=3, proto=0x6B, sequence=9))
    msg.decode()
    assert (msg["family"], msg["dst_len"], msg["table"], msg["proto"], msg["scope"], msg["type"]) == (
        family, dst_len, 255, 0x6B, scope, netlink.RTN_LOCAL)
    assert (msg["header"]["type"], msg["header"]["flags"], msg["header"]["sequence_number"]) == (kind, flags, 9)
    assert (msg.get_attr("RTA_DST"), msg.get_attr("RTA_OIF")) == (op.address, 3)
    assert netlink.parse_local_route(netlink.encode_route(op, 3, 0x6B, 9)[16:]) == (op.address, 3, 0x6B)


@pytest.mark.parametrize("payload", [
    pytest.param(netlink._RTMSG.pack(socket.AF_INET, 8, 0, 0, 255, 2, 254, 2, 0)
                 + netlink._attribute(netlink.RTA_DST, socket.inet_aton("127.0.0.0")), id="not_a_host"),
    pytest.param(netlink._RTMSG.pack(socket.AF_INET, 32, 0, 0, 255, 2, 253, 3, 0)
                 + netlink._attribute(netlink.RTA_DST, socket.inet_aton("10.0.0.255")), id="broadcast"),
    pytest.param(netlink._RTMSG.pack(socket.AF_INET, 32, 0, 0, 254, 4, 0, 1, 0)
                 + netlink._attribute(netlink.RTA_DST, socket.inet_aton("10.0.0.9")), id="unicast_main"),
])
def test_route_dump_keeps_local_host_routes_only(payload):
    assert netlink.parse_local_route(payload) is None


def _event(kind: str) -> bytes:
    """An rtnetlink event as the kernel multicasts it, encoded by pyroute2."""
    from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    if kind.endswith("ADDR"):
        msg = ifaddrmsg()
        msg["family"], msg["prefixlen"], msg["index"] = socket.AF_INET, 24, 2
        msg["attrs"] = [("IFA_ADDRESS", "192.168.7.1"), ("IFA_LOCAL", "192.168.7.1"), ("IFA_LABEL", "eth0")]
    else:
        msg = ifinfmsg()
        msg["index"], msg["attrs"] = 2, [("IFLA_IFNAME", "eth0")]
    msg["header"]["type"] = getattr(netlink, f"RTM_{kind}")
    msg.encode()
    return bytes(msg.data)


@pytest.mark.parametrize("kinds", [
    pytest.param(["NEWADDR"], id="one_address_added"),
    pytest.param(["DELADDR", "NEWADDR"], id="an_address_replaced_in_one_read"),
    pytest.param(["NEWLINK", "DELLINK", "NEWADDR"], id="links_and_addresses"),
])
def test_address_events_are_read_by_type(kinds):
    """address_events.py looks again on these types; pyroute2 encodes what the kernel sends."""
    data = b"".join(_event(kind) for kind in kinds)
    assert netlink.message_types(data) == [getattr(netlink, f"RTM_{kind}") for kind in kinds]


def test_a_malformed_event_raises_instead_of_looping():
    with pytest.raises(OSError):
        netlink.message_types(struct.pack("=IHHII", 4, netlink.RTM_NEWADDR, 0, 0, 0))

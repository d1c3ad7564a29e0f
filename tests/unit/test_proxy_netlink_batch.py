"""The hand-encoded RTM_NEWADDR/RTM_DELADDR messages decode to what pyroute2 would send."""

from __future__ import annotations

import socket

import pytest
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg

from kubeport.proxy import netlink_batch
from kubeport.proxy.netlink_batch import AddressOp


def decode(data: bytes) -> ifaddrmsg:
    msg = ifaddrmsg(data)
    msg.decode()
    return msg


@pytest.mark.parametrize(
    "op, family, prefixlen, kind, flags, attrs",
    [
        pytest.param(AddressOp(True, "10.96.0.20"), socket.AF_INET, 32, netlink_batch.RTM_NEWADDR, 0,
                     {"IFA_LOCAL": "10.96.0.20", "IFA_ADDRESS": "10.96.0.20", "IFA_PROTO": 0x6B}, id="add_ipv4"),
        pytest.param(AddressOp(True, "fd00:10:96::20"), socket.AF_INET6, 128, netlink_batch.RTM_NEWADDR,
                     netlink_batch.IFA_F_NODAD, {"IFA_ADDRESS": "fd00:10:96::20", "IFA_PROTO": 0x6B},
                     id="add_ipv6_nodad"),
        pytest.param(AddressOp(False, "10.96.0.20"), socket.AF_INET, 32, netlink_batch.RTM_DELADDR, 0,
                     {"IFA_LOCAL": "10.96.0.20", "IFA_ADDRESS": "10.96.0.20"}, id="delete_ipv4"),
    ],
)
def test_encoded_message_decodes_like_pyroute2(op, family, prefixlen, kind, flags, attrs):
    msg = decode(netlink_batch.encode(op, index=1, proto=0x6B, sequence=7))
    assert (msg["family"], msg["prefixlen"], msg["index"], msg["flags"]) == (family, prefixlen, 1, flags)
    assert (msg["header"]["type"], msg["header"]["sequence_number"]) == (kind, 7)
    assert {name: msg.get_attr(name) for name in attrs} == attrs
    if not op.add:
        assert msg.get_attr("IFA_PROTO") is None


def test_nothing_to_do_opens_no_socket():
    assert netlink_batch.apply([], index=1, proto=0x6B) == {}

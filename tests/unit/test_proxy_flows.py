"""The UDP flow table, sans-IO: idle expiry with `now`, limits, endpoint removal."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kubeport.proxy.flows import Admission, FlowTable

EP1 = SimpleNamespace(key="10.244.0.1:53")
EP2 = SimpleNamespace(key="10.244.0.2:53")


def table(idle: float = 30.0, max_flows: int = 100, per_client: int = 10) -> FlowTable[str]:
    return FlowTable(idle, max_flows, per_client)


def test_idle_flow_expires_after_the_timeout__conntrack_udp_stream_30s():
    flows = table()
    flows.add(("10.0.0.1", 5000), "10.0.0.1", EP1, "sock-1", now=0.0)
    assert flows.next_expiry() == 30.0
    assert flows.expire(29.9) == []
    assert [f.handle for f in flows.expire(30.0)] == ["sock-1"]
    assert len(flows) == 0 and flows.next_expiry() is None


@pytest.mark.parametrize(
    "refresh",
    [
        pytest.param(lambda flows, flow, now: flows.get(flow.client, now), id="client_datagram_refreshes"),
        pytest.param(lambda flows, flow, now: flows.touch(flow, now), id="endpoint_reply_refreshes"),
    ],
)
def test_traffic_either_way_keeps_a_flow_alive(refresh):
    flows = table()
    flow = flows.add(("10.0.0.1", 5000), "10.0.0.1", EP1, "s", now=0.0)
    refresh(flows, flow, 20.0)
    assert flows.expire(45.0) == []
    assert flows.next_expiry() == 50.0
    assert flows.expire(50.0) == [flow]


def test_expiry_takes_the_least_recently_used_first_and_stops_at_the_first_live_one():
    flows = table(idle=10)
    a = flows.add("a", "10.0.0.1", EP1, "a", now=0.0)
    b = flows.add("b", "10.0.0.2", EP1, "b", now=1.0)
    c = flows.add("c", "10.0.0.3", EP1, "c", now=2.0)
    flows.get("a", 5.0)
    assert flows.expire(11.5) == [b]
    assert flows.expire(20.0, limit=1) == [c]
    assert flows.expire(20.0) == [a]


def test_limits__global_then_per_client():
    flows = table(max_flows=3, per_client=2)
    flows.add(("10.0.0.1", 1), "10.0.0.1", EP1, "s", 0.0)
    flows.add(("10.0.0.1", 2), "10.0.0.1", EP1, "s", 0.0)
    assert flows.admit("10.0.0.1") is Admission.CLIENT_LIMIT
    assert flows.admit("10.0.0.2") is Admission.OK
    flows.add(("10.0.0.2", 1), "10.0.0.2", EP1, "s", 0.0)
    assert flows.admit("10.0.0.3") is Admission.TABLE_FULL
    flows.expire(100.0)
    assert flows.admit("10.0.0.1") is Admission.OK


def test_flows_to_a_removed_endpoint_go_at_once__no_stale_conntrack():
    flows = table()
    keep = flows.add("a", "10.0.0.1", EP1, "a", 0.0)
    gone = flows.add("b", "10.0.0.2", EP2, "b", 0.0)
    assert flows.remove_unless({EP1.key}) == [gone]
    assert list(flows) == [keep]
    assert flows.admit("10.0.0.2") is Admission.OK


def test_remove_is_idempotent_and_duplicate_add_is_an_error():
    flows = table()
    flow = flows.add("a", "10.0.0.1", EP1, "a", 0.0)
    with pytest.raises(KeyError):
        flows.add("a", "10.0.0.1", EP1, "a", 0.0)
    assert flows.remove(flow) is True
    assert flows.remove(flow) is False

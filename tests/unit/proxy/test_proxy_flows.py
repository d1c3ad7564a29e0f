"""The UDP flow table, sans-IO: idle expiry with `now`, limits, endpoint removal."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kubeport.proxy.flows import Admission, FlowTable

EP1 = SimpleNamespace(key="10.244.0.1:53")
EP2 = SimpleNamespace(key="10.244.0.2:53")


def table(idle: float = 30.0, max_flows: int = 100, per_client: int = 10,
          stream: float | None = None) -> FlowTable[str]:
    return FlowTable(idle, max_flows, per_client, stream)


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


# --- conntrack's two UDP timeouts: 30 s, and 120 s for an answered flow in use past 2 s ----------

CLIENT = ("10.0.0.1", 5000)


@pytest.mark.parametrize(("events", "expires_at"), [
    pytest.param([], 30.0, id="never_answered__udp_timeout"),
    pytest.param([("reply", 0.5)], 30.5, id="answered_at_once_then_quiet__udp_timeout__dns_like"),
    pytest.param([("reply", 0.5), ("client", 1.5)], 31.5, id="answered_but_over_before_2s__udp_timeout"),
    pytest.param([("client", 5.0)], 35.0, id="in_use_past_2s_never_answered__udp_timeout"),
    pytest.param([("reply", 0.5), ("client", 2.0)], 122.0, id="answered_and_in_use_at_2s__stream_timeout"),
    pytest.param([("client", 1.0), ("reply", 3.0)], 123.0, id="first_answer_after_2s__stream_timeout"),
    pytest.param([("reply", 0.5), ("client", 2.5), ("reply", 60.0)], 180.0, id="stream_refreshed_either_way"),
])
def test_stream_timeout_for_an_answered_flow_in_use_past_2s__nf_conntrack_udp(events, expires_at):
    flows = table(stream=120.0)
    flow = flows.add(CLIENT, "10.0.0.1", EP1, "s", now=0.0)
    for direction, now in events:
        flows.get(CLIENT, now) if direction == "client" else flows.touch(flow, now)
    assert flows.next_expiry() == expires_at
    assert flows.expire(expires_at - 0.01) == [] and len(flows) == 1
    assert flows.expire(expires_at) == [flow] and len(flows) == 0


def test_an_idle_stream_does_not_hold_back_the_expiry_of_short_flows():
    flows = table(stream=120.0)
    stream = flows.add(CLIENT, "10.0.0.1", EP1, "stream", now=0.0)
    flows.touch(stream, 0.1)
    flows.get(CLIENT, 2.0)  # a stream from now, idle until 122
    short = flows.add(("10.0.0.2", 5000), "10.0.0.2", EP1, "short", now=3.0)
    assert flows.next_expiry() == 33.0
    assert flows.expire(33.0) == [short]
    assert flows.get(CLIENT, 40.0) is stream and flows.remove(stream) and len(flows) == 0


@pytest.mark.parametrize("stream", [pytest.param(None, id="unset"), pytest.param(30.0, id="not_longer")])
def test_one_timeout_when_the_stream_timeout_is_not_longer(stream):
    flows = table(stream=stream)
    flow = flows.add(CLIENT, "10.0.0.1", EP1, "s", now=0.0)
    flows.touch(flow, 0.1)
    flows.get(CLIENT, 5.0)
    assert not flow.stream and flows.next_expiry() == 35.0


def test_endpoint_removal_and_clear_reach_streams_too():
    flows = table(stream=120.0)
    stream = flows.add(CLIENT, "10.0.0.1", EP1, "s", now=0.0)
    flows.touch(stream, 3.0)
    other = flows.add(("10.0.0.2", 5000), "10.0.0.2", EP2, "o", now=3.0)
    assert flows.remove_unless({EP2.key}) == [stream]
    assert flows.clear() == [other] and len(flows) == 0
    again = flows.add(CLIENT, "10.0.0.1", EP1, "again", now=10.0)
    flows.touch(again, 12.0)  # a stream again
    with pytest.raises(KeyError):
        flows.add(CLIENT, "10.0.0.1", EP1, "twice", now=13.0)

"""ClientIP session affinity, driven with explicit `now` values: kube-proxy's `recent` rules
(pkg/proxy/iptables/proxier.go writeServiceToEndpointRules) and the removed userspace balancer
(pkg/proxy/userspace/roundrobin.go)."""

from __future__ import annotations

import pytest

from kubeport.endpoints.model import DEFAULT_AFFINITY_TIMEOUT_SECONDS
from kubeport.proxy.affinity import AffinityTable

A, B, C = "10.244.1.5:8080", "10.244.2.5:8080", "10.244.3.5:8080"
ALL = frozenset({A, B, C})


def test_unknown_client_misses() -> None:
    assert AffinityTable(10).lookup("192.0.2.1", ALL, now=0.0) is None


def test_recorded_client_sticks_within_timeout() -> None:
    table = AffinityTable(10)
    table.record("192.0.2.1", B, now=100.0)
    assert table.lookup("192.0.2.1", ALL, now=109.9) == B


def test_timeout_slides_with_each_new_connection__iptables_recent_set() -> None:
    table = AffinityTable(10)
    table.record("192.0.2.1", A, now=0.0)
    for now in (5.0, 10.0, 15.0):
        assert table.lookup("192.0.2.1", ALL, now=now) == A
    assert table.lookup("192.0.2.1", ALL, now=24.9) == A


def test_entry_expires_when_idle_for_the_timeout__userspace_ttl() -> None:
    table = AffinityTable(10)
    table.record("192.0.2.1", A, now=0.0)
    assert table.lookup("192.0.2.1", ALL, now=10.0) is None
    assert len(table) == 0


def test_default_timeout_is_three_hours() -> None:
    table = AffinityTable(DEFAULT_AFFINITY_TIMEOUT_SECONDS)
    table.record("192.0.2.1", A, now=0.0)
    assert table.lookup("192.0.2.1", ALL, now=10799.0) == A
    assert table.lookup("192.0.2.1", ALL, now=10799.0 + 10800.0) is None


def test_pick_chooses_only_on_a_miss_and_records_the_choice() -> None:
    table = AffinityTable(10)
    choices = iter([C, A])
    assert table.pick("192.0.2.1", ALL, 0.0, lambda: next(choices)) == C
    assert table.pick("192.0.2.1", ALL, 1.0, lambda: next(choices)) == C
    assert table.pick("192.0.2.1", frozenset({A, B}), 2.0, lambda: next(choices)) == A
    assert table.pins("192.0.2.1") == (C, A)


CLIENT = "192.0.2.1"
LOCAL = frozenset({B})  # the Local chain of an eTP/iTP=Local frontend: this node's endpoints only


def _never() -> str:
    raise AssertionError("a pinned client must not be re-picked")


# Steps, run in order against one AffinityTable(10) for CLIENT:
#   ("pick", now, eligible, choice, expected)  choice None: the pin must answer
#   ("forget", keys, removed)                  endpoints removed from the port
#   ("expire", now, removed)                   the sweeper
#   ("pins", expected)                         the client's pins, first pinned first
@pytest.mark.parametrize(
    "steps",
    [
        pytest.param(
            [("pick", 0.0, ALL, A, A), ("pick", 1.0, LOCAL, B, B), ("pick", 2.0, ALL, None, A)],
            id="ineligible_pin_skipped_not_dropped__cluster_pin_survives_local_frontend",
        ),
        pytest.param(
            [("pick", 0.0, ALL, A, A), ("pick", 1.0, LOCAL, B, B), ("pick", 2.0, LOCAL, None, B),
             ("pins", (A, B))],
            id="restricted_frontend_records_its_own_pin__per_endpoint_recent_list",
        ),
        pytest.param(
            [("pick", 0.0, LOCAL, B, B), ("pick", 1.0, ALL, None, B)],
            id="local_pin_is_honoured_by_the_cluster_chain_too",
        ),
        pytest.param(
            [("pick", 0.0, ALL, A, A), ("pick", 1.0, LOCAL, B, B), ("pick", 2.0, ALL, None, A),
             ("pick", 3.0, frozenset({A, B}), None, A)],
            id="first_pin_wins_where_several_are_offered__fixed_order_like_the_chain",
        ),
        pytest.param(
            [("pick", 0.0, ALL, A, A), ("pick", 5.0, LOCAL, B, B), ("pick", 12.0, ALL, None, B),
             ("pins", (B,))],
            id="pins_time_out_one_by_one__timed_out_pin_dropped_on_the_way",
        ),
        pytest.param(
            [("pick", 0.0, ALL, A, A), ("pick", 1.0, LOCAL, B, B), ("pick", 9.0, LOCAL, None, B),
             ("expire", 10.5, 1), ("pins", (B,)), ("pick", 11.0, ALL, None, B)],
            id="skipped_pin_still_expires__sweeper",
        ),
        pytest.param(
            [("pick", 0.0, ALL, A, A), ("pick", 1.0, LOCAL, B, B), ("forget", [A], 1), ("pins", (B,)),
             ("pick", 2.0, ALL, None, B)],
            id="removed_endpoint_drops_its_pins",
        ),
        pytest.param(
            [("pick", 0.0, ALL, A, A), ("forget", [A], 1), ("pick", 1.0, frozenset({B, C}), C, C),
             ("pick", 2.0, ALL, None, C)],
            id="removed_endpoint_back__client_stays_on_its_new_pick",
        ),
    ],
)
def test_pins_per_endpoint__skipped_where_not_offered(steps) -> None:
    """A `recent` list per endpoint chain, checked only for the chain's endpoints (proxier.go
    writeServiceToEndpointRules); removed endpoints lose theirs (roundrobin.go removeStaleAffinity)."""
    table = AffinityTable(10)
    for step in steps:
        match step:
            case ("pick", now, eligible, choice, expected):
                assert table.pick(CLIENT, eligible, now, (lambda c=choice: c) if choice else _never) == expected
            case ("forget", keys, removed):
                assert table.forget(keys) == removed
            case ("expire", now, removed):
                assert table.expire(now) == removed
            case ("pins", expected):
                assert table.pins(CLIENT) == expected


@pytest.mark.parametrize(
    ("pins", "moved_off", "new", "expected"),
    [
        pytest.param((A,), A, B, (B,), id="only_pin__repointed"),
        pytest.param((A, B), A, C, (C, B), id="new_pin_takes_the_failed_pins_place"),
        pytest.param((A, B), A, B, (B,), id="moved_onto_another_pin__failed_one_dropped"),
        pytest.param((A,), None, B, (A, B), id="no_pin_moved_off__appended"),
        pytest.param((A,), C, B, (A, B), id="moved_off_pin_not_held__appended"),
    ],
)
def test_record_replaces_a_pin_the_client_was_moved_off(pins, moved_off, new, expected) -> None:
    table = AffinityTable(10)
    for now, key in enumerate(pins):
        table.record(CLIENT, key, float(now))
    table.record(CLIENT, new, 5.0, replaces=moved_off)
    assert table.pins(CLIENT) == expected
    assert len(table) == len(expected)
    assert table.forget([A, B, C]) == len(expected)
    assert table.pins(CLIENT) == () and len(table) == 0


def test_forget_drops_clients_of_removed_endpoints_only() -> None:
    table = AffinityTable(10)
    table.record("192.0.2.1", A, now=0.0)
    table.record("192.0.2.2", A, now=0.0)
    table.record("192.0.2.3", B, now=0.0)
    assert table.forget([A, "10.9.9.9:1"]) == 2
    assert table.lookup("192.0.2.1", ALL, now=1.0) is None
    assert table.lookup("192.0.2.3", ALL, now=1.0) == B


def test_record_repoints_a_client_and_forget_follows_the_new_key() -> None:
    table = AffinityTable(10)
    table.record("192.0.2.1", A, now=0.0)
    table.record("192.0.2.1", B, now=1.0, replaces=A)
    assert table.forget([A]) == 0
    assert table.lookup("192.0.2.1", ALL, now=2.0) == B
    assert table.forget([B]) == 1


def test_clear_when_port_loses_all_endpoints() -> None:
    table = AffinityTable(10)
    table.record("192.0.2.1", A, now=0.0)
    table.clear()
    assert len(table) == 0 and table.forget([A]) == 0


def test_expire_removes_only_timed_out_entries_within_budget() -> None:
    table = AffinityTable(10)
    for i in range(10):
        table.record(f"192.0.2.{i}", A, now=float(i))
    table.lookup("192.0.2.0", ALL, now=9.0)  # refreshed: now the most recent
    assert table.expire(now=15.0, budget=3) == 3  # .1 .2 .3 (last used 1..3)
    assert table.expire(now=15.0) == 2  # .4 .5; .6-.9 and the refreshed .0 are fresh
    assert len(table) == 5
    assert table.lookup("192.0.2.0", ALL, now=15.0) == A


def test_size_cap_evicts_least_recently_used_client() -> None:
    table = AffinityTable(10, max_entries=2)
    table.record("192.0.2.1", A, now=0.0)
    table.record("192.0.2.2", B, now=1.0)
    table.lookup("192.0.2.1", ALL, now=2.0)
    table.record("192.0.2.3", C, now=3.0)
    assert len(table) == 2
    assert table.lookup("192.0.2.2", ALL, now=4.0) is None
    assert table.lookup("192.0.2.1", ALL, now=4.0) == A
    assert table.forget([B]) == 0


def test_tables_are_per_service_port() -> None:
    """Per service port, as roundrobin.go keys it by ServicePortName and iptables by endpoint chain."""
    http, https = AffinityTable(10), AffinityTable(10)
    http.record("192.0.2.1", A, now=0.0)
    assert https.lookup("192.0.2.1", ALL, now=1.0) is None


@pytest.mark.parametrize("timeout", [0, -1])
def test_timeout_must_be_positive(timeout) -> None:
    with pytest.raises(ValueError, match="timeout"):
        AffinityTable(timeout)


def test_size_cap_counts_pins_and_evicts_the_least_recently_used_one() -> None:
    table = AffinityTable(10, max_entries=2)
    table.record(CLIENT, A, now=0.0)
    table.record(CLIENT, B, now=1.0)
    table.record("192.0.2.2", C, now=2.0)
    assert table.pins(CLIENT) == (B,) and len(table) == 2
    assert table.forget([A]) == 0

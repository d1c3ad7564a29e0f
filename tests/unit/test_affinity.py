"""ClientIP session affinity (reference C), driven with explicit `now` values."""

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


def test_only_currently_usable_endpoints_are_eligible__reference_c() -> None:
    table = AffinityTable(10)
    table.record("192.0.2.1", A, now=0.0)
    assert table.lookup("192.0.2.1", frozenset({B, C}), now=1.0) is None
    # The stale pin is gone: A coming back does not resurrect it.
    assert table.lookup("192.0.2.1", ALL, now=2.0) is None


def test_pick_chooses_only_on_a_miss_and_records_the_choice() -> None:
    table = AffinityTable(10)
    choices = iter([C, A])
    assert table.pick("192.0.2.1", ALL, 0.0, lambda: next(choices)) == C
    assert table.pick("192.0.2.1", ALL, 1.0, lambda: next(choices)) == C
    assert table.pick("192.0.2.1", frozenset({A, B}), 2.0, lambda: next(choices)) == A
    assert table.lookup("192.0.2.1", ALL, now=3.0) == A


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
    table.record("192.0.2.1", B, now=1.0)
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


def test_tables_are_per_service_port__reference_c() -> None:
    http, https = AffinityTable(10), AffinityTable(10)
    http.record("192.0.2.1", A, now=0.0)
    assert https.lookup("192.0.2.1", ALL, now=1.0) is None


@pytest.mark.parametrize("timeout", [0, -1])
def test_timeout_must_be_positive(timeout) -> None:
    with pytest.raises(ValueError, match="timeout"):
        AffinityTable(timeout)

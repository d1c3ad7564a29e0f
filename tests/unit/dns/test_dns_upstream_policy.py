"""Which upstream a forwarded query asks, for how long, and which are down: CoreDNS forward
(plugin/forward/forward.go ServeDNS, policy.go, health.go). Pure, time passed in."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from kubeport.dns.forward.policy import FORWARD_DEADLINE, MAX_FAILS, Tries, UpstreamHealth, policy_order

U = ["u0", "u1", "u2"]


@pytest.mark.parametrize("upstreams", [pytest.param(U[:2], id="two"), pytest.param(U, id="three")])
def test_policy_random_spreads_the_first_try__forward_policy_random(upstreams: list[str]) -> None:
    rng = random.Random(7)
    orders = [policy_order(upstreams, set(), rng) for _ in range(3000)]
    assert all(sorted(order) == sorted(upstreams) for order in orders)
    counts = Counter(order[0] for order in orders)
    assert set(counts) == set(upstreams) and min(counts.values()) > 3000 / len(upstreams) * 0.85


@pytest.mark.parametrize("upstreams, down, expected", [
    pytest.param(["u0"], set(), ["u0"], id="one_upstream"),
    pytest.param([], set(), [], id="none"),
    pytest.param(U, {"u1"}, {"u0", "u2"}, id="down_ones_skipped__forward_health"),
    pytest.param(U, set(U), set(U), id="all_down_asks_them_anyway__forward_all_unhealthy"),
])
def test_policy_skips_upstreams_down(upstreams: list[str], down: set[str], expected) -> None:
    order = policy_order(upstreams, down, random.Random(1))
    assert (set(order) if isinstance(expected, set) else order) == expected and len(order) == len(expected)


@pytest.mark.parametrize("order, outcomes, tries", [
    # one upstream, a packet lost: asked again after read_timeout, answered (not SERVFAIL at 2 s)
    pytest.param(["u0"], ["timeout", "answer"], [("u0", 0.0, 2.0), ("u0", 2.0, 2.0)],
                 id="lost_packet_retried__forward_deadline"),
    # three silent upstreams: 2 s each, the third try cut at the 5 s deadline, then SERVFAIL
    pytest.param(U, ["timeout"] * 3, [("u0", 0.0, 2.0), ("u1", 2.0, 2.0), ("u2", 4.0, 1.0), None],
                 id="deadline_5s_caps_the_last_try"),
    # the list restarts from its start while time remains
    pytest.param(U[:2], ["timeout"] * 3, [("u0", 0.0, 2.0), ("u1", 2.0, 2.0), ("u0", 4.0, 1.0), None],
                 id="cycles_over_the_list__forward_servedns"),
    # refused at once (ICMP): the next upstream at once, the refusing one never again
    pytest.param(U[:2], ["refused"] + ["timeout"] * 3,
                 [("u0", 0.0, 2.0), ("u1", 0.0, 2.0), ("u1", 2.0, 2.0), ("u1", 4.0, 1.0), None],
                 id="refused_left_at_once"),
    pytest.param(["u0"], ["refused"], [("u0", 0.0, 2.0), None], id="only_upstream_refused_is_servfail_at_once"),
])
def test_tries_until_the_deadline(order: list[str], outcomes: list[str], tries: list) -> None:
    plan = Tries(list(order), now=0.0, read_timeout=2.0)
    now = 0.0
    seen = []
    for index, expected in enumerate(tries):
        attempt = plan.next(now)
        seen.append(None if attempt is None else (attempt[0], now, attempt[1]))
        if attempt is None or index >= len(outcomes):
            break
        outcome = outcomes[index]
        if outcome == "answer":
            break
        if outcome == "refused":
            plan.drop(attempt[0])
        else:
            now += attempt[1]
    assert seen == tries
    assert FORWARD_DEADLINE == 5.0


def test_drop_keeps_the_cycle_position() -> None:
    plan = Tries(["u0", "u1", "u2"], now=0.0, read_timeout=2.0)
    assert plan.next(0.0)[0] == "u0" and plan.next(0.0)[0] == "u1"
    plan.drop("u0")
    assert [plan.next(0.0)[0] for _ in range(3)] == ["u2", "u1", "u2"]


def test_health_down_after_more_than_max_fails_checks__forward_max_fails() -> None:
    health: UpstreamHealth[str] = UpstreamHealth()
    went_down = [health.check_failed("u0") for _ in range(MAX_FAILS + 2)]
    assert went_down == [False] * MAX_FAILS + [True, False] and health.down == {"u0"}
    assert health.answered("u0") and not health.down and not health.answered("u0")
    assert health.check_failed("u0") is False  # counting starts again

"""BackoffPolicy: client-go's reflector backoff, pure (failure count, outage age and random
number in), with a short cap while an outage is young and a jittered prompt relist after 410.

client-go: ``wait.Backoff{Duration: 800ms, Factor: 2, Jitter: 1, Cap: 30s}`` (the reflector's
backoff manager) steps the duration, caps it, then jitters it, so delays at the cap are 30..60 s.
Retry-After (``rest.checkWait``) is never a reason to retry sooner than the backoff.
"""

from __future__ import annotations

import pytest

from kubeport.endpoints.apiserver.backoff import BackoffPolicy

#: client-go's numbers; no outage age given: no young cap
DEFAULT = BackoffPolicy(initial=0.8)
#: kubeport's defaults: 0.2 s first step, steps of at most 0.5 s for 20 s of outage
KUBEPORT = BackoffPolicy()


@pytest.mark.parametrize("failures, rand, retry_after, expected", [
    (0, 0.0, None, 0.0),
    (1, 0.0, None, 0.8),
    (2, 0.0, None, 1.6),
    (3, 0.5, None, 4.8),          # 3.2 plus half of it as jitter
    (6, 0.0, None, 25.6),
    (7, 0.0, None, 30.0),         # 51.2 capped
    (10, 0.0, None, 30.0),
    (10, 0.5, None, 45.0),        # jitter applies after the cap...
    (10, 0.99, None, 59.7),       # ...up to double it
    (100_000, 0.5, None, 45.0),   # a failure lasting days: no float overflow
    (1, 0.7, 5.0, 5.0),           # Retry-After above the backoff: waited for
    (3, 0.5, 1.0, 4.8),           # Retry-After below the backoff: the backoff wins
    (1, 0.0, 0.0, 0.8),           # "Retry-After: 0" does not spin
    (1, 0.5, 1.0, 1.2),           # "Retry-After: 1" is a floor: nodes still spread out
    (0, 0.0, 2.0, 2.0),           # no failure counted yet: Retry-After alone
    (1, 0.0, 86400.0, 300.0),     # a proxy's absurd Retry-After is bounded
    (1, 0.0, -5.0, 0.8),          # a negative one is nothing
], ids=["no_failure_no_wait", "first__client_go_800ms", "doubles", "jitter_adds_up_to_factor",
        "sixth_below_cap", "cap__client_go_30s", "stays_at_cap", "jitter_after_cap__wait_backoff_step",
        "jitter_up_to_double_at_cap", "huge_failure_count", "retry_after_above_backoff__429",
        "retry_after_is_a_floor_not_a_replacement", "retry_after_zero_backs_off",
        "retry_after_one_keeps_jitter", "retry_after_without_failures", "retry_after_bounded",
        "retry_after_negative_ignored"])
def test_backoff_policy(failures, rand, retry_after, expected):
    assert DEFAULT.delay(failures, rand, retry_after) == pytest.approx(expected)


@pytest.mark.parametrize("policy, failures, expected", [
    (BackoffPolicy(initial=0.5, cap=1.5, jitter=0.0), 4, 1.5),
    (BackoffPolicy(initial=0.001, cap=0.004, jitter=0.0), 10**9, 0.004),
    (BackoffPolicy(initial=2.0, cap=1.0, jitter=0.0), 1, 1.0),
    (BackoffPolicy(initial=1.0, cap=10.0, factor=1.0, jitter=0.0), 50, 1.0),
], ids=["custom_cap", "tiny_steps_many_failures", "initial_above_cap", "constant_factor"])
def test_backoff_policy_shapes(policy, failures, expected):
    assert policy.delay(failures, 0.0) == pytest.approx(expected)


def test_jitter_spreads_delays_at_the_cap_over_30_to_60_seconds():
    delays = [DEFAULT.delay(20, i / 100) for i in range(100)]
    assert min(delays) == pytest.approx(30.0) and max(delays) == pytest.approx(59.7)
    assert len(set(delays)) == 100


@pytest.mark.parametrize("failures, outage, rand, retry_after, expected", [
    (1, 0.0, 0.0, None, 0.2),         # a short first step
    (1, 0.0, 0.99, None, 0.398),
    (2, 0.3, 0.0, None, 0.4),
    (3, 0.9, 0.0, None, 0.5),         # 0.8 capped while the outage is young
    (3, 0.9, 0.99, None, 0.995),      # ...so no delay above 1 s
    (30, 19.9, 0.99, None, 0.995),    # still young after 30 failures
    (30, 24.0, 0.0, None, 1.5),       # then the cap grows with the outage, no cliff
    (40, 60.0, 0.0, None, 10.5),
    (60, 118.0, 0.0, None, 25.0),
    (80, 600.0, 0.5, None, 45.0),     # a long outage: client-go's cap and jitter
    (3, 1.0, 0.0, 5.0, 5.0),          # Retry-After above the young cap: waited for
    (3, 1.0, 0.0, 0.0, 0.5),          # "Retry-After: 0" does not spin
], ids=["first_step_short", "first_step_jittered", "doubles", "young_cap", "young_cap_jittered_below_1s",
        "young_by_age_not_count", "cap_grows_after_young", "cap_grows_linearly", "cap_grows_more",
        "long_outage_client_go_cap", "retry_after_floor_over_young_cap", "retry_after_zero_young"])
def test_young_outage_retries_fast_then_backs_off__follow_a_restart_within_2s(failures, outage, rand,
                                                                               retry_after, expected):
    assert KUBEPORT.delay(failures, rand, retry_after, outage=outage) == pytest.approx(expected)


@pytest.mark.parametrize("rand, retry_after, expected", [
    (0.0, None, 0.0),
    (0.5, None, 0.25),
    (0.999, None, 0.4995),       # at most half a second: no failure backoff
    (0.2, 1.0, 1.0),             # "Too large resource version" carries Retry-After: 1
], ids=["relist_at_once", "relist_jittered", "relist_jitter_bounded", "relist_retry_after_floor"])
def test_relist_after_410_is_prompt_not_backed_off(rand, retry_after, expected):
    assert KUBEPORT.relist_delay(rand, retry_after) == pytest.approx(expected)

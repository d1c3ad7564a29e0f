"""Retry delays: capped exponential backoff with jitter, and Retry-After honoured.

Pure: the caller passes the failure count and a random number in [0, 1), so the policy is
tested table-driven and tests can make every delay tiny by choosing the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """client-go's reflector backoff: 800ms doubling to 30s, jitter up to +100%."""

    initial: float = 0.8
    cap: float = 30.0
    factor: float = 2.0
    #: Fraction of the delay added at random (0: none, 1: up to double), spreading the
    #: reconnects of many nodes after an API server restart.
    jitter: float = 1.0
    #: Longest Retry-After obeyed: a misbehaving proxy's "Retry-After: 86400" is not.
    max_retry_after: float = 300.0
    #: A stream healthy for this long resets the failure count.
    reset_after: float = 120.0

    def delay(self, failures: int, rand: float, retry_after: float | None = None) -> float:
        """Seconds to wait before the next attempt after ``failures`` consecutive failures."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after)
        if failures <= 0:
            return 0.0
        base = min(self.cap, self.initial * self.factor ** (failures - 1))
        return min(self.cap, base * (1.0 + self.jitter * rand))

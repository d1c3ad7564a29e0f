"""Retry delays: capped exponential backoff with jitter, and Retry-After as a floor.

Pure: the caller passes the failure count and a random number in [0, 1), so the policy is
tested table-driven and tests can make every delay tiny by choosing the numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """client-go's reflector backoff (``wait.Backoff{800ms, Factor 2, Jitter 1, Cap 30s}``):
    the step is capped first, then jittered, so delays at the cap are 30..60 s."""

    initial: float = 0.8
    cap: float = 30.0
    factor: float = 2.0
    #: Fraction of the delay added at random (0: none, 1: up to double), spreading the
    #: reconnects of many nodes after an API server restart, also at the cap.
    jitter: float = 1.0
    #: Longest Retry-After obeyed: a misbehaving proxy's "Retry-After: 86400" is not.
    max_retry_after: float = 300.0
    #: A stream healthy for this long resets the failure count.
    reset_after: float = 120.0

    def delay(self, failures: int, rand: float, retry_after: float | None = None) -> float:
        """Seconds to wait before the next attempt after ``failures`` consecutive failures.

        ``retry_after`` (the server's Retry-After) is a floor, never a replacement: "0" must
        not spin, and "1" must not make every node retry in the same second.
        """
        backoff = self._step(failures) * (1.0 + self.jitter * rand) if failures > 0 else 0.0
        if retry_after is None:
            return backoff
        return max(backoff, min(max(retry_after, 0.0), self.max_retry_after))

    def _step(self, failures: int) -> float:
        if self.factor <= 1.0 or self.initial <= 0.0:
            return min(self.cap, self.initial)
        # Steps beyond the one reaching the cap change nothing; stopping there also keeps
        # factor ** n from overflowing after a failure lasting days.
        to_cap = math.ceil(math.log(max(self.cap / self.initial, 1.0), self.factor)) + 1
        return min(self.cap, self.initial * self.factor ** (min(failures, to_cap) - 1))

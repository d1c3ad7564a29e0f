"""Retry delays: capped exponential backoff with jitter, Retry-After as a floor, a short cap
while an outage is young, and the prompt relist that a gone resourceVersion calls for.

Pure: the caller passes the failure count, how long the failures have lasted and a random
number in [0, 1), so the policy is tested table-driven and tests can make every delay tiny
by choosing the numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """client-go's reflector backoff shape (``wait.Backoff{800ms, Factor 2, Jitter 1, Cap 30s}``:
    the step is capped first, then jittered, so delays at the cap are 30..60 s), with two
    changes so that a node follows an API server restart within about a second of it being
    ready again:

    - a shorter first step (0.2 s), and while an outage is *young* (failing for less than
      ``young`` seconds) the step is capped at ``young_cap`` (0.5 s: delays of 0.5..1 s with
      the jitter). An API server restart takes seconds; a node sleeping 6..12 s after it
      is a node without updates for that long.
    - past that, the cap grows with the outage (``young_cap`` plus ``growth`` seconds per
      second beyond ``young``) up to ``cap``: a long outage is not hammered, and there is
      no cliff from 1 s to 60 s.

    A gone resourceVersion (410 Expired, "too old resource version") is no failure: the
    informer relists after :meth:`relist_delay`, a jitter of at most ``relist_jitter``.
    """

    initial: float = 0.2
    cap: float = 30.0
    factor: float = 2.0
    #: Fraction of the delay added at random (0: none, 1: up to double), spreading the
    #: reconnects of many nodes after an API server restart, also at the cap.
    jitter: float = 1.0
    #: Longest Retry-After obeyed: a misbehaving proxy's "Retry-After: 86400" is not.
    max_retry_after: float = 300.0
    #: A stream healthy for this long resets the failure count and ends the outage (client-go
    #: waits 2 minutes; here a short one, so that cuts minutes apart each count as young).
    reset_after: float = 10.0
    #: An outage failing for less than this many seconds is young: steps capped at young_cap.
    young: float = 20.0
    young_cap: float = 0.5
    #: Seconds of step cap gained per second of outage beyond ``young``.
    growth: float = 0.25
    #: Longest random pause before a relist after 410: spreads the relists of many nodes.
    relist_jitter: float = 0.5

    def delay(self, failures: int, rand: float, retry_after: float | None = None,
              outage: float | None = None) -> float:
        """Seconds to wait before the next attempt after ``failures`` consecutive failures,
        the first of them ``outage`` seconds ago (None: the outage's age is not known, no
        young cap).

        ``retry_after`` (the server's Retry-After) is a floor, never a replacement: "0" must
        not spin, and "1" must not make every node retry in the same second.
        """
        backoff = 0.0
        if failures > 0:
            step = self._step(failures)
            if outage is not None:
                step = min(step, self.young_cap + max(outage - self.young, 0.0) * self.growth)
            backoff = step * (1.0 + self.jitter * rand)
        return self._floor(backoff, retry_after)

    def relist_delay(self, rand: float, retry_after: float | None = None) -> float:
        """Before a relist the server asked for (410, a version not there yet): a jitter of
        at most ``relist_jitter``, never the failure backoff; Retry-After still a floor."""
        return self._floor(self.relist_jitter * rand, retry_after)

    def _floor(self, delay: float, retry_after: float | None) -> float:
        if retry_after is None:
            return delay
        return max(delay, min(max(retry_after, 0.0), self.max_retry_after))

    def _step(self, failures: int) -> float:
        if self.factor <= 1.0 or self.initial <= 0.0:
            return min(self.cap, self.initial)
        # Steps beyond the one reaching the cap change nothing; stopping there also keeps
        # factor ** n from overflowing after a failure lasting days.
        to_cap = math.ceil(math.log(max(self.cap / self.initial, 1.0), self.factor)) + 1
        return min(self.cap, self.initial * self.factor ** (min(failures, to_cap) - 1))

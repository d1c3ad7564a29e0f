"""Which upstream to ask, for how long, and which are down: CoreDNS forward's rules. Pure.

CoreDNS ``forward`` (plugin/forward/forward.go ServeDNS) takes the upstreams in its policy's
order (``random`` by default: a new permutation per query), skips those its health checks
mark down, and cycles through that list until an upstream answers or 5 s have passed since
the query arrived (``defaultTimeout``), each try waiting at most ``read_timeout`` (2 s). So a
lost packet costs a retry, not a SERVFAIL. A failed try starts health checks of that
upstream (``. IN NS`` every 0.5 s until one is answered); it is down once more than
``max_fails`` (2) checks in a row failed.

Deliberate differences: a try never outlives the deadline (CoreDNS checks the deadline only
before a try, so its last one may end at 6 s, after a stub resolver's own 5 s timeout); an
upstream that refused the query (ICMP port unreachable) or answered garbage is not asked
again for the same query (CoreDNS asks again at once, spinning until the deadline); a real
answer also ends the checks (an upstream that answers is up).
"""

from __future__ import annotations

import random
from typing import Collection, Generic, Hashable, Sequence, TypeVar

#: CoreDNS forward: defaultTimeout, max_fails, health_check interval, the checker's read timeout
FORWARD_DEADLINE = 5.0
MAX_FAILS = 2
CHECK_INTERVAL = 0.5
CHECK_TIMEOUT = 1.0

U = TypeVar("U", bound=Hashable)


def policy_order(upstreams: Sequence[U], down: Collection[U], rng: random.Random) -> list[U]:
    """The upstreams to try for one query: a random permutation (CoreDNS ``policy random``)
    without those marked down, or all of them when every one is down (CoreDNS then asks a
    random one: its health checks may be what is broken)."""
    count = len(upstreams)
    if count == 1:
        order = list(upstreams)
    elif count == 2:  # one random bit, as CoreDNS's random.List
        order = [upstreams[1], upstreams[0]] if rng.random() < 0.5 else list(upstreams)
    else:
        order = rng.sample(upstreams, count)
    if down:
        healthy = [upstream for upstream in order if upstream not in down]
        if healthy:
            return healthy
    return order


class Tries(Generic[U]):
    """One forwarded query's tries: ``order`` cycled until the deadline, each try capped."""

    __slots__ = ("order", "position", "deadline", "read_timeout")

    def __init__(self, order: list[U], *, now: float, read_timeout: float, deadline: float = FORWARD_DEADLINE):
        self.order = order
        self.position = 0
        self.deadline = now + deadline
        self.read_timeout = read_timeout

    def next(self, now: float) -> tuple[U, float] | None:
        """The upstream to ask next and how long to wait for it; None: give up (SERVFAIL)."""
        remaining = self.deadline - now
        if not self.order or remaining <= 0:
            return None
        if self.position >= len(self.order):
            self.position = 0  # back to the start of the list, as CoreDNS
        upstream = self.order[self.position]
        self.position += 1
        return upstream, min(self.read_timeout, remaining)

    def drop(self, upstream: U) -> None:
        """The upstream refused the query or answered garbage: do not ask it again."""
        if upstream in self.order:
            index = self.order.index(upstream)
            del self.order[index]
            if index < self.position:
                self.position -= 1


class UpstreamHealth(Generic[U]):
    """Health checks failed in a row, per upstream; down beyond ``max_fails``."""

    __slots__ = ("max_fails", "fails", "down")

    def __init__(self, max_fails: int = MAX_FAILS):
        self.max_fails = max_fails
        self.fails: dict[U, int] = {}
        self.down: set[U] = set()

    def check_failed(self, upstream: U) -> bool:
        """Count a failed check; True when the upstream has just gone down."""
        fails = self.fails.get(upstream, 0) + 1
        self.fails[upstream] = fails
        if fails > self.max_fails and upstream not in self.down:
            self.down.add(upstream)
            return True
        return False

    def answered(self, upstream: U) -> bool:
        """The upstream answered (a check or a query); True when it was down."""
        self.fails.pop(upstream, None)
        if upstream in self.down:
            self.down.discard(upstream)
            return True
        return False

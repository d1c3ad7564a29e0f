"""Endpoint choice: power of two choices on active connections, passive outlier ejection, affinity.

kube-proxy picks uniformly at random. Here two distinct candidates are drawn at
random and the one with fewer active connections wins (P2C: exponentially better
maximum load than one random choice, no global state to keep consistent).
Endpoints whose connects fail ``eject_after`` times in a row are ejected for an
exponentially growing time, but never all at once (if every candidate is
ejected, all are used: a guess beats a certain failure). ClientIP affinity
(kube-proxy C) is consulted first, among the currently usable candidates only.

Sans-IO: ``now`` is passed in; the random generator is injected (seedable).
"""

from __future__ import annotations

import random
from typing import Callable, Collection, Iterable, Protocol, Sequence

from kubeport.endpoints.types import PortEndpoint, ServicePortName

from .stats import ServicePortStats


class Affinity(Protocol):
    def lookup(self, client_ip: str, eligible_keys: Collection[str], now: float) -> str | None: ...
    def record(self, client_ip: str, key: str, now: float) -> None: ...
    def forget(self, keys: Iterable[str]) -> None: ...


def default_affinity_factory(timeout_seconds: int) -> Affinity:
    from .affinity import AffinityTable  # helper H6's sans-IO table

    return AffinityTable(timeout_seconds)


class EndpointState:
    """Runtime state of one endpoint of one service port (kept while the port uses it)."""

    __slots__ = (
        "key", "ip", "port", "family", "sockaddr", "active",
        "consecutive_failures", "ejections", "ejected_until", "connections", "removed",
    )

    def __init__(self, ip: str, port: int, key: str) -> None:
        self.key = key
        self.ip = ip
        self.port = port
        self.family = 6 if ":" in ip else 4
        self.sockaddr = (ip, port, 0, 0) if self.family == 6 else (ip, port)
        self.active = 0
        self.consecutive_failures = 0
        self.ejections = 0
        self.ejected_until = 0.0
        #: live relays to this endpoint (TCP connections, UDP flows), for the grace-period cut.
        self.connections: set = set()
        self.removed = False

    def __repr__(self) -> str:
        return f"<EndpointState {self.key} active={self.active}>"


class Balancer:
    """The choice among candidates of one service port. Holds that port's affinity table."""

    __slots__ = ("_random", "eject_after", "eject_base", "eject_max", "affinity", "stats")

    def __init__(
        self,
        rng: random.Random,
        *,
        eject_after: int = 2,
        eject_base: float = 5.0,
        eject_max: float = 300.0,
        affinity: Affinity | None = None,
        stats: ServicePortStats | None = None,
    ) -> None:
        self._random = rng.random
        self.eject_after = eject_after
        self.eject_base = eject_base
        self.eject_max = eject_max
        self.affinity = affinity
        self.stats = stats if stats is not None else ServicePortStats()

    def pick(
        self,
        candidates: Sequence[EndpointState],
        keys: Collection[str],
        client_ip: str,
        now: float,
        exclude: Collection[EndpointState] = (),
    ) -> EndpointState | None:
        """The endpoint for a new connection or flow; None when there is no candidate left."""
        affinity = self.affinity
        if affinity is not None:
            key = affinity.lookup(client_ip, keys, now)
            if key is not None:
                for endpoint in candidates:
                    if endpoint.key == key and endpoint not in exclude and endpoint.ejected_until <= now:
                        return endpoint
            chosen = self._choose(candidates, now, exclude)
            if chosen is not None:
                affinity.record(client_ip, chosen.key, now)
            return chosen
        return self._choose(candidates, now, exclude)

    def _choose(
        self, candidates: Sequence[EndpointState], now: float, exclude: Collection[EndpointState]
    ) -> EndpointState | None:
        n = len(candidates)
        if n == 0:
            return None
        rand = self._random
        if n == 1:
            a = candidates[0]
            if a not in exclude:
                return a
            return None
        i = int(rand() * n)
        j = int(rand() * (n - 1))
        if j >= i:
            j += 1
        a = candidates[i]
        b = candidates[j]
        if (
            a.ejected_until <= now and b.ejected_until <= now
            and (not exclude or (a not in exclude and b not in exclude))
        ):
            return a if a.active <= b.active else b
        return self._choose_filtered(candidates, now, exclude)

    def _choose_filtered(
        self, candidates: Sequence[EndpointState], now: float, exclude: Collection[EndpointState]
    ) -> EndpointState | None:
        untried = [e for e in candidates if e not in exclude]
        usable = [e for e in untried if e.ejected_until <= now] or untried
        n = len(usable)
        if n <= 1:
            return usable[0] if usable else None
        rand = self._random
        i = int(rand() * n)
        j = int(rand() * (n - 1))
        if j >= i:
            j += 1
        a, b = usable[i], usable[j]
        return a if a.active <= b.active else b

    def connect_failed(self, endpoint: EndpointState, now: float) -> bool:
        """Count a failed connect; True when that ejects the endpoint."""
        self.stats.connect_failures += 1
        endpoint.consecutive_failures += 1
        if endpoint.consecutive_failures < self.eject_after:
            return False
        endpoint.consecutive_failures = 0
        endpoint.ejections += 1
        duration = min(self.eject_base * (2 ** (endpoint.ejections - 1)), self.eject_max)
        endpoint.ejected_until = now + duration
        self.stats.ejections += 1
        return True

    @staticmethod
    def connect_succeeded(endpoint: EndpointState) -> None:
        if endpoint.consecutive_failures or endpoint.ejections:
            endpoint.consecutive_failures = 0
            endpoint.ejections = 0


class ServicePortPool:
    """Every endpoint one service port uses, across its frontends, with its balancer and stats."""

    __slots__ = ("name", "endpoints", "balancer", "stats")

    def __init__(self, name: ServicePortName, balancer: Balancer) -> None:
        self.name = name
        self.endpoints: dict[str, EndpointState] = {}
        self.balancer = balancer
        self.stats = balancer.stats

    def sync(self, wanted: Iterable[PortEndpoint]) -> list[EndpointState]:
        """Keep the states of ``wanted`` endpoints (by IP:port), add new ones; the removed states."""
        current = self.endpoints
        fresh: dict[str, EndpointState] = {}
        for endpoint in wanted:
            key = endpoint.key
            if key not in fresh:
                fresh[key] = current.get(key) or EndpointState(endpoint.ip, endpoint.port, key)
        removed = [state for key, state in current.items() if key not in fresh]
        for state in removed:
            state.removed = True
        self.endpoints = fresh
        if removed and self.balancer.affinity is not None:
            self.balancer.affinity.forget([s.key for s in removed])
        return removed

    def states(self, endpoints: Iterable[PortEndpoint]) -> tuple[EndpointState, ...]:
        table = self.endpoints
        return tuple(table[e.key] for e in endpoints)


class Route:
    """What a listener needs to place a new client; swapped whole, never mutated."""

    __slots__ = ("pool", "balancer", "stats", "candidates", "keys", "local_candidates", "local_keys")

    def __init__(
        self,
        pool: ServicePortPool,
        candidates: tuple[EndpointState, ...],
        local_candidates: tuple[EndpointState, ...] | None = None,
    ) -> None:
        self.pool = pool
        self.balancer = pool.balancer
        self.stats = pool.stats
        self.candidates = candidates
        self.keys = frozenset(e.key for e in candidates)
        self.local_candidates = local_candidates
        self.local_keys = (
            frozenset(e.key for e in local_candidates) if local_candidates is not None else self.keys
        )

    def all_keys(self) -> frozenset[str]:
        return self.keys | self.local_keys


BalancerFactory = Callable[[ServicePortName, int], Balancer]

"""Endpoint choice: power of two choices on active connections, passive outlier ejection, affinity.

kube-proxy picks uniformly at random. Here two distinct candidates are drawn at
random and the one with fewer active connections wins (P2C: exponentially better
maximum load than one random choice, no global state to keep consistent).
Endpoints whose connects fail ``eject_after`` times in a row are ejected for an
exponentially growing time, but never all at once (if every candidate is
ejected, all are used: a guess beats a certain failure). ClientIP affinity
(kube-proxy C) is consulted first, among the route's own candidates only: a pin to
an endpoint the route does not offer is skipped, not lost (affinity.py).

Sans-IO: ``now`` is passed in; the random generator is injected (seedable).
"""

from __future__ import annotations

import random
from typing import Callable, Collection, Iterable, Protocol, Sequence

from kubeport.endpoints.types import PortEndpoint, ServicePortName
from kubeport.proxy.stats import ServicePortStats


class Affinity(Protocol):
    def lookup(self, client_ip: str, eligible_keys: Collection[str], now: float) -> str | None: ...
    def record(self, client_ip: str, key: str, now: float, *, replaces: str | None = None) -> None: ...
    def forget(self, keys: Iterable[str]) -> None: ...


def default_affinity_factory(timeout_seconds: int) -> Affinity:
    from kubeport.proxy.affinity import AffinityTable  # helper H6's sans-IO table

    return AffinityTable(timeout_seconds)


class EndpointState:
    """Runtime state of one endpoint of one service port (kept while the port uses it).

    One exists per endpoint of every proxied port (a large cluster has many), so it holds only
    what cannot be derived: the socket address is built per connect, the "IP:port" key
    on first use (affinity, logs), and the set of live relays once a relay is tracked.
    """

    __slots__ = (
        "ip", "port", "family", "active",
        "consecutive_failures", "ejections", "ejected_until", "_key", "_connections", "removed",
    )

    def __init__(self, ip: str, port: int, key: str | None = None) -> None:
        self.ip = ip
        self.port = port
        self.family = 6 if ":" in ip else 4
        self.active = 0
        self.consecutive_failures = 0
        self.ejections = 0
        self.ejected_until = 0.0
        self._key = key
        self._connections: set | None = None
        self.removed = False

    @property
    def key(self) -> str:
        """kube-proxy's endpoint identity, "IP:port" ("[v6]:port")."""
        key = self._key
        if key is None:
            key = self._key = f"[{self.ip}]:{self.port}" if self.family == 6 else f"{self.ip}:{self.port}"
        return key

    @property
    def sockaddr(self) -> tuple:
        return (self.ip, self.port, 0, 0) if self.family == 6 else (self.ip, self.port)

    @property
    def connections(self) -> set:
        """Live relays to this endpoint (TCP connections, UDP flows), for the grace-period cut."""
        connections = self._connections
        if connections is None:
            connections = self._connections = set()
        return connections

    def has_connections(self) -> bool:
        return bool(self._connections)

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
                    if endpoint.key == key:
                        if endpoint not in exclude and endpoint.ejected_until <= now:
                            return endpoint
                        break
            chosen = self._choose(candidates, now, exclude)
            if chosen is not None:
                # A pin that failed this connection or is ejected moves to the new pick.
                affinity.record(client_ip, chosen.key, now, replaces=key)
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
        #: in the order of the last sync; a tuple, not a dict: there is a pool per service port, and
        #: the routes of a port that uses every endpoint share this very tuple as their candidates.
        self.endpoints: tuple[EndpointState, ...] = ()
        self.balancer = balancer
        self.stats = balancer.stats

    def endpoint(self, key: str) -> EndpointState | None:
        for state in self.endpoints:
            if state.key == key:
                return state
        return None

    def find(self, ip: str, port: int) -> EndpointState | None:
        for state in self.endpoints:
            if state.port == port and state.ip == ip:
                return state
        return None

    def sync(self, wanted: Iterable[PortEndpoint]) -> list[EndpointState]:
        """Keep the states of ``wanted`` endpoints (by IP and port), add new ones; the removed states.

        The states are keyed by (IP, port), not by the PortEndpoint's key string: that string
        would outlive the PortEndpoint (one per endpoint of every port) for nothing.
        """
        current = {(state.ip, state.port): state for state in self.endpoints}
        fresh: dict[tuple[str, int], EndpointState] = {}
        for endpoint in wanted:
            where = (endpoint.ip, endpoint.port)
            if where not in fresh:
                state = current.pop(where, None)
                fresh[where] = state if state is not None else EndpointState(*where)
        removed = list(current.values())
        for state in removed:
            state.removed = True
        self.endpoints = tuple(fresh.values())
        if removed and self.balancer.affinity is not None:
            self.balancer.affinity.forget([s.key for s in removed])
        return removed

    def states(self, endpoints: Sequence[PortEndpoint]) -> tuple[EndpointState, ...]:
        """The states of ``endpoints`` (all synced), in their order; the pool's own tuple when
        that is the same list (the usual case: one frontend using every endpoint)."""
        mine = self.endpoints
        if len(endpoints) == len(mine) and all(
            s.port == e.port and s.ip == e.ip for s, e in zip(mine, endpoints)
        ):
            return mine
        table = {(state.ip, state.port): state for state in mine}
        return tuple(table[e.ip, e.port] for e in endpoints)


_NO_KEYS: frozenset[str] = frozenset()


class Route:
    """What a listener needs to place a new client; swapped whole, never mutated.

    ``keys``/``local_keys`` (the candidates' keys) only matter to ClientIP affinity, so
    they are built only for a port that has it: a Route is rebuilt whenever affinity is
    switched on or off (it is part of the frontend rule).
    """

    __slots__ = ("pool", "balancer", "stats", "candidates", "keys", "local_candidates", "local_keys",
                 "proxy_protocol", "keep")

    def __init__(
        self,
        pool: ServicePortPool,
        candidates: tuple[EndpointState, ...],
        local_candidates: tuple[EndpointState, ...] | None = None,
        *,
        proxy_protocol: bool = False,
        keep: int = 0,
    ) -> None:
        self.pool = pool
        #: whose address the upstream side may bind: clientaddress.Keep (0: the node's, always)
        self.keep = keep
        #: each connection opens with a PROXY protocol v2 header to the backend (proxyprotocol.py)
        self.proxy_protocol = proxy_protocol
        self.balancer = pool.balancer
        self.stats = pool.stats
        self.candidates = candidates
        self.local_candidates = local_candidates
        if pool.balancer.affinity is None:
            self.keys = self.local_keys = _NO_KEYS
            return
        self.keys = frozenset(e.key for e in candidates)
        self.local_keys = (
            frozenset(e.key for e in local_candidates) if local_candidates is not None else self.keys
        )

    def all_keys(self) -> frozenset[str]:
        """Every endpoint a client of this route may be relayed to."""
        keys = {e.key for e in self.candidates}
        if self.local_candidates:
            keys.update(e.key for e in self.local_candidates)
        return frozenset(keys)


BalancerFactory = Callable[[ServicePortName, int], Balancer]

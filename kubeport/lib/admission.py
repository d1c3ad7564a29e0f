"""Which new connection a server with connection caps takes, and which old one makes room.

At most ``limit`` connections are open, ``per_client`` of them from one client address. At
the per-client cap the client's own connection idle longest is closed for the new one; at
the global cap any client's. With none of those idle, the new connection is turned away at
once: a client that opened many connections and left them idle (a resolver that never
closes, a scraper's pool) still gets its next request answered, and one that keeps many
busy cannot take everybody's place. RFC 7766 section 6.2.3 asks this of a DNS server over
TCP ("close idle connections ... when under heavy load"); the status and health ports apply
the same rule.

Pure bookkeeping: the connections say whether they are idle and when they were last active,
and are told to go (:meth:`Admissible.evict`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar


class Admissible(Protocol):
    #: the client's address ("" where there is none, a Unix socket's peer)
    client: str
    #: monotonic seconds of its last read or write
    last_activity: float

    @property
    def idle(self) -> bool:
        """Nothing under way: no request begun, none being answered."""
        ...

    def evict(self) -> None:
        """Close, to make room for a new connection."""
        ...


C = TypeVar("C", bound=Admissible)


def _nothing() -> None:
    pass


class ConnectionAdmission(Generic[C]):
    def __init__(self, limit: int, per_client: int, *, rejected: Callable[[], None] = _nothing,
                 evicted: Callable[[], None] = _nothing) -> None:
        """``rejected`` and ``evicted`` count what the caps did (a server's metrics)."""
        self.limit = limit
        self.per_client = per_client
        self._rejected = rejected
        self._evicted = evicted
        self.open: set[C] = set()
        self._per_client: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.open)

    def __iter__(self) -> Iterator[C]:
        return iter(self.open)

    def admit(self, connection: C) -> bool:
        """Count ``connection`` in, evicting the one idle longest at a cap; False: refused."""
        client = connection.client
        if self._per_client.get(client, 0) >= self.per_client:
            if not self._evict_idle_longest([c for c in self.open if c.client == client and c.idle]):
                return False
        elif len(self.open) >= self.limit:
            if not self._evict_idle_longest([c for c in self.open if c.idle]):
                return False
        self.open.add(connection)
        self._per_client[client] = self._per_client.get(client, 0) + 1
        return True

    def discard(self, connection: C) -> None:
        if connection in self.open:
            self.open.discard(connection)
            count = self._per_client[connection.client] - 1
            if count:
                self._per_client[connection.client] = count
            else:
                del self._per_client[connection.client]

    def _evict_idle_longest(self, idle: list[C]) -> bool:
        if not idle:
            self._rejected()
            return False
        self._evicted()
        oldest = min(idle, key=_last_activity)
        self.discard(oldest)  # its close completes later; the place is free now
        oldest.evict()
        return True


def _last_activity(connection: Admissible) -> float:
    return connection.last_activity

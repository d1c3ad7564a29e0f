"""ClientIP session affinity for one service port, sans-IO (reference C).

kube-proxy keeps one affinity table per *service port* (not per Service), keyed by the
client's IP as the node sees it before SNAT, with a sliding timeout refreshed by each
new connection (or new UDP flow): iptables ``recent --rcheck --seconds N`` then
``--set``, the old userspace balancer's ``lastUsed``. Only endpoints currently in the
chosen set are eligible; when the remembered endpoint is gone the client gets a fresh
pick and a new entry.

Time is passed in (``now``, seconds on any monotonic clock), so tests never sleep.
Entries live in an ordered dict in last-use order, so expiry walks only expired
entries from the front and a size cap evicts the least recently used client.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Collection, Iterable

#: Enough for a large node's distinct clients per service port; beyond it the least
#: recently used client loses its affinity (it just gets a fresh pick).
DEFAULT_MAX_ENTRIES = 65536
#: Entries removed per expire() call at most, so one call never stalls the loop.
DEFAULT_EXPIRE_BUDGET = 1024


class AffinityTable:
    """client IP -> endpoint key ("IP:port") with a sliding timeout."""

    __slots__ = ("_timeout", "_max_entries", "_entries", "_clients_by_key")

    def __init__(self, timeout_seconds: float, *, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        """
        :param timeout_seconds: ``sessionAffinityConfig.clientIP.timeoutSeconds`` (> 0).
        :param max_entries: size cap; the least recently used client is evicted beyond it.
        """
        if timeout_seconds <= 0:
            raise ValueError(f"affinity timeout must be > 0 seconds, got {timeout_seconds}")
        if max_entries < 1:
            raise ValueError(f"affinity max_entries must be >= 1, got {max_entries}")
        self._timeout = float(timeout_seconds)
        self._max_entries = max_entries
        #: client IP -> (endpoint key, last used), oldest use first.
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._clients_by_key: dict[str, set[str]] = {}

    @property
    def timeout(self) -> float:
        return self._timeout

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, client_ip: str, eligible_keys: Collection[str], now: float) -> str | None:
        """The client's endpoint if it is still fresh and eligible; a hit restarts the timer.

        A stale entry, or one whose endpoint is not in ``eligible_keys`` (pass a set), is
        dropped and None is returned: the caller picks anew and :meth:`record` s it.
        """
        entry = self._entries.get(client_ip)
        if entry is None:
            return None
        key, last_used = entry
        if now - last_used >= self._timeout or key not in eligible_keys:
            self._drop(client_ip, key)
            return None
        self._entries[client_ip] = (key, now)
        self._entries.move_to_end(client_ip)
        return key

    def record(self, client_ip: str, key: str, now: float) -> None:
        """Remember ``key`` for ``client_ip`` from ``now`` on."""
        held = self._entries.get(client_ip)
        if held is not None and held[0] != key:
            self._unindex(client_ip, held[0])
        self._entries[client_ip] = (key, now)
        self._entries.move_to_end(client_ip)
        self._clients_by_key.setdefault(key, set()).add(client_ip)
        while len(self._entries) > self._max_entries:
            oldest, (oldest_key, _) = self._entries.popitem(last=False)
            self._unindex(oldest, oldest_key)

    def pick(self, client_ip: str, eligible_keys: Collection[str], now: float, choose: Callable[[], str]) -> str:
        """The affine endpoint, or ``choose()``'s pick, recorded for next time."""
        key = self.lookup(client_ip, eligible_keys, now)
        if key is None:
            key = choose()
            self.record(client_ip, key, now)
        return key

    def forget(self, keys: Iterable[str]) -> int:
        """Drop every client pinned to one of ``keys`` (endpoints that were removed)."""
        removed = 0
        for key in keys:
            for client_ip in self._clients_by_key.pop(key, ()):
                del self._entries[client_ip]
                removed += 1
        return removed

    def clear(self) -> None:
        """Forget everything (the port lost all its endpoints)."""
        self._entries.clear()
        self._clients_by_key.clear()

    def expire(self, now: float, budget: int = DEFAULT_EXPIRE_BUDGET) -> int:
        """Remove up to ``budget`` timed-out entries; returns how many went.

        The cost is bounded by ``budget`` and by the number of expired entries: entries
        are kept in last-use order, so the walk stops at the first fresh one.
        """
        removed = 0
        entries = self._entries
        while entries and removed < budget:
            client_ip, (key, last_used) = next(iter(entries.items()))
            if now - last_used < self._timeout:
                break
            self._drop(client_ip, key)
            removed += 1
        return removed

    def _drop(self, client_ip: str, key: str) -> None:
        del self._entries[client_ip]
        self._unindex(client_ip, key)

    def _unindex(self, client_ip: str, key: str) -> None:
        clients = self._clients_by_key.get(key)
        if clients is not None:
            clients.discard(client_ip)
            if not clients:
                del self._clients_by_key[key]

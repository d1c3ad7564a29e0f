"""ClientIP session affinity for one service port, sans-IO (kube-proxy's
pkg/proxy/iptables/proxier.go writeServiceToEndpointRules; the removed userspace balancer
pkg/proxy/userspace/roundrobin.go; limits in pkg/apis/core/validation/validation.go).

kube-proxy keeps one affinity table per *service port* (not per Service), keyed by the
client's IP as the node sees it before SNAT, with a sliding timeout refreshed by each
new connection (or new UDP flow): iptables ``recent --rcheck --seconds N`` then
``--set``, the old userspace balancer's ``lastUsed``.

The state is per endpoint, as in kube-proxy (iptables: one ``recent`` list per endpoint
chain; nftables: one affinity set per endpoint): a client holds one *pin* per endpoint it
was sent to, each with its own timer. A frontend consults only the pins of the endpoints
its chain offers (cluster chain: all of them; the Local chains of eTP/iTP=Local: local
ones only). A pin to an endpoint that frontend does not offer is skipped, not dropped: the
client gets a fresh pick there, which is pinned too, and its first pin still holds
wherever that endpoint is offered. Pins go when they time out or their endpoint is
removed from the port (:meth:`AffinityTable.forget`).

A client's pins are tried in the order they were made (kube-proxy tries them in its
fixed chain order, so a frontend keeps its endpoint whatever other frontends pinned
since); almost every client has exactly one.

Time is passed in (``now``, seconds on any monotonic clock), so tests never sleep.
Pins live in an ordered dict in last-use order, so expiry walks only expired pins from
the front and a size cap evicts the least recently used pin.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Collection, Iterable

#: Enough for a large node's distinct clients per service port; beyond it the least
#: recently used pin is evicted (its client just gets a fresh pick).
DEFAULT_MAX_ENTRIES = 65536
#: Pins removed per expire() call at most, so one call never stalls the loop.
DEFAULT_EXPIRE_BUDGET = 1024


class AffinityTable:
    """client IP -> endpoint keys ("IP:port"), one pin per endpoint, each with a sliding timeout."""

    __slots__ = ("_timeout", "_max_entries", "_entries", "_pins", "_clients_by_key")

    def __init__(self, timeout_seconds: float, *, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        """
        :param timeout_seconds: ``sessionAffinityConfig.clientIP.timeoutSeconds`` (> 0).
        :param max_entries: size cap in pins; the least recently used pin is evicted beyond it.
        """
        if timeout_seconds <= 0:
            raise ValueError(f"affinity timeout must be > 0 seconds, got {timeout_seconds}")
        if max_entries < 1:
            raise ValueError(f"affinity max_entries must be >= 1, got {max_entries}")
        self._timeout = float(timeout_seconds)
        self._max_entries = max_entries
        #: (client IP, endpoint key) -> last used, oldest use first.
        self._entries: OrderedDict[tuple[str, str], float] = OrderedDict()
        #: client IP -> its pinned endpoint keys, in the order they were pinned.
        self._pins: dict[str, tuple[str, ...]] = {}
        self._clients_by_key: dict[str, set[str]] = {}

    @property
    def timeout(self) -> float:
        return self._timeout

    def __len__(self) -> int:
        """Pins held (a client pinned through two frontends to two endpoints counts twice)."""
        return len(self._entries)

    def pins(self, client_ip: str) -> tuple[str, ...]:
        """The client's pinned endpoint keys, first pinned first (fresh or not yet swept)."""
        return self._pins.get(client_ip, ())

    def lookup(self, client_ip: str, eligible_keys: Collection[str], now: float) -> str | None:
        """The client's first fresh pin among ``eligible_keys`` (pass a set); a hit restarts its timer.

        Pins to endpoints outside ``eligible_keys`` are skipped and kept (kube-proxy: each
        chain checks only its own endpoints' affinity); a timed-out pin met on the way is
        dropped. None: the caller picks anew and :meth:`record` s it.
        """
        pins = self._pins.get(client_ip)
        if pins is None:
            return None
        entries = self._entries
        for key in pins:
            if key in eligible_keys:
                pin = (client_ip, key)
                if now - entries[pin] >= self._timeout:
                    self._drop(client_ip, key)
                    continue
                entries[pin] = now
                entries.move_to_end(pin)
                return key
        return None

    def record(self, client_ip: str, key: str, now: float, *, replaces: str | None = None) -> None:
        """Pin ``client_ip`` to ``key`` from ``now`` on.

        ``replaces``: a pin the client was just moved off (its endpoint failed or is
        ejected); it goes, and the new pin takes its place in the client's order. Without
        it the new pin comes after the client's others.
        """
        pins = self._pins.get(client_ip, ())
        moved = replaces is not None and replaces != key and replaces in pins
        if moved:
            del self._entries[client_ip, replaces]
            self._unindex(client_ip, replaces)
        if key in pins:
            if moved:
                self._pins[client_ip] = tuple(k for k in pins if k != replaces)
        else:
            self._pins[client_ip] = tuple(key if k == replaces else k for k in pins) if moved else pins + (key,)
            self._clients_by_key.setdefault(key, set()).add(client_ip)
        pin = (client_ip, key)
        self._entries[pin] = now
        self._entries.move_to_end(pin)
        while len(self._entries) > self._max_entries:
            (oldest, oldest_key), _ = self._entries.popitem(last=False)
            self._unpin(oldest, oldest_key)

    def pick(self, client_ip: str, eligible_keys: Collection[str], now: float, choose: Callable[[], str]) -> str:
        """The affine endpoint, or ``choose()``'s pick, recorded for next time."""
        key = self.lookup(client_ip, eligible_keys, now)
        if key is None:
            key = choose()
            self.record(client_ip, key, now)
        return key

    def forget(self, keys: Iterable[str]) -> int:
        """Drop every pin to one of ``keys`` (endpoints that were removed); returns how many went."""
        removed = 0
        for key in keys:
            for client_ip in self._clients_by_key.pop(key, ()):
                del self._entries[client_ip, key]
                self._unpin_only(client_ip, key)
                removed += 1
        return removed

    def clear(self) -> None:
        """Forget everything (the port lost all its endpoints)."""
        self._entries.clear()
        self._pins.clear()
        self._clients_by_key.clear()

    def expire(self, now: float, budget: int = DEFAULT_EXPIRE_BUDGET) -> int:
        """Remove up to ``budget`` timed-out pins; returns how many went.

        The cost is bounded by ``budget`` and by the number of expired pins: pins are
        kept in last-use order, so the walk stops at the first fresh one.
        """
        removed = 0
        entries = self._entries
        while entries and removed < budget:
            (client_ip, key), last_used = next(iter(entries.items()))
            if now - last_used < self._timeout:
                break
            self._drop(client_ip, key)
            removed += 1
        return removed

    def _drop(self, client_ip: str, key: str) -> None:
        del self._entries[client_ip, key]
        self._unpin(client_ip, key)

    def _unpin(self, client_ip: str, key: str) -> None:
        self._unpin_only(client_ip, key)
        self._unindex(client_ip, key)

    def _unpin_only(self, client_ip: str, key: str) -> None:
        pins = self._pins[client_ip]
        if len(pins) == 1:
            del self._pins[client_ip]
        else:
            self._pins[client_ip] = tuple(k for k in pins if k != key)

    def _unindex(self, client_ip: str, key: str) -> None:
        clients = self._clients_by_key.get(key)
        if clients is not None:
            clients.discard(client_ip)
            if not clients:
                del self._clients_by_key[key]

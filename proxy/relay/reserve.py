"""The last descriptors of the process are not the proxy's: the status API, DNS and the health
port keep answering when relayed connections use up ``RLIMIT_NOFILE``.

Everything shares one limit, and Linux hands out the lowest free descriptor, so whoever
accepts first takes the last ones: relayed connections up to ``ulimit -n`` left the
status API unreachable. While the proxy accepts (and makes the backend socket of what it
accepted, in the same callback) or takes datagrams (a new UDP flow opens a socket), the soft
limit is lowered by the reserve, and raised back after: the proxy meets ``EMFILE`` with the
reserve still free, and pauses accepting as it does for any shortage of descriptors; the
other servers open theirs from the reserve. The loop is one thread, so nothing else opens a
descriptor in between (a manifest read in a worker thread could, and would find the same
ceiling: it is retried by its next batch). Two ``setrlimit`` calls per accepting callback.

The proxy opens descriptors outside those callbacks too, and they go under the same ceiling
through :meth:`DescriptorReserve.within` too: the splice pipes of a direction turning bulk (two
descriptors, ``pipes.py``; refused, the direction keeps copying) and the socket of a connect
retried on another endpoint after a refused or timed-out one (``tcp.py``; refused, the client
is reset as when every attempt failed). Inside an accepting callback the ceiling is already
set and the nested call adds nothing; outside, it costs the same two ``setrlimit`` calls.
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

Callback = TypeVar("Callback", bound=Callable[..., Any])

#: descriptors kept out of the proxy's reach: a sixteenth of the limit, at least 32, at most 1024
RESERVE_SHARE = 16
RESERVE_MIN = 32
RESERVE_MAX = 1024


def reserve_for(limit: int) -> int:
    """How many of ``limit`` descriptors the proxy leaves to the rest of the daemon."""
    return min(RESERVE_MAX, max(RESERVE_MIN, limit // RESERVE_SHARE))


class DescriptorReserve:
    def __init__(self, limits: Any = resource) -> None:
        self._limits = limits
        self._soft, self._hard = limits.getrlimit(limits.RLIMIT_NOFILE)
        self.reserve = reserve_for(self._soft)
        #: the soft limit while the proxy opens descriptors; None: too few to split
        self.ceiling: int | None = self._soft - self.reserve if self._soft > 2 * self.reserve else None
        if self.ceiling is None:
            log.warning("open-file limit %d: too low to keep descriptors for the status API and DNS apart "
                        "from the proxy's", self._soft)
        #: the ceiling is set now (a callback under it is running): a nested one leaves it
        self.lowered = False

    def within(self, callback: Callback) -> Callback:
        """``callback`` run with the proxy's lower ceiling (already set: run as it is, and the
        limit comes back when the outermost one returns)."""
        ceiling = self.ceiling
        if ceiling is None:
            return callback
        setrlimit, kind, soft, hard = self._limits.setrlimit, self._limits.RLIMIT_NOFILE, self._soft, self._hard

        def under_ceiling(*args: Any) -> Any:
            if self.lowered:
                return callback(*args)
            setrlimit(kind, (ceiling, hard))
            self.lowered = True
            try:
                return callback(*args)
            finally:
                self.lowered = False
                setrlimit(kind, (soft, hard))

        return under_ceiling  # type: ignore[return-value]

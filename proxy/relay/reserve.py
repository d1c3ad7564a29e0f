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

Listeners stop shorter still (:meth:`DescriptorReserve.listener_fits`): every Service port is
a listening socket, and thousands of them would otherwise take every descriptor below the
proxy's ceiling, leaving none for the connections they accept. A listener is opened only while
the lowest free descriptor (the one its socket would get) is below ``listener_ceiling``, one
more reserve below the proxy's ceiling; past it the frontend is named in one problem line
(:func:`no_listener_problem`) and tried again when listeners close or on a timer
(``listeners.py``). Looked at, not enforced with ``setrlimit``: a cold start opens thousands
of listeners in a row, and a lowered limit held that often would refuse the manifest reads
and last-good copies running in threads meanwhile. kube-proxy has no such limit (its rules
are the kernel's, not sockets); the way out is a higher ``LimitNOFILE`` (docs/operating.md).
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import sys
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


def ceilings(limit: int) -> tuple[int, int] | None:
    """The soft limits the proxy opens descriptors under, for a soft limit of ``limit``:
    (relayed connections', listeners'), each one reserve below the last; None when ``limit``
    is too low to split. Where a second reserve would leave listeners less than a reserve's
    worth, they share the connections' ceiling."""
    reserve = reserve_for(limit)
    if limit <= 2 * reserve:
        return None
    connections = limit - reserve
    return connections, connections - reserve if limit > 3 * reserve else connections


#: frontends named in the problem line; the rest are counted
NAMED_FRONTENDS = 3


def no_listener_problem(first: list[str], count: int, limit: int) -> str | None:
    """The one problem line for the ``count`` frontends without a listener for want of
    descriptors, naming the ``first`` (at most NAMED_FRONTENDS of them) and counting the rest."""
    if count <= 0:
        return None
    shown = ", ".join(first[:NAMED_FRONTENDS])
    rest = count - min(len(first), NAMED_FRONTENDS)
    more = f" and {rest:,} more" if rest > 0 else ""
    frontends = "1 frontend has" if count == 1 else f"{count:,} frontends have"
    return f"{frontends} no listener (descriptor limit {limit} reached): {shown}{more}"


def lowest_free_descriptor() -> int:
    """The descriptor the next socket would get (Linux hands out the lowest free one), by
    opening and closing one; ``sys.maxsize`` when none is free."""
    try:
        fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            return sys.maxsize
        raise
    os.close(fd)
    return fd


class DescriptorReserve:
    def __init__(self, limits: Any = resource, lowest_free: Callable[[], int] = lowest_free_descriptor) -> None:
        self._limits = limits
        self._lowest_free = lowest_free
        self._soft, self._hard = limits.getrlimit(limits.RLIMIT_NOFILE)
        self.reserve = reserve_for(self._soft)
        split = ceilings(self._soft)
        #: the soft limit while the proxy opens descriptors; None: too few to split
        self.ceiling: int | None = split[0] if split else None
        #: the descriptors listeners may take are below this: connections keep a reserve of their own
        self.listener_ceiling: int | None = split[1] if split else None
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

    @property
    def limit(self) -> int:
        """The process's soft limit (the one ``ulimit -n`` and LimitNOFILE set)."""
        return self._soft

    def listener_fits(self) -> bool:
        """A listener opened now would stop short of the connections' and the daemon's reserves."""
        return self.listener_ceiling is None or self._lowest_free() < self.listener_ceiling

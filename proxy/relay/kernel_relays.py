"""The directions a sockmap program relays in the kernel (``--tcp-relay``, sockmap.py).

A relayed connection (tcp.py) hands a direction that turns bulk to ``KernelRelays.take``;
its bytes then go from socket to socket in softirq and workqueue context, and this process
sees only the end (FIN, reset) and sweeps the queue bound.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kubeport.lib.lograte import limit_repeats
from kubeport.proxy.relay.direction import Direction
from kubeport.proxy.relay.sockmap import bytes_acked, bytes_consumed, bytes_written, cookie, send_queue

if TYPE_CHECKING:
    from kubeport.proxy.relay.context import RelayContext

log = logging.getLogger(__name__)
limit_repeats(log)  # a refusing map or a lossy kernel fails every connection alike

#: Direction.kernel: the program relays the direction; it is about to leave the verdict map
#: (HOLDING, see KernelRelays); or its source is out of the verdict map
#: until the destination has every byte the program took (then it is spliced).
KERNEL, HOLDING, PAUSED = "kernel", "holding", "paused"
#: how long a held source waits to leave the verdict map: longer than a run of the program
#: over a receive queue (microseconds) takes, short against the sweep interval.
_HOLD_S = 0.001


class KernelRelays:
    """The directions the sockmap program relays, and the sweep that bounds their queues.

    Each sweep (every ``interval`` while any is left) reads the program's byte counts of every
    direction with one batch lookup, and a destination (TCP_INFO and SIOCOUTQ) only when its
    count ran ``limit`` past what it was last seen to have taken, or its source sent its FIN.
    A direction more than ``limit`` behind is paused (sockmap.py) and, once its destination
    took every counted byte, spliced here for the rest of the connection: putting a source
    back into the verdict map while it receives lost and repeated whole skbs on 6.18 (a
    long stream paused and resumed again and again came through short, with bytes
    repeated); splicing after the pause lost nothing in the same test. A direction
    whose source sent its FIN ends once its destination took every counted byte.

    A pause can drop bytes: it deletes the source from ``verdict``, and ``sock_map_del_link``
    -> ``sk_psock_stop_verdict`` clears the psock's program while ``sk_psock_verdict_data_ready``
    may be running ``tcp_read_skb`` on the socket on another CPU; ``sk_psock_verdict_recv``
    then finds no program and drops each skb it still takes (net/core/skmsg.c). The program
    never counts those, so the destination does not wait for them and the stream would go on
    with a hole. Before a paused direction is spliced, what its source's receive queue gave
    up (``bytes_consumed``) is checked against the program's count; a difference is a hole,
    and the connection is reset instead (counted in ``lost``).

    Bytes the program counted but the destination never gets would leave such a direction
    waiting forever, its client hanging on a stream that cannot complete. A direction still
    short of its count after ``lost_after`` seconds in which its destination's send queue
    stayed empty (so nothing blocked the psock from sending: ``sk_psock_backlog`` retries
    every jiffy) and took nothing more is taken as a kernel loss: its connection is reset,
    so both ends see an error instead of a hang, and ``lost`` counts it.
    """

    def __init__(self, ctx: RelayContext, sockmap, limit: int, interval: float, lost_after: float = 5.0) -> None:
        self.ctx = ctx
        self.sockmap = sockmap
        self.limit = limit
        self.interval = interval
        self.lost_after = lost_after
        self.directions: set[Direction] = set()
        self._timer = None
        #: sockets the kernel refused (map full, socket type): those directions were spliced.
        self.refused = 0
        #: directions the program has relayed; those paused as their destination fell behind.
        self.taken = 0
        self.pauses = 0
        #: connections reset because counted bytes never reached their destination.
        self.lost = 0

    def take(self, direction: Direction) -> bool:
        """Start relaying ``direction`` in the kernel (False: the kernel refused, nothing changed)."""
        sockmap = self.sockmap
        src_cookie = 0
        try:
            src_cookie = cookie(direction.src)
            sockmap.link(src_cookie, direction.dst_fd)
            # All this process wrote is in dst (nothing is pending); a SYN counts there too.
            base = bytes_written(direction.dst)
            src_base = bytes_consumed(direction.src)
            sockmap.start(src_cookie, direction.src)
        except OSError as exc:
            self._refused(src_cookie, exc)
            return False
        direction.cookie = src_cookie
        direction.base = base
        direction.src_base = src_base
        direction.kernel = KERNEL
        direction.checked = direction.counted = 0
        self.directions.add(direction)
        self.taken += 1
        if self._timer is None:
            self._timer = self.ctx.loop.call_later(self.interval, self._sweep)
        return True

    def _refused(self, src_cookie: int, exc: OSError) -> None:
        self.refused += 1
        if src_cookie:
            self.sockmap.unlink(src_cookie)
        log.debug("sockmap refused a socket (%s): spliced instead", exc)

    def account(self, direction: Direction) -> None:
        """The kernel's last bytes of ``direction`` to the port's counters; it is no longer swept."""
        if not direction.cookie:
            return
        self.directions.discard(direction)
        try:
            self._count(direction, self.sockmap.counted(direction.cookie))
        except OSError:
            pass
        self.sockmap.unlink(direction.cookie)
        direction.cookie = 0

    @staticmethod
    def _count(direction: Direction, counted: int) -> None:
        """Add what the program counted since the last sweep to the port's byte counters."""
        moved = counted - direction.counted
        if moved:
            direction.counted = counted
            if direction.up:
                direction.stats.bytes_to_backend += moved
            else:
                direction.stats.bytes_to_client += moved

    def _give_back(self, direction: Direction) -> None:
        """The kernel relayed all it took from a paused source; this process splices the rest."""
        self.account(direction)
        direction.kernel = None
        direction.kernel_ok = False
        direction.readable = direction.writable = True
        direction.fin_clean = False  # read to the end, not to the first short read
        direction.pump()

    def _behind(self, direction: Direction, counted: int) -> int:
        return counted - (bytes_written(direction.dst) - direction.base)

    def _lost(self, direction: Direction, behind: int, written: int, queued: int, now: float) -> bool:
        """``direction`` waits for ``behind`` counted bytes, its destination has taken ``written``
        and holds ``queued`` unacknowledged: have the rest been lost (see the class)?"""
        waiting = direction.waiting
        if waiting is None or waiting[0] != written or queued:
            direction.waiting = (written, now)
            return False
        if now - waiting[1] < self.lost_after:
            return False
        self.lost += 1
        log.warning("sockmap: %d bytes the kernel took for %s never reached it in %.0fs; the connection is reset",
                    behind, "the backend" if direction.up else "the client", now - waiting[1])
        return True

    def _dropped_at_pause(self, direction: Direction, counted: int) -> bool:
        """Did the pause drop bytes the program never saw (see the class)? Then the stream has a hole."""
        consumed = bytes_consumed(direction.src)
        if consumed is None or direction.src_base is None:
            return False
        dropped = consumed - direction.src_base - counted
        if dropped <= 1:  # a FIN's sequence number (bytes_consumed)
            return False
        self.lost += 1
        log.warning("sockmap: pausing %s dropped %d bytes (net/core/skmsg.c sk_psock_verdict_recv without a "
                    "program); the connection is reset", "the client" if direction.up else "the backend", dropped)
        return True

    def _pause_held(self, direction: Direction) -> None:
        if direction.kernel is not HOLDING or direction not in self.directions:
            return  # the connection ended meanwhile
        try:
            self.sockmap.pause(direction.cookie, direction.src)
        except OSError as exc:
            direction.conn.abort(exc)
            return
        direction.kernel = PAUSED
        self.pauses += 1

    def _sweep(self) -> None:
        self._timer = None
        sockmap, limit = self.sockmap, self.limit
        try:
            counts = sockmap.all_counted()
        except OSError:  # a kernel without batch lookups (before 5.6): one lookup per direction
            counts = {}
        now = self.ctx.loop.time()
        for direction in list(self.directions):
            if direction not in self.directions:  # its connection was aborted by this sweep
                continue
            conn = direction.conn
            try:
                counted = counts.get(direction.cookie)
                if counted is None:
                    counted = sockmap.counted(direction.cookie)
                self._count(direction, counted)
                if direction.kernel is HOLDING:
                    continue
                if direction.kernel is PAUSED or direction.peer_closed:
                    queued = send_queue(direction.dst)
                    written = bytes_acked(direction.dst) + queued - direction.base
                    behind = counted - written
                    if behind > 0:
                        if self._lost(direction, behind, written, queued, now):
                            conn.abort()
                        continue
                    if direction.kernel is PAUSED:
                        if self._dropped_at_pause(direction, counted):
                            conn.abort()
                        else:
                            self._give_back(direction)
                        continue
                    conn.kernel_finished(direction)
                elif counted - direction.checked > limit:
                    behind = self._behind(direction, counted)
                    direction.checked = counted - behind
                    if behind > limit:
                        sockmap.hold(direction.src)
                        direction.kernel = HOLDING
                        self.ctx.loop.call_later(_HOLD_S, self._pause_held, direction)
            except OSError as exc:
                conn.abort(exc)
        if self.directions:
            self._timer = self.ctx.loop.call_later(self.interval, self._sweep)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.directions.clear()
        self.sockmap.close()

"""TCP (and SCTP stream) frontends: accept, connect with retry, then relay.

Per connection: one accept, one non-blocking connect, two registrations in the edge
poller, two Directions (relay.py); pooled pipes only once a direction turns bulk. No
task or coroutine objects.
A connect that fails (refused, unreachable, timed out) is counted against the
endpoint (ejection) and retried on another endpoint, up to ``connect_attempts``.
Every backend socket is made under the descriptor reserve's ceiling (reserve.py), a retry's
too, which runs on the failed connect's edge rather than in the accepting callback.
A backend reset is passed on to the client as a reset (SO_LINGER 0), and vice versa.

With a sockmap (``--tcp-relay``, sockmap.py), a direction that turns bulk is handed to the
kernel instead of splice: its bytes go from socket to socket in softirq and workqueue
context; this process sees only the end (FIN, reset) and sweeps the queue bound
(``KernelRelays``).
"""

from __future__ import annotations

import _socket
import errno
import logging
import os
import socket
import struct
from enum import Enum

from kubeport.lib.lograte import limit_repeats
from kubeport.proxy.balancer import EndpointState, Route
from kubeport.proxy.host import capture
from kubeport.proxy.relay.context import RelayContext
from kubeport.proxy.relay.direction import Direction
from kubeport.proxy.relay.poller import EDGE_INPUT, EPOLLERR, EPOLLHUP, EPOLLIN, EPOLLOUT, EPOLLRDHUP
from kubeport.proxy.relay.sockmap import bytes_acked, bytes_consumed, bytes_written, cookie, send_queue
from kubeport.proxy.table import Frontend

log = logging.getLogger(__name__)
limit_repeats(log)  # one failing client or endpoint fails every connection alike

_LINGER_RESET = struct.pack("ii", 1, 0)
_SOL_SOCKET = socket.SOL_SOCKET
_SO_LINGER = socket.SO_LINGER
_SO_ERROR = socket.SO_ERROR
_IPPROTO_TCP = socket.IPPROTO_TCP
_TCP_NODELAY = socket.TCP_NODELAY
_STREAM_NONBLOCK = socket.SOCK_STREAM | socket.SOCK_NONBLOCK
#: relayed sockets are the C type: socket.socket's Python layer (__init__, close, io refs) costs
#: microseconds per connection and gives nothing here.
RawSocket = _socket.socket
_STREAM = int(socket.SOCK_STREAM)
_AF_INET, _AF_INET6 = int(socket.AF_INET), int(socket.AF_INET6)
_ACCEPT_BATCH = 64
#: the descriptor or memory shortage errors: pause accepting, then retry (trio's list).
_ACCEPT_PAUSE = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
#: the client went away between SYN and accept, or a firewall refused it: next one.
_ACCEPT_SKIP = {errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.EINTR}



class ConnState(Enum):
    """Where a relayed connection is: choosing and connecting a backend, relaying, or closed."""

    CONNECTING = "connecting"
    RELAYING = "relaying"
    CLOSED = "closed"


# Module globals, compared with `is`: a global load and an identity test on the hot path.
CONNECTING, RELAYING, CLOSED = ConnState.CONNECTING, ConnState.RELAYING, ConnState.CLOSED
_INPUT = EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP
_CLOSED = EPOLLERR | EPOLLHUP | EPOLLRDHUP
_OUTPUT = EPOLLOUT | EPOLLERR | EPOLLHUP
#: Direction.kernel: the program relays the direction; it is about to leave the verdict map
#: (HOLDING, see KernelRelays); or its source is out of the verdict map
#: until the destination has every byte the program took (then it is spliced).
KERNEL, HOLDING, PAUSED = "kernel", "holding", "paused"
#: how long a held source waits to leave the verdict map: longer than a run of the program
#: over a receive queue (microseconds) takes, short against the sweep interval.
_HOLD_S = 0.001


def reset(sock: RawSocket) -> None:
    """Close with an RST instead of a FIN."""
    try:
        sock.setsockopt(_SOL_SOCKET, _SO_LINGER, _LINGER_RESET)
    except OSError:
        pass
    sock.close()


class Conn:
    """One client connection: connect (with retries), then two Directions, all on edge callbacks."""

    __slots__ = (
        "ctx", "route", "stats", "client", "client_fd", "client_ip", "candidates", "keys", "backend",
        "backend_fd", "endpoint", "tried", "attempt", "state", "up", "down", "proto", "early_events",
        "timeout_token", "client_nonblocking", "client_output",
    )

    def __init__(self, ctx: RelayContext, route: Route, client: RawSocket, client_ip: str,
                 candidates, keys, proto: int = 0) -> None:
        self.ctx = ctx
        self.proto = proto
        self.route = route
        self.stats = route.stats
        self.client = client
        self.client_fd = client.fileno()
        self.client_ip = client_ip
        self.candidates = candidates
        self.keys = keys
        self.backend: RawSocket | None = None
        self.backend_fd = -1
        self.endpoint: EndpointState | None = None
        self.tried: list[EndpointState] = []
        self.attempt = 0
        self.state = CONNECTING
        self.up: Direction | None = None
        self.down: Direction | None = None
        #: client edges seen while connecting (a FIN flagged then must not be forgotten).
        self.early_events = 0
        self.timeout_token = 0
        self.client_nonblocking = False
        self.client_output = False
        ctx.conns.add(self)
        ctx.poller.register(self.client_fd, self._on_client, EDGE_INPUT)

    # --- connecting -------------------------------------------------------------------

    def connect(self, endpoint: EndpointState) -> None:
        self.endpoint = endpoint
        self.attempt += 1
        try:
            family = _AF_INET6 if endpoint.family == 6 else _AF_INET
            backend = self.ctx.backend_socket(family, _STREAM_NONBLOCK, self.proto)
        except OSError as exc:
            log.warning("no socket for a connection to %s: %s", endpoint.key, exc)
            self._give_up()
            return
        self.backend = backend
        self.backend_fd = backend.fileno()
        if not self.proto:
            # Relayed bytes go out as they come; the client side inherits this from the listener.
            backend.setsockopt(_IPPROTO_TCP, _TCP_NODELAY, 1)
        err = backend.connect_ex(endpoint.sockaddr)
        if err == errno.EINPROGRESS:
            self.ctx.poller.register(self.backend_fd, self._on_backend)
            self.timeout_token = self.ctx.timeouts.add(self)
        elif err == 0:
            self.ctx.poller.register(self.backend_fd, self._on_backend)
            self._connected(EPOLLIN)
        else:
            self._connect_failed(err)

    def connect_timed_out(self) -> None:
        self.timeout_token = 0
        if self.state is CONNECTING:
            self._connect_failed(errno.ETIMEDOUT)

    def _connect_failed(self, err: int) -> None:
        ctx = self.ctx
        endpoint = self.endpoint
        now = ctx.clock()
        balancer = self.route.balancer
        if balancer.connect_failed(endpoint, now):
            log.info("%s: endpoint %s ejected after connect failures (last: %s)",
                     self.route.pool.name, endpoint.key, os.strerror(err))
        self._drop_backend()
        self.tried.append(endpoint)
        if self.attempt < ctx.config.connect_attempts:
            retry = balancer.pick(self.candidates, self.keys, self.client_ip, now, self.tried)
            if retry is not None:
                self.connect(retry)
                return
        log.debug("%s: no endpoint reachable for %s (last: %s)", self.route.pool.name, self.client_ip,
                  os.strerror(err))
        self._give_up()

    def _drop_backend(self) -> None:
        if self.timeout_token:
            self.ctx.timeouts.cancel(self.timeout_token)
            self.timeout_token = 0
        if self.backend is not None:
            self.ctx.poller.forget(self.backend_fd)
            self.backend.close()
            self.backend = None

    def _give_up(self) -> None:
        self.stats.connect_giveups += 1
        self.state = CLOSED
        self._drop_backend()
        self.ctx.poller.forget(self.client_fd)
        reset(self.client)
        self.ctx.conn_closed(self)

    def _connected(self, backend_events: int) -> None:
        self.state = RELAYING
        if self.timeout_token:
            self.ctx.timeouts.cancel(self.timeout_token)
            self.timeout_token = 0
        endpoint = self.endpoint
        self.route.balancer.connect_succeeded(endpoint)
        endpoint.active += 1
        if self.ctx.track_endpoint_conns:
            endpoint.connections.add(self)
        self.stats.active += 1
        client, backend = self.client, self.backend
        self.up = Direction(self, client, backend, True)
        self.down = Direction(self, backend, client, False)
        self._closed_edge(self.up, self.early_events)
        self.down.readable = bool(backend_events & _INPUT)
        self._closed_edge(self.down, backend_events)
        # The client has usually sent its request already: move it now. That may close the
        # connection (the client reset it while the backend connect was under way).
        self.up.pump()
        if self.state is RELAYING and self.down.readable:
            self.down.pump()

    # --- edges ------------------------------------------------------------------------

    def _on_client(self, events: int) -> None:
        if self.state is not RELAYING:
            self.early_events |= events  # input waits in the socket; the first pump reads it
            return
        if events & _INPUT:
            up = self.up
            if up.kernel is not None:
                self._kernel_edge(up, events)
            else:
                up.readable = True
                if events & _CLOSED:
                    self._closed_edge(up, events)
                up.pump()
        if events & _OUTPUT and self.state is RELAYING:
            down = self.down
            if down.kernel is None and not down.writable:  # only a blocked direction has anything to resume
                down.writable = True
                down.pump()

    def _on_backend(self, events: int) -> None:
        state = self.state
        if state is CONNECTING:
            if events & (EPOLLERR | EPOLLHUP):
                err = self.backend.getsockopt(_SOL_SOCKET, _SO_ERROR)
                if err:
                    self._connect_failed(err)
                # else: a stale event of a closed socket whose descriptor number this one reuses
            elif events & EPOLLOUT:
                self._connected(events)
            return
        if state is not RELAYING:
            return
        if events & _INPUT:
            down = self.down
            if down.kernel is not None:
                self._kernel_edge(down, events)
            else:
                down.readable = True
                if events & _CLOSED:
                    self._closed_edge(down, events)
                down.pump()
        if events & _OUTPUT and self.state is RELAYING:
            # Input edges come with EPOLLOUT set whenever the socket has room: most are not news.
            up = self.up
            if up.kernel is None and not up.writable:
                up.writable = True
                up.pump()

    def _closed_edge(self, direction: Direction, events: int) -> None:
        """The source reported a FIN or an error; a clean TCP FIN lets a short read end it."""
        if events & _CLOSED:
            direction.peer_closed = True
            direction.fin_clean = not (events & EPOLLERR) and not self.proto

    # --- the kernel relays ------------------------------------------------------------

    def to_kernel(self, direction: Direction) -> bool:
        """``direction`` turned bulk and a read just emptied its source: hand it, and the other one
        if it holds nothing, to the sockmap.

        False (it stays here) when the kernel refuses the socket.
        """
        if self.state is not RELAYING or not direction.kernel_ok or not self._may_take(direction):
            return False
        kernel = self.ctx.kernel
        if not kernel.take(direction):
            direction.kernel_ok = False
            return False
        other = self.down if direction is self.up else self.up
        if other.kernel_ok and not other.bulk_reads and self._may_take(other):
            kernel.take(other)  # its last read emptied its source: it starts at an skb boundary
        return True

    @staticmethod
    def _may_take(direction: Direction) -> bool:
        return direction.kernel is None and direction.pipe is None and not direction.pending \
            and not direction.eof and not direction.peer_closed and not direction.done

    def _kernel_edge(self, direction: Direction, events: int) -> None:
        """Input edges of a source the program reads: only its end is news."""
        if events & EPOLLERR:
            self.abort()
        elif events & (EPOLLRDHUP | EPOLLHUP) and not direction.peer_closed:
            # Redirected bytes may still wait in the peer's psock queue: the sweep passes the
            # FIN on once the destination has them all.
            direction.peer_closed = True

    def kernel_finished(self, direction: Direction) -> None:
        """The source's FIN came and the destination took every byte: half-close, as splice does."""
        self.ctx.kernel.account(direction)
        direction.finish()

    # --- relaying (called by the directions) -----------------------------------------

    def watch_client_output(self) -> None:
        if not self.client_output and self.state is RELAYING:
            self.client_output = True
            self.ctx.poller.watch_output(self.client_fd)

    def direction_done(self, direction: Direction) -> bool:
        """One direction ended cleanly; True when that closed the connection (or it was closed)."""
        if self.state is CLOSED:  # aborted by the same pump that saw the end
            return True
        other = self.down if direction is self.up else self.up
        if other.done:
            self._close(reset_both=False)
            return True
        return False

    def abort(self, exc: BaseException | None = None) -> None:
        """Tear down with resets, so the error reaches both peers (RST propagation)."""
        if self.state is CLOSED:
            return
        if self.state is CONNECTING:
            self._give_up()
            return
        self._close(reset_both=True)

    def _close(self, *, reset_both: bool) -> None:
        self.state = CLOSED
        ctx = self.ctx
        pipes = ctx.pipes
        self.up.release_pipe(pipes)
        self.down.release_pipe(pipes)
        if ctx.kernel is not None:
            ctx.kernel.account(self.up)
            ctx.kernel.account(self.down)
        ctx.poller.forget(self.client_fd)
        ctx.poller.forget(self.backend_fd)
        if reset_both:
            reset(self.client)
            reset(self.backend)
        else:
            self.client.close()
            self.backend.close()
        endpoint = self.endpoint
        endpoint.active -= 1
        if ctx.track_endpoint_conns:
            endpoint.connections.discard(self)
        self.stats.active -= 1
        self.up = self.down = None  # no cycles left: freed by reference counting, not the GC
        ctx.conn_closed(self)


class KernelRelays:
    """The directions the sockmap program relays, and the sweep that bounds their queues.

    Each sweep (every ``interval`` while any is left) reads the program's byte counts of every
    direction with one batch lookup, and a destination (TCP_INFO and SIOCOUTQ) only when its
    count ran ``limit`` past what it was last seen to have taken, or its source sent its FIN.
    A direction more than ``limit`` behind is paused (sockmap.py) and, once its destination
    took every counted byte, spliced here for the rest of the connection: putting a source
    back into the verdict map while it receives lost and repeated whole skbs on 6.18 (a
    512 MiB stream with 12 pauses and resumes came through 196,449 bytes short, 196 bytes
    repeated at 245 MiB); splicing after the pause lost nothing in the same test. A direction
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


class TcpListener:
    """A listening socket on one frontend; ``route`` is swapped whole on endpoint changes."""

    def __init__(self, ctx: RelayContext, frontend: Frontend, route: Route, proto: int = 0,
                 transparent: bool = False) -> None:
        self.ctx = ctx
        self.frontend = frontend
        self.route = route
        self.proto = proto
        #: an externalIP or LB frontend: its address may not be the node's (capture.py).
        self.transparent = transparent
        self.sock: socket.socket | None = None
        self._fd = -1
        self._paused: object | None = None
        self._family = int(socket.AF_INET)
        #: times accepting paused for lack of descriptors or memory.
        self.accept_pauses = 0

    @property
    def hold_label(self) -> str:
        return f"tcp/{self.proto}/{self.frontend.ip}/{self.frontend.port}"

    def open(self) -> None:
        family = socket.AF_INET6 if self.frontend.family == 6 else socket.AF_INET
        self._family = int(family)
        # A socket kept open across a crash has its queued connections served now.
        self.sock = self.ctx.hold.adopt_or_bind(self.hold_label, lambda: self._bind(family))
        self._fd = self.sock.fileno()
        self.ctx.loop.add_reader(self._fd, self._on_acceptable)

    def _bind(self, family: int) -> socket.socket:
        sock = socket.socket(family, _STREAM_NONBLOCK, self.proto)
        try:
            sock.setsockopt(_SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(_SOL_SOCKET, socket.SO_REUSEPORT, 1)  # workers share listeners
            capture.bind_anywhere(sock, family == socket.AF_INET6, self.transparent)  # inherited by accepted ones
            if not self.proto:
                sock.setsockopt(_IPPROTO_TCP, _TCP_NODELAY, 1)  # inherited by accepted sockets
            sock.bind((self.frontend.ip, self.frontend.port))
            sock.listen(self.ctx.config.backlog)
        except OSError:
            sock.close()
            raise
        return sock

    def close(self, *, accept_queued: bool = False) -> None:
        """Stop accepting; established connections are not touched.

        ``accept_queued``: first take the connections the kernel already queued (shutdown):
        their clients completed the handshake and expect service, not a reset.
        """
        if self.sock is None:
            return
        if self._paused is not None:
            self._paused.cancel()
            self._paused = None
        else:
            self.ctx.loop.remove_reader(self._fd)
        if accept_queued:
            while self.sock is not None and self._on_acceptable():
                pass
            if self._paused is not None:  # out of descriptors: the rest get reset
                self._paused.cancel()
                self._paused = None
            if self.sock is None:
                return  # an accept error closed it
        self.ctx.hold.release(self.hold_label)
        self.sock.close()
        self.sock = None

    def _on_acceptable(self) -> bool:
        """Accept one batch; True when the batch was full (more may be queued)."""
        # _accept() + the C socket type is socket.accept() without its Python layer. The accepted
        # socket stays blocking (accept4 without SOCK_NONBLOCK; an ioctl would cost a syscall):
        # the relay passes MSG_DONTWAIT, and makes it non-blocking only to splice.
        accept = self.sock._accept
        family, proto = self._family, self.proto
        for _ in range(_ACCEPT_BATCH):
            try:
                fd, address = accept()
            except BlockingIOError:
                return False
            except OSError as exc:
                if exc.errno in _ACCEPT_SKIP:
                    continue
                if exc.errno in _ACCEPT_PAUSE:
                    self._pause(exc)
                    return False
                self._fail(exc)
                return False
            self._place(RawSocket(family, _STREAM, proto, fd), address[0])
        return True

    def _place(self, client: RawSocket, client_ip: str) -> None:
        ctx = self.ctx
        route = self.route
        route.stats.total += 1
        candidates, keys = route.candidates, route.keys
        if route.local_candidates is not None and ctx.local_clients(client_ip):
            candidates, keys = route.local_candidates, route.local_keys
        endpoint = route.balancer.pick(candidates, keys, client_ip, ctx.clock())
        if endpoint is None:
            route.stats.connect_giveups += 1
            reset(client)
            return
        Conn(ctx, route, client, client_ip, candidates, keys, self.proto).connect(endpoint)

    def _pause(self, exc: OSError) -> None:
        self.accept_pauses += 1
        log.warning("%s: accept failed (%s); pausing %.2fs", self.frontend, exc, self.ctx.config.accept_pause)
        self.ctx.loop.remove_reader(self._fd)
        self._paused = self.ctx.loop.call_later(self.ctx.config.accept_pause, self._resume)

    def _resume(self) -> None:
        self._paused = None
        if self.sock is not None:
            self.ctx.loop.add_reader(self._fd, self._on_acceptable)

    def _fail(self, exc: OSError) -> None:
        log.error("%s: accept failed: %s", self.frontend, exc)
        self.close()
        self.ctx.on_fatal(exc)

"""One relayed TCP (or SCTP stream) connection: connect with retry, then relay.

The listener that accepts it is tcp_listener.py; the sockmap's side is kernel_relays.py.
Per connection: one non-blocking connect, two registrations in the edge
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
(``KernelRelays``, kernel_relays.py).
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
from kubeport.proxy.proxyprotocol import send_header
from kubeport.proxy.relay.context import RelayContext
from kubeport.proxy.relay.direction import Direction
from kubeport.proxy.relay.poller import EDGE_INPUT, EPOLLERR, EPOLLHUP, EPOLLIN, EPOLLOUT, EPOLLRDHUP

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
        keep = self.route.keep
        if keep and self.ctx.client_addresses.keeps(keep, self.client_ip, endpoint.ip):
            try:
                self.ctx.bind_client_address(backend, family, self.client_ip)
            except OSError as exc:
                # The client's address cannot be bound (gone, or no privilege): the node's then.
                log.debug("upstream of %s from the node's address: %s", self.client_ip, exc)
                backend.close()
                backend = self.backend = self.ctx.backend_socket(family, _STREAM_NONBLOCK, self.proto)
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
        if self.route.proxy_protocol:  # the header goes first, before any relayed byte
            try:
                client_address = self.client.getpeername()
            except OSError:  # the client has gone already
                self._give_up()
                return
            try:
                send_header(self.client, self.backend, client_address)
            except OSError as exc:  # the backend reset at once: as a failed connect
                self._connect_failed(exc.errno or errno.EIO)
                return
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

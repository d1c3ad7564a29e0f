"""A TCP (or SCTP stream) frontend's listening socket and its accept loop.

Accepts in batches on the loop's reader callback, picks an endpoint and hands each
client to a ``Conn`` (tcp.py). Pauses on descriptor or memory shortage.
"""

from __future__ import annotations

import errno
import logging
import socket

from kubeport.lib.lograte import limit_repeats
from kubeport.proxy.balancer import Route
from kubeport.proxy.host import capture
from kubeport.proxy.relay.context import RelayContext
from kubeport.proxy.relay.tcp import Conn, RawSocket, reset
from kubeport.proxy.table import Frontend

log = logging.getLogger(__name__)
limit_repeats(log)  # one failing frontend fails every accept alike

_SOL_SOCKET = socket.SOL_SOCKET
_IPPROTO_TCP = socket.IPPROTO_TCP
_TCP_NODELAY = socket.TCP_NODELAY
_STREAM_NONBLOCK = socket.SOCK_STREAM | socket.SOCK_NONBLOCK
_STREAM = int(socket.SOCK_STREAM)
_ACCEPT_BATCH = 64
#: the descriptor or memory shortage errors: pause accepting, then retry (trio's list).
_ACCEPT_PAUSE = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
#: the client went away between SYN and accept, or a firewall refused it: next one.
_ACCEPT_SKIP = {errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.EINTR}


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

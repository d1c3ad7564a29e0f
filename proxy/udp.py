"""UDP frontends: a flow table of connected upstream sockets, replies sent from the frontend.

Each client address gets a flow: one socket connected to the chosen endpoint.
Datagrams from the client go out on it; datagrams coming back are sent to the
client from the listening socket, which is bound to the frontend address, so the
reply's source is the address the client talked to. Flows expire after
``udp_idle_timeout`` without traffic either way (one timer per listener), and
are dropped at once when their endpoint leaves the route.
"""

from __future__ import annotations

import errno
import logging
import socket

from .balancer import Route
from .context import RelayContext
from .flows import Admission, Flow, FlowTable
from .table import Frontend

log = logging.getLogger(__name__)

_DGRAM_NONBLOCK = socket.SOCK_DGRAM | socket.SOCK_NONBLOCK
_IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)
_IPV6_FREEBIND = 78
_BATCH = 64
#: an ICMP error from the endpoint, reported on the connected socket.
_ENDPOINT_ERRORS = {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH}


class UdpListener:
    def __init__(self, ctx: RelayContext, frontend: Frontend, route: Route) -> None:
        self.ctx = ctx
        self.frontend = frontend
        self._route = route
        config = ctx.config
        self.flows: FlowTable[socket.socket] = FlowTable(
            config.udp_idle_timeout, config.udp_max_flows, config.udp_max_flows_per_client
        )
        self.sock: socket.socket | None = None
        self._fd = -1
        self._timer = None
        #: shutting down: serve until the flows are gone, then close.
        self._draining = False

    @property
    def route(self) -> Route:
        return self._route

    @route.setter
    def route(self, route: Route) -> None:
        """Swap the endpoints; flows to an endpoint the new route lacks are dropped at once."""
        self._route = route
        for flow in self.flows.remove_unless(route.all_keys()):
            self._release(flow)

    def open(self) -> None:
        family = socket.AF_INET6 if self.frontend.family == 6 else socket.AF_INET
        sock = socket.socket(family, _DGRAM_NONBLOCK)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.setsockopt(socket.IPPROTO_IPV6, _IPV6_FREEBIND, 1)
            else:
                sock.setsockopt(socket.IPPROTO_IP, _IP_FREEBIND, 1)
            sock.bind((self.frontend.ip, self.frontend.port))
        except OSError:
            sock.close()
            raise
        self.sock = sock
        self._fd = sock.fileno()
        self.ctx.loop.add_reader(self._fd, self._on_datagrams)

    def drain(self, *, hand_over: bool = False) -> None:
        """Shutdown: keep serving (closing would orphan the flows), close once no flow is left.

        ``hand_over``: a successor bound the same frontend (SO_REUSEPORT). Connecting this
        socket to its own address takes it out of the kernel's choice for new datagrams
        (a connected socket only matches its peer), so every client, old or new, now
        reaches the successor; the replies of this socket's flows still go out through
        it (sendto works on a connected UDP socket) until the flows are idle.
        """
        if self.sock is None:
            return
        self._draining = True
        self.ctx.draining.add(self)
        if hand_over:
            try:
                self.sock.connect(self.sock.getsockname())
            except OSError as exc:
                log.warning("%s: cannot step aside for the successor: %s", self.frontend, exc)
        if not len(self.flows):
            self.close()

    def close(self) -> None:
        if self.sock is None:
            return
        self.ctx.loop.remove_reader(self._fd)
        self.sock.close()
        self.sock = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for flow in self.flows.clear():
            self._release(flow)
        if self._draining:
            self.ctx.udp_drained(self)

    # --- client -> endpoint -------------------------------------------------------------

    def _on_datagrams(self) -> None:
        sock = self.sock
        flows = self.flows
        ctx = self.ctx
        buffer, view = ctx.datagram_buffer, ctx.datagram_view
        now = ctx.clock()
        stats = self._route.stats
        for _ in range(_BATCH):
            try:
                size, client = sock.recvfrom_into(buffer)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in _ENDPOINT_ERRORS:
                    continue  # an ICMP error for a reply we sent to a client: nothing to do
                log.error("%s: receive failed: %s", self.frontend, exc)
                self.close()
                ctx.on_fatal(exc)
                return
            flow = flows.get(client, now)
            if flow is None:
                flow = self._new_flow(client, now)
                if flow is None:
                    continue
            try:
                flow.handle.send(view[:size])
            except BlockingIOError:
                continue  # UDP: a full socket buffer drops, as the network would
            except OSError as exc:
                self._endpoint_failed(flow, exc)
                if self.sock is None:
                    return  # that was a draining frontend's last flow
                continue
            stats.bytes_to_backend += size

    def _new_flow(self, client, now: float) -> Flow | None:
        route = self._route
        client_ip = client[0]
        admission = self.flows.admit(client_ip)
        if admission is not Admission.OK:
            route.stats.udp_flows_rejected += 1
            return None
        candidates, keys = route.candidates, route.keys
        if route.local_candidates is not None and self.ctx.local_clients(client_ip):
            candidates, keys = route.local_candidates, route.local_keys
        endpoint = route.balancer.pick(candidates, keys, client_ip, now)
        if endpoint is None:
            return None
        upstream = socket.socket(socket.AF_INET6 if endpoint.family == 6 else socket.AF_INET, _DGRAM_NONBLOCK)
        try:
            upstream.connect(endpoint.sockaddr)
        except OSError as exc:
            upstream.close()
            route.balancer.connect_failed(endpoint, now)
            log.debug("%s: UDP connect to %s failed: %s", self.frontend, endpoint.key, exc)
            return None
        flow = self.flows.add(client, client_ip, endpoint, upstream, now)
        endpoint.active += 1  # flows count as load for the balancer's choice
        route.stats.udp_flows += 1
        route.stats.udp_flows_total += 1
        self.ctx.loop.add_reader(upstream.fileno(), self._on_replies, flow)
        if self._timer is None:
            self._arm_timer()
        return flow

    # --- endpoint -> client -------------------------------------------------------------

    def _on_replies(self, flow: Flow) -> None:
        upstream = flow.handle
        sock = self.sock
        ctx = self.ctx
        buffer, view = ctx.datagram_buffer, ctx.datagram_view
        stats = self._route.stats
        client = flow.client
        for _ in range(_BATCH):
            try:
                size = upstream.recv_into(buffer)
            except BlockingIOError:
                break
            except OSError as exc:
                self._endpoint_failed(flow, exc)
                return
            try:
                sock.sendto(view[:size], client)
            except OSError:
                continue  # a client that cannot take a datagram loses it, as with a router
            stats.bytes_to_client += size
        self.flows.touch(flow, self.ctx.clock())

    def _endpoint_failed(self, flow: Flow, exc: OSError) -> None:
        """The endpoint answered with an ICMP error: count it, let the next datagram pick again."""
        if exc.errno not in _ENDPOINT_ERRORS:
            log.warning("%s: UDP flow %s -> %s: %s", self.frontend, flow.client, flow.endpoint.key, exc)
        self._route.balancer.connect_failed(flow.endpoint, self.ctx.clock())
        if self.flows.remove(flow):
            self._release(flow)

    # --- expiry ---------------------------------------------------------------------------

    def _arm_timer(self) -> None:
        deadline = self.flows.next_expiry()
        if deadline is None:
            self._timer = None
            return
        delay = max(deadline - self.ctx.clock(), 0.0)
        self._timer = self.ctx.loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        for flow in self.flows.expire(self.ctx.clock()):
            self._release(flow)
        self._arm_timer()

    def _release(self, flow: Flow) -> None:
        upstream = flow.handle
        self.ctx.loop.remove_reader(upstream.fileno())
        upstream.close()
        flow.endpoint.active -= 1
        self._route.stats.udp_flows -= 1
        if self._draining and self.sock is not None and not len(self.flows):
            self.close()

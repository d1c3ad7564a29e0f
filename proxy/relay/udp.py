"""UDP frontends: a flow table of connected upstream sockets, replies sent from the frontend.

Each client address gets a flow: one socket connected to the chosen endpoint.
Datagrams from the client go out on it; datagrams coming back are sent to the
client from the listening socket, which is bound to the frontend address, so the
reply's source is the address the client talked to. Flows expire after
``udp_idle_timeout`` without traffic either way, an answered flow in use for over 2 s
after ``udp_stream_timeout`` (conntrack's two UDP timeouts; one timer per listener), and
are dropped at once when their endpoint leaves the route.

I/O is batched (datagrams.py): one recvmmsg per readiness of a frontend, one sendmmsg
per flow for its datagrams of that batch; replies of every flow that is ready in one
poller dispatch are read with a recvmmsg each and leave with one sendmmsg per
frontend at the end of the dispatch. A flow is keyed by the client's sockaddr as
received, which is also where its replies are addressed: no address tuple per
datagram. Frontend and upstream sockets sit level-triggered in the relay's poller.
"""

from __future__ import annotations

import errno
import logging
import os
import socket

from kubeport.lib import mmsg
from kubeport.lib.lograte import limit_repeats
from kubeport.lib.sockbuf import enlarge_receive_buffer
from kubeport.proxy.balancer import Route
from kubeport.proxy.flows import Admission, Flow, FlowTable
from kubeport.proxy.host import capture
from kubeport.proxy.relay import datagrams
from kubeport.proxy.relay.context import RelayContext
from kubeport.proxy.relay.poller import LEVEL_INPUT
from kubeport.proxy.table import Frontend

log = logging.getLogger(__name__)
limit_repeats(log)  # one failing client or endpoint fails every connection alike

_DGRAM_NONBLOCK = socket.SOCK_DGRAM | socket.SOCK_NONBLOCK
#: datagrams read per readiness of a frontend, and replies gathered per poller dispatch.
BATCH = 64
#: recvmmsg calls per ready flow and dispatch: a flow that keeps its socket full shares the loop.
_REPLY_READS = 4
#: an ICMP error from the endpoint, reported on the connected socket.
_ENDPOINT_ERRORS = {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH}
_FULL = {errno.EAGAIN, errno.ENOBUFS}


class Upstream:
    """A flow's connected socket; called by the poller when replies wait on it."""

    __slots__ = ("listener", "flow", "sock", "fd", "name_address", "name_length")

    def __init__(self, listener: "UdpListener", sock: socket.socket, name: bytes) -> None:
        self.listener = listener
        self.flow: Flow | None = None
        self.sock = sock
        self.fd = sock.fileno()
        #: the client's sockaddr (the flow's key, kept alive by the flow table) for msg_name
        self.name_address = datagrams.buffer_address(name)
        self.name_length = len(name)

    def __call__(self, events: int) -> None:
        self.listener.on_replies(self)


class ReplyBatch:
    """Replies read in one poller dispatch, for every UDP frontend of a relay context."""

    def __init__(self, ctx: RelayContext) -> None:
        self.ctx = ctx
        self.slots = datagrams.Outbound(BATCH)
        #: [listener, first slot, count] in slot order; a listener's runs in a row are merged.
        self.runs: list[list] = []
        #: the client addresses the gathered replies point at, alive until they are sent
        #: (a flow may be released before the end of the dispatch).
        self.names: list[bytes] = []
        self.scheduled = False

    def add(self, listener: "UdpListener", start: int, count: int, name: bytes) -> None:
        self.names.append(name)
        runs = self.runs
        if runs and runs[-1][0] is listener and runs[-1][1] + runs[-1][2] == start:
            runs[-1][2] += count
        else:
            runs.append([listener, start, count])
        if not self.scheduled:
            self.scheduled = True
            self.ctx.poller.defer(self.flush)

    def flush(self) -> None:
        self.scheduled = False
        runs, self.runs = self.runs, []
        slots = self.slots
        for listener, start, count in runs:
            if listener.sock is not None:  # a frontend closed since: its replies are dropped
                slots.send(listener.fd, start, count)
        slots.used = 0
        self.names.clear()


def _batches(ctx: RelayContext) -> tuple[datagrams.Inbound, ReplyBatch]:
    """The context's datagram buffers, made by the first UDP frontend (TCP-only relays have none)."""
    batches = ctx.udp_batches
    if batches is None:
        if not mmsg.available():
            raise OSError(errno.ENOSYS, "the UDP relay needs recvmmsg/sendmmsg (64-bit Linux)")
        batches = ctx.udp_batches = (datagrams.Inbound(BATCH), ReplyBatch(ctx))
    return batches


class UdpListener:
    def __init__(self, ctx: RelayContext, frontend: Frontend, route: Route, transparent: bool = False) -> None:
        self.ctx = ctx
        self.frontend = frontend
        self._route = route
        #: an externalIP or LB frontend: replies may leave from an address the node lacks (capture.py).
        self.transparent = transparent
        config = ctx.config
        self.flows: FlowTable[Upstream] = FlowTable(
            config.udp_idle_timeout, config.udp_max_flows, config.udp_max_flows_per_client, config.udp_stream_timeout
        )
        self.sock: socket.socket | None = None
        self.fd = -1
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

    @property
    def hold_label(self) -> str:
        return f"udp/{self.frontend.ip}/{self.frontend.port}"

    def open(self) -> None:
        self._inbound, self._replies = _batches(self.ctx)
        family = socket.AF_INET6 if self.frontend.family == 6 else socket.AF_INET
        # A socket kept open across a crash has its queued datagrams answered now.
        self.sock = self.ctx.hold.adopt_or_bind(self.hold_label, lambda: self._bind(family))
        self.fd = self.sock.fileno()
        self.ctx.poller.register(self.fd, self._on_datagrams, LEVEL_INPUT)

    def _bind(self, family: int) -> socket.socket:
        sock = socket.socket(family, _DGRAM_NONBLOCK)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            capture.bind_anywhere(sock, family == socket.AF_INET6, self.transparent)
            # kube-proxy's DNAT has no queue to overflow; here a burst of new clients waits
            # while their flows are made, and the default buffer is too small to hold it.
            enlarge_receive_buffer(sock)
            sock.bind((self.frontend.ip, self.frontend.port))
        except OSError:
            sock.close()
            raise
        return sock

    def drain(self, *, hand_over: bool = False) -> None:
        """Shutdown: keep serving (closing would orphan the flows), close once no flow is left.

        ``hand_over``: a successor bound the same frontend (SO_REUSEPORT). Connecting this
        socket to its own address takes it out of the kernel's choice for new datagrams
        (a connected socket only matches its peer), so every client, old or new, now
        reaches the successor; the replies of this socket's flows still go out through
        it (sendmmsg with an address works on a connected UDP socket) until the flows are idle.
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
        self.ctx.poller.forget(self.fd)
        self.ctx.hold.release(self.hold_label)
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

    def _on_datagrams(self, events: int) -> None:
        inbound = self._inbound
        try:
            fields = inbound.receive(self.fd)
        except OSError as exc:
            if exc.errno in _ENDPOINT_ERRORS:
                return  # an ICMP error for a reply we sent to a client: nothing to do
            log.error("%s: receive failed: %s", self.frontend, exc)
            self.close()
            self.ctx.on_fatal(exc)
            return
        # Group the batch by client: (namelen, flags, length) per datagram.
        by_client: dict[bytes, list[int]] = {}
        set_length, name_of = inbound.set_length, inbound.name
        slot = 0
        for i in range(0, len(fields), 3):
            set_length(slot, fields[i + 2])
            name = name_of(slot, fields[i])
            held = by_client.get(name)
            if held is None:
                by_client[name] = [slot]
            else:
                held.append(slot)
            slot += 1
        now = self.ctx.clock()
        flows = self.flows
        sent_bytes = 0
        for name, slots in by_client.items():
            flow = flows.get(name, now)
            if flow is None:
                flow = self._new_flow(name, now)
                if flow is None:
                    continue
            sent, error = inbound.send(flow.handle.fd, slots)
            if error and error not in _FULL:  # a full socket buffer drops, as the network would
                self._endpoint_failed(flow, OSError(error, os.strerror(error)))
                if self.sock is None:
                    return  # that was a draining frontend's last flow
            for position in range(sent):
                sent_bytes += fields[3 * slots[position] + 2]
        self._route.stats.bytes_to_backend += sent_bytes

    def _new_flow(self, name: bytes, now: float) -> Flow | None:
        route = self._route
        client = mmsg.address_of(name)
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
        family = socket.AF_INET6 if endpoint.family == 6 else socket.AF_INET
        sock = socket.socket(family, _DGRAM_NONBLOCK)
        try:
            if route.keep and self.ctx.client_addresses.keeps(route.keep, client_ip, endpoint.ip):
                try:
                    self.ctx.bind_client_address(sock, family, client_ip)
                except OSError as exc:  # the node's address then
                    log.debug("UDP flow of %s from the node's address: %s", client_ip, exc)
                    sock.close()
                    sock = socket.socket(family, _DGRAM_NONBLOCK)
            sock.connect(endpoint.sockaddr)
        except OSError as exc:
            sock.close()
            route.balancer.connect_failed(endpoint, now)
            log.debug("%s: UDP connect to %s failed: %s", self.frontend, endpoint.key, exc)
            return None
        upstream = Upstream(self, sock, name)
        flow = self.flows.add(name, client_ip, endpoint, upstream, now)
        upstream.flow = flow
        endpoint.active += 1  # flows count as load for the balancer's choice
        route.stats.udp_flows += 1
        route.stats.udp_flows_total += 1
        self.ctx.poller.register(upstream.fd, upstream, LEVEL_INPUT)
        if self._timer is None:
            self._arm_timer()
        return flow

    # --- endpoint -> client -------------------------------------------------------------

    def on_replies(self, upstream: Upstream) -> None:
        """Read the flow's replies into the shared batch; they leave at the end of the dispatch."""
        flow = upstream.flow
        if flow is None:
            return  # released earlier in this dispatch
        replies = self._replies
        slots = replies.slots
        received = 0
        for _ in range(_REPLY_READS):
            if slots.full():
                replies.flush()
            start, room = slots.used, slots.count - slots.used
            try:
                sizes = slots.receive(upstream.fd, upstream.name_address, upstream.name_length)
            except OSError as exc:
                self._endpoint_failed(flow, exc)
                return
            if not sizes:
                break
            replies.add(self, start, len(sizes), flow.client)
            received += sum(sizes)
            if len(sizes) < room:
                break  # the socket is empty
        if received:
            self._route.stats.bytes_to_client += received
            self.flows.touch(flow, self.ctx.clock())

    def _endpoint_failed(self, flow: Flow, exc: OSError) -> None:
        """The endpoint answered with an ICMP error: count it, let the next datagram pick again."""
        if exc.errno not in _ENDPOINT_ERRORS:
            log.warning("%s: UDP flow %s -> %s: %s", self.frontend, mmsg.address_of(flow.client),
                        flow.endpoint.key, exc)
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
        upstream.flow = None
        self.ctx.poller.forget(upstream.fd)
        upstream.sock.close()
        flow.endpoint.active -= 1
        self._route.stats.udp_flows -= 1
        if self._draining and self.sock is not None and not len(self.flows):
            self.close()

"""The UDP flow table, sans-IO: client address -> flow, idle expiry with ``now``, limits.

A flow is one client address talking to one endpoint through one frontend, like a
conntrack entry. Traffic either way refreshes it (conntrack does too), and its timeout is
conntrack's: ``idle_timeout`` (nf_conntrack_udp_timeout, 30 s), or ``stream_timeout``
(nf_conntrack_udp_timeout_stream, 120 s) once the endpoint has answered and the flow is
still in use :data:`STREAM_AFTER` seconds after it began (the kernel's ``stream_ts``): a
DNS-like exchange goes after 30 s, a QUIC or VPN session survives a quiet minute. Each
kind is kept in least-recently-used order in a table of its own, so expiry looks only at
the oldest entries of each: its cost grows with what expires, not with the table.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from typing import Any, Collection, Generic, Hashable, Iterator, TypeVar

H = TypeVar("H")

#: seconds after its first datagram from which a flow that has had a reply is a stream.
STREAM_AFTER = 2.0


class Admission(enum.Enum):
    OK = "ok"
    TABLE_FULL = "table full"
    CLIENT_LIMIT = "client limit"


class Flow(Generic[H]):
    __slots__ = ("client", "client_ip", "endpoint", "handle", "last_seen", "created", "replied", "stream")

    def __init__(self, client: Hashable, client_ip: str, endpoint: Any, handle: H, now: float) -> None:
        self.client = client
        self.client_ip = client_ip
        #: the endpoint (anything with a ``key``) the flow was placed on.
        self.endpoint = endpoint
        #: the I/O side's object (the connected upstream socket); opaque here.
        self.handle = handle
        self.last_seen = now
        self.created = now
        #: the endpoint has answered (conntrack's SEEN_REPLY).
        self.replied = False
        #: kept for the stream timeout (conntrack's ASSURED UDP entry).
        self.stream = False

    def __repr__(self) -> str:
        return f"<Flow {self.client!r} -> {getattr(self.endpoint, 'key', self.endpoint)}>"


class FlowTable(Generic[H]):
    def __init__(self, idle_timeout: float, max_flows: int, max_flows_per_client: int,
                 stream_timeout: float | None = None) -> None:
        self.idle_timeout = idle_timeout
        #: None when not longer than ``idle_timeout``: one timeout for every flow.
        self.stream_timeout = stream_timeout if stream_timeout and stream_timeout > idle_timeout else None
        self.max_flows = max_flows
        self.max_flows_per_client = max_flows_per_client
        self._flows: OrderedDict[Hashable, Flow[H]] = OrderedDict()
        self._streams: OrderedDict[Hashable, Flow[H]] = OrderedDict()
        self._per_client: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._flows) + len(self._streams)

    def __iter__(self) -> Iterator[Flow[H]]:
        return iter([*self._flows.values(), *self._streams.values()])

    def get(self, client: Hashable, now: float) -> Flow[H] | None:
        """The client's flow, refreshed; None if it has none."""
        flow = self._flows.get(client)
        if flow is not None:
            flow.last_seen = now
            if flow.replied and self.stream_timeout is not None and now - flow.created >= STREAM_AFTER:
                self._promote(flow)
            else:
                self._flows.move_to_end(client)
            return flow
        flow = self._streams.get(client)
        if flow is not None:
            flow.last_seen = now
            self._streams.move_to_end(client)
        return flow

    def touch(self, flow: Flow[H], now: float) -> None:
        """Traffic from the endpoint back to the client: keeps the flow alive, and marks it answered."""
        flow.last_seen = now
        if flow.stream:
            self._streams.move_to_end(flow.client)
            return
        flow.replied = True
        if self.stream_timeout is not None and now - flow.created >= STREAM_AFTER:
            self._promote(flow)
        else:
            self._flows.move_to_end(flow.client)

    def _promote(self, flow: Flow[H]) -> None:
        del self._flows[flow.client]
        flow.stream = True
        self._streams[flow.client] = flow

    def admit(self, client_ip: str) -> Admission:
        if len(self._flows) >= self.max_flows:
            return Admission.TABLE_FULL
        if self._per_client.get(client_ip, 0) >= self.max_flows_per_client:
            return Admission.CLIENT_LIMIT
        return Admission.OK

    def add(self, client: Hashable, client_ip: str, endpoint: Any, handle: H, now: float) -> Flow[H]:
        if client in self._flows or client in self._streams:
            raise KeyError(f"flow for {client!r} exists")
        flow = Flow(client, client_ip, endpoint, handle, now)
        self._flows[client] = flow
        self._per_client[client_ip] = self._per_client.get(client_ip, 0) + 1
        return flow

    def remove(self, flow: Flow[H]) -> bool:
        flows = self._streams if flow.stream else self._flows
        if flows.get(flow.client) is not flow:
            return False
        del flows[flow.client]
        left = self._per_client[flow.client_ip] - 1
        if left:
            self._per_client[flow.client_ip] = left
        else:
            del self._per_client[flow.client_ip]
        return True

    def expire(self, now: float, limit: int = 4096) -> list[Flow[H]]:
        """Remove and return flows idle past their timeout (at most ``limit`` per call)."""
        expired: list[Flow[H]] = []
        for flows, timeout in self._timed():
            deadline = now - timeout
            while flows and len(expired) < limit:
                oldest = next(iter(flows.values()))
                if oldest.last_seen > deadline:
                    break
                self.remove(oldest)
                expired.append(oldest)
        return expired

    def next_expiry(self) -> float | None:
        """When the first flow expires if nothing refreshes it; None if the table is empty."""
        due = [next(iter(flows.values())).last_seen + timeout for flows, timeout in self._timed() if flows]
        return min(due) if due else None

    def _timed(self) -> list[tuple[OrderedDict[Hashable, Flow[H]], float]]:
        timed = [(self._flows, self.idle_timeout)]
        if self.stream_timeout is not None:
            timed.append((self._streams, self.stream_timeout))
        return timed

    def remove_unless(self, endpoint_keys: Collection[str]) -> list[Flow[H]]:
        """Remove and return flows whose endpoint is not among ``endpoint_keys`` (endpoint removed).

        kube-proxy clears such conntrack entries after a sync; here they go at once,
        so the client's next datagram is placed on a live endpoint.
        """
        stale = [f for f in self if f.endpoint.key not in endpoint_keys]
        for flow in stale:
            self.remove(flow)
        return stale

    def clear(self) -> list[Flow[H]]:
        flows = list(self)
        self._flows.clear()
        self._streams.clear()
        self._per_client.clear()
        return flows

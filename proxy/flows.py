"""The UDP flow table, sans-IO: client address -> flow, idle expiry with ``now``, limits.

A flow is one client address talking to one endpoint through one frontend, like a
conntrack entry. Traffic either way refreshes it (conntrack does too); a flow idle
for ``idle_timeout`` seconds expires. Entries are kept in least-recently-used
order, so expiry looks only at the oldest entries: its cost grows with what
expires, not with the table.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from typing import Any, Collection, Generic, Hashable, Iterator, TypeVar

H = TypeVar("H")


class Admission(enum.Enum):
    OK = "ok"
    TABLE_FULL = "table full"
    CLIENT_LIMIT = "client limit"


class Flow(Generic[H]):
    __slots__ = ("client", "client_ip", "endpoint", "handle", "last_seen")

    def __init__(self, client: Hashable, client_ip: str, endpoint: Any, handle: H, now: float) -> None:
        self.client = client
        self.client_ip = client_ip
        #: the endpoint (anything with a ``key``) the flow was placed on.
        self.endpoint = endpoint
        #: the I/O side's object (the connected upstream socket); opaque here.
        self.handle = handle
        self.last_seen = now

    def __repr__(self) -> str:
        return f"<Flow {self.client!r} -> {getattr(self.endpoint, 'key', self.endpoint)}>"


class FlowTable(Generic[H]):
    def __init__(self, idle_timeout: float, max_flows: int, max_flows_per_client: int) -> None:
        self.idle_timeout = idle_timeout
        self.max_flows = max_flows
        self.max_flows_per_client = max_flows_per_client
        self._flows: OrderedDict[Hashable, Flow[H]] = OrderedDict()
        self._per_client: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._flows)

    def __iter__(self) -> Iterator[Flow[H]]:
        return iter(list(self._flows.values()))

    def get(self, client: Hashable, now: float) -> Flow[H] | None:
        """The client's flow, refreshed; None if it has none."""
        flow = self._flows.get(client)
        if flow is not None:
            flow.last_seen = now
            self._flows.move_to_end(client)
        return flow

    def touch(self, flow: Flow[H], now: float) -> None:
        """Traffic from the endpoint back to the client also keeps a flow alive."""
        flow.last_seen = now
        self._flows.move_to_end(flow.client)

    def admit(self, client_ip: str) -> Admission:
        if len(self._flows) >= self.max_flows:
            return Admission.TABLE_FULL
        if self._per_client.get(client_ip, 0) >= self.max_flows_per_client:
            return Admission.CLIENT_LIMIT
        return Admission.OK

    def add(self, client: Hashable, client_ip: str, endpoint: Any, handle: H, now: float) -> Flow[H]:
        if client in self._flows:
            raise KeyError(f"flow for {client!r} exists")
        flow = Flow(client, client_ip, endpoint, handle, now)
        self._flows[client] = flow
        self._per_client[client_ip] = self._per_client.get(client_ip, 0) + 1
        return flow

    def remove(self, flow: Flow[H]) -> bool:
        if self._flows.get(flow.client) is not flow:
            return False
        del self._flows[flow.client]
        left = self._per_client[flow.client_ip] - 1
        if left:
            self._per_client[flow.client_ip] = left
        else:
            del self._per_client[flow.client_ip]
        return True

    def expire(self, now: float, limit: int = 4096) -> list[Flow[H]]:
        """Remove and return flows idle for ``idle_timeout`` (at most ``limit`` per call)."""
        expired = []
        deadline = now - self.idle_timeout
        flows = self._flows
        while flows and len(expired) < limit:
            oldest = next(iter(flows.values()))
            if oldest.last_seen > deadline:
                break
            self.remove(oldest)
            expired.append(oldest)
        return expired

    def next_expiry(self) -> float | None:
        """When the oldest flow expires if nothing refreshes it; None if the table is empty."""
        if not self._flows:
            return None
        return next(iter(self._flows.values())).last_seen + self.idle_timeout

    def remove_unless(self, endpoint_keys: Collection[str]) -> list[Flow[H]]:
        """Remove and return flows whose endpoint is not among ``endpoint_keys`` (endpoint removed).

        kube-proxy clears such conntrack entries after a sync; here they go at once,
        so the client's next datagram is placed on a live endpoint.
        """
        stale = [f for f in self._flows.values() if f.endpoint.key not in endpoint_keys]
        for flow in stale:
            self.remove(flow)
        return stale

    def clear(self) -> list[Flow[H]]:
        flows = list(self._flows.values())
        self._flows.clear()
        self._per_client.clear()
        return flows

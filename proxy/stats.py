"""Per service port counters. One object per ServicePortName, so cardinality is bounded by the services."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ServicePortStats:
    #: TCP connections being relayed now.
    active: int = 0
    #: TCP connections accepted since the port appeared.
    total: int = 0
    #: bytes client -> backend (TCP and UDP).
    bytes_to_backend: int = 0
    #: bytes backend -> client (TCP and UDP).
    bytes_to_client: int = 0
    #: backend connects that failed (refused, unreachable, timed out).
    connect_failures: int = 0
    #: TCP clients reset because no endpoint could be reached.
    connect_giveups: int = 0
    #: endpoints ejected by passive outlier detection.
    ejections: int = 0
    #: UDP flows open now.
    udp_flows: int = 0
    #: UDP flows opened since the port appeared.
    udp_flows_total: int = 0
    #: UDP datagrams dropped because a flow limit was reached.
    udp_flows_rejected: int = 0

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}

"""The proxy's own health, kube-proxy's ``/healthz`` and ``/livez``, sans-IO.

Restated from ``pkg/proxy/healthcheck/proxy_health.go`` (newest version, KEP-3836):

* ``queued_update(now)`` when a change the proxy must apply arrives (only the oldest
  pending time is kept); ``updated(now)`` after it was applied.
* A family is unhealthy when it has an update pending for ``health_timeout`` or longer
  (kube-proxy: 2 x syncPeriod = 60 s). Families that never completed an update are not
  judged (kube-proxy's quirk: healthy while starting up; ``/readyz`` covers startup).
* ``/livez``: 200 iff every family is healthy. ``/healthz``: 200 iff healthy **and**
  the node is eligible (Node object known, not being deleted, no
  ``ToBeDeletedByClusterAutoscaler`` taint: :attr:`NodeInfo.eligible`), so eTP=Cluster
  load balancers drain nodes being scaled down; liveness probes should use ``/livez``.
* Bodies are kube-proxy's newest JSON; when healthy ``lastUpdated`` is reported as the
  current time, as kube-proxy does for backwards compatibility.

``now`` is wall-clock POSIX time (``time.time()``): the bodies print it as timestamps.
Nothing here reads a clock, opens a socket or logs.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable

from kubeport.endpoints.types import NodeInfo

#: kube-proxy's healthTimeout: 2 x the default syncPeriod of 30 s.
DEFAULT_HEALTH_TIMEOUT = 60.0
IPV4 = "IPv4"
IPV6 = "IPv6"
#: What kube-proxy sets on every health response (proxy and service health checks).
JSON_HEADERS = (("Content-Type", "application/json"), ("X-Content-Type-Options", "nosniff"))
#: Go's zero time.Time, printed for "never".
GO_ZERO_TIME = "0001-01-01T00:00:00Z"


@dataclass(frozen=True, slots=True)
class FamilyHealth:
    last_updated: float
    healthy: bool


@dataclass(frozen=True, slots=True)
class HealthStatus:
    """kube-proxy's ProxyHealth: the state at one instant."""

    healthy: bool
    #: most recent update of any family; None before the first one.
    last_updated: float | None
    current_time: float
    #: per family that has completed at least one update.
    families: dict[str, FamilyHealth]


@dataclass(frozen=True, slots=True)
class HealthResponse:
    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = JSON_HEADERS


class ProxyHealth:
    def __init__(
        self,
        health_timeout: float = DEFAULT_HEALTH_TIMEOUT,
        *,
        families: Iterable[str] = (IPV4,),
        require_node: bool = True,
    ) -> None:
        """
        :param health_timeout: how long an update may stay pending before the proxy is unhealthy.
        :param families: the IP families the proxy serves; ``queued_update``/``updated``
            without a family apply to all of them.
        :param require_node: True (kube-proxy's newest rule): no Node object means "not
            eligible". False: an unknown node counts as eligible (kube-proxy before
            KEP-3836's node manager; manifest mode without a Node manifest).
        """
        self.health_timeout = health_timeout
        self.families = tuple(families)
        self.require_node = require_node
        self._last_updated: dict[str, float] = {}
        self._oldest_pending: dict[str, float] = {}
        self._node: NodeInfo | None = None
        #: responses served, by status code (kubeproxy_proxy_healthz_total / _livez_total).
        self.healthz_total: Counter[int] = Counter()
        self.livez_total: Counter[int] = Counter()

    # --- inputs -------------------------------------------------------------------------

    def queued_update(self, now: float, family: str | None = None) -> None:
        """A change arrived that the proxy has not applied yet (the oldest one counts)."""
        for name in self._families(family):
            self._oldest_pending.setdefault(name, now)

    def updated(self, now: float, family: str | None = None) -> None:
        """Everything queued so far has been applied."""
        for name in self._families(family):
            self._oldest_pending.pop(name, None)
            self._last_updated[name] = now

    def sync_node(self, node: NodeInfo | None) -> None:
        """This node's Node object as last seen (None: unknown or deleted)."""
        self._node = node

    # --- state --------------------------------------------------------------------------

    @property
    def node_eligible(self) -> bool:
        if self._node is None:
            return not self.require_node
        return self._node.eligible

    def status(self, now: float) -> HealthStatus:
        families: dict[str, FamilyHealth] = {}
        healthy = True
        for name, last in self._last_updated.items():
            pending_since = self._oldest_pending.get(name)
            family_healthy = pending_since is None or now - pending_since < self.health_timeout
            families[name] = FamilyHealth(last, family_healthy)
            healthy = healthy and family_healthy
        last_updated = max(self._last_updated.values(), default=None)
        return HealthStatus(healthy, last_updated, now, families)

    def healthy(self, now: float) -> bool:
        """The proxy's own health, ignoring node eligibility (what service health checks use)."""
        return self.status(now).healthy

    # --- HTTP answers -----------------------------------------------------------------------

    def livez(self, now: float) -> HealthResponse:
        status = self.status(now)
        code = 200 if status.healthy else 503
        self.livez_total[code] += 1
        return HealthResponse(code, _body(status, node_eligible=None))

    def healthz(self, now: float) -> HealthResponse:
        status = self.status(now)
        eligible = self.node_eligible
        code = 200 if status.healthy and eligible else 503
        self.healthz_total[code] += 1
        return HealthResponse(code, _body(status, node_eligible=eligible, report_now=code == 200))

    def _families(self, family: str | None) -> tuple[str, ...]:
        return self.families if family is None else (family,)


def _body(status: HealthStatus, *, node_eligible: bool | None, report_now: bool | None = None) -> bytes:
    """kube-proxy's ProxyHealth JSON, fields in its order, compact like Go's encoder."""
    if report_now is None:
        report_now = status.healthy
    last_updated = status.current_time if report_now else status.last_updated
    document: dict[str, object] = {
        "lastUpdated": go_time(last_updated),
        "currentTime": go_time(status.current_time),
    }
    if node_eligible is not None:
        document["nodeEligible"] = node_eligible
    document["healthy"] = status.healthy
    if status.families:
        document["status"] = {
            name: {"lastUpdated": go_time(family.last_updated), "healthy": family.healthy}
            for name, family in sorted(status.families.items())
        }
    return json.dumps(document, separators=(",", ":")).encode()


def go_time(timestamp: float | None) -> str:
    """A POSIX time as Go's time.Time marshals (RFC 3339, fraction without trailing zeros), in UTC."""
    if timestamp is None:
        return GO_ZERO_TIME
    moment = datetime.fromtimestamp(timestamp, tz=timezone.utc)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if moment.microsecond:
        text += f".{moment.microsecond:06d}".rstrip("0")
    return text + "Z"

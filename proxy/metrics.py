"""Proxy metrics: kube-proxy's names where kube-proxy has one, ours for the relay.

Everything is either updated once per sync or read from the proxier's counters at
scrape time; nothing is done per connection or per packet. Per-service-port series are
capped (the busiest ``MAX_SERVICE_PORT_SERIES``, the rest summed as ``_other``) so
a large cluster cannot blow up a scrape.
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kubeport.endpoints.programming import programming_starts
from kubeport.endpoints.types import ServiceName, Snapshot
from kubeport.lib.http import server as http_server
from kubeport.proxy.table import TableContext, local_policy_drops

#: kube-proxy's sync histogram: 1 ms doubling, 15 buckets.
SYNC_BUCKETS = tuple(0.001 * 2**k for k in range(15))
#: kube-proxy's network programming histogram.
PROGRAMMING_BUCKETS = (
    (0.25, 0.5)
    + tuple(float(s) for s in range(1, 60))
    + tuple(float(s) for s in range(60, 120, 5))
    + tuple(float(s) for s in range(120, 301, 30))
)
MAX_SERVICE_PORT_SERIES = 1000


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry, node_name: str, clock=time.time) -> None:
        self._clock = clock
        prefix = "kubeproxy"
        self.sync_duration = Histogram(
            f"{prefix}_sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds",
            buckets=SYNC_BUCKETS, registry=registry)
        self.last_sync = Gauge(
            f"{prefix}_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced", registry=registry)
        self.last_queued = Gauge(
            f"{prefix}_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued", registry=registry)
        self.programming = Histogram(
            f"{prefix}_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds", buckets=PROGRAMMING_BUCKETS, registry=registry)
        self.endpoint_changes = Counter(
            f"{prefix}_sync_proxy_rules_endpoint_changes", "Cumulative proxy rules Endpoint changes",
            registry=registry)
        self.service_changes = Counter(
            f"{prefix}_sync_proxy_rules_service_changes", "Cumulative proxy rules Service changes",
            registry=registry)
        self.endpoint_changes_pending = Gauge(
            f"{prefix}_sync_proxy_rules_endpoint_changes_pending", "Pending proxy rules Endpoint changes",
            registry=registry)
        self.service_changes_pending = Gauge(
            f"{prefix}_sync_proxy_rules_service_changes_pending", "Pending proxy rules Service changes",
            registry=registry)
        self.no_local_endpoints = Gauge(
            f"{prefix}_sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints", ["traffic_policy"],
            registry=registry)
        self.healthz = Counter(f"{prefix}_proxy_healthz", "Cumulative proxy healthz HTTP status", ["code"],
                               registry=registry)
        self.livez = Counter(f"{prefix}_proxy_livez", "Cumulative proxy livez HTTP status", ["code"],
                             registry=registry)
        self._registry = registry
        registry.register(HttpConnectionsCollector())
        #: trigger times older than this are not ours to measure (kube-proxy's trackerStartTime).
        self._started = clock()
        self._applied: Snapshot | None = None
        #: only node_name matters: whether a port has endpoints, or local ones, ignores topology.
        self._drops_ctx = TableContext(node_name=node_name)
        self._no_local: dict[ServiceName, tuple[int, int]] = {}
        self._no_local_totals = [0, 0]  # internal, external: kept as services change

    def attach_proxier(self, proxier: Any) -> None:
        self._registry.register(RelayCollector(proxier))

    def health_request(self, path: str, code: int) -> None:
        (self.healthz if path == "healthz" else self.livez).labels(code=str(code)).inc()

    def queued(self, snapshot: Snapshot) -> None:
        self.last_queued.set(self._clock())
        services, endpoints = _split_changes(self._applied, snapshot)
        self.service_changes_pending.set(services)
        self.endpoint_changes_pending.set(endpoints)

    def synced(self, snapshot: Snapshot, seconds: float) -> None:
        now = self._clock()
        self.sync_duration.observe(seconds)
        self.last_sync.set(now)
        services, endpoints = _split_changes(self._applied, snapshot)
        self.service_changes.inc(services)
        self.endpoint_changes.inc(endpoints)
        self.service_changes_pending.set(0)
        self.endpoint_changes_pending.set(0)
        if self._applied is not None:
            for _, started in programming_starts(self._applied, snapshot, self._started):
                self.programming.observe(max(0.0, now - started))
        self._count_no_local(snapshot)
        self._applied = snapshot

    def _count_no_local(self, snapshot: Snapshot) -> None:
        totals = self._no_local_totals
        for name in snapshot.changed_since(self._applied):
            internal, external = self._no_local.pop(name, (0, 0))
            totals[0] -= internal
            totals[1] -= external
            internal, external = local_policy_drops(snapshot.services.get(name), self._drops_ctx)
            if internal or external:
                self._no_local[name] = (internal, external)
            totals[0] += internal
            totals[1] += external
        self.no_local_endpoints.labels(traffic_policy="internal").set(totals[0])
        self.no_local_endpoints.labels(traffic_policy="external").set(totals[1])


def _split_changes(old: Snapshot | None, new: Snapshot) -> tuple[int, int]:
    """(service changes, endpoint-only changes) between two snapshots."""
    services = endpoints = 0
    for name in new.changed_since(old):
        before = old.services.get(name) if old is not None else None
        after = new.services.get(name)
        if before is not None and after is not None and before.service == after.service:
            endpoints += 1
        else:
            services += 1
    return services, endpoints


class HttpConnectionsCollector(Collector):
    """The HTTP servers' connections turned away at their caps (the health, metrics and
    health-check node ports: ``kubeport/lib/http/server.py``), read at scrape time."""

    def __init__(self, stats: http_server.ConnectionStats | None = None) -> None:
        self._stats = http_server.CONNECTION_STATS if stats is None else stats

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator:
        yield CounterMetricFamily("kubeport_http_connections_rejected",
                                  "HTTP connections reset at once: at a connection cap, none idle to make room",
                                  value=self._stats.rejected)
        yield CounterMetricFamily("kubeport_http_connections_evicted",
                                  "Idle HTTP connections closed to make room at a connection cap",
                                  value=self._stats.evicted)


class RelayCollector(Collector):
    """The relay's counters per service port, read at scrape time."""

    def __init__(self, proxier: Any) -> None:
        self._proxier = proxier

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator:
        stats: Mapping[Any, Any] = self._proxier.stats
        families = {
            "active": GaugeMetricFamily("kubeport_proxy_connections_active", "Open relayed TCP connections",
                                        labels=["service_port"]),
            "total": CounterMetricFamily("kubeport_proxy_connections", "Accepted TCP connections",
                                         labels=["service_port"]),
            "bytes": CounterMetricFamily("kubeport_proxy_bytes", "Bytes relayed",
                                         labels=["service_port", "direction"]),
            "connect_failures": CounterMetricFamily("kubeport_proxy_connect_failures",
                                                    "Backend connects that failed (retried elsewhere)",
                                                    labels=["service_port"]),
            "connect_giveups": CounterMetricFamily("kubeport_proxy_connect_giveups",
                                                   "Client connections reset after every attempt failed",
                                                   labels=["service_port"]),
            "ejections": CounterMetricFamily("kubeport_proxy_endpoint_ejections",
                                             "Endpoints ejected after failed connects", labels=["service_port"]),
            "udp_flows": GaugeMetricFamily("kubeport_proxy_udp_flows_active", "Live UDP flows",
                                           labels=["service_port"]),
            "udp_flows_total": CounterMetricFamily("kubeport_proxy_udp_flows", "UDP flows created",
                                                   labels=["service_port"]),
            "udp_flows_rejected": CounterMetricFamily("kubeport_proxy_udp_flows_rejected",
                                                      "UDP flows refused by the flow limits",
                                                      labels=["service_port"]),
        }
        for label, protocol, values in _capped(stats):
            families["bytes"].add_metric([label, "to_backend"], values["bytes_to_backend"])
            families["bytes"].add_metric([label, "to_client"], values["bytes_to_client"])
            # A port's series are those of its protocol: no zero connection series for a UDP port.
            keys = _STREAM_KEYS if protocol != "UDP" else ()
            keys += _UDP_KEYS if protocol in ("UDP", None) else ()
            for key in keys:
                families[key].add_metric([label], values[key])
        yield from families.values()


_STREAM_KEYS = ("active", "total", "connect_failures", "connect_giveups", "ejections")
_UDP_KEYS = ("udp_flows", "udp_flows_total", "udp_flows_rejected")


_FIELDS = ("active", "total", "bytes_to_backend", "bytes_to_client", "connect_failures", "connect_giveups",
           "ejections", "udp_flows", "udp_flows_total", "udp_flows_rejected")


def _capped(stats: Mapping[Any, Any]) -> list[tuple[str, str | None, dict[str, int]]]:
    """(label, protocol, counters) per service port; protocol None for the summed rest."""
    rows = [(str(name), getattr(name, "protocol", None), {f: getattr(s, f, 0) for f in _FIELDS})
            for name, s in stats.items()]
    if len(rows) <= MAX_SERVICE_PORT_SERIES:
        return rows
    rows.sort(key=lambda row: (row[2]["total"] + row[2]["udp_flows_total"]), reverse=True)
    kept, rest = rows[:MAX_SERVICE_PORT_SERIES], rows[MAX_SERVICE_PORT_SERIES:]
    other = {f: sum(row[2][f] for row in rest) for f in _FIELDS}
    return kept + [("_other", None, other)]

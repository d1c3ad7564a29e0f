"""Proxy metrics: kube-proxy's names where kube-proxy has one, ours for the relay.

Everything is either updated once per sync or read from the proxier's counters at
scrape time; nothing is done per connection or per packet. Per-service-port series are
capped (the busiest ``MAX_SERVICE_PORT_SERIES``, the rest summed as ``_other``) so
a large cluster cannot blow up a scrape.
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kubeport.endpoints.programming import slice_programming_starts
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
#: the ``ip_family`` label's values: kube-proxy's ``string(v1.IPFamily)``
FAMILY_LABELS = {4: "IPv4", 6: "IPv6"}
_FAMILY_NUMBERS = {label: number for number, label in FAMILY_LABELS.items()}


class ProxyMetrics:
    """kube-proxy's sync metrics (``pkg/proxy/metrics/metrics.go``), with the ``ip_family``
    label kube-proxy 1.33 puts on those its per-family proxiers each report.

    kubeport has one proxier for every family: a sync programs them all at once, so each
    sync is observed once per family served (``families``), with the same duration, as
    kube-proxy's dual-stack MetaProxier observes one sync per family proxier. What is read
    per object is labelled with the object's own family: a network programming latency with
    the family of the EndpointSlice it is read from, a service without local endpoints with
    each family of its clusterIPs.

    What a sync is here (kube-proxy's ``syncProxyRules``, ``pkg/proxy/nftables/proxier.go``):

    - a *partial* sync: an apply of a snapshot (``ProxyService.apply_snapshot``), which
      changes only the services the snapshot changed;
    - a *full* sync: the first apply of this process (every service is built, as kube-proxy's
      first sync has ``needFullSync``), and each full resync of the host (``proxy/fullsync.py``:
      hourly as ``proxyutil.FullSyncPeriod``, on SIGHUP, and soon after a failure), which
      writes the nftables table whole and puts the VIP addresses back.

    Both count in ``sync_proxy_rules_duration_seconds``. A sync *fails* when the host's
    programming (the nftables table or the VIP addresses) reported a problem, or the apply
    raised: it counts in ``sync_proxy_rules_nftables_sync_failures_total`` (the name of
    kube-proxy's nftables mode, whose table kubeport's ``inet kubeport`` stands for) and leaves
    ``sync_proxy_rules_last_timestamp_seconds`` alone, which kube-proxy sets on success only.
    The duration is observed either way, as kube-proxy's deferred observation is.
    """

    def __init__(self, registry: CollectorRegistry, node_name: str, clock=time.time,
                 families: Sequence[str] = ("IPv4",)) -> None:
        self._clock = clock
        #: the families served, as ``ip_family`` values ("IPv4", "IPv6")
        self._families = tuple(families)
        prefix = "kubeproxy"
        family = ["ip_family"]
        self.sync_duration = Histogram(
            f"{prefix}_sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds", family,
            buckets=SYNC_BUCKETS, registry=registry)
        self.full_sync_duration = Histogram(
            f"{prefix}_sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs",
            family, buckets=SYNC_BUCKETS, registry=registry)
        self.partial_sync_duration = Histogram(
            f"{prefix}_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs", family, buckets=SYNC_BUCKETS, registry=registry)
        self.sync_failures = Counter(
            f"{prefix}_sync_proxy_rules_nftables_sync_failures", "Cumulative proxy nftables sync failures", family,
            registry=registry)
        self.last_sync = Gauge(
            f"{prefix}_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced", family, registry=registry)
        self.last_queued = Gauge(
            f"{prefix}_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued", family, registry=registry)
        self.programming = Histogram(
            f"{prefix}_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds", family, buckets=PROGRAMMING_BUCKETS,
            registry=registry)
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
            "Number of services with a Local traffic policy and no endpoints", ["ip_family", "traffic_policy"],
            registry=registry)
        self.healthz = Counter(f"{prefix}_proxy_healthz", "Cumulative proxy healthz HTTP status", ["code"],
                               registry=registry)
        self.livez = Counter(f"{prefix}_proxy_livez", "Cumulative proxy livez HTTP status", ["code"],
                             registry=registry)
        # Every served family's series from the start: a failure counter read with rate() and
        # a histogram's _count must exist at 0 before the first sync, not appear with it.
        for name in self._families:
            for metric in (self.sync_duration, self.full_sync_duration, self.partial_sync_duration,
                           self.sync_failures, self.programming):
                metric.labels(ip_family=name)
        self._registry = registry
        registry.register(HttpConnectionsCollector())
        #: trigger times older than this are not ours to measure (kube-proxy's trackerStartTime).
        self._started = clock()
        self._applied: Snapshot | None = None
        #: only node_name matters: whether a port has endpoints, or local ones, ignores topology.
        self._drops_ctx = TableContext(node_name=node_name)
        self._no_local: dict[ServiceName, dict[int, tuple[int, int]]] = {}
        #: {family: [internal, external]}, kept as services change
        self._no_local_totals: dict[int, list[int]] = {}

    def attach_proxier(self, proxier: Any) -> None:
        self._registry.register(RelayCollector(proxier))

    def health_request(self, path: str, code: int) -> None:
        (self.healthz if path == "healthz" else self.livez).labels(code=str(code)).inc()

    def queued(self, snapshot: Snapshot) -> None:
        now = self._clock()
        for name in self._families:
            self.last_queued.labels(ip_family=name).set(now)
        services, endpoints = _split_changes(self._applied, snapshot)
        self.service_changes_pending.set(services)
        self.endpoint_changes_pending.set(endpoints)

    def sync_done(self, seconds: float, *, full: bool, failed: bool, now: float | None = None) -> None:
        """One sync of every family served: full or partial, failed or not (see the class)."""
        now = self._clock() if now is None else now
        kind = self.full_sync_duration if full else self.partial_sync_duration
        for name in self._families:
            self.sync_duration.labels(ip_family=name).observe(seconds)
            kind.labels(ip_family=name).observe(seconds)
            if failed:
                self.sync_failures.labels(ip_family=name).inc()
            else:
                self.last_sync.labels(ip_family=name).set(now)

    def synced(self, snapshot: Snapshot, seconds: float, *, full: bool = False, failed: bool = False) -> None:
        """``snapshot`` applied in ``seconds``: a sync, and the changes it carried."""
        now = self._clock()
        self.sync_done(seconds, full=full, failed=failed, now=now)
        services, endpoints = _split_changes(self._applied, snapshot)
        self.service_changes.inc(services)
        self.endpoint_changes.inc(endpoints)
        self.service_changes_pending.set(0)
        self.endpoint_changes_pending.set(0)
        if self._applied is not None:
            served = set(self._families)
            for _, slice_, started in slice_programming_starts(self._applied, snapshot, self._started):
                if slice_.address_type in served:  # an FQDN slice is no proxier's
                    self.programming.labels(ip_family=slice_.address_type).observe(max(0.0, now - started))
        self._count_no_local(snapshot)
        self._applied = snapshot

    def _count_no_local(self, snapshot: Snapshot) -> None:
        totals = self._no_local_totals
        for name in snapshot.changed_since(self._applied):
            for family, (internal, external) in self._no_local.pop(name, {}).items():
                totals[family][0] -= internal
                totals[family][1] -= external
            drops = local_policy_drops(snapshot.services.get(name), self._drops_ctx)
            if drops:
                self._no_local[name] = drops
            for family, (internal, external) in drops.items():
                total = totals.setdefault(family, [0, 0])
                total[0] += internal
                total[1] += external
        for family in sorted(totals.keys() | {_FAMILY_NUMBERS[name] for name in self._families}):
            internal, external = totals.get(family, (0, 0))
            self.no_local_endpoints.labels(ip_family=FAMILY_LABELS[family], traffic_policy="internal").set(internal)
            self.no_local_endpoints.labels(ip_family=FAMILY_LABELS[family], traffic_policy="external").set(external)


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
        balanced = CounterMetricFamily("kubeport_proxy_connects_balanced",
                                       "Connects of the node's pods balanced in the kernel at connect() "
                                       "(no relay on their path)", labels=["service_port"])
        counts = sorted(((str(name), count) for name, count in getattr(self._proxier, "connects_balanced", {}).items()),
                        key=lambda item: item[1], reverse=True)
        for label, count in counts[:MAX_SERVICE_PORT_SERIES]:
            balanced.add_metric([label], count)
        if len(counts) > MAX_SERVICE_PORT_SERIES:
            balanced.add_metric(["_other"], sum(count for _, count in counts[MAX_SERVICE_PORT_SERIES:]))
        yield balanced
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

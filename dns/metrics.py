"""Prometheus metrics of the DNS server under CoreDNS's names, read from DnsServer.stats
at scrape time (the query path only bumps integers; nothing here runs per query).

Labels follow CoreDNS's, with values chosen for one kubeport DNS server:

- ``server``: ``dns://:<port>``, as CoreDNS names a ``.:53`` server block;
- ``zone``: ``.`` — kubeport is one server block for every name, like the default
  Corefile (the cluster zone and forwarding under ``.:53``);
- ``family``: ``1`` (IPv4) or ``2`` (IPv6), from the listen addresses. Counters are not
  kept per family, so with listeners of both families the label is empty;
- ``type``: the query type when it is one of :data:`QTYPE_LABELS`, else ``other``
  (bounded cardinality, like CoreDNS's own list of monitored types);
- ``plugin``: empty — the counters do not record which part wrote a response.

``coredns_dns_request_duration_seconds``: only answers that are built (answer-cache
misses) and upstream round trips are timed, two clock reads each. Answers served from a
cache (encoded cluster answers, cached upstream answers, errors written without a lookup)
take microseconds and are not timed: they are counted in the first bucket (0.25 ms) and
add nothing to ``_sum``, so ``_count`` still equals the number of requests.

Not exported: ``coredns_kubernetes_dns_programming_duration_seconds`` needs the
EndpointSlice ``endpoints.kubernetes.io/last-change-trigger-time`` annotation, which the
slim types do not keep.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from kubeport.dns.stats import DURATION_BUCKETS, DnsStats

if TYPE_CHECKING:
    from kubeport.dns.server import DnsServer

#: query types that get their own ``type`` label value; every other type is ``other``
QTYPE_LABELS = frozenset({"A", "AAAA", "SRV", "PTR", "TXT", "CNAME", "NS", "SOA", "MX", "ANY"})
ZONE = "."
NO_PLUGIN = ""
BUCKET_BOUNDS = (*map(floatToGoString, DURATION_BUCKETS), "+Inf")

_S, _Z = "server", "zone"
#: name (without _total) -> (family class, help, labels)
METRICS: dict[str, tuple[type[Any], str, tuple[str, ...]]] = {
    "coredns_dns_requests": (CounterMetricFamily, "Counter of DNS requests made per zone, protocol and family.",
                             (_S, _Z, "proto", "family", "type")),
    "coredns_dns_responses": (CounterMetricFamily, "Counter of response status codes.", (_S, _Z, "rcode", "plugin")),
    "coredns_dns_request_duration_seconds": (
        HistogramMetricFamily, "Histogram of the time (in seconds) each request took per zone.", (_S, _Z, "type")),
    "coredns_cache_hits": (CounterMetricFamily, "The count of cache hits.", (_S, "type")),
    "coredns_cache_misses": (CounterMetricFamily, "The count of cache misses.", (_S,)),
    "coredns_cache_entries": (GaugeMetricFamily, "The number of elements in the cache.", (_S, "type")),
    "coredns_forward_requests": (CounterMetricFamily, "Counter of requests made per upstream.", ("to",)),
    "coredns_forward_responses": (CounterMetricFamily, "Counter of responses received per upstream.",
                                  ("to", "rcode")),
    "coredns_forward_conn_cache_hits": (CounterMetricFamily, "Counter of connection cache hits per upstream and "
                                        "protocol.", ("to", "proto")),
    "coredns_forward_conn_cache_misses": (CounterMetricFamily, "Counter of connection cache misses per upstream "
                                          "and protocol.", ("to", "proto")),
    "coredns_forward_max_concurrent_rejects": (
        CounterMetricFamily, "Counter of the number of queries rejected because the concurrent queries were at "
        "maximum.", ()),
    "coredns_forward_healthcheck_failures": (CounterMetricFamily, "Counter of the number of failed healthchecks.",
                                             ("to",)),
    "coredns_forward_healthcheck_broken": (
        CounterMetricFamily, "Counter of the number of complete failures of the healthchecks.", ()),
    "kubeport_dns_forward_timeouts": (
        CounterMetricFamily, "Queries to an upstream that got no answer in time (the next upstream is tried).",
        ("to",)),
    "kubeport_dns_answer_cache_hits": (CounterMetricFamily, "Cluster-zone answers served pre-encoded.", (_S,)),
    "kubeport_dns_answer_cache_misses": (CounterMetricFamily, "Cluster-zone answers built (then kept encoded).",
                                         (_S,)),
    "kubeport_dns_answer_cache_entries": (GaugeMetricFamily, "Encoded cluster-zone answers kept.", (_S,)),
    "kubeport_dns_dropped": (CounterMetricFamily, "Packets not answered: no complete DNS header, or a response.",
                             (_S,)),
    "kubeport_dns_tcp_rejected": (CounterMetricFamily, "TCP connections closed at once: the connection cap was "
                                  "reached with none idle, or the client address's share.", (_S,)),
    "kubeport_dns_tcp_evicted": (CounterMetricFamily, "Idle TCP connections closed to make room at the "
                                 "connection cap.", (_S,)),
    "kubeport_dns_tcp_read_timeouts": (CounterMetricFamily, "TCP connections closed: a message did not arrive "
                                       "whole within the read deadline.", (_S,)),
    "kubeport_dns_oversized": (CounterMetricFamily, "UDP queries over 4096 bytes, answered FORMERR.", (_S,)),
    "kubeport_dns_send_failed": (CounterMetricFamily, "UDP replies the kernel refused to send (a full send "
                                 "buffer); the client retries.", (_S,)),
}


def type_label(qtype: str) -> str:
    return qtype if qtype in QTYPE_LABELS else "other"


def family_label(addresses: Iterable[str]) -> str:
    """CoreDNS's family (1: IPv4, 2: IPv6) when every listener has the same one, else ""."""
    families = {ipaddress.ip_address(address).version for address in addresses}
    return {frozenset({4}): "1", frozenset({6}): "2"}.get(frozenset(families), "")


def _family(name: str) -> Any:
    kind, documentation, labels = METRICS[name]
    return kind(name, documentation, labels=labels)


class DnsCollector:
    """A custom collector: ``registry.register(DnsCollector(dns_server))``.

    Reads ``server.stats``, ``server.port``, ``server.config`` and the caches on every
    scrape, so it follows ``reconfigure()`` (a new forwarder, new addresses) by itself.
    """

    def __init__(self, server: DnsServer):
        self.server = server

    def describe(self) -> Iterator[Metric]:
        """The families without samples: registering reads no stats, and duplicates are caught."""
        return (_family(name) for name in METRICS)

    def collect(self) -> Iterator[Metric]:
        server, stats = self.server, self.server.stats
        families = {name: _family(name) for name in METRICS}
        own = [f"dns://:{server.port}"]
        block = [*own, ZONE]
        _add_requests(families["coredns_dns_requests"], stats, block, family_label(server.config.addresses))
        for rcode, count in sorted(stats.responses.items()):
            families["coredns_dns_responses"].add_metric([*block, rcode, NO_PLUGIN], count)
        _add_durations(families["coredns_dns_request_duration_seconds"], stats, block)
        _add_upstream_cache(families, server, own)
        _add_forward(families, stats)
        for name, value in (("kubeport_dns_answer_cache_hits", stats.answer_cache_hits),
                            ("kubeport_dns_answer_cache_misses", stats.answer_cache_misses),
                            ("kubeport_dns_answer_cache_entries", len(server.answerer.cache)),
                            ("kubeport_dns_dropped", stats.dropped),
                            ("kubeport_dns_tcp_rejected", stats.tcp_rejected),
                            ("kubeport_dns_tcp_evicted", stats.tcp_evicted),
                            ("kubeport_dns_tcp_read_timeouts", stats.tcp_read_timeouts),
                            ("kubeport_dns_oversized", stats.oversized),
                            ("kubeport_dns_send_failed", stats.send_failed)):
            families[name].add_metric(own, value)
        return iter(families.values())


def _add_requests(metric: Any, stats: DnsStats, block: list[str], family: str) -> None:
    totals: Counter[tuple[str, str]] = Counter()
    for (proto, qtype), count in stats.requests.items():
        totals[(proto, type_label(qtype))] += count
    for (proto, qtype), count in sorted(totals.items()):
        metric.add_metric([*block, proto, family, qtype], count)


def _add_durations(metric: Any, stats: DnsStats, block: list[str]) -> None:
    """Timed answers in their buckets; the untimed (cached) rest in the first bucket."""
    requests: Counter[str] = Counter()
    for (_, qtype), count in stats.requests.items():
        requests[type_label(qtype)] += count
    counts: dict[str, list[int]] = {}
    sums: Counter[str] = Counter()
    for qtype, histogram in stats.durations.items():
        label = type_label(qtype)
        merged = counts.setdefault(label, [0] * len(BUCKET_BOUNDS))
        for position, count in enumerate(histogram.counts):
            merged[position] += count
        sums[label] += histogram.total
    for label in sorted(requests):
        merged = counts.get(label, [0] * len(BUCKET_BOUNDS))
        merged[0] += max(0, requests[label] - sum(merged))
        cumulative = 0
        buckets = []
        for bound, count in zip(BUCKET_BOUNDS, merged):
            cumulative += count
            buckets.append((bound, cumulative))
        metric.add_metric([*block, label], buckets, sums[label])


def _add_upstream_cache(families: dict[str, Any], server: DnsServer, own: list[str]) -> None:
    stats = server.stats
    for kind in ("success", "denial"):
        families["coredns_cache_hits"].add_metric([*own, kind], stats.cache_hits[kind])
    families["coredns_cache_misses"].add_metric(own, stats.cache_misses)
    cache = server.forwarder.cache
    negative = cache.negative_entries()
    families["coredns_cache_entries"].add_metric([*own, "success"], len(cache) - negative)
    families["coredns_cache_entries"].add_metric([*own, "denial"], negative)


def _add_forward(families: dict[str, Any], stats: DnsStats) -> None:
    for to, count in sorted(stats.forward_requests.items()):
        families["coredns_forward_requests"].add_metric([to], count)
    for (to, rcode), count in sorted(stats.forward_responses.items()):
        families["coredns_forward_responses"].add_metric([to, rcode], count)
    for (to, proto), count in sorted(stats.forward_conn_cache_hits.items()):
        families["coredns_forward_conn_cache_hits"].add_metric([to, proto], count)
    for (to, proto), count in sorted(stats.forward_conn_cache_misses.items()):
        families["coredns_forward_conn_cache_misses"].add_metric([to, proto], count)
    for to, count in sorted(stats.forward_timeouts.items()):
        families["kubeport_dns_forward_timeouts"].add_metric([to], count)
    for to, count in sorted(stats.forward_healthcheck_failures.items()):
        families["coredns_forward_healthcheck_failures"].add_metric([to], count)
    families["coredns_forward_healthcheck_broken"].add_metric([], stats.forward_healthcheck_broken)
    families["coredns_forward_max_concurrent_rejects"].add_metric([], stats.forward_refused)

"""Prometheus metrics of the DNS server under CoreDNS's names, read from DnsServer.stats
at scrape time (the query path only bumps integers; nothing here runs per query).

Labels follow CoreDNS's, with values chosen for one kubeport DNS server:

- ``server``: ``dns://:<port>``, as CoreDNS names a ``.:53`` server block;
- ``zone``: ``.`` — kubeport is one server block for every name, like the default
  Corefile (the cluster zone and forwarding under ``.:53``); the cache's ``zones`` is ``.`` too,
  except ``coredns_cache_entries``, which has a series per stub domain (``zones="consul.local."``)
  since each has its own cache, as NodeLocal DNSCache's server block per stub domain (the hit,
  miss, stale and prefetch counters stay summed under ``.``);
- ``to``: the upstream asked, ``IP:PORT`` or ``[IPv6]:PORT``, stub domains' and default
  upstreams' alike (CoreDNS forward's label);
- ``view``: empty, as CoreDNS without the ``view`` plugin;
- ``family``: ``1`` (IPv4) or ``2`` (IPv6), from the listen addresses. Counters are not
  kept per family, so with listeners of both families the label is empty;
- ``type``: the query type when it is one of :data:`QTYPE_LABELS`, else ``other``
  (bounded cardinality, like CoreDNS's own list of monitored types);
- ``plugin``: empty — the counters do not record which part wrote a response.

``coredns_dns_request_size_bytes`` and ``_response_size_bytes`` count every reply: a reply
served from a cache counts under the sizes of the query it was built for and of itself
(queries that differ only in their EDNS options share a kept reply), so the query path
still only bumps one integer.

``coredns_build_info`` names kubeport's version and, in ``goversion``, the Python running it;
``coredns_plugin_enabled`` lists the CoreDNS plugins kubeport does the work of;
``coredns_panics_total`` counts queries whose handling raised.

``coredns_dns_request_duration_seconds``: only answers that are built (answer-cache
misses) and upstream round trips are timed, two clock reads each. Answers served from a
cache (encoded cluster answers, cached upstream answers, errors written without a lookup)
are not timed (the two clock reads would be a large part of their cost): they are counted
in the first bucket and add nothing to ``_sum``, so ``_count`` still equals the number of
requests.

``coredns_kubernetes_dns_programming_duration_seconds{service_kind}``: from an EndpointSlice's
last-change-trigger-time (or a change's arrival) to the moment its answers are dropped, so
the next query gets the new answer (see :func:`kubeport.dns.records.programming_kinds`).

``coredns_forward_request_duration_seconds{to,rcode}`` (CoreDNS before 1.11) and
``coredns_proxy_request_duration_seconds{proxy_name="forward",to,rcode}`` (since): each
answered round trip to an upstream.
"""

from __future__ import annotations

import ipaddress
import platform
from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from kubeport.dns.stats import DURATION_BUCKETS, PROGRAMMING_BUCKETS, SIZE_BUCKETS, DnsStats
from kubeport.lib.version import __version__

if TYPE_CHECKING:
    from kubeport.dns.server import DnsServer

#: query types that get their own ``type`` label value; every other type is ``other``
QTYPE_LABELS = frozenset({"A", "AAAA", "SRV", "PTR", "TXT", "CNAME", "NS", "SOA", "MX", "ANY"})
ZONE = "."
NO_PLUGIN = ""
BUCKET_BOUNDS = (*map(floatToGoString, DURATION_BUCKETS), "+Inf")
SIZE_BOUNDS = (*SIZE_BUCKETS, float("inf"))
PROGRAMMING_BOUNDS = (*map(floatToGoString, PROGRAMMING_BUCKETS), "+Inf")
NO_VIEW = ""
#: the CoreDNS plugins whose work kubeport does, as a kubeadm Corefile enables them
PLUGINS = ("cache", "forward", "health", "kubernetes", "loadbalance", "prometheus", "ready")

_S, _Z, _V = "server", "zone", "view"
#: name (without _total) -> (family class, help, labels)
METRICS: dict[str, tuple[type[Any], str, tuple[str, ...]]] = {
    "coredns_dns_requests": (CounterMetricFamily, "Counter of DNS requests made per zone, protocol and family.",
                             (_S, _Z, _V, "proto", "family", "type")),
    "coredns_dns_responses": (CounterMetricFamily, "Counter of response status codes.",
                              (_S, _Z, _V, "rcode", "plugin")),
    "coredns_dns_request_duration_seconds": (
        HistogramMetricFamily, "Histogram of the time (in seconds) each request took per zone.", (_S, _Z, _V, "type")),
    "coredns_dns_request_size_bytes": (HistogramMetricFamily, "Size of the EDNS0 UDP buffer in bytes (64K for TCP).",
                                       (_S, _Z, _V, "proto")),
    "coredns_dns_response_size_bytes": (HistogramMetricFamily, "Size of the returned response in bytes.",
                                        (_S, _Z, _V, "proto")),
    "coredns_panics": (CounterMetricFamily, "A metrics that counts the number of panics.", ()),
    "coredns_build_info": (GaugeMetricFamily, "A metric with a constant '1' value labeled by version, revision, and "
                           "goversion from which CoreDNS was built.", ("version", "revision", "goversion")),
    "coredns_plugin_enabled": (GaugeMetricFamily, "A metric that indicates whether a plugin is enabled on per "
                               "server and zone basis.", (_S, _Z, _V, "name")),
    "coredns_kubernetes_dns_programming_duration_seconds": (
        HistogramMetricFamily, "Histogram of the time (in seconds) it took to program a dns instance.",
        ("service_kind",)),
    "coredns_cache_requests": (CounterMetricFamily, "The count of cache requests.", (_S, "zones", _V)),
    "coredns_cache_hits": (CounterMetricFamily, "The count of cache hits.", (_S, "type", "zones", _V)),
    "coredns_cache_misses": (CounterMetricFamily, "The count of cache misses. Deprecated, derive misses from cache "
                             "hits/requests counters.", (_S, "zones", _V)),
    "coredns_cache_served_stale": (CounterMetricFamily, "The number of requests served from stale cache entries.",
                                   (_S, "zones", _V)),
    "coredns_cache_prefetch": (CounterMetricFamily, "The number of times the cache has prefetched a cached item.",
                               (_S, "zones", _V)),
    "coredns_cache_entries": (GaugeMetricFamily, "The number of elements in the cache.", (_S, "type", "zones", _V)),
    "coredns_forward_requests": (CounterMetricFamily, "Counter of requests made per upstream.", ("to",)),
    "coredns_forward_responses": (CounterMetricFamily, "Counter of responses received per upstream.",
                                  ("to", "rcode")),
    "coredns_forward_request_duration_seconds": (
        HistogramMetricFamily, "Histogram of the time each request took.", ("to", "rcode")),
    "coredns_proxy_request_duration_seconds": (
        HistogramMetricFamily, "Histogram of the time each request took.", ("proxy_name", "to", "rcode")),
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
    "coredns_autopath_success": (CounterMetricFamily, "Counter of requests that did autopath.", (_S,)),
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
        block = [*own, ZONE, NO_VIEW]
        _add_requests(families["coredns_dns_requests"], stats, block, family_label(server.config.addresses))
        for rcode, count in sorted(stats.responses.items()):
            families["coredns_dns_responses"].add_metric([*block, rcode, NO_PLUGIN], count)
        _add_durations(families["coredns_dns_request_duration_seconds"], stats, block)
        _add_sizes(families, stats, block)
        for kind, histogram in sorted(stats.programming.items()):
            cumulative, buckets = 0, []
            for bound, count in zip(PROGRAMMING_BOUNDS, histogram.counts):
                cumulative += count
                buckets.append((bound, cumulative))
            families["coredns_kubernetes_dns_programming_duration_seconds"].add_metric([kind], buckets, histogram.total)
        families["coredns_panics"].add_metric([], stats.panics)
        families["coredns_build_info"].add_metric([__version__, "", platform.python_version()], 1)
        for plugin in PLUGINS:
            families["coredns_plugin_enabled"].add_metric([*block, plugin], 1)
        _add_upstream_cache(families, server, own)
        _add_forward(families, stats)
        for name, value in (("coredns_autopath_success", stats.autopath_successes),
                            ("kubeport_dns_answer_cache_hits", stats.answer_cache_hits),
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


def _add_sizes(families: dict[str, Any], stats: DnsStats, block: list[str]) -> None:
    """Both size histograms from the (proto, request size, response size) counts."""
    requests: dict[str, Counter[int]] = {}
    responses: dict[str, Counter[int]] = {}
    for (proto, request, response), count in stats.sizes.items():
        requests.setdefault(proto, Counter())[request] += count
        responses.setdefault(proto, Counter())[response] += count
    sized = (("coredns_dns_request_size_bytes", requests), ("coredns_dns_response_size_bytes", responses))
    for name, by_proto in sized:
        for proto, sizes in sorted(by_proto.items()):
            buckets = [(floatToGoString(bound), sum(count for size, count in sizes.items() if size <= bound))
                       for bound in SIZE_BOUNDS]
            families[name].add_metric([*block, proto], buckets, sum(size * count for size, count in sizes.items()))


def _add_upstream_cache(families: dict[str, Any], server: DnsServer, own: list[str]) -> None:
    stats = server.stats
    cache_block = [*own, ZONE, NO_VIEW]
    hits = stats.cache_hits
    for kind in ("success", "denial"):
        families["coredns_cache_hits"].add_metric([*own, kind, ZONE, NO_VIEW], hits[kind])
    families["coredns_cache_misses"].add_metric(cache_block, stats.cache_misses)
    families["coredns_cache_requests"].add_metric(cache_block, stats.cache_misses + sum(hits.values()))
    families["coredns_cache_served_stale"].add_metric(cache_block, stats.served_stale)
    families["coredns_cache_prefetch"].add_metric(cache_block, stats.prefetches)
    for zone, forwarder in server.forwarders:  # a cache per stub domain, as a server block each
        cache = forwarder.cache
        negative = cache.negative_entries()
        families["coredns_cache_entries"].add_metric([*own, "success", zone, NO_VIEW], len(cache) - negative)
        families["coredns_cache_entries"].add_metric([*own, "denial", zone, NO_VIEW], negative)


def _add_forward(families: dict[str, Any], stats: DnsStats) -> None:
    for to, count in sorted(stats.forward_requests.items()):
        families["coredns_forward_requests"].add_metric([to], count)
    for (to, rcode), count in sorted(stats.forward_responses.items()):
        families["coredns_forward_responses"].add_metric([to, rcode], count)
    for (to, rcode), histogram in sorted(stats.forward_durations.items()):
        cumulative, buckets = 0, []
        for bound, count in zip(BUCKET_BOUNDS, histogram.counts):
            cumulative += count
            buckets.append((bound, cumulative))
        families["coredns_forward_request_duration_seconds"].add_metric([to, rcode], buckets, histogram.total)
        families["coredns_proxy_request_duration_seconds"].add_metric(["forward", to, rcode], buckets, histogram.total)
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

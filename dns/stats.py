"""Counters of the DNS server, named after the CoreDNS metrics the daemon exports them as.

Per-query counters are one-element lists ("cells") that cached answers hold directly,
so counting a cached answer is ``cell[0] += 1`` rather than a Counter update (which
would cost more than the answer itself). A kept answer holds one cell per protocol, for
its (qtype, rcode, cache) combination: its hits count once there, and the reads add them to
the requests, responses and cache hits they are. Read them through the properties.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field

Cell = list[int]

#: Upper bounds (seconds) of the request duration buckets: CoreDNS's plugin.TimeBuckets,
#: prometheus.ExponentialBuckets(0.00025, 2, 16), 0.25 ms .. 8.192 s.
DURATION_BUCKETS: tuple[float, ...] = tuple(0.00025 * 2**i for i in range(16))
#: Upper bounds (bytes) of the request and response size buckets (CoreDNS plugin/metrics/vars).
SIZE_BUCKETS: tuple[float, ...] = (0, 100, 200, 300, 400, 511, 1023, 2047, 4095, 8291, 16e3, 32e3, 48e3, 64e3)


@dataclass(slots=True)
class DurationHistogram:
    """Observations per bucket (not cumulative; the last one is +Inf) and their sum."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(DURATION_BUCKETS, seconds)] += 1  # Prometheus buckets are "<= le"
        self.total += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)


#: Upper bounds (seconds) of coredns_kubernetes_dns_programming_duration_seconds:
#: prometheus.ExponentialBuckets(0.001, 2, 20), 1 ms .. ~17 min (plugin/kubernetes/metrics.go).
PROGRAMMING_BUCKETS: tuple[float, ...] = tuple(0.001 * 2**i for i in range(20))


@dataclass(slots=True)
class ProgrammingHistogram:
    """Observations per programming-duration bucket (the last one is +Inf) and their sum."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(PROGRAMMING_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(PROGRAMMING_BUCKETS, seconds)] += 1
        self.total += seconds


@dataclass(slots=True)
class DnsStats:
    _requests: dict[tuple[str, str], Cell] = field(default_factory=dict)
    _responses: dict[str, Cell] = field(default_factory=dict)
    #: (proto, request size, response size) -> replies not served from a kept reply
    _sizes: dict[tuple[str, int, int], Cell] = field(default_factory=dict)
    #: (proto, qtype, rcode, upstream cache kind or None for a cluster answer, request size,
    #: response size) -> queries answered from a kept reply: requests, responses, cache hits
    #: and sizes all at once (a kept reply answers queries of one size with replies of one size)
    _served: dict[tuple[str, str, str, str | None, int, int], Cell] = field(default_factory=dict)
    #: queries whose handling raised (a bug): coredns_panics_total
    panics: int = 0
    #: expired upstream answers served (serve_stale): coredns_cache_served_stale_total
    served_stale: int = 0
    #: upstream answers refreshed before they expired: coredns_cache_prefetch_total
    prefetches: int = 0
    #: queries answered by walking the pod's search path: coredns_autopath_success_total
    autopath_successes: int = 0
    #: (upstream, rcode name) -> round trips answered: coredns_forward_request_duration_seconds{to,rcode}
    forward_durations: dict[tuple[str, str], DurationHistogram] = field(default_factory=dict)
    #: service_kind -> change-to-answered durations: coredns_kubernetes_dns_programming_duration_seconds
    programming: dict[str, ProgrammingHistogram] = field(default_factory=dict)
    #: cluster-zone answers built (CoreDNS has no such cache; the hits are in _served)
    answer_cache_misses: int = 0
    #: upstream answers from the cache, by "success"|"denial": coredns_cache_hits_total{type}
    _cache_hits: dict[str, Cell] = field(default_factory=dict)
    #: coredns_cache_misses_total
    cache_misses: int = 0
    #: upstream "ip:port" -> queries sent: coredns_forward_requests_total{to}
    forward_requests: Counter[str] = field(default_factory=Counter)
    #: (upstream, rcode name) -> responses: coredns_forward_responses_total{to,rcode}
    forward_responses: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: upstream queries without an answer in time (per attempt)
    forward_timeouts: Counter[str] = field(default_factory=Counter)
    #: (upstream, "udp"|"tcp") -> queries sent on a connection kept from an earlier query /
    #: on a new one: coredns_forward_conn_cache_hits_total / _misses_total{to,proto}
    forward_conn_cache_hits: Counter[tuple[str, str]] = field(default_factory=Counter)
    forward_conn_cache_misses: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: failed health checks per upstream: coredns_forward_healthcheck_failures_total{to}
    forward_healthcheck_failures: Counter[str] = field(default_factory=Counter)
    #: queries sent to an upstream while every one was down:
    #: coredns_forward_healthcheck_broken_total
    forward_healthcheck_broken: int = 0
    #: forwarded queries refused over max_concurrent_forwards:
    #: coredns_forward_max_concurrent_rejects_total
    forward_refused: int = 0
    #: packets not answered: no complete header, or a response sent to us
    dropped: int = 0
    #: UDP replies the kernel refused to send (a full send buffer): the client retries
    send_failed: int = 0
    #: TCP connections closed at once: max_tcp_connections were open and none idle, or
    #: max_tcp_connections_per_client from the same address and none of them idle
    tcp_rejected: int = 0
    #: idle TCP connections closed to make room for a new one at max_tcp_connections (any
    #: client's) or at max_tcp_connections_per_client (the same client's)
    tcp_evicted: int = 0
    #: TCP connections closed because a message did not arrive whole within tcp_read_timeout
    tcp_read_timeouts: int = 0
    #: UDP queries longer than the receive slot (4096 bytes), answered FORMERR as CoreDNS
    #: answers what it cannot unpack
    oversized: int = 0
    #: qtype name -> durations of the answers that were timed: answers built (answer cache
    #: misses) and upstream round trips. Cached answers are not timed (timing would cost a
    #: large part of what they cost); coredns_dns_request_duration_seconds counts them in its
    #: first bucket.
    durations: dict[str, DurationHistogram] = field(default_factory=dict)

    def count_tcp_rejected(self) -> None:
        self.tcp_rejected += 1

    def count_tcp_evicted(self) -> None:
        self.tcp_evicted += 1

    def request_cell(self, proto: str, qtype: str) -> Cell:
        cell = self._requests.get((proto, qtype))
        if cell is None:
            cell = self._requests[(proto, qtype)] = [0]
        return cell

    def response_cell(self, rcode: str) -> Cell:
        cell = self._responses.get(rcode)
        if cell is None:
            cell = self._responses[rcode] = [0]
        return cell

    def served_cells(self, qtype: str, rcode: str, cache_kind: str | None, request_size: int,
                     reply_sizes: tuple[int, int]) -> tuple[Cell, Cell]:
        """The (UDP, TCP) cells a kept reply counts its hits in; ``cache_kind`` "success" or
        "denial" for an upstream answer (coredns_cache_hits_total), None for a cluster one;
        ``request_size`` the size of the queries it answers, ``reply_sizes`` its (UDP, TCP)
        replies' (with the ID)."""
        return tuple(self._served.setdefault((proto, qtype, rcode, cache_kind, request_size, size), [0])
                     for proto, size in zip(("udp", "tcp"), reply_sizes))  # type: ignore[return-value]

    def cache_hit_cell(self, kind: str) -> Cell:
        cell = self._cache_hits.get(kind)
        if cell is None:
            cell = self._cache_hits[kind] = [0]
        return cell

    def count(self, proto: str, qtype: str, rcode: str, request_size: int, response_size: int) -> None:
        self.request_cell(proto, qtype)[0] += 1
        self.response_cell(rcode)[0] += 1
        cell = self._sizes.get((proto, request_size, response_size))
        if cell is None:
            cell = self._sizes[(proto, request_size, response_size)] = [0]
        cell[0] += 1

    def observe(self, qtype: str, seconds: float) -> None:
        histogram = self.durations.get(qtype)
        if histogram is None:
            histogram = self.durations[qtype] = DurationHistogram()
        histogram.observe(seconds)

    def observe_forward(self, to: str, rcode: str, seconds: float) -> None:
        histogram = self.forward_durations.get((to, rcode))
        if histogram is None:
            histogram = self.forward_durations[(to, rcode)] = DurationHistogram()
        histogram.observe(seconds)

    @property
    def requests(self) -> Counter[tuple[str, str]]:
        """(proto "udp"|"tcp", qtype name) -> count: coredns_dns_requests_total{proto,type}"""
        counts = Counter({key: cell[0] for key, cell in self._requests.items() if cell[0]})
        for (proto, qtype, *_), cell in self._served.items():
            if cell[0]:
                counts[(proto, qtype)] += cell[0]
        return counts

    @property
    def responses(self) -> Counter[str]:
        """rcode name -> count: coredns_dns_responses_total{rcode}"""
        counts = Counter({key: cell[0] for key, cell in self._responses.items() if cell[0]})
        for (_, _, rcode, *_), cell in self._served.items():
            if cell[0]:
                counts[rcode] += cell[0]
        return counts

    @property
    def cache_hits(self) -> Counter[str]:
        """"success"|"denial" -> upstream answers served from the cache"""
        counts = Counter({key: cell[0] for key, cell in self._cache_hits.items() if cell[0]})
        for (_, _, _, kind, *_), cell in self._served.items():
            if kind is not None and cell[0]:
                counts[kind] += cell[0]
        return counts

    @property
    def sizes(self) -> Counter[tuple[str, int, int]]:
        """(proto, request size, response size) -> count: coredns_dns_request_size_bytes and
        coredns_dns_response_size_bytes"""
        counts = Counter({key: cell[0] for key, cell in self._sizes.items() if cell[0]})
        for (proto, _, _, _, request, response), cell in self._served.items():
            if cell[0]:
                counts[(proto, request, response)] += cell[0]
        return counts

    @property
    def answer_cache_hits(self) -> int:
        """cluster-zone answers served pre-encoded"""
        return sum(cell[0] for key, cell in self._served.items() if key[3] is None)

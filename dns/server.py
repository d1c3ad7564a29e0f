"""DnsServer: UDP and TCP listeners around the sans-IO answerer.

UDP is read by a drain loop on a raw non-blocking socket (:mod:`.udp`); a TCP connection
(:mod:`.tcp`, RFC 7766 framing, deadlines and pipelining) hands each frame to the same
:meth:`Answerer.answer`. A cached answer (cluster or relayed upstream) is written back
from the same callback, and only questions that need an upstream become tasks (owned by
the server, cancelled on stop). The server owns the TCP connection cap: no client address
holds more than its share, and at the cap the connection idle longest makes room for a
new one (RFC 7766 section 6.2.3).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import ipaddress
import logging
import socket
import time
from dataclasses import replace
from typing import Callable, Mapping

from kubeport.dns.answer import Answerer, Forward
from kubeport.dns.config import DnsConfig, default_upstreams, search_domains
from kubeport.dns.forward.forwarder import Forwarder, StoredMessage, UpstreamCache
from kubeport.dns.forward.policy import FORWARD_DEADLINE
from kubeport.dns.forward.zones import ZoneRoutes, zone_key
from kubeport.dns.kubedns import NAME as KUBE_DNS_NAME
from kubeport.dns.kubedns import NAMESPACE as KUBE_DNS_NAMESPACE
from kubeport.dns.kubedns import KubeDnsConfig, KubeDnsConfigError, merged, parse_kube_dns
from kubeport.dns.lookup import qtype_name
from kubeport.dns.records import RecordIndex, programming_kinds
from kubeport.dns.stats import DnsStats, ProgrammingHistogram
from kubeport.dns.tcp import TcpConnection
from kubeport.dns.udp import UdpServing, bind_tcp, bind_udp, udp_listener
from kubeport.dns.wire import CD, NOERROR, NXDOMAIN, REFUSED, question_reply
from kubeport.endpoints.types import Snapshot
from kubeport.lib.admission import ConnectionAdmission
from kubeport.lib.heldsockets import NOT_HELD, HeldSockets

log = logging.getLogger(__name__)

Send = Callable[[bytes], None]

#: binding with port 0 retries when the free UDP port is taken for TCP
PORT_ATTEMPTS = 20


class DnsServer:
    """The node's cluster DNS server, a :class:`~kubeport.endpoints.interfaces.Consumer` of snapshots."""

    name = "dns"

    def __init__(self, config: DnsConfig, *, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, hold: HeldSockets = NOT_HELD):
        config = _with_host_search(config)
        #: the configuration as given (flags, file); ``config`` is it with the kube-dns
        #: ConfigMap's settings merged in (:mod:`.kubedns`)
        self._given = config
        self._kube_dns = KubeDnsConfig()
        self._kube_dns_problem: str | None = None
        self._reconfiguring = asyncio.Lock()
        self.config = config
        #: the listening sockets are opened through it (adopted after a crash, else bound and kept)
        self._hold = hold
        self.stats = DnsStats()
        self._clock = clock
        self._monotonic = monotonic
        self._index = _index_for(config, clock())
        #: trigger times from before this are not this server's to measure
        self._started = clock()
        self._snapshot: Snapshot | None = None
        self.answerer = Answerer(config, self._index, self.stats, timer=monotonic, clock=monotonic)
        self.forwarders = self._make_forwarders(config)
        self._udp: list[UdpServing] = []
        self._listening = False
        self._tcp: list[asyncio.Server] = []
        # RFC 7766 section 6.2.3: idle connections make room under load (kubeport.lib.admission).
        self._connections: ConnectionAdmission[TcpConnection] = ConnectionAdmission(
            config.max_tcp_connections, config.max_tcp_connections_per_client,
            rejected=self.stats.count_tcp_rejected, evicted=self.stats.count_tcp_evicted)
        self._tasks: set[asyncio.Task[None]] = set()
        #: cache keys of stale entries being refreshed in the background
        self._refreshing: set[bytes] = set()
        self.port = config.port

    @property
    def forwarder(self) -> Forwarder:
        """The default upstreams' forwarder (every name under no stub domain)."""
        return self.forwarders.default

    def _make_forwarders(self, config: DnsConfig) -> ZoneRoutes[Forwarder]:
        """One forwarder, with its own cache, health and concurrency cap, per stub domain and
        one for the rest: CoreDNS's server block per zone, each with ``forward`` and ``cache``."""
        upstreams = config.upstreams if config.upstreams is not None else default_upstreams()
        default = self._make_forwarder(config, upstreams, ".")
        return ZoneRoutes(default, {zone_key(zone): self._make_forwarder(config, servers, zone)
                                    for zone, servers in config.stub_domains})

    def _make_forwarder(self, config: DnsConfig, upstreams: tuple[tuple[str, int], ...], zone: str) -> Forwarder:
        own = {(address, config.port) for address in config.addresses}
        looping = [u for u in upstreams if u in own]
        if looping:
            log.warning("dns: ignoring upstreams %s of zone %s: they are this server (a forwarding loop)",
                        looping, zone)
        remaining = tuple(u for u in upstreams if u not in own)
        if not remaining and zone == ".":
            log.warning("dns: no upstream resolver: every name outside %s (and unknown reverse names) "
                        "will be answered SERVFAIL; set dns.upstreams (--upstream)", config.zone)
        elif not remaining:
            log.warning("dns: no upstream resolver for the stub domain %s: its names will be answered SERVFAIL",
                        zone)
        cache = UpstreamCache(config.cache_size, config.cache_max_ttl, config.cache_max_negative_ttl,
                              serve_stale=config.serve_stale)
        return Forwarder(remaining, timeout=config.upstream_timeout, cache=cache, stats=self.stats,
                         max_concurrent=config.max_concurrent_forwards, udp_size=config.edns_udp_size,
                         expire=config.upstream_expire, clock=self._monotonic)

    # --- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Bind UDP and TCP on every address (port 0: one free port shared by all); nothing
        to do when started already (or starting: the first sync and a takeover may race)."""
        if self._listening:
            return
        self._listening = True
        try:
            await self._start()
        except BaseException:
            self._listening = False
            raise
        self._listening = True  # a bind retried on another port went through stop()
        log.info("dns: listening on %s port %d (udp, tcp)", ", ".join(self.config.addresses), self.port)

    async def _start(self) -> None:
        for attempt in range(PORT_ATTEMPTS):
            try:
                await self._bind_all()
                break
            except OSError as error:
                await self.stop()
                if self.config.port != 0 or error.errno != errno.EADDRINUSE or attempt == PORT_ATTEMPTS - 1:
                    raise
                self.port = 0  # the free UDP port was taken for TCP: pick another
            except BaseException:
                await self.stop()
                raise
        if self.forwarder.closed:  # stopped before (a rebind, a failed bind)
            self.forwarders = self._make_forwarders(self.config)

    async def _bind_all(self) -> None:
        loop = asyncio.get_running_loop()
        for address in self.config.addresses:
            family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
            # SO_REUSEPORT: a new kubeport instance binds the same address before this one
            # leaves (seamless restart); the kernel spreads queries over both meanwhile.
            sock = self._hold.adopt_or_bind(f"dns-udp/{address}/{self.port}",
                                            functools.partial(bind_udp, address, self.port, family))
            self._udp.append(UdpServing(sock, udp_listener(sock, self.answerer, self._forward, self.stats), loop))
            if self.port == 0:
                self.port = sock.getsockname()[1]
            listener = self._hold.adopt_or_bind(f"dns-tcp/{address}/{self.port}",
                                                functools.partial(bind_tcp, address, self.port, family))
            server = await loop.create_server(lambda: TcpConnection(self), sock=listener)
            self._tcp.append(server)

    async def stop(self, lame_duck: float = 0.0, *, hand_over: bool = False) -> None:
        """Keep answering for ``lame_duck`` seconds (clients move on), then stop accepting,
        close connections, cancel forwards.

        ``hand_over``: a successor listens on the same addresses (SO_REUSEPORT). New queries
        go to it at once (the UDP sockets step aside, the TCP listeners close); the queries
        already queued here are answered, and the forwards in flight get their upstream's
        answer (up to the forward deadline) before the sockets close: none is lost.
        """
        if lame_duck > 0:
            await asyncio.sleep(lame_duck)
        self._listening = False
        for address in self.config.addresses:  # closed for good: the holder's copies first
            self._hold.release(f"dns-udp/{address}/{self.port}")
            self._hold.release(f"dns-tcp/{address}/{self.port}")
        for server in self._tcp:
            server.close()
        if hand_over:
            for serving in self._udp:
                serving.step_aside()
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=FORWARD_DEADLINE)
        for serving in self._udp:
            serving.close()
        for connection in list(self._connections):
            connection.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in self._tcp:
            await server.wait_closed()
        self._tcp.clear()
        self._udp.clear()
        await self._close_forwarders()

    # --- data -----------------------------------------------------------------------

    def apply(self, snapshot: Snapshot) -> None:
        """Take a snapshot; only services changed since the previous one are rebuilt, and
        their cached answers dropped before this returns (fresh at once)."""
        previous = self._snapshot
        changed = snapshot.changed_since(previous)
        change = self._index.apply(snapshot, changed, now=self._clock())
        self._snapshot = snapshot
        self.answerer.invalidate(change)
        if previous is not None and change.services:
            now = self._clock()  # answered from here on: the changed answers are dropped
            programming = self.stats.programming
            for kind, started in programming_kinds(previous, snapshot, change.services, self._started):
                histogram = programming.get(kind)
                if histogram is None:
                    histogram = programming[kind] = ProgrammingHistogram()
                histogram.observe(max(0.0, now - started))

    def snapshot_queued(self, snapshot: Snapshot) -> None:
        """Nothing to do before the apply: answers change when the index does."""

    async def apply_snapshot(self, snapshot: Snapshot) -> None:
        """:meth:`apply`, then listen if not listening yet: beside a predecessor (a rollout)
        DNS listens only once it knows the cluster, since the kernel spreads queries over
        both instances' sockets and an unsynced one would answer cluster names SERVFAIL."""
        self.apply(snapshot)
        if not self._listening:
            await self.start()

    async def _close_forwarders(self) -> None:
        forwarders = [forwarder for _, forwarder in self.forwarders]
        for forwarder in forwarders:
            forwarder.close()
        for forwarder in forwarders:
            await forwarder.wait_closed()

    @property
    def problems(self) -> list[str]:
        """An unusable kube-dns ConfigMap (its last good settings kept); otherwise none: a name
        it cannot answer is an answer (SERVFAIL, NXDOMAIN), not a problem."""
        return [self._kube_dns_problem] if self._kube_dns_problem is not None else []

    def kube_dns_changed(self, data: Mapping[str, str] | None) -> None:
        """The kube-dns ConfigMap's ``data`` as listed or watched (None: there is none): its
        stub domains and upstream nameservers applied from the next query on, merged with the
        given configuration (:func:`.kubedns.merged`). Data that does not parse is a problem,
        and the last good settings stay, as kube-dns and NodeLocal DNSCache ignore such an
        update."""
        try:
            cluster = parse_kube_dns(data, self._given.zone)
        except KubeDnsConfigError as error:
            problem = (f"ConfigMap {KUBE_DNS_NAMESPACE}/{KUBE_DNS_NAME}: {error}; keeping the last good settings "
                       f"({self._kube_dns.describe()})")
            if problem != self._kube_dns_problem:
                log.error("dns: %s", problem)
            self._kube_dns_problem = problem
            return
        if self._kube_dns_problem is not None:
            log.info("dns: ConfigMap %s/%s: usable again", KUBE_DNS_NAMESPACE, KUBE_DNS_NAME)
            self._kube_dns_problem = None
        if cluster == self._kube_dns:
            return
        log.info("dns: ConfigMap %s/%s: %s", KUBE_DNS_NAMESPACE, KUBE_DNS_NAME, cluster.describe())
        self._kube_dns = cluster
        self._spawn(self.reconfigure(self._given))

    @property
    def synced(self) -> bool:
        return self._index.synced

    @property
    def listening(self) -> bool:
        """Started and not stopped since."""
        return self._listening

    def set_ttl(self, ttl: int) -> None:
        self._given = self._given.with_changes(ttl=ttl)
        self._reconfigure_data(self.config.with_changes(ttl=ttl))

    async def reconfigure(self, config: DnsConfig) -> None:
        """Apply a new configuration (as given: the kube-dns ConfigMap's settings are merged in
        here); listeners are rebound only if addresses/port changed."""
        async with self._reconfiguring:
            await self._reconfigure(config)

    async def _reconfigure(self, config: DnsConfig) -> None:
        self._given = config = _with_host_search(config)
        config = merged(config, self._kube_dns)
        rebind = (config.addresses, config.port) != (self.config.addresses, self.config.port)
        was_listening = self._listening
        if rebind:
            await self.stop()
        if _forwarding(config) != _forwarding(self.config):
            await self._close_forwarders()
            self.forwarders = self._make_forwarders(config)
        self._reconfigure_data(config)
        if rebind:
            self.port = config.port
            if was_listening:  # else the first sync starts it (a handover's new instance)
                await self.start()

    def _reconfigure_data(self, config: DnsConfig) -> None:
        if _index_shape(config) != _index_shape(self.config):
            self._index = _index_for(config, self._clock())
            if self._snapshot is not None:
                self._index.apply(self._snapshot, None, now=self._clock())
        self.config = config
        self.answerer.reconfigure(config, self._index)

    # --- per query --------------------------------------------------------------------

    def _forward(self, forward: Forward, send: Send) -> None:
        query = forward.query
        if forward.walk is not None:
            self._spawn(self._autopath(forward, send, self._monotonic()))
            return
        do = bool(query.edns and query.edns.do)
        cd = bool(query.flags & CD)
        key = Forwarder.cache_key(forward.question, do=do, cd=cd)
        now = self._monotonic()
        forwarder = self.forwarders.route(forward.labels)
        stored = forwarder.cached(key, now, stale=self.config.serve_stale > 0)
        stale = None
        if stored is not None:
            if now < stored.expires:
                config = self.config
                if config.prefetch and now >= stored.prefetch_at(config.prefetch_percentage) and \
                        stored.counts_towards_prefetch(now, config.prefetch_duration, config.prefetch):
                    self._refresh(forwarder, forward, key, do=do, cd=cd, prefetch=True)
                send(self.answerer.relay_stored(forward, stored, now))
                return
            stale = stored
            if self.config.serve_stale_refresh == "immediate":
                # CoreDNS cache handler.go: the stale item at TTL 0 now, a prefetch behind it
                self.stats.served_stale += 1
                send(self.answerer.relay(forward, stale.stale()))
                self._refresh(forwarder, forward, key, do=do, cd=cd)
                return
        if forwarder.busy:
            self.stats.forward_refused += 1
            send(self.answerer.reply_raw(query, forward.tcp, question_reply(
                query, REFUSED, self.config.edns_udp_size, authoritative=False), REFUSED, forward.request_size))
            return
        task = asyncio.get_running_loop().create_task(
            self._resolve(forwarder, forward, send, key, do=do, cd=cd, started=now, stale=stale))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _spawn(self, work) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _autopath(self, forward: Forward, send: Send, started: float) -> None:
        """Walk the search names outside the cluster zone upstream, one at a time, the
        upstream cache first (CoreDNS's autopath sits before forward, behind no cache)."""
        step: bytes | Forward = forward
        try:
            while isinstance(step, Forward) and step.walk is not None:
                query = step.query
                key = Forwarder.cache_key(step.question, do=bool(query.edns and query.edns.do),
                                          cd=bool(query.flags & CD))
                now = self._monotonic()
                forwarder = self.forwarders.route(step.labels)
                stored = forwarder.cache.lookup(key, now)
                if stored is not None:
                    message: bytes | None = stored.aged(now)
                else:
                    message = await forwarder.resolve(step.question, do=bool(query.edns and query.edns.do),
                                                           cd=bool(query.flags & CD), tcp=step.tcp)
                step = self.answerer.autopath_step(step, message)
        except Exception:  # a bug must cost one SERVFAIL, not the client's silence
            self.stats.panics += 1
            log.exception("dns: autopath for %s failed", forward.query.labels)
            step = self.answerer.relay(replace(forward, walk=None), None)
        if isinstance(step, Forward):  # an ExternalName found on the way: its chain
            self._forward(step, send)
            return
        send(step)
        self.stats.observe(qtype_name(forward.query.qtype), self._monotonic() - started)

    def _refresh(self, forwarder: Forwarder, forward: Forward, key: bytes, *, do: bool, cd: bool,
                 prefetch: bool = False) -> None:
        """Ask upstream for a stale or soon expiring entry in the background, once at a time
        per question; the answer only refreshes the cache."""
        if key in self._refreshing or forwarder.busy:
            return
        self._refreshing.add(key)
        if prefetch:
            self.stats.prefetches += 1

        async def refresh() -> None:
            try:
                await forwarder.resolve(forward.question, do=do, cd=cd, tcp=forward.tcp)
            except Exception:
                self.stats.panics += 1
                log.exception("dns: refreshing %s failed", forward.labels)
            finally:
                self._refreshing.discard(key)

        task = asyncio.get_running_loop().create_task(refresh())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resolve(self, forwarder: Forwarder, forward: Forward, send: Send, key: bytes, *, do: bool,
                       cd: bool, started: float, stale: StoredMessage | None = None) -> None:
        """Forward and relay; ``stale`` (serve_stale verify) is answered at TTL 0 instead when
        upstream gives no NOERROR or NXDOMAIN (CoreDNS cache verifyStaleResponseWriter)."""
        try:
            message = await forwarder.resolve(forward.question, do=do, cd=cd, tcp=forward.tcp)
        except Exception:  # a bug must cost one SERVFAIL, not the client's silence
            self.stats.panics += 1
            log.exception("dns: forwarding %s failed", forward.labels)
            message = None
        now = self._monotonic()
        if stale is not None and (message is None or message[3] & 0xF not in (NOERROR, NXDOMAIN)):
            self.stats.served_stale += 1
            send(self.answerer.relay(forward, stale.stale()))
            self.stats.observe(qtype_name(forward.query.qtype), now - started)
            return
        stored = forwarder.cache.lookup(key, now) if message is not None else None
        if stored is not None:  # cached: relay it so that its reply is kept encoded too
            send(self.answerer.relay_stored(forward, stored, now))
        else:
            send(self.answerer.relay(forward, message))
        self.stats.observe(qtype_name(forward.query.qtype), now - started)


def _with_host_search(config: DnsConfig) -> DnsConfig:
    """autopath's search domains after the cluster's: by default the host's, as CoreDNS
    reads its own /etc/resolv.conf (a node-local server's is the node's, as the kubelet's
    ClusterFirst pods get them)."""
    if config.autopath and config.autopath_search is None:
        return config.with_changes(autopath_search=search_domains())
    return config


def _forwarding(config: DnsConfig) -> tuple[object, ...]:
    return (config.upstreams, config.stub_domains, config.upstream_timeout, config.cache_size, config.cache_max_ttl,
            config.cache_max_negative_ttl, config.max_concurrent_forwards, config.edns_udp_size, config.upstream_expire,
            config.serve_stale)


def _index_shape(config: DnsConfig) -> tuple[object, ...]:
    """The options an index is built for: changing one rebuilds it."""
    return (config.zone, config.endpoint_pod_names, config.namespaces, config.noendpoints, config.labels,
            config.namespace_labels)


def _index_for(config: DnsConfig, now: float) -> RecordIndex:
    return RecordIndex(config.zone, endpoint_pod_names=config.endpoint_pod_names,
                       exposed=frozenset(config.namespaces) if config.namespaces else None,
                       endpoints=not config.noendpoints, now=now, selector=config.label_selector,
                       namespace_selector=config.namespace_selector)

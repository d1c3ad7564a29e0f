"""The Proxier: reconciles live listeners, VIP addresses and DROP rules with the desired table.

``apply(snapshot)`` rebuilds the rules of the services that changed (all of them
when the node changed), diffs them frontend by frontend, and then: opens
listeners for new frontends, closes gone ones, and swaps a changed frontend's
endpoints in place (``listener.route = ...``) without touching its socket or
its established connections. Unchanged services cost nothing.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import random
from types import MappingProxyType
from typing import Awaitable, Callable, Iterable, Iterator, Mapping

from kubeport.endpoints.types import ServiceName, ServicePortName, Snapshot
from kubeport.lib.heldsockets import NOT_HELD, HeldSockets
from kubeport.proxy.balancer import Balancer, Route, ServicePortPool, default_affinity_factory
from kubeport.proxy.clientaddress import frontend_keep
from kubeport.proxy.config import ProxyConfig
from kubeport.proxy.connectlb.balancing import ConnectBalancing, remove_left_over
from kubeport.proxy.host.addresses import AddressManager, NetlinkAddresses, canonical
from kubeport.proxy.host.kernel import requests_migrate, sctp_supported
from kubeport.proxy.host.nftables import Firewall, NftFirewall
from kubeport.proxy.host.replies import ClientReplies, NodeLinks, RepliesError, read_links, transparent_allowed
from kubeport.proxy.host.state import HostState
from kubeport.proxy.housekeeping import AffinitySweeper
from kubeport.proxy.nodeview import NodeView
from kubeport.proxy.relay.context import RelayContext
from kubeport.proxy.relay.listeners import Listeners, ServedElsewhere
from kubeport.proxy.stats import ServicePortStats
from kubeport.proxy.table import (
    ForwardingTable,
    Frontend,
    FrontendKind,
    FrontendRule,
    RuleChange,
    TableContext,
    service_rules,
)

log = logging.getLogger(__name__)

#: services rebuilt, and listeners opened, between two turns of the event loop in a big apply.
_SERVICES_PER_TURN = 500
_LISTENERS_PER_TURN = 500
#: seconds between tries of the frontends refused a listener for want of descriptors, when no
#: apply comes meanwhile (connections closing free descriptors without any change to apply)
LISTENER_RETRY_S = 5.0
_by_name = operator.attrgetter("namespace", "name")


class Proxier:
    def __init__(
        self,
        config: ProxyConfig,
        node_name: str,
        *,
        addresses: AddressManager | None = None,
        firewall: Firewall | None = None,
        affinity_factory=default_affinity_factory,
        relay: bool = True,
        replies: ClientReplies | None = None,
        balancing: ConnectBalancing | None = None,
        hold: HeldSockets = NOT_HELD,
    ) -> None:
        self.config = config
        #: False: the relay workers listen and relay; this process programs the node only
        self._relay = relay
        #: where the listeners are adopted from, or bound and kept, across a crash
        self._hold = hold
        self.node_name = node_name
        self._addresses: AddressManager = addresses if addresses is not None else NetlinkAddresses(
            config.vip_interface)
        if firewall is None and config.firewall:
            firewall = NftFirewall()
            if replies is None and config.keep_client_address:
                replies = ClientReplies()
            if balancing is None and config.connect_balancing:
                balancing = ConnectBalancing(node_name, config.connect_balancing_cgroup, config.bpf_root)
        #: this process programs the node (not a relay worker, nor a test's fake firewall)
        self._programs_host = firewall is not None and isinstance(firewall, NftFirewall)
        self._host = HostState(self._addresses, firewall)
        #: the process that programs the host also takes replies to clients' addresses back to
        #: the relays (relay workers only bind them: their parent programs the tables)
        self._replies = replies
        #: the node's pods balanced at connect() (the process that programs the host only)
        self._balancing = balancing
        #: where the client's address is kept: "client", or "node: <why>" (status)
        self._client_address = "node: --no-keep-client-address" if not config.keep_client_address else "client"
        self._affinity_factory = affinity_factory
        self._rng = random.Random(config.seed)
        self._table = ForwardingTable()
        self._pools: dict[ServicePortName, ServicePortPool] = {}
        self._pool_affinity: dict[ServicePortName, int] = {}
        self._ctx: RelayContext | None = None
        self._listeners: Listeners | None = None
        self._table_ctx: TableContext | None = None
        self._node = NodeView(config.nodeport_addresses)
        self._snapshot: Snapshot | None = None
        self._extra_addresses: frozenset[str] = frozenset()
        self._reserved: frozenset[Frontend] = frozenset()
        self._fatal: asyncio.Future | None = None
        self._ready = asyncio.Event()
        self._applying = asyncio.Lock()  # an apply and a full resync of the host never overlap
        self._stopping = False
        self._forced = asyncio.Event()
        self._stopped = asyncio.Event()
        self._grace_timers: set[asyncio.TimerHandle] = set()
        self._listener_retry: asyncio.TimerHandle | None = None
        self._sweeper: AffinitySweeper | None = None
        self._local_vips_version = -1  # of the VIP set last given to the local-client test

    # --- lifecycle ----------------------------------------------------------------------

    async def start(
        self, extra_addresses: Iterable[str] = (), reserved_frontends: Iterable[Frontend] | None = None
    ) -> None:
        """Add ``extra_addresses`` (the DNS server's) and prepare; opens no listener yet.

        ``reserved_frontends`` (else ``config.reserved_frontends``) are never proxied; when
        neither names any, port 53 TCP and UDP on every extra address are reserved (a
        kube-dns Service with that ClusterIP belongs to the DNS server).
        """
        loop = asyncio.get_running_loop()
        self._fatal = loop.create_future()
        self._ctx = RelayContext(loop, self.config, on_fatal=self._on_fatal, hold=self._hold)
        log.info("TCP relay: %s", self._ctx.tcp_relay)
        config = self.config
        self._sweeper = AffinitySweeper(loop, self._ctx.clock, config.affinity_sweep_interval,
                                        config.affinity_sweep_budget)
        self._extra_addresses = frozenset(canonical(a) for a in extra_addresses)
        if reserved_frontends is None and self.config.reserved_frontends:
            reserved_frontends = [Frontend(canonical(ip), port, proto) for ip, port, proto in config.reserved_frontends]
        if reserved_frontends is None:
            reserved_frontends = [Frontend(a, 53, proto) for a in self._extra_addresses for proto in ("TCP", "UDP")]
        self._reserved = frozenset(reserved_frontends)
        sctp = sctp_supported()
        if not sctp:
            log.warning("SCTP is not supported by this kernel: SCTP service ports are not served")
        listeners = Listeners if self._relay else ServedElsewhere
        self._listeners = listeners(self._ctx, sctp=sctp, steer_affinity=config.workers > 1)
        await self._host.start(self._extra_addresses, config.cluster_cidrs, config.service_cidrs,
                               extra_ports=(f for f in self._reserved if f.ip in self._extra_addresses))
        await self._start_client_address()
        if self._balancing is not None:
            self._balancing.start()
        elif self._programs_host and not config.connect_balancing:
            remove_left_over(config.bpf_root, self.node_name)

    async def _start_client_address(self) -> None:
        """Decide once whether upstream sockets bind the client's address, before any route."""
        if not self.config.keep_client_address:
            return
        bridge_problem = None if self.config.keep_client_address_on_bridge else "told by the parent"
        if self._replies is not None:
            await self._replies.start(await self._read_links())
            problem, bridge_problem = self._replies.problem, self._replies.bridge_problem
        else:
            problem = transparent_allowed()
        if problem is not None:
            self._client_address = f"node: {problem}"
        elif bridge_problem is not None:
            self._ctx.client_addresses.on_bridge = False
            self._client_address = f"client; the node's to endpoints on the client's own bridge: {bridge_problem}"

    async def _read_links(self) -> NodeLinks:
        try:
            return await read_links()
        except (RepliesError, OSError) as exc:
            log.warning("reading the node's links for pod subnets and bridges: %s", exc)
            return NodeLinks((), ())

    @property
    def client_address(self) -> str:
        """What endpoints see where kube-proxy keeps the client's address: "client", or why the node's."""
        return self._client_address

    @property
    def pod_traffic(self) -> str:
        """Which path serves the node's pods reaching Services: connect-time balancing (in which
        cgroup, pinned where), or the relay and why."""
        balancing = self._balancing
        if balancing is None:
            return "relay: --no-connect-balancing" if not self.config.connect_balancing else "relay"
        if balancing.problem is not None:
            return f"relay: {balancing.problem}"
        if not balancing.active:
            return "relay: not started"
        return f"connect(): cgroup {balancing.cgroup}, pinned in {balancing.pin_directory}"

    @property
    def connects_balanced(self) -> Mapping[ServicePortName, int]:
        """Connects of the node's pods balanced in the kernel, per service port."""
        return self._balancing.connects() if self._balancing is not None else {}

    @property
    def keeps_client(self) -> bool:
        return self._client_address.startswith("client")

    @property
    def keeps_client_on_bridge(self) -> bool:
        return self._client_address == "client"

    async def stop(
        self, grace: float = 0.0, *, abort: asyncio.Event | None = None, release: bool = True,
        hand_over: bool | None = None, keep_if: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        """Stop accepting, drain, close; ``release=False`` leaves VIPs and nftables to a successor,
        and so does ``keep_if()`` true once the drain is over (one started meanwhile).

        TCP and SCTP listeners close at once; what the kernel queued is served in the drain,
        except in a handover (``hand_over``, by default ``not release``) with tcp_migrate_req=1
        (the kernel moves it to the successor). UDP frontends serve their flows until idle; in
        a handover new datagrams go to the successor meanwhile. Established connections run
        until they end, ``grace`` seconds pass or ``abort`` is set; the rest are reset.
        """
        if hand_over is None:
            hand_over = not release
        if self._ctx is None:
            return
        if self._stopping:  # a second stop cuts the first one's drain short and waits for it
            self._forced.set()
            await self._stopped.wait()
            return
        ctx = self._ctx
        self._stopping = True
        # Connections the kernel queued already: served here while draining, unless a successor
        # gets them anyway (tcp_migrate_req) or no drain would let them finish.
        take_queued = grace > 0 and (not hand_over or not requests_migrate())
        if self._listener_retry is not None:
            self._listener_retry.cancel()
            self._listener_retry = None
        self._listeners.stop_accepting(hand_over=hand_over, accept_queued=take_queued)
        if grace > 0 and (ctx.conns or ctx.draining):
            await ctx.wait_idle_for(grace, abort, self._forced)
        if ctx.conns:
            log.info("shutdown: resetting %d connections still open", len(ctx.conns))
        for conn in list(ctx.conns):
            conn.abort()
        self._listeners.close_all()
        for timer in self._grace_timers:
            timer.cancel()
        self._grace_timers.clear()
        self._sweeper.close()
        ctx.close()
        if release and keep_if is not None and await keep_if():
            release = False
        await self._host.stop(release=release)
        if self._replies is not None:
            await self._replies.stop(release=release)
        if self._balancing is not None:
            self._balancing.stop(release=release)
        self._ctx = None
        self._stopped.set()

    def _on_fatal(self, exc: BaseException) -> None:
        if self._fatal is not None and not self._fatal.done():
            self._fatal.set_exception(exc)

    async def wait_failed(self) -> None:
        """Raises the first error the proxy cannot recover from (e.g. an unexpected accept error)."""
        await self._fatal

    async def wait_ready(self) -> None:
        """Until the first synced snapshot has been applied."""
        await self._ready.wait()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    # --- views ------------------------------------------------------------------------

    @property
    def stats(self) -> Mapping[ServicePortName, ServicePortStats]:
        return MappingProxyType({name: pool.stats for name, pool in self._pools.items()})

    @property
    def rules(self) -> Mapping[Frontend, FrontendRule]:
        return MappingProxyType(self._table.rules)

    @property
    def listening(self) -> frozenset[Frontend]:
        return self._listeners.open_frontends() if self._listeners else frozenset()

    @property
    def reserved_frontends(self) -> frozenset[Frontend]:
        """Frontends left to someone else (the DNS server's), as decided at start."""
        return self._reserved

    def listener(self, frontend: Frontend):
        """The live listener of ``frontend`` (TcpListener or UdpListener), None without one."""
        return self._listeners.listener(frontend) if self._listeners else None

    @property
    def tcp_relay(self) -> str:  # how bulk TCP bytes move: sockmap or splice, and why
        return self._ctx.tcp_relay if self._ctx is not None else self.config.tcp_relay

    @property
    def open_connections(self) -> int:  # TCP and SCTP connections relayed now
        return len(self._ctx.conns) if self._ctx is not None else 0

    @property
    def pending_endpoint_cuts(self) -> int:  # endpoint grace periods still running
        return len(self._grace_timers)

    @property
    def nodeport_addresses(self) -> tuple[str, ...]:
        """Where NodePorts listen, per --nodeport-addresses (empty: none matched, or not applied yet)."""
        return self._table_ctx.nodeport_addresses if self._table_ctx is not None else ()

    @property
    def health_check_addresses(self) -> tuple[str, ...]:  # see NodePortSelection; empty: nowhere
        return self._node.selection.health_check_addresses

    @property
    def problems(self) -> list[str]:
        found = [str(c) for c in self._table.conflicts()] + list(self._host.problems.values())
        if self._host.unfiltered:
            found.append(self._host.unfiltered)
        found += self._node.problems
        if self.config.keep_client_address and not self.keeps_client:
            found.append(f"endpoints see the node's address, not the client's ({self._client_address[6:]})")
        if self._balancing is not None and self._balancing.problem is not None:
            found.append(f"connect-time balancing is off, the relay serves the node's pods: {self._balancing.problem}")
        if self._listeners is not None:
            found += self._listeners.problems()
        return found

    # --- applying snapshots ---------------------------------------------------------------

    @property
    def host_problems(self) -> bool:  # the addresses or the table are not in line (retried in full)
        return bool(self._host.problems)

    @property
    def node_addresses(self) -> tuple[str, ...]:
        return self._node.addresses

    def invalidate_node_addresses(self) -> None:
        self._node.stale = True

    async def refresh_node_addresses(self) -> bool:
        """Re-read the node's own addresses, as kube-proxy at every sync: True if NodePorts moved."""
        if self._snapshot is None or self._stopping:
            return False
        if tuple(await self._addresses.interface_addresses()) == self._node.addresses:
            return False
        self._node.stale = True
        await self.apply(self._snapshot)
        return True

    async def resync_host(self) -> None:
        """Write the nftables table whole and restore the VIP addresses from what the kernel
        holds (kube-proxy's full sync, at least hourly): undoes changes made behind our back."""
        async with self._applying:
            if self._ctx is not None and not self._stopping:
                await self._host.resync()

    async def apply(self, snapshot: Snapshot) -> None:
        """Bring listeners, addresses and DROP rules in line with ``snapshot`` (incrementally)."""
        async with self._applying:
            await self._apply(snapshot)

    async def _apply(self, snapshot: Snapshot) -> None:
        if self._ctx is None:
            raise RuntimeError("Proxier.apply before start")
        if self._stopping:
            return  # draining: the listeners are closed for good
        if not snapshot.servable:
            log.debug("snapshot %d is not synced yet: nothing applied", snapshot.generation)
            return
        table_ctx = await self._table_context(snapshot)
        if table_ctx != self._table_ctx:
            changed = frozenset(snapshot.services) | self._table.services()
            self._table_ctx = table_ctx
        else:
            changed = snapshot.changed_since(self._snapshot)
        changes: list[RuleChange] = []
        host = self._host
        host.set_service_cidrs(snapshot.service_cidrs)  # ServiceCIDRs come and go (KEP-1880)
        for count, name in enumerate(sorted(changed, key=_by_name), 1):
            service_changes = self._update_service(name, snapshot, table_ctx)
            if service_changes:
                host.account(service_changes)
                changes += service_changes
            if not count % _SERVICES_PER_TURN:
                # A cold start builds every service at once: let the loop serve meanwhile, and the
                # netlink thread start on the addresses counted so far.
                host.begin_adding()
                await asyncio.sleep(0)
                if self._stopping:
                    return
        await self._reconcile(changes)
        self._snapshot = snapshot
        self._ready.set()

    async def _table_context(self, snapshot: Snapshot) -> TableContext:
        node = snapshot.node
        previous = self._table_ctx
        if (previous is not None and self._snapshot is not None and snapshot.node is self._snapshot.node
                and not self._node.stale):
            return previous
        primary = node.primary_ips() if node is not None else ()
        local = await self._addresses.interface_addresses()
        selection = self._node.select(node, local)
        self._ctx.local_clients.set_node_addresses(local)
        if self.keeps_client:
            links = await self._read_links()
            self._ctx.client_addresses.set_node(local, links.networks)
            if self._replies is not None:
                self._replies.set_bridges(links.bridges)
        self._host.set_node_addresses(local)
        return TableContext(
            node_name=self.node_name,
            zone=node.zone if node is not None else None,
            nodeport_addresses=selection.addresses,
            reserved=self._reserved,
            node_ips=tuple(primary),
        )

    def _update_service(self, name: ServiceName, snapshot: Snapshot, ctx: TableContext) -> list[RuleChange]:
        state = snapshot.services.get(name)
        rules = service_rules(state, ctx)
        had = {rule.port_name for rule in self._table.service(name).values()}
        wanted: dict[ServicePortName, list] = {}
        for rule in rules.values():
            endpoints = wanted.setdefault(rule.port_name, [])
            endpoints.extend(rule.endpoints)
            endpoints.extend(rule.local_client_endpoints or ())
        affinity = state.service.affinity_timeout if state is not None else 0
        for port_name in had - wanted.keys():
            self._retire(port_name, self._pools.pop(port_name).sync(()))
            self._pool_affinity.pop(port_name, None)
            self._sweeper.track(port_name, None)
        for port_name, endpoints in wanted.items():
            pool = self._pool(port_name, affinity)
            self._retire(port_name, pool.sync(endpoints))
        return self._table.update(name, {frontend: self._bind(rule) for frontend, rule in rules.items()})

    def _bind(self, rule: FrontendRule) -> FrontendRule:
        """The rule with its pool's EndpointStates in place of the PortEndpoints it was built with.

        The table then keeps the very tuples the listeners' routes use (no second copy of
        100,000 endpoints), and two rules compare equal exactly when their routes would: the
        pool keeps an endpoint's state while the endpoint stays.
        """
        local = rule.local_client_endpoints
        if not rule.endpoints and not local:
            return rule
        pool = self._pools[rule.port_name]
        return FrontendRule(
            rule.port_name, rule.kind, rule.action, pool.states(rule.endpoints),
            pool.states(local) if local is not None else None, rule.affinity_timeout, rule.source_ranges,
            rule.proxy_protocol,
        )

    def _pool(self, port_name: ServicePortName, affinity_timeout: int) -> ServicePortPool:
        pool = self._pools.get(port_name)
        if pool is None:
            config = self.config
            balancer = Balancer(self._rng, eject_after=config.eject_after_failures,
                                eject_base=config.eject_base_seconds, eject_max=config.eject_max_seconds)
            pool = self._pools[port_name] = ServicePortPool(port_name, balancer)
        if self._pool_affinity.get(port_name, 0) != affinity_timeout:  # only ports with affinity have an entry
            pool.balancer.affinity = self._affinity_factory(affinity_timeout) if affinity_timeout else None
            if affinity_timeout:
                self._pool_affinity[port_name] = affinity_timeout
            else:
                del self._pool_affinity[port_name]
            self._sweeper.track(port_name, pool.balancer.affinity)
        return pool

    def _retire(self, port_name: ServicePortName, removed) -> None:
        """Endpoints gone from a service port: cut their connections after the grace period, if any."""
        grace = self.config.endpoint_grace_period
        if grace is None or self._ctx is None:
            return
        doomed = [state for state in removed if state.has_connections()]
        if not doomed:
            return

        def cut() -> None:
            self._grace_timers.discard(timer)
            pool = self._pools.get(port_name)
            for state in doomed:
                if pool is not None and pool.find(state.ip, state.port) is not None:
                    continue  # the endpoint came back within the grace period: keep its connections
                for conn in list(state.connections):
                    conn.abort()

        timer = self._ctx.loop.call_later(grace, cut)
        self._grace_timers.add(timer)

    async def _reconcile(self, changes: list[RuleChange]) -> None:
        host = self._host
        await host.before_listeners()
        if self._replies is not None and self.keeps_client:
            if self._replies.needs_recount:  # the bridges changed: what counts changed too
                self._replies.recount(_endpoint_elements(self._table.rules.items()))
            else:
                self._replies.account(_endpoint_elements((c.frontend, c.old) for c in changes),
                                      _endpoint_elements((c.frontend, c.new) for c in changes))
            await self._replies.sync()
        if self._balancing is not None:
            await self._balancing.apply(changes, self._table.rules)
        listeners = self._listeners
        for count, change in enumerate(changes, 1):
            listeners.apply(change, self._route_for)
            if not count % _LISTENERS_PER_TURN:
                await asyncio.sleep(0)  # a cold start opens every listener at once: keep serving
                if self._stopping:
                    return
        listeners.retry_failed(self._route_for)
        listeners.log_shortage()
        self._retry_listeners_later()
        await host.after_listeners()
        if host.wanted_version != self._local_vips_version:
            self._local_vips_version = host.wanted_version
            self._ctx.local_clients.set_vips(host.wanted)

    def _retry_listeners_later(self) -> None:
        if self._listener_retry is None and self._listeners.short_of_descriptors and not self._stopping:
            self._listener_retry = self._ctx.loop.call_later(LISTENER_RETRY_S, self._retry_listeners)

    def _retry_listeners(self) -> None:
        """The frontends short of descriptors tried again, unless an apply runs (it tries them
        itself at its end, and sets the timer again)."""
        self._listener_retry = None
        if self._stopping or self._applying.locked():
            return
        self._listeners.retry_short(self._route_for)
        self._listeners.log_shortage()
        self._retry_listeners_later()

    def _route_for(self, rule: FrontendRule) -> Route:
        external_local = rule.kind is not FrontendKind.CLUSTER_IP and rule.local_client_endpoints is not None
        return Route(self._pools[rule.port_name], rule.endpoints, rule.local_client_endpoints,  # bound: _bind
                     proxy_protocol=rule.proxy_protocol,
                     keep=frontend_keep(rule.kind, external_local, self.keeps_client))


def _endpoint_elements(changes) -> Iterator[tuple[str, str, int]]:
    """(address, protocol, port) of every endpoint a rule of ``changes`` names; lazily, so a
    node without bridges (which counts none) builds none."""
    for frontend, rule in changes:
        if rule is None:
            continue
        proto = frontend.protocol.lower()
        for endpoint in rule.endpoints:
            yield endpoint.ip, proto, endpoint.port
        for endpoint in rule.local_client_endpoints or ():
            yield endpoint.ip, proto, endpoint.port

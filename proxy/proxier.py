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
import random
import socket
from collections import Counter
from types import MappingProxyType
from typing import Iterable, Mapping

from kubeport.endpoints.types import ServiceName, ServicePortName, Snapshot

from .addresses import AddressError, AddressManager, NetlinkAddresses, canonical
from .balancer import Balancer, Route, ServicePortPool, default_affinity_factory
from .config import ProxyConfig
from .context import RelayContext
from .firewall import Firewall, FirewallError, NftFirewall
from .listeners import Listeners
from .nodeports import select_nodeport_addresses
from .stats import ServicePortStats
from .table import (
    Action,
    ForwardingTable,
    Frontend,
    FrontendKind,
    FrontendRule,
    RuleChange,
    TableContext,
    service_rules,
)

log = logging.getLogger(__name__)

_VIP_KINDS = (FrontendKind.CLUSTER_IP, FrontendKind.EXTERNAL_IP, FrontendKind.LOAD_BALANCER)


def sctp_supported() -> bool:
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_SCTP).close()
    except OSError:
        return False
    return True


class Proxier:
    def __init__(
        self,
        config: ProxyConfig,
        node_name: str,
        *,
        addresses: AddressManager | None = None,
        firewall: Firewall | None = None,
        affinity_factory=default_affinity_factory,
    ) -> None:
        self.config = config
        self.node_name = node_name
        self._addresses = addresses if addresses is not None else (
            NetlinkAddresses(config.vip_interface) if config.manage_addresses else None
        )
        self._firewall = firewall if firewall is not None else (NftFirewall() if config.firewall else None)
        self._affinity_factory = affinity_factory
        self._rng = random.Random(config.seed)
        self._table = ForwardingTable()
        self._pools: dict[ServicePortName, ServicePortPool] = {}
        self._pool_affinity: dict[ServicePortName, int] = {}
        self._ports_of: dict[ServiceName, set[ServicePortName]] = {}
        #: frontends per VIP address, and the DROP set, kept up to date change by change.
        self._vip_frontends: Counter[str] = Counter()
        self._drops: dict[Frontend, bool] = {}
        self._ctx: RelayContext | None = None
        self._listeners: Listeners | None = None
        self._table_ctx: TableContext | None = None
        self._snapshot: Snapshot | None = None
        self._extra_addresses: frozenset[str] = frozenset()
        self._reserved: frozenset[Frontend] = frozenset()
        self._fatal: asyncio.Future | None = None
        self._ready = asyncio.Event()
        self._grace_timers: set[asyncio.TimerHandle] = set()
        #: the VIP set last given to the address manager, and to the local-client test.
        self._vips: frozenset[str] = frozenset()
        self._local_vips: frozenset[str] = frozenset()
        #: side-effect failures of the last apply (addresses, firewall), for status and logs.
        self._side_problems: dict[str, str] = {}

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
        self._ctx = RelayContext(loop, self.config, on_fatal=self._on_fatal)
        self._extra_addresses = frozenset(canonical(a) for a in extra_addresses)
        if reserved_frontends is None and self.config.reserved_frontends:
            reserved_frontends = [
                Frontend(canonical(ip), port, proto) for ip, port, proto in self.config.reserved_frontends
            ]
        if reserved_frontends is None:
            reserved_frontends = [
                Frontend(a, 53, proto) for a in self._extra_addresses for proto in ("TCP", "UDP")
            ]
        self._reserved = frozenset(reserved_frontends)
        sctp = sctp_supported()
        if not sctp:
            log.warning("SCTP is not supported by this kernel: SCTP service ports are not served")
        self._listeners = Listeners(self._ctx, sctp=sctp)
        await self._sync_addresses(self._extra_addresses)
        if self._firewall is not None:
            await self._firewall.start(self.config.cluster_cidrs)

    async def stop(self, grace: float = 0.0) -> None:
        """Stop accepting, drain established connections for up to ``grace`` seconds, close, remove VIPs."""
        if self._ctx is None:
            return
        ctx, listeners = self._ctx, self._listeners
        listeners.close_all()
        if ctx.conns and grace > 0:
            try:
                await asyncio.wait_for(ctx.wait_idle(), grace)
            except asyncio.TimeoutError:
                log.info("shutdown: resetting %d connections still open after %.1fs", len(ctx.conns), grace)
        for conn in list(ctx.conns):
            conn.abort()
        for timer in self._grace_timers:
            timer.cancel()
        self._grace_timers.clear()
        ctx.close()
        if self._firewall is not None:
            await self._firewall.stop()
        if self._addresses is not None:
            await self._addresses.stop()
        self._ctx = None

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
    def problems(self) -> list[str]:
        found = [str(c) for c in self._table.conflicts()] + list(self._side_problems.values())
        if self._listeners is not None:
            found += self._listeners.problems()
        return found

    # --- applying snapshots ---------------------------------------------------------------

    async def apply(self, snapshot: Snapshot) -> None:
        """Bring listeners, addresses and DROP rules in line with ``snapshot`` (incrementally)."""
        if self._ctx is None:
            raise RuntimeError("Proxier.apply before start")
        if not snapshot.synced:
            log.debug("snapshot %d is not synced yet: nothing applied", snapshot.generation)
            return
        table_ctx = await self._table_context(snapshot)
        if table_ctx != self._table_ctx:
            changed = frozenset(snapshot.services) | self._table.services()
            self._table_ctx = table_ctx
        else:
            changed = snapshot.changed_since(self._snapshot)
        changes: list[RuleChange] = []
        for name in sorted(changed):
            changes += self._update_service(name, snapshot, table_ctx)
        await self._reconcile(changes)
        self._snapshot = snapshot
        self._ready.set()

    async def _table_context(self, snapshot: Snapshot) -> TableContext:
        node = snapshot.node
        previous = self._table_ctx
        if previous is not None and self._snapshot is not None and snapshot.node is self._snapshot.node:
            return previous
        primary = node.primary_ips() if node is not None else ()
        local = await self._addresses.interface_addresses() if self._addresses is not None else ()
        if self._addresses is None:
            local = _interface_addresses_fallback(primary)
        self._ctx.local_clients.set_node_addresses(local)
        nodeport_ips = select_nodeport_addresses(self.config.nodeport_addresses, primary, local)
        return TableContext(
            node_name=self.node_name,
            zone=node.zone if node is not None else None,
            nodeport_addresses=nodeport_ips,
            reserved=self._reserved,
        )

    def _update_service(self, name: ServiceName, snapshot: Snapshot, ctx: TableContext) -> list[RuleChange]:
        state = snapshot.services.get(name)
        changes = self._table.update(name, service_rules(state, ctx))
        wanted: dict[ServicePortName, list] = {}
        for rule in self._table.service(name).values():
            endpoints = wanted.setdefault(rule.port_name, [])
            endpoints.extend(rule.endpoints)
            endpoints.extend(rule.local_client_endpoints or ())
        affinity = state.service.affinity_timeout if state is not None else 0
        for port_name in self._ports_of.pop(name, set()) - wanted.keys():
            self._retire(port_name, self._pools.pop(port_name).sync(()))
            self._pool_affinity.pop(port_name, None)
        for port_name, endpoints in wanted.items():
            pool = self._pool(port_name, affinity)
            self._retire(port_name, pool.sync(endpoints))
        if wanted:
            self._ports_of[name] = set(wanted)
        return changes

    def _pool(self, port_name: ServicePortName, affinity_timeout: int) -> ServicePortPool:
        pool = self._pools.get(port_name)
        if pool is None:
            balancer = Balancer(
                self._rng,
                eject_after=self.config.eject_after_failures,
                eject_base=self.config.eject_base_seconds,
                eject_max=self.config.eject_max_seconds,
            )
            pool = self._pools[port_name] = ServicePortPool(port_name, balancer)
        if self._pool_affinity.get(port_name, 0) != affinity_timeout:
            pool.balancer.affinity = self._affinity_factory(affinity_timeout) if affinity_timeout else None
            self._pool_affinity[port_name] = affinity_timeout
        return pool

    def _retire(self, port_name: ServicePortName, removed) -> None:
        """Endpoints gone from a service port: cut their connections after the grace period, if any."""
        grace = self.config.endpoint_grace_period
        if grace is None or self._ctx is None:
            return
        doomed = [state for state in removed if state.connections]
        if not doomed:
            return

        def cut() -> None:
            self._grace_timers.discard(timer)
            pool = self._pools.get(port_name)
            for state in doomed:
                if pool is not None and state.key in pool.endpoints:
                    continue  # the endpoint came back within the grace period: keep its connections
                for conn in list(state.connections):
                    conn.abort()

        timer = self._ctx.loop.call_later(grace, cut)
        self._grace_timers.add(timer)

    async def _reconcile(self, changes: list[RuleChange]) -> None:
        for change in changes:
            self._account(change.frontend, change.old, -1)
            self._account(change.frontend, change.new, +1)
        wanted = self._extra_addresses | frozenset(self._vip_frontends)
        if wanted - self._vips:  # add first, so new listeners bind to addresses that exist
            await self._sync_addresses(wanted | self._vips)
        await self._sync_firewall(self._drops)
        listeners = self._listeners
        for change in changes:
            listeners.apply(change, self._route_for)
        listeners.retry_failed(self._route_for)
        if wanted != self._vips:  # remove last, once nothing listens on them
            await self._sync_addresses(wanted)
        if wanted != self._local_vips:
            self._local_vips = wanted
            self._ctx.local_clients.set_vips(wanted)

    def _account(self, frontend: Frontend, rule: FrontendRule | None, sign: int) -> None:
        """Count a rule in or out of the VIP addresses and the DROP set."""
        if rule is None:
            return
        if rule.kind in _VIP_KINDS:
            self._vip_frontends[frontend.ip] += sign
            if not self._vip_frontends[frontend.ip]:
                del self._vip_frontends[frontend.ip]
        if rule.action is Action.DROP:
            if sign > 0:
                self._drops[frontend] = rule.drops_only_external
            else:
                self._drops.pop(frontend, None)

    async def _sync_addresses(self, wanted: frozenset[str]) -> None:
        if self._addresses is None:
            self._vips = wanted
            return
        try:
            await self._addresses.sync(wanted)
        except AddressError as exc:
            log.error("VIP addresses: %s", exc)
            self._side_problems["addresses"] = f"VIP addresses: {exc}"
            return
        self._side_problems.pop("addresses", None)
        self._vips = wanted

    async def _sync_firewall(self, drops: dict[Frontend, bool]) -> None:
        if self._firewall is None:
            return
        try:
            await self._firewall.sync(dict(drops))
        except FirewallError as exc:
            log.error("nftables: %s", exc)
            self._side_problems["firewall"] = f"nftables DROP rules: {exc}"
            return
        self._side_problems.pop("firewall", None)

    def _route_for(self, rule: FrontendRule) -> Route:
        pool = self._pools[rule.port_name]
        local = rule.local_client_endpoints
        return Route(pool, pool.states(rule.endpoints), pool.states(local) if local is not None else None)


def _interface_addresses_fallback(primary: Iterable[str]) -> tuple[str, ...]:
    """Without an address manager (tests), the node's own addresses stand in for its links."""
    return tuple(primary) + ("127.0.0.1", "::1")

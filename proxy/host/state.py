"""What the Proxier programs outside its sockets: VIP addresses and nftables sets.

Both are counted change by change (a VIP stays while any frontend uses it) and synced
in the order listeners need: addresses are added while listeners open (they bind with
IP_FREEBIND, so they need not wait) and removed after they close; the firewall is synced
before listeners open. Only what changed reaches the address manager and the firewall:
with many services a one-endpoint change must not cost a pass over every VIP. A failure
is logged and kept as a problem; the next sync retries (last good state wins).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Iterable

from kubeport.proxy.host.addresses import AddressError, AddressManager
from kubeport.proxy.host.nftables import Firewall, FirewallError, Vips
from kubeport.proxy.table import Action, Frontend, FrontendKind, FrontendRule, RuleChange

log = logging.getLogger(__name__)

_VIP_KINDS = (FrontendKind.CLUSTER_IP, FrontendKind.EXTERNAL_IP, FrontendKind.LOAD_BALANCER)
#: taken by port through the firewall when it can (capture.py), else local addresses too.
_CAPTURED_KINDS = (FrontendKind.EXTERNAL_IP, FrontendKind.LOAD_BALANCER)


class HostState:
    def __init__(self, addresses: AddressManager, firewall: Firewall | None) -> None:
        self._addresses = addresses
        self._firewall = firewall
        self._extra: frozenset[str] = frozenset()
        #: frontends per VIP address, the DROP set and the source ranges.
        self._vip_frontends: dict[str, int] = {}
        self.drops: dict[Frontend, bool] = {}
        self.allowed: dict[Frontend, tuple[str, ...]] = {}
        #: externalIP and LB frontends taken by port: True served, False refused (capture.py).
        self.captured: dict[Frontend, bool] = {}
        #: addresses the address manager holds, and those handed to it but not confirmed yet.
        self._held: set[str] = set()
        self._in_flight: set[str] = set()
        #: the difference between what is wanted and ``_held | _in_flight``, kept change by
        #: change: a sync costs what changed, not every VIP there is.
        self._to_add: set[str] = set()
        self._to_remove: set[str] = set()
        #: additions handed to the address manager and not awaited yet.
        self._adding: list[asyncio.Task] = []
        #: bumped whenever the wanted set changes (the local-client test follows it).
        self.wanted_version = 0
        #: the drops or source ranges changed since the firewall last took them.
        self._firewall_dirty = True
        #: a pruning address sync has run (until then a predecessor's leftovers may be present).
        self._pruned = False
        self.problems: dict[str, str] = {}
        #: the frontends served on VIP addresses (the firewall rejects their other ports), and
        #: the extra addresses' (the DNS server's).
        self._vip_ports: set[Frontend] = set()
        self._extra_ports: frozenset[Frontend] = frozenset()
        #: the node's own addresses: never filtered, though a Service names one as its VIP.
        self._node_addresses: frozenset[str] = frozenset()
        #: set while nothing keeps the VIPs' other ports from the node's wildcard sockets; not
        #: in ``problems``, which a full sync retries.
        self.unfiltered: str | None = None
        #: --service-cluster-ip-range, always in the services4/6 sets whatever a snapshot says
        self._flag_service_cidrs: tuple[str, ...] = ()

    async def start(self, extra_addresses: frozenset[str], cluster_cidrs: Iterable[str],
                    service_cidrs: Iterable[str] = (), extra_ports: Iterable[Frontend] = ()) -> None:
        """Add the extra addresses only: a predecessor's VIPs (seamless restart) stay until the
        first snapshot says which are wanted; the firewall table is written by the first sync.
        ``extra_ports``: what is served on the extra addresses."""
        self._extra = extra_addresses
        self._extra_ports = frozenset(extra_ports)
        self._flag_service_cidrs = tuple(service_cidrs)
        self._to_add |= extra_addresses - self._held
        self.wanted_version += 1
        await self._add_addresses()
        if self._firewall is not None:
            await self._firewall.start(cluster_cidrs, service_cidrs)
            if not self._firewall.enabled:
                self.unfiltered = ("no nftables: every port of a ClusterIP reaches the node's sockets bound to "
                                   "0.0.0.0 or :: (install nft)")

    def set_service_cidrs(self, service_cidrs: Iterable[str]) -> None:
        """The service ranges of a snapshot (the flag's and the ServiceCIDR objects', KEP-1880):
        what the node routes on to an unallocated address in them is dropped, as kube-proxy's
        nftables mode follows ServiceCIDRs. Synced with the next firewall sync."""
        if self._firewall is None:
            return
        wanted = tuple(dict.fromkeys((*self._flag_service_cidrs, *service_cidrs)))
        if self._firewall.set_service_cidrs(wanted):
            self._firewall_dirty = True

    def set_node_addresses(self, addresses: Iterable[str]) -> None:
        node = frozenset(addresses)
        if node != self._node_addresses:
            self._node_addresses = node
            self._firewall_dirty = True

    @property
    def wanted(self) -> frozenset[str]:
        """Every address the node should have: the extra ones and each VIP a frontend uses."""
        return self._extra | frozenset(self._vip_frontends)

    @property
    def capturing(self) -> bool:
        """externalIPs and LB IPs are taken by port, not made local addresses (capture.py)."""
        return self._firewall is not None and self._firewall.capturing

    def account(self, changes: Iterable[RuleChange]) -> None:
        capturing = self.capturing
        vip_kinds = (FrontendKind.CLUSTER_IP,) if capturing else _VIP_KINDS
        for change in changes:
            frontend, old, new = change.frontend, change.old, change.new
            # The new rule is counted before the old one goes: a VIP kept by a changed frontend
            # never drops to zero users, so it is neither queued for removal nor re-announced.
            on_vip = new is not None and new.kind in vip_kinds
            if on_vip:
                self._count_vip(frontend.ip, +1)
            if old is not None and old.kind in vip_kinds:
                self._count_vip(frontend.ip, -1)
            if on_vip != (frontend in self._vip_ports):
                self._firewall_dirty = True
                if on_vip:
                    self._vip_ports.add(frontend)
                else:
                    self._vip_ports.discard(frontend)
            self._filter(frontend, old, -1)
            self._filter(frontend, new, +1)
            if capturing:
                self._capture(frontend, old, new)

    def begin_adding(self) -> None:
        """Hand the addresses counted so far to the address manager, without waiting.

        The kernel is slow to add many addresses on one link (in the netlink thread):
        started while the table is still being built, that work overlaps with the rest.
        """
        if self._to_add:
            self._adding.append(asyncio.ensure_future(self._add_addresses()))

    async def before_listeners(self) -> None:
        """Start adding the new addresses, sync the firewall; the additions are awaited later
        (``wait_added``): listeners bind with IP_FREEBIND and need not wait for them."""
        self.begin_adding()
        if self._firewall_dirty:
            await self._sync_firewall()
        if self._adding:
            await asyncio.sleep(0)  # one turn: the additions go to the netlink thread now

    async def wait_added(self) -> None:
        """Until every addition handed over has been applied: only then do clients reach the VIPs."""
        while self._adding:
            adding, self._adding = self._adding, []
            await asyncio.gather(*adding)

    async def after_listeners(self) -> None:
        await self.wait_added()
        if not self._pruned:  # the first time, a predecessor's leftovers go too: the whole set
            await self._prune_addresses()
        elif self._to_remove:  # remove last, once nothing listens on them
            await self._remove_addresses()

    async def stop(self, *, release: bool) -> None:
        await self.wait_added()
        if self._firewall is not None:
            await self._firewall.stop(release=release)
        await self._addresses.stop(release=release)

    def _filter(self, frontend: Frontend, rule: FrontendRule | None, sign: int) -> None:
        if rule is None:
            return
        if rule.action is Action.DROP:
            self._firewall_dirty = True
            if sign > 0:
                self.drops[frontend] = rule.drops_only_external
            else:
                self.drops.pop(frontend, None)
        if rule.source_ranges is not None:
            self._firewall_dirty = True
            if sign > 0:
                self.allowed[frontend] = rule.source_ranges
            else:
                self.allowed.pop(frontend, None)

    def _capture(self, frontend: Frontend, old: FrontendRule | None, new: FrontendRule | None) -> None:
        was = self.captured.get(frontend)
        if new is not None and new.kind in _CAPTURED_KINDS:
            self.captured[frontend] = new.action is not Action.REFUSE
        elif old is not None and old.kind in _CAPTURED_KINDS:
            self.captured.pop(frontend, None)
        if self.captured.get(frontend) != was:
            self._firewall_dirty = True

    def _count_vip(self, address: str, sign: int) -> None:
        counts = self._vip_frontends
        count = counts.get(address, 0) + sign
        if count:
            counts[address] = count
            if count != 1 or sign < 0:
                return
        else:
            del counts[address]
        self._firewall_dirty = True  # the VIP set changed
        if address in self._extra:
            return  # wanted either way
        self.wanted_version += 1
        if count:  # the first frontend on it
            self._to_remove.discard(address)
            if address not in self._held and address not in self._in_flight:
                self._to_add.add(address)
        else:  # the last one left
            self._to_add.discard(address)
            if address in self._held or address in self._in_flight:
                self._to_remove.add(address)

    async def resync(self) -> None:
        """Put right what was changed behind this process's back (an address deleted, the table
        flushed): the table is written whole and the link re-read, as kube-proxy's full sync.
        Not while an apply runs (the Proxier serializes them)."""
        await self.wait_added()
        if self._firewall is not None:
            try:
                await self._firewall.resync()
            except FirewallError as exc:
                log.error("nftables: %s", exc)
                self.problems["capture"] = str(exc)
            else:
                self.problems.pop("capture", None)
            await self._sync_firewall()
        if self._pruned:
            wanted = self.wanted
            try:
                restored = await self._addresses.repair(wanted)
            except AddressError as exc:
                log.error("VIP addresses: %s", exc)
                self.problems["addresses"] = f"VIP addresses: {exc}"
                return
            self.problems.pop("addresses", None)
            self._held, self._to_add, self._to_remove = set(wanted), set(), set()
            if restored:
                log.warning("VIP addresses: %d were missing from the link (removed by something else) and were "
                            "added back (%s)", len(restored),
                            ", ".join(restored[:5]) + (" ..." if len(restored) > 5 else ""))

    def _is_wanted(self, address: str) -> bool:
        return address in self._vip_frontends or address in self._extra

    async def _add_addresses(self) -> None:
        adding = frozenset(self._to_add)
        if not adding:
            return
        self._to_add.clear()
        self._in_flight |= adding
        try:
            added = await self._address_call(self._addresses.change, adding, ())
        finally:
            self._in_flight -= adding
        if added:
            self._held |= adding
        else:  # retried by the next sync; some may be in place already (the manager skips those)
            self._to_add |= {a for a in adding if self._is_wanted(a)}

    async def _remove_addresses(self) -> None:
        removing = frozenset(self._to_remove)
        if await self._address_call(self._addresses.change, (), removing):
            self._held -= removing
            self._to_remove -= removing

    async def _prune_addresses(self) -> None:
        wanted = self.wanted
        if await self._address_call(self._addresses.sync, wanted):
            self._held = set(wanted)
            self._to_add.clear()
            self._to_remove.clear()
            self._pruned = True

    async def _address_call(self, method, *args) -> bool:
        try:
            await method(*args)
        except AddressError as exc:
            log.error("VIP addresses: %s", exc)
            self.problems["addresses"] = f"VIP addresses: {exc}"
            return False
        self.problems.pop("addresses", None)
        return True

    async def _sync_firewall(self) -> None:
        self._firewall_dirty = False  # changes made while nft runs mark it again
        if self._firewall is None:
            return
        try:
            vips = Vips(frozenset(self.wanted - self._node_addresses), frozenset(self._vip_ports | self._extra_ports))
            await self._firewall.sync(dict(self.drops), dict(self.allowed), dict(self.captured), vips)
        except FirewallError as exc:
            log.error("nftables: %s", exc)
            self.problems["firewall"] = f"nftables rules: {exc}"
            self._firewall_dirty = True  # retried on the next sync
            return
        self.problems.pop("firewall", None)

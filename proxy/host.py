"""What the Proxier programs outside its sockets: VIP addresses and nftables sets.

Both are counted change by change (a VIP stays while any frontend uses it) and synced
in the order listeners need: addresses are added before listeners bind and removed
after they close; the firewall is synced in between. A failure is logged and kept as
a problem; the next sync retries (last good state wins).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Iterable

from .addresses import AddressError, AddressManager
from .firewall import Firewall, FirewallError
from .table import Action, Frontend, FrontendKind, FrontendRule, RuleChange

log = logging.getLogger(__name__)

_VIP_KINDS = (FrontendKind.CLUSTER_IP, FrontendKind.EXTERNAL_IP, FrontendKind.LOAD_BALANCER)


class HostState:
    def __init__(self, addresses: AddressManager | None, firewall: Firewall | None) -> None:
        self._addresses = addresses
        self._firewall = firewall
        self._extra: frozenset[str] = frozenset()
        #: frontends per VIP address, the DROP set and the source ranges.
        self._vip_frontends: Counter[str] = Counter()
        self.drops: dict[Frontend, bool] = {}
        self.allowed: dict[Frontend, tuple[str, ...]] = {}
        #: the addresses last given to the address manager.
        self.vips: frozenset[str] = frozenset()
        #: a pruning address sync has run (until then a predecessor's leftovers may be present).
        self._pruned = False
        self.problems: dict[str, str] = {}

    async def start(self, extra_addresses: frozenset[str], cluster_cidrs: Iterable[str]) -> None:
        """Add the extra addresses only: a predecessor's VIPs (seamless restart) stay until the
        first snapshot says which are wanted; the firewall table is written by the first sync."""
        self._extra = extra_addresses
        await self._sync_addresses(extra_addresses, prune=False)
        if self._firewall is not None:
            await self._firewall.start(cluster_cidrs)

    @property
    def wanted(self) -> frozenset[str]:
        return self._extra | frozenset(self._vip_frontends)

    def account(self, changes: Iterable[RuleChange]) -> None:
        for change in changes:
            self._count(change.frontend, change.old, -1)
            self._count(change.frontend, change.new, +1)

    async def before_listeners(self) -> None:
        wanted = self.wanted
        if wanted - self.vips:  # add first, so new listeners bind to addresses that exist
            await self._sync_addresses(wanted | self.vips, prune=False)
        await self._sync_firewall()

    async def after_listeners(self) -> None:
        wanted = self.wanted
        if wanted != self.vips or not self._pruned:  # remove last, once nothing listens on them
            await self._sync_addresses(wanted)

    async def stop(self, *, release: bool) -> None:
        if self._firewall is not None:
            await self._firewall.stop(release=release)
        if self._addresses is not None:
            await self._addresses.stop(release=release)

    def _count(self, frontend: Frontend, rule: FrontendRule | None, sign: int) -> None:
        if rule is None:
            return
        if rule.kind in _VIP_KINDS:
            self._vip_frontends[frontend.ip] += sign
            if not self._vip_frontends[frontend.ip]:
                del self._vip_frontends[frontend.ip]
        if rule.action is Action.DROP:
            if sign > 0:
                self.drops[frontend] = rule.drops_only_external
            else:
                self.drops.pop(frontend, None)
        if rule.source_ranges is not None:
            if sign > 0:
                self.allowed[frontend] = rule.source_ranges
            else:
                self.allowed.pop(frontend, None)

    async def _sync_addresses(self, wanted: frozenset[str], *, prune: bool = True) -> None:
        if self._addresses is None:
            self.vips = wanted
            self._pruned = True
            return
        try:
            await self._addresses.sync(wanted, prune=prune)
        except AddressError as exc:
            log.error("VIP addresses: %s", exc)
            self.problems["addresses"] = f"VIP addresses: {exc}"
            return
        self.problems.pop("addresses", None)
        self.vips = wanted
        self._pruned = self._pruned or prune

    async def _sync_firewall(self) -> None:
        if self._firewall is None:
            return
        try:
            await self._firewall.sync(dict(self.drops), dict(self.allowed))
        except FirewallError as exc:
            log.error("nftables: %s", exc)
            self.problems["firewall"] = f"nftables rules: {exc}"
            return
        self.problems.pop("firewall", None)

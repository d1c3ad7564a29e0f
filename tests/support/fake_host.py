"""Stand-ins for the proxy's side-effecting reconcilers of the host (proxy/host): the VIP
addresses and the nftables table, in memory, recording what they were asked to do."""

from __future__ import annotations

from typing import Iterable

from kubeport.proxy.host.nftables import NO_VIPS, AllowSet, CaptureSet, DropSet, Vips
from kubeport.proxy.table import Frontend


class FakeAddresses:
    """NetlinkAddresses' stand-in: a set of addresses, plus fixed node addresses.

    ``owned``: addresses a predecessor left (NetlinkAddresses adopts those by their route protocol).
    """

    def __init__(self, node_addresses: Iterable[str] = (), owned: Iterable[str] = ()) -> None:
        self.node_addresses = tuple(node_addresses)
        self._owned: set[str] = set(owned)
        self.history: list[frozenset[str]] = []
        self.released: bool | None = None

    @property
    def owned(self) -> frozenset[str]:
        return frozenset(self._owned)

    async def sync(self, wanted: Iterable[str], *, prune: bool = True) -> None:
        wanted = set(wanted) - set(self.node_addresses)
        if not prune:
            wanted |= self._owned
        if wanted != self._owned:
            self._owned = wanted
            self.history.append(frozenset(wanted))

    async def change(self, add: Iterable[str], remove: Iterable[str]) -> None:
        wanted = (self._owned | (set(add) - set(self.node_addresses))) - set(remove)
        if wanted != self._owned:
            self._owned = wanted
            self.history.append(frozenset(wanted))

    async def interface_addresses(self) -> tuple[str, ...]:
        return self.node_addresses

    async def repair(self, wanted: Iterable[str]) -> list[str]:
        vanished = sorted((set(wanted) - set(self.node_addresses)) - self._owned)
        await self.sync(wanted)
        return vanished

    async def stop(self, *, release: bool = True) -> None:
        self.released = release
        if release:
            self._owned = set()


class FakeFirewall:
    """NftFirewall's stand-in: holds the desired drops and source ranges, records every change of the drops."""

    def __init__(self) -> None:
        self.drops: dict[Frontend, bool] = {}
        self.allowed: dict[Frontend, tuple[str, ...]] = {}
        self.syncs: list[dict[Frontend, bool]] = []
        self.cluster_cidrs: tuple[str, ...] = ()
        self.service_cidrs: tuple[str, ...] = ()
        self.captured: dict[Frontend, bool] = {}
        self.vips: Vips = NO_VIPS
        self.enabled = False
        self.capturing = False
        self.released: bool | None = None
        self.resyncs = 0

    #: tests set it False: a host without nft.
    has_nft = True

    async def start(self, cluster_cidrs: Iterable[str], service_cidrs: Iterable[str] = ()) -> None:
        self.cluster_cidrs = tuple(cluster_cidrs)
        self.service_cidrs = tuple(service_cidrs)
        self.enabled = self.has_nft
        self.capturing = self.can_capture

    #: tests set it False: a host without policy routing (externalIPs become addresses).
    can_capture = True

    def set_service_cidrs(self, service_cidrs: Iterable[str]) -> bool:
        wanted = tuple(service_cidrs)
        if not self.enabled or wanted == self.service_cidrs:
            return False
        self.service_cidrs = wanted
        return True

    async def sync(self, desired: DropSet, allowed: AllowSet | None = None,
                   captured: CaptureSet | None = None, vips: Vips = NO_VIPS) -> None:
        self.vips = vips
        self.allowed = dict(allowed or {})
        self.captured = dict(captured or {})
        if dict(desired) != self.drops:
            self.drops = dict(desired)
            self.syncs.append(dict(desired))

    async def resync(self) -> None:
        self.resyncs += 1

    async def stop(self, *, release: bool = True) -> None:
        self.enabled = False
        self.released = release
        if release:
            self.drops = {}
            self.allowed = {}
            self.captured = {}
            self.vips = NO_VIPS

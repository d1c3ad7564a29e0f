"""NodePort and ClusterIP allocators with static/dynamic bands, as the API server has them.

Sources: ``pkg/registry/core/service/allocator/bitmap.go`` (``randomScanStrategyWithOffset``),
``portallocator/allocator.go`` (``calculateRangeOffset``, KEP-3668),
``ipallocator/bitmap.go`` (``calculateRangeOffset``, KEP-3070).

A range is a row of offsets ``[0, size)``. The first ``band_offset`` offsets are the
static (lower) band, the rest the dynamic (upper) band. Dynamic allocation picks a
random start in the upper band and scans forward with wrap inside it; only when the
upper band is full does it do the same in the lower band. An explicit value anywhere
in the range is accepted when free. Pure in-memory state; ``rng`` makes it deterministic.
"""

from __future__ import annotations

import ipaddress
import random
from typing import Iterable

PORT_RANGE_DEFAULT = (30000, 32767)
_IPV6_MAX_ENTRIES = 65536  # the API server caps its IPv6 bitmap at 2^16 entries


class AllocationError(Exception):
    """An allocation refused; ``str()`` is the API server's text."""


class AlreadyAllocated(AllocationError):
    pass


class NotInRange(AllocationError):
    pass


class RangeFull(AllocationError):
    def __init__(self) -> None:
        super().__init__("range is full")


def port_band_offset(size: int) -> int:
    """KEP-3668: min(max(16, size/32), 128); no static band for ranges of 16 or fewer."""
    if size <= 16:
        return 0
    return min(max(16, size // 32), 128)


def ip_band_offset(cidr_size: int) -> int:
    """KEP-3070: min(max(16, cidrSize/16), 256) over the full CIDR size; 0 when it is 16 or less."""
    if cidr_size <= 16:
        return 0
    return min(max(16, cidr_size // 16), 256)


class _Bands:
    """The bitmap and its scan strategy, over offsets; ``reserved`` offsets are never picked."""

    def __init__(self, size: int, band_offset: int, rng: random.Random, reserved: Iterable[int] = ()) -> None:
        self.size = max(size, 0)
        self.band_offset = min(band_offset, self.size)
        self._rng = rng
        self._reserved = frozenset(r for r in reserved if 0 <= r < self.size)
        self._allocated: set[int] = set()
        # Free counts per band let a full band be skipped without a scan.
        reserved_lower = sum(1 for r in self._reserved if r < self.band_offset)
        self._free_lower = self.band_offset - reserved_lower
        self._free_upper = self.size - self.band_offset - (len(self._reserved) - reserved_lower)

    def has(self, offset: int) -> bool:
        return offset in self._allocated

    @property
    def used(self) -> int:
        return len(self._allocated)

    def take(self, offset: int) -> bool:
        if offset in self._allocated:
            return False
        self._allocated.add(offset)
        self._count(offset, -1)
        return True

    def give_back(self, offset: int) -> None:
        if offset in self._allocated:
            self._allocated.remove(offset)
            self._count(offset, +1)

    def _count(self, offset: int, delta: int) -> None:
        if offset in self._reserved:
            return  # reserved offsets never count as free
        if offset < self.band_offset:
            self._free_lower += delta
        else:
            self._free_upper += delta

    def take_next(self) -> int | None:
        if self._free_upper > 0:
            found = self._scan(self.band_offset, self.size)
        elif self._free_lower > 0:
            found = self._scan(0, self.band_offset)
        else:
            return None
        assert found is not None, "free count says a band has room"
        self.take(found)
        return found

    def _scan(self, lo: int, hi: int) -> int | None:
        width = hi - lo
        start = self._rng.randrange(width)
        allocated, reserved = self._allocated, self._reserved
        for i in range(width):
            at = lo + (start + i) % width
            if at not in allocated and at not in reserved:
                return at
        return None


class PortAllocator:
    """NodePorts from ``lo``-``hi`` inclusive (``--service-node-port-range``)."""

    def __init__(self, lo: int, hi: int, rng: random.Random | None = None) -> None:
        if not 0 < lo <= hi <= 65535:
            raise ValueError(f"invalid node port range {lo}-{hi}")
        self.lo, self.hi = lo, hi
        size = hi - lo + 1
        self._bands = _Bands(size, port_band_offset(size), rng or random.Random())

    def __str__(self) -> str:
        return f"{self.lo}-{self.hi}"

    @property
    def band_offset(self) -> int:
        return self._bands.band_offset

    @property
    def static_band(self) -> tuple[int, int] | None:
        """(first, last) port of the static band, None when the range has none."""
        if not self.band_offset:
            return None
        return (self.lo, self.lo + self.band_offset - 1)

    @property
    def dynamic_band(self) -> tuple[int, int]:
        return (self.lo + self.band_offset, self.hi)

    @property
    def used(self) -> int:
        return self._bands.used

    def contains(self, port: int) -> bool:
        return self.lo <= port <= self.hi

    def has(self, port: int) -> bool:
        return self.contains(port) and self._bands.has(port - self.lo)

    def allocate(self, port: int) -> None:
        if not self.contains(port):
            raise NotInRange(f"provided port is not in the valid range. The range of valid ports is {self}")
        if not self._bands.take(port - self.lo):
            raise AlreadyAllocated("provided port is already allocated")

    def allocate_next(self) -> int:
        offset = self._bands.take_next()
        if offset is None:
            raise RangeFull()
        return self.lo + offset

    def release(self, port: int) -> None:
        """Free ``port``; a port not allocated or out of range is a no-op."""
        if self.contains(port):
            self._bands.give_back(port - self.lo)


class IPAllocator:
    """ClusterIPs from one service CIDR; ``reserved`` IPs are only ever allocated explicitly."""

    def __init__(
        self,
        cidr: str | ipaddress.IPv4Network | ipaddress.IPv6Network,
        rng: random.Random | None = None,
        reserved: Iterable[str] = (),
    ) -> None:
        self.network = ipaddress.ip_network(cidr)
        cidr_size = self.network.num_addresses
        if self.network.version == 6:
            entries = min(cidr_size, _IPV6_MAX_ENTRIES) - 1  # minus the network address
        else:
            entries = cidr_size - 2  # minus network and broadcast
        # Offsets count from network+1.
        self._address_type = type(self.network.network_address)
        self._base = int(self.network.network_address) + 1
        self._entries = max(entries, 0)
        reserved_offsets = [o for o in (self._offset(ip) for ip in reserved) if o is not None]
        self._bands = _Bands(self._entries, ip_band_offset(cidr_size), rng or random.Random(), reserved_offsets)

    def __str__(self) -> str:
        return str(self.network)

    @property
    def family(self) -> str:
        return "IPv4" if self.network.version == 4 else "IPv6"

    @property
    def band_offset(self) -> int:
        return self._bands.band_offset

    @property
    def static_band(self) -> tuple[str, str] | None:
        if not self.band_offset:
            return None
        return (self._ip(0), self._ip(self.band_offset - 1))

    @property
    def first_dynamic(self) -> str | None:
        if self.band_offset >= self._entries:
            return None
        return self._ip(self.band_offset)

    @property
    def used(self) -> int:
        return self._bands.used

    def _ip(self, offset: int) -> str:
        return str(self._address_type(self._base + offset))

    def _offset(self, ip: str) -> int | None:
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return None
        if address.version != self.network.version or address not in self.network:
            return None
        offset = int(address) - self._base
        return offset if 0 <= offset < self._entries else None

    def contains(self, ip: str) -> bool:
        return self._offset(ip) is not None

    def has(self, ip: str) -> bool:
        offset = self._offset(ip)
        return offset is not None and self._bands.has(offset)

    def allocate(self, ip: str) -> None:
        offset = self._offset(ip)
        if offset is None:
            raise NotInRange(f"the provided IP ({ip}) is not in the valid range. The range of valid IPs is {self}")
        if not self._bands.take(offset):
            raise AlreadyAllocated("provided IP is already allocated")

    def allocate_next(self) -> str:
        offset = self._bands.take_next()
        if offset is None:
            raise RangeFull()
        return self._ip(offset)

    def release(self, ip: str) -> None:
        offset = self._offset(ip)
        if offset is not None:
            self._bands.give_back(offset)


class _Range:
    """One ServiceCIDR range: its bitmap and the ServiceCIDRs naming it (name -> Ready)."""

    __slots__ = ("allocator", "owners")

    def __init__(self, allocator: IPAllocator) -> None:
        self.allocator = allocator
        self.owners: dict[str, bool] = {}

    @property
    def ready(self) -> bool:
        """MetaAllocator.syncAllocators: ready while any ServiceCIDR naming it is ready."""
        return any(self.owners.values())


class ServiceCIDRAllocator:
    """One family's ClusterIPs over the ranges of the ServiceCIDRs: the MultiCIDR allocator
    (``pkg/registry/core/service/ipallocator/cidrallocator.go`` MetaAllocator, KEP-1880).

    Each range is an :class:`IPAllocator` with its own static and dynamic bands. A dynamic
    pick tries the ready ranges in turn and takes the first with room; upstream iterates a Go
    map (no defined order), here the order is fixed so that a manifest directory allocates
    the same way every time: the default range (``--service-cluster-ip-range``) first, then by
    ServiceCIDR name. A range being deleted is not ready: nothing new comes from it, what it
    holds stays until released. Ranges may overlap (the API server allows it): an address is
    taken in every range that contains it, so no two Services ever get it.
    """

    def __init__(self, family: str, rng: random.Random | None = None, reserved: Iterable[str] = ()) -> None:
        self.family = family
        self._rng = rng or random.Random()
        self._reserved = tuple(reserved)
        self._ranges: dict[str, _Range] = {}
        self._order: list[_Range] = []
        self._taken: set[str] = set()
        #: the name whose ranges are tried first (the default ServiceCIDR)
        self.default_owner = ""

    def __str__(self) -> str:
        return ", ".join(str(r.allocator) for r in self._order if r.ready) or "(none)"

    # --- the ranges ----------------------------------------------------------------------

    def add(self, cidr: str, owner: str, *, ready: bool = True) -> None:
        """``owner`` (a ServiceCIDR) names ``cidr``; a new range takes the addresses already
        allocated inside it (from an overlapping range)."""
        held = self._ranges.get(cidr)
        if held is None:
            held = self._ranges[cidr] = _Range(IPAllocator(cidr, self._rng, reserved=self._reserved))
            for ip in self._taken:
                if held.allocator.contains(ip):
                    held.allocator.allocate(ip)
        held.owners[owner] = ready
        self._sort()

    def set_ready(self, cidr: str, owner: str, ready: bool) -> None:
        held = self._ranges.get(cidr)
        if held is not None and owner in held.owners:
            held.owners[owner] = ready

    def remove(self, cidr: str, owner: str) -> None:
        """``owner`` no longer names ``cidr``; the range goes with its last owner."""
        held = self._ranges.get(cidr)
        if held is None:
            return
        held.owners.pop(owner, None)
        if not held.owners:
            del self._ranges[cidr]
            self._sort()

    def in_use(self, cidr: str) -> bool:
        """Some allocated address of ``cidr`` is in no other ready range: deleting the range
        would orphan it (``canDeleteCIDR`` of pkg/controller/servicecidrs)."""
        held = self._ranges.get(cidr)
        if held is None:
            return False
        others = [r for r in self._order if r is not held and r.ready]
        return any(held.allocator.has(ip) and not any(r.allocator.contains(ip) for r in others)
                   for ip in self._taken)

    def _sort(self) -> None:
        def key(item: tuple[str, _Range]) -> tuple[bool, str, str]:
            cidr, held = item
            return (self.default_owner not in held.owners, min(held.owners), cidr)

        self._order = [held for _, held in sorted(self._ranges.items(), key=key)]

    # --- the allocator's interface (IPAllocator's) ----------------------------------------

    @property
    def used(self) -> int:
        return len(self._taken)

    @property
    def ranges(self) -> list[IPAllocator]:
        """Every range, in the order dynamic picks try them."""
        return [r.allocator for r in self._order]

    def contains(self, ip: str) -> bool:
        return any(r.allocator.contains(ip) for r in self._order)

    def has(self, ip: str) -> bool:
        return ip in self._taken

    def allocate(self, ip: str) -> None:
        """An explicit ClusterIP: it must lie in a ready range (``getAllocator(ip, ready=true)``)."""
        if not any(r.ready and r.allocator.contains(ip) for r in self._order):
            raise NotInRange(f"the provided IP ({ip}) is not in the valid range. The range of valid IPs is {self}")
        self._take(ip)

    def reserve(self, ip: str) -> None:
        """Take again an address a stored Service holds: any range will do, ready or not
        (a Service keeps its ClusterIP while its range is being deleted)."""
        if not self.contains(ip):
            ranges = ", ".join(str(r) for r in self.ranges) or "(none)"
            raise NotInRange(f"the provided IP ({ip}) is not in the valid range. The range of valid IPs is {ranges}")
        self._take(ip)

    def _take(self, ip: str) -> None:
        if ip in self._taken:
            raise AlreadyAllocated("provided IP is already allocated")
        for held in self._order:
            if held.allocator.contains(ip):
                held.allocator.allocate(ip)
        self._taken.add(ip)

    def allocate_next(self) -> str:
        for held in self._order:
            if not held.ready:
                continue
            try:
                ip = held.allocator.allocate_next()
            except RangeFull:
                continue
            for other in self._order:
                if other is not held and other.allocator.contains(ip):
                    other.allocator.allocate(ip)
            self._taken.add(ip)
            return ip
        raise RangeFull()

    def release(self, ip: str) -> None:
        if ip not in self._taken:
            return
        self._taken.discard(ip)
        for held in self._order:
            held.allocator.release(ip)

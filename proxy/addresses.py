"""VIP addresses (/32, /128) on a local link, reconciled over rtnetlink (netlink_batch.py).

ClusterIPs become local addresses of the node (default link ``lo``; the ``dummy`` link
type may be missing from the kernel), so the proxy can listen on them; externalIPs and
LoadBalancer IPs too, but only where their ports cannot be taken alone (capture.py). Addresses kubeport adds carry the address protocol
``IFA_PROTO = 0x6b`` ("k"): after a crash the next run recognises its own leftovers,
and it never touches an address it did not add.

The kernel takes its time with thousands of addresses on one link (each add walks the
link's list: 10,000 take ~1.8 s of system time), so every netlink call runs in one
dedicated thread and the event loop keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Protocol

from . import netlink_batch
from .netlink_batch import AddressOp

log = logging.getLogger(__name__)

#: IFA_PROTO value marking addresses kubeport added.
ADDRESS_PROTO = 0x6B
_EEXIST = 17
_EADDRNOTAVAIL = 99


class AddressError(RuntimeError):
    pass


def canonical(address: str) -> str:
    return str(ipaddress.ip_address(address))


class AddressManager(Protocol):
    async def sync(self, wanted: Iterable[str], *, prune: bool = True) -> None: ...
    async def change(self, add: Iterable[str], remove: Iterable[str]) -> None: ...
    async def interface_addresses(self, *, quick: bool = False) -> tuple[str, ...]: ...
    async def stop(self, *, release: bool = True) -> None: ...
    async def repair(self, wanted: Iterable[str]) -> list[str]: ...
    @property
    def owned(self) -> frozenset[str]: ...


class NetlinkAddresses:
    def __init__(self, interface: str = "lo") -> None:
        self.interface = interface
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="kubeport-netlink")
        self._index: int | None = None
        self._owned: set[str] = set()
        self._scanned = False
        #: the VIP link's addresses kubeport did not add (loopback's own), as last read in full
        self._vip_link_others: tuple[str, ...] = ()
        self._strict_dumps = True

    @property
    def owned(self) -> frozenset[str]:
        return frozenset(self._owned)

    async def _call(self, fn, *args):
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        except OSError as exc:  # the netlink socket itself failed: a problem to retry, like a refusal
            raise AddressError(f"netlink ({self.interface}): {exc}") from exc

    # --- in the netlink thread ---------------------------------------------------------

    def _link(self) -> int:
        if self._index is None:
            try:
                index = netlink_batch.link_index(self.interface)
            except netlink_batch.LinkNotFound:
                raise AddressError(f"vip_interface {self.interface!r}: no such link") from None
            netlink_batch.set_link_up(index)
            self._index = index
        return self._index

    def _dump(self) -> list[tuple[str, int, int | None]]:
        """(address, link index, IFA_PROTO) of every address on every link."""
        return netlink_batch.dump_addresses()

    def _scan(self) -> dict[str, tuple[int, int | None]]:
        """Once per run: what is present; leftovers of a previous run on our link become ours."""
        self._link()
        if self._scanned:
            return {}
        present = {address: (index, proto) for address, index, proto in self._dump()}
        self._owned |= {
            a for a, (index, proto) in present.items() if index == self._index and proto == ADDRESS_PROTO
        }
        self._scanned = True
        return present

    def _apply(self, wanted: frozenset[str], prune: bool = True) -> None:
        present = self._scan()
        self._add([a for a in sorted(wanted - self._owned) if a not in present])
        if prune:
            problems = self._remove(sorted(self._owned - wanted))
            if problems:
                raise AddressError("; ".join(problems))

    def _change(self, add: frozenset[str], remove: frozenset[str]) -> None:
        present = self._scan()
        self._add([a for a in sorted(add) if a not in self._owned and a not in present])
        problems = self._remove(sorted(a for a in remove if a in self._owned))
        if problems:
            raise AddressError("; ".join(problems))

    def _add(self, additions: list[str]) -> None:
        # Addresses already present but not ours are someone else's: usable, never ours to remove.
        refused = netlink_batch.apply((AddressOp(True, a) for a in additions), self._index, ADDRESS_PROTO)
        for address in additions:
            code = refused.get(address)
            if code is None:
                self._owned.add(address)
            elif code != _EEXIST:  # EEXIST: it appeared meanwhile; not ours
                raise AddressError(f"adding {address} to {self.interface}: {os.strerror(code)}")

    def _remove(self, addresses: list[str]) -> list[str]:
        """Remove our addresses; returns a line per address the kernel refused to remove."""
        refused = netlink_batch.apply((AddressOp(False, a) for a in addresses), self._index, ADDRESS_PROTO)
        problems = []
        for address in addresses:
            code = refused.get(address)
            if code not in (None, _EADDRNOTAVAIL):
                problems.append(f"removing {address} from {self.interface}: {os.strerror(code)}")
                continue
            self._owned.discard(address)
        return problems

    def _repair(self, wanted: frozenset[str]) -> list[str]:
        """What the kernel holds now, not what this run believes: ours that vanished (an operator,
        another tool) come back, ours no longer wanted go. Returns those added back."""
        self._index = None  # the link may have been re-created
        self._link()
        present = {address: (index, proto) for address, index, proto in self._dump()}
        # Kernels before 5.18 drop IFA_PROTO: an untagged address this run added is still ours.
        ours = {a for a, (index, proto) in present.items()
                if index == self._index and (proto == ADDRESS_PROTO or (proto is None and a in self._owned))}
        vanished = sorted(a for a in wanted if a not in present)
        self._owned = ours
        self._add(vanished)
        problems = self._remove(sorted(self._owned - wanted))
        if problems:
            raise AddressError("; ".join(problems))
        return vanished

    def _close(self, release: bool) -> None:
        if release and self._owned and self._index is not None:
            for problem in self._remove(sorted(self._owned)):
                log.warning("%s", problem)

    # --- the event loop side -------------------------------------------------------------

    async def sync(self, wanted: Iterable[str], *, prune: bool = True) -> None:
        """Add the wanted addresses that are missing, remove ours that are no longer wanted.

        ``prune=False`` only adds: at start, a predecessor's addresses (adopted by their
        IFA_PROTO) must stay until this run knows which it wants (seamless restart).
        Addresses must be in canonical text form (the slim types and ``canonical`` give that).
        """
        await self._call(self._apply, frozenset(wanted), prune)

    async def change(self, add: Iterable[str], remove: Iterable[str]) -> None:
        """Add ``add`` where missing, remove those of ``remove`` that are ours: costs the change only."""
        await self._call(self._change, frozenset(add), frozenset(remove))

    async def interface_addresses(self, *, quick: bool = False) -> tuple[str, ...]:
        """Every address on the node's links except the ones kubeport added. ``quick``: the
        VIP link (where the 10,000 VIPs are) is not read again, its other addresses are the
        last full read's: a read every 30 s then costs the node's few links only."""
        return await self._call(self._interface_addresses, quick)

    def _interface_addresses(self, quick: bool) -> tuple[str, ...]:
        index = self._link()
        if quick and self._strict_dumps:
            found: set[str] = set(self._vip_link_others)
            for link in netlink_batch.link_indexes():
                if link != index:
                    entries = netlink_batch.dump_link_addresses(link)
                    if entries is None:  # a kernel before 4.20: no filtering
                        self._strict_dumps = False
                        return self._interface_addresses(False)
                    found.update(a for a, _, _ in entries)
            return tuple(sorted(found))
        dump = self._dump()
        self._vip_link_others = tuple(sorted(a for a, link, _ in dump if link == index and a not in self._owned))
        return tuple(sorted({a for a, _, _ in dump} - self._owned))

    async def repair(self, wanted: Iterable[str]) -> list[str]:
        """Re-read the link and restore ``wanted`` (kube-proxy rewrites its rules in full at
        least hourly); the addresses that had vanished and were added back."""
        return await self._call(self._repair, frozenset(wanted))

    async def stop(self, *, release: bool = True) -> None:
        """Remove our addresses; ``release=False`` (handover) leaves them to the successor."""
        await self._call(self._close, release)
        self._executor.shutdown(wait=True)


class FakeAddresses:
    """For unit tests: a set of addresses, plus fixed node addresses.

    ``owned``: addresses a predecessor left (NetlinkAddresses adopts those by IFA_PROTO).
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

    async def interface_addresses(self, *, quick: bool = False) -> tuple[str, ...]:
        return self.node_addresses

    async def repair(self, wanted: Iterable[str]) -> list[str]:
        vanished = sorted((set(wanted) - set(self.node_addresses)) - self._owned)
        await self.sync(wanted)
        return vanished

    async def stop(self, *, release: bool = True) -> None:
        self.released = release
        if release:
            self._owned = set()


class SharedAddresses:
    """A relay worker's view: another process owns the addresses; the node's link addresses are told.

    Workers (see workers.py) bind with IP_FREEBIND, so they need no address of their own;
    they only need the node's link addresses for NodePort selection and local clients.
    """

    def __init__(self, node_addresses: Iterable[str] = ()) -> None:
        self.node_addresses = tuple(node_addresses)

    @property
    def owned(self) -> frozenset[str]:
        return frozenset()

    async def sync(self, wanted: Iterable[str], *, prune: bool = True) -> None:
        return None

    async def change(self, add: Iterable[str], remove: Iterable[str]) -> None:
        return None

    async def interface_addresses(self, *, quick: bool = False) -> tuple[str, ...]:
        return self.node_addresses

    async def repair(self, wanted: Iterable[str]) -> list[str]:
        return []

    async def stop(self, *, release: bool = True) -> None:
        return None

"""VIP addresses (/32, /128) on a local link, reconciled, via pyroute2.

ClusterIPs, externalIPs and LoadBalancer VIPs become local addresses of the node
(default link ``lo``; the ``dummy`` link type may be missing from the kernel), so
the proxy can listen on them. Addresses kubeport adds carry the address protocol
``IFA_PROTO = 0x6b`` ("k"): after a crash the next run recognises its own leftovers,
and it never touches an address it did not add.

pyroute2 0.9 cannot share uvloop's loop (its netlink endpoint needs the default
loop), so every netlink call runs in one dedicated thread with its own IPRoute.
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
    async def interface_addresses(self) -> tuple[str, ...]: ...
    async def stop(self, *, release: bool = True) -> None: ...
    @property
    def owned(self) -> frozenset[str]: ...


class NetlinkAddresses:
    def __init__(self, interface: str = "lo") -> None:
        self.interface = interface
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="kubeport-netlink")
        self._ipr = None  # created in the netlink thread
        self._index: int | None = None
        self._owned: set[str] = set()
        self._scanned = False

    @property
    def owned(self) -> frozenset[str]:
        return frozenset(self._owned)

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # --- in the netlink thread ---------------------------------------------------------

    def _route(self):
        if self._ipr is None:
            from pyroute2 import IPRoute

            self._ipr = IPRoute()
            found = self._ipr.link_lookup(ifname=self.interface)
            if not found:
                raise AddressError(f"vip_interface {self.interface!r}: no such link")
            self._index = found[0]
            self._ipr.link("set", index=self._index, state="up")
        return self._ipr

    def _dump(self) -> list[tuple[str, int, int | None]]:
        """(address, link index, IFA_PROTO) of every address on every link."""
        return [
            (canonical(msg.get_attr("IFA_ADDRESS")), msg["index"], msg.get_attr("IFA_PROTO"))
            for msg in self._route().get_addr()
        ]

    def _apply(self, wanted: frozenset[str], prune: bool = True) -> None:
        self._route()
        present: dict[str, tuple[int, int | None]] = {}
        if not self._scanned:
            for address, index, proto in self._dump():
                present[address] = (index, proto)
            # Leftovers of a previous run on our link are ours: adopt the wanted, drop the rest.
            self._owned |= {
                a for a, (index, proto) in present.items() if index == self._index and proto == ADDRESS_PROTO
            }
            self._scanned = True
        additions = [a for a in sorted(wanted - self._owned) if a not in present]
        # Addresses already present but not ours are someone else's: usable, never ours to remove.
        refused = netlink_batch.apply((AddressOp(True, a) for a in additions), self._index, ADDRESS_PROTO)
        for address in additions:
            code = refused.get(address)
            if code is None:
                self._owned.add(address)
            elif code != _EEXIST:  # EEXIST: it appeared meanwhile; not ours
                raise AddressError(f"adding {address} to {self.interface}: {os.strerror(code)}")
        if prune:
            problems = self._remove(sorted(self._owned - wanted))
            if problems:
                raise AddressError("; ".join(problems))

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

    def _close(self, release: bool) -> None:
        if release and self._owned and self._index is not None:
            for problem in self._remove(sorted(self._owned)):
                log.warning("%s", problem)
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None

    # --- the event loop side -------------------------------------------------------------

    async def sync(self, wanted: Iterable[str], *, prune: bool = True) -> None:
        """Add the wanted addresses that are missing, remove ours that are no longer wanted.

        ``prune=False`` only adds: at start, a predecessor's addresses (adopted by their
        IFA_PROTO) must stay until this run knows which it wants (seamless restart).
        Addresses must be in canonical text form (the slim types and ``canonical`` give that).
        """
        await self._call(self._apply, frozenset(wanted), prune)

    async def interface_addresses(self) -> tuple[str, ...]:
        """Every address on the node's links except the ones kubeport added."""
        dump = await self._call(self._dump)
        return tuple(sorted({a for a, _, _ in dump} - self._owned))

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

    async def interface_addresses(self) -> tuple[str, ...]:
        return self.node_addresses

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

    async def interface_addresses(self) -> tuple[str, ...]:
        return self.node_addresses

    async def stop(self, *, release: bool = True) -> None:
        return None

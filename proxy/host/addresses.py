"""VIP addresses (/32, /128) made local to the node by local routes, over rtnetlink (netlink.py).

ClusterIPs become local addresses of the node, so the proxy can listen on them; externalIPs
and LoadBalancer IPs too, but only where their ports cannot be taken alone (capture.py).
Each VIP is a host route of type local in table local (``ip route add local VIP dev lo
table local proto 0x6b``): the kernel delivers its packets to local sockets and answers
from it as from an address of the node, listeners bind it with IP_FREEBIND (IPv6 asks for
it; IPv4 binds a local route's address as it is). Routes kubeport adds carry the route
protocol ``0x6b`` ("k"): after a crash the next run recognises its own leftovers, and it
never touches a route it did not add.

Routes, not addresses on a link: the kernel walks a link's whole address list, and with
multipath routing every route on the link, for each address added: adding addresses
slows down as they grow in number, adding local routes does not. They are not node
addresses either, so reading the node's addresses (at each address event, for NodePorts)
never reads the VIPs.

Versions before this one added the VIPs as addresses with ``IFA_PROTO = 0x6b``: a run that
finds such addresses on its link (handed the node over by such a version) replaces each
with a route, removing the address and adding the route back to back in one batch.

Every netlink call runs in one dedicated thread: the event loop keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Protocol

from kubeport.proxy.host import netlink
from kubeport.proxy.host.netlink import RouteOp

log = logging.getLogger(__name__)

#: The route protocol marking the VIP routes kubeport added (``ip route show table local proto 0x6b``).
ADDRESS_PROTO = 0x6B
_EEXIST = 17
_ENOENT = 2
_ESRCH = 3


class AddressError(RuntimeError):
    pass


def canonical(address: str) -> str:
    return str(ipaddress.ip_address(address))


class AddressManager(Protocol):
    async def sync(self, wanted: Iterable[str], *, prune: bool = True) -> None: ...
    async def change(self, add: Iterable[str], remove: Iterable[str]) -> None: ...
    async def interface_addresses(self) -> tuple[str, ...]: ...
    async def stop(self, *, release: bool = True) -> None: ...
    async def repair(self, wanted: Iterable[str]) -> list[str]: ...
    @property
    def owned(self) -> frozenset[str]: ...


class NetlinkAddresses:
    """The VIPs as local routes through link ``interface`` (default ``lo``)."""

    def __init__(self, interface: str = "lo") -> None:
        self.interface = interface
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="kubeport-netlink")
        self._index: int | None = None
        self._owned: set[str] = set()
        self._scanned = False

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
                index = netlink.link_index(self.interface)
            except netlink.LinkNotFound:
                raise AddressError(f"vip_interface {self.interface!r}: no such link") from None
            netlink.set_link_up(index)
            self._index = index
        return self._index

    def _present(self) -> dict[str, tuple[int, int]]:
        """Every local host route: address -> (link index, protocol)."""
        return {address: (index, proto) for address, index, proto in netlink.dump_local_routes()}

    def _ours(self, present: dict[str, tuple[int, int]]) -> set[str]:
        return {a for a, (index, proto) in present.items() if index == self._index and proto == ADDRESS_PROTO}

    def _scan(self) -> dict[str, tuple[int, int]]:
        """Once per run: what is local now; a previous run's routes on our link become ours."""
        self._link()
        if self._scanned:
            return {}
        present = self._present()
        self._owned |= self._ours(present)
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
        # Addresses local already but not by our route are someone else's: usable, never ours
        # to remove (a node address: the kernel's local route).
        refused = netlink.apply((RouteOp(True, a) for a in additions), self._index, ADDRESS_PROTO)
        for address in additions:
            code = refused.get(address)
            if code is None:
                self._owned.add(address)
            elif code != _EEXIST:  # EEXIST: it appeared meanwhile; not ours
                raise AddressError(f"adding a local route for {address} via {self.interface}: {os.strerror(code)}")

    def _remove(self, addresses: list[str]) -> list[str]:
        """Remove our routes; returns a line per route the kernel refused to remove."""
        refused = netlink.apply((RouteOp(False, a) for a in addresses), self._index, ADDRESS_PROTO)
        problems = []
        for address in addresses:
            code = refused.get(address)
            if code not in (None, _ESRCH, _ENOENT):  # gone already: someone removed it
                problems.append(f"removing the local route for {address} via {self.interface}: "
                                f"{os.strerror(code)}")
                continue
            self._owned.discard(address)
        return problems

    def _repair(self, wanted: frozenset[str]) -> list[str]:
        """What the kernel holds now, not what this run believes: ours that vanished (an operator,
        another tool) come back, ours no longer wanted go. Returns those added back."""
        self._index = None  # the link may have been re-created
        self._link()
        present = self._present()
        vanished = sorted(a for a in wanted if a not in present)
        self._owned = self._ours(present)
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
        """Add the wanted VIPs that are missing, remove ours that are no longer wanted.

        ``prune=False`` only adds: at start, a predecessor's routes (adopted by their
        protocol) must stay until this run knows which it wants (seamless restart).
        Addresses must be in canonical text form (the slim types and ``canonical`` give that).
        """
        await self._call(self._apply, frozenset(wanted), prune)

    async def change(self, add: Iterable[str], remove: Iterable[str]) -> None:
        """Add ``add`` where missing, remove those of ``remove`` that are ours: costs the change only."""
        await self._call(self._change, frozenset(add), frozenset(remove))

    async def interface_addresses(self) -> tuple[str, ...]:
        """Every address on the node's links (the VIPs are routes, not addresses: a small dump)."""
        return await self._call(self._interface_addresses)

    def _interface_addresses(self) -> tuple[str, ...]:
        self._link()
        return tuple(sorted({a for a, _, _ in netlink.dump_addresses()}))

    async def repair(self, wanted: Iterable[str]) -> list[str]:
        """Re-read table local and restore ``wanted`` (kube-proxy rewrites its rules in full at
        least hourly); the VIPs that had vanished and were added back."""
        return await self._call(self._repair, frozenset(wanted))

    async def stop(self, *, release: bool = True) -> None:
        """Remove our routes; ``release=False`` (handover) leaves them to the successor."""
        await self._call(self._close, release)
        self._executor.shutdown(wait=True)


class SharedAddresses:
    """A relay worker's view: another process owns the addresses; the node's link addresses are told.

    Workers (see workers/parent.py) bind with IP_FREEBIND, so they need no address of their own;
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

    async def interface_addresses(self) -> tuple[str, ...]:
        return self.node_addresses

    async def repair(self, wanted: Iterable[str]) -> list[str]:
        return []

    async def stop(self, *, release: bool = True) -> None:
        return None

"""DROP for frontends whose Local traffic policy has no local endpoint (reference A.6).

A listening socket cannot drop a SYN (the kernel completes the handshake before
accept), and no listener means "refused", so kube-proxy's DROP needs a packet
filter. kubeport owns one nftables table, ``inet kubeport``: a base chain on the
input hook and sets of (daddr . l4proto . dport) elements. Each sync sends one
``nft -f -`` batch holding only the changed elements (atomic: all or nothing).

* ``drop4``/``drop6``: every client is dropped (ClusterIP with iTP=Local).
* ``dropext4``/``dropext6``: only clients outside the pod CIDRs (``local4``/``local6``)
  and not the node itself (``fib saddr type local``) are dropped (eTP=Local).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import shutil
from typing import Iterable, Mapping, Protocol

from .table import Frontend

log = logging.getLogger(__name__)

TABLE = "inet kubeport"

#: frontend -> True when only non-local clients are dropped.
DropSet = Mapping[Frontend, bool]


class FirewallError(RuntimeError):
    pass


def _set_name(frontend: Frontend, only_external: bool) -> str:
    return f"{'dropext' if only_external else 'drop'}{frontend.family}"


def _element(frontend: Frontend) -> str:
    return f"{frontend.ip} . {frontend.protocol.lower()} . {frontend.port}"


def render_setup(cluster_cidrs: Iterable[str]) -> str:
    """The whole table, replacing any leftover of a previous run, as one atomic batch."""
    local: dict[int, list[str]] = {4: [], 6: []}
    for cidr in cluster_cidrs:
        network = ipaddress.ip_network(cidr, strict=False)
        local[network.version].append(str(network))
    lines = [f"table {TABLE} {{}}", f"delete table {TABLE}", f"table {TABLE} {{"]
    for family, addr_type in ((4, "ipv4_addr"), (6, "ipv6_addr")):
        for name in (f"drop{family}", f"dropext{family}"):
            lines.append(f"  set {name} {{ type {addr_type} . inet_proto . inet_service; }}")
        elements = f" elements = {{ {', '.join(local[family])} }};" if local[family] else ""
        lines.append(f"  set local{family} {{ type {addr_type}; flags interval;{elements} }}")
    lines += [
        "  chain input {",
        "    type filter hook input priority filter - 5; policy accept;",
        "    ip daddr . meta l4proto . th dport @drop4 drop",
        "    ip6 daddr . meta l4proto . th dport @drop6 drop",
        "    ip daddr . meta l4proto . th dport @dropext4 ip saddr != @local4 fib saddr type != local drop",
        "    ip6 daddr . meta l4proto . th dport @dropext6 ip6 saddr != @local6 fib saddr type != local drop",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def render_changes(current: DropSet, desired: DropSet) -> str:
    """The batch turning ``current`` into ``desired``; "" when they are the same."""
    lines = []
    for frontend, only_external in sorted(current.items()):
        if desired.get(frontend) != only_external:
            lines.append(f"delete element {TABLE} {_set_name(frontend, only_external)} {{ {_element(frontend)} }}")
    for frontend, only_external in sorted(desired.items()):
        if current.get(frontend) != only_external:
            lines.append(f"add element {TABLE} {_set_name(frontend, only_external)} {{ {_element(frontend)} }}")
    return "".join(line + "\n" for line in lines)


class Firewall(Protocol):
    async def start(self, cluster_cidrs: Iterable[str]) -> None: ...
    async def sync(self, desired: DropSet) -> None: ...
    async def stop(self) -> None: ...


class NftFirewall:
    """The real one: runs ``nft -f -`` in the daemon's network namespace."""

    def __init__(self, nft: str = "nft") -> None:
        self._nft = nft
        self._current: dict[Frontend, bool] = {}
        self.enabled = False

    async def _run(self, script: str) -> None:
        proc = await asyncio.create_subprocess_exec(
            self._nft, "-f", "-",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate(script.encode())
        if proc.returncode != 0:
            raise FirewallError(f"nft -f - failed ({proc.returncode}): {err.decode(errors='replace').strip()}")

    async def start(self, cluster_cidrs: Iterable[str]) -> None:
        if shutil.which(self._nft) is None:
            log.error("nft not found: Local traffic policies without local endpoints refuse instead of drop")
            return
        try:
            await self._run(render_setup(cluster_cidrs))
        except FirewallError as exc:
            log.error("%s: Local traffic policies without local endpoints refuse instead of drop", exc)
            return
        self._current = {}
        self.enabled = True

    async def sync(self, desired: DropSet) -> None:
        if not self.enabled:
            return
        script = render_changes(self._current, desired)
        if not script:
            return
        await self._run(script)  # atomic: on failure nothing changed, the next sync retries
        self._current = dict(desired)

    async def stop(self) -> None:
        if not self.enabled:
            return
        self.enabled = False
        self._current = {}
        try:
            await self._run(f"delete table {TABLE}\n")
        except FirewallError as exc:
            log.warning("removing nftables table %s: %s", TABLE, exc)


class FakeFirewall:
    """For unit tests: holds the desired drops, records every sync."""

    def __init__(self) -> None:
        self.drops: dict[Frontend, bool] = {}
        self.syncs: list[dict[Frontend, bool]] = []
        self.cluster_cidrs: tuple[str, ...] = ()
        self.enabled = False

    async def start(self, cluster_cidrs: Iterable[str]) -> None:
        self.cluster_cidrs = tuple(cluster_cidrs)
        self.enabled = True

    async def sync(self, desired: DropSet) -> None:
        if dict(desired) != self.drops:
            self.drops = dict(desired)
            self.syncs.append(dict(desired))

    async def stop(self) -> None:
        self.enabled = False
        self.drops = {}

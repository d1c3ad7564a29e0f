"""Replies to the client's address reach the relay: what keeps the client's address possible.

When the relay's upstream socket binds the client's address (clientaddress.py), the endpoint
answers the client, not the node. Three pieces take such a reply to kubeport's socket, as
Linux TPROXY setups do (the kernel's Documentation/networking/tproxy.rst):

- table ``inet kubeport_replies``: the first packet a transparent socket of this node sends
  (``ct state new socket transparent 1``, on output) marks its connection (``ct mark``), and on
  prerouting every packet of a marked connection gets the capture fwmark bit. A conntrack mark
  costs each received packet one compare where a ``socket`` match on prerouting would cost it a
  socket lookup, and it survives the daemon: connections of a killed or handed-over process
  keep being delivered to their sockets;
- the capture rule and routing table (capture.py: ``fwmark ... lookup 27499``, whose one route
  is ``local default dev lo``) deliver marked packets locally, where the socket takes them;
- table ``bridge kubeport``: a bridge CNI (``cni0``, ``cbr0``) puts a client pod and a
  same-node endpoint on one segment, so the endpoint's reply is bridged straight to the client
  and never meets the node's IP stack (kube-proxy leans on br_netfilter for the same case). A
  frame from a same-node endpoint's (address, protocol, port) to a pod of that bridge's subnet
  is handed to the host instead (destination MAC set to the bridge's, packet type host); the
  host then delivers it to kubeport's socket, or, when it belongs to a direct pod-to-pod
  connection, routes it back out to the pod.

The marking table is written whole by ``start`` (one batch deleting and recreating it, so a
successor taking over never leaves a moment without it); a predecessor's bridge table is kept
until the first sync writes it whole with this process's endpoints (an unsynced successor
knows none, and its predecessor still relays flows to them). Both are left to a successor on
handover; the endpoints of the bridge set follow the snapshots change by change.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import shutil
import socket
from dataclasses import dataclass
from typing import Iterable

from kubeport.proxy.host import capture

log = logging.getLogger(__name__)

INET_TABLE = "inet kubeport_replies"
BRIDGE_TABLE = "bridge kubeport"
#: before the capture chains' dstnat priority: the mark must be there when routing decides.
INET_HOOK = "type filter hook prerouting priority mangle; policy accept;"
OUTPUT_HOOK = "type filter hook output priority mangle; policy accept;"
#: before the bridge decides where the frame goes.
BRIDGE_HOOK = "type filter hook prerouting priority -300; policy accept;"

_IP_TRANSPARENT = getattr(socket, "IP_TRANSPARENT", 19)


@dataclass(frozen=True, slots=True)
class Bridge:
    name: str
    mac: str
    #: the subnets of the bridge's addresses: where its pods are
    networks: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NodeLinks:
    """What ``ip -details -json address show`` says of the node's links."""

    #: every subnet of an address on a link (``10.244.1.1/24``)
    networks: tuple[str, ...]
    bridges: tuple[Bridge, ...]


def parse_links(text: str) -> NodeLinks:
    networks: list[str] = []
    bridges: list[Bridge] = []
    for link in json.loads(text or "[]"):
        own: list[str] = []
        for info in link.get("addr_info", ()):
            local, prefix = info.get("local"), info.get("prefixlen")
            if local is None or prefix is None or info.get("scope") == "host":
                continue
            network = ipaddress.ip_network(f"{local}/{prefix}", strict=False)
            if network.prefixlen < network.max_prefixlen:
                own.append(f"{local}/{prefix}")
        networks += own
        kind = (link.get("linkinfo") or {}).get("info_kind")
        if kind == "bridge" and own and link.get("address"):
            bridges.append(Bridge(link["ifname"], link["address"], tuple(own)))
    return NodeLinks(tuple(networks), tuple(bridges))


async def read_links() -> NodeLinks:
    proc = await asyncio.create_subprocess_exec("ip", "-details", "-json", "address", "show",
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode:
        raise RepliesError(f"ip -details -json address show: {err.decode(errors='replace').strip()}")
    return parse_links(out.decode())


class RepliesError(RuntimeError):
    pass


Element = tuple[str, str, int]  # endpoint address, protocol (tcp/udp), port


def _element(element: Element) -> str:
    ip, proto, port = element
    return f"{ip} . {proto} . {port}"


def _family(ip: str) -> int:
    return 6 if ":" in ip else 4


def _subnets(bridge: Bridge, family: int) -> list[str]:
    return [str(ipaddress.ip_network(n, strict=False)) for n in bridge.networks if _family(n) == family]


def bridge_rules(bridges: Iterable[Bridge]) -> list[str]:
    rules = []
    for bridge in bridges:
        for family, ip in ((4, "ip"), (6, "ip6")):
            subnets = _subnets(bridge, family)
            if subnets:
                rules.append(f"{ip} daddr {{ {', '.join(subnets)} }} {ip} saddr . meta l4proto . th sport "
                             f"@endpoints{family} ether daddr set {bridge.mac} meta pkttype set host")
    return rules


def render_inet_setup(mark: int) -> str:
    """The marking table whole, replacing any previous one in one batch."""
    lines = [f"table {INET_TABLE} {{}}", f"delete table {INET_TABLE}", f"table {INET_TABLE} {{",
             "  chain output {", f"    {OUTPUT_HOOK}",
             f"    ct state new socket transparent 1 ct mark set ct mark | {mark:#x}",
             "  }",
             "  chain prerouting {", f"    {INET_HOOK}",
             f"    ct mark & {mark:#x} == {mark:#x} meta mark set meta mark | {mark:#x}",
             "  }", "}"]
    return "\n".join(lines) + "\n"


def render_bridge_setup(bridges: Iterable[Bridge], endpoints: Iterable[Element]) -> str:
    """The bridge table whole, with its elements, replacing any previous one in one batch."""
    by_family: dict[int, list[str]] = {4: [], 6: []}
    for element in sorted(endpoints):
        by_family[_family(element[0])].append(_element(element))
    lines = [f"table {BRIDGE_TABLE} {{}}", f"delete table {BRIDGE_TABLE}", f"table {BRIDGE_TABLE} {{"]
    for family, addr_type in ((4, "ipv4_addr"), (6, "ipv6_addr")):
        elements = f" elements = {{ {', '.join(by_family[family])} }};" if by_family[family] else ""
        lines.append(f"  set endpoints{family} {{ type {addr_type} . inet_proto . inet_service;{elements} }}")
    lines += ["  chain prerouting {", f"    {BRIDGE_HOOK}", *(f"    {rule}" for rule in bridge_rules(bridges)),
              "  }", "}"]
    return "\n".join(lines) + "\n"


def render_changes(current: frozenset[Element], desired: frozenset[Element]) -> str:
    lines = [f"delete element {BRIDGE_TABLE} endpoints{_family(e[0])} {{ {_element(e)} }}"
             for e in sorted(current - desired)]
    lines += [f"add element {BRIDGE_TABLE} endpoints{_family(e[0])} {{ {_element(e)} }}"
              for e in sorted(desired - current)]
    return "".join(line + "\n" for line in lines)


def teardown_script() -> str:
    return "".join(f"table {t} {{}}\ndelete table {t}\n" for t in (INET_TABLE, BRIDGE_TABLE))


async def _nft(script: str) -> None:
    proc = await asyncio.create_subprocess_exec("nft", "-f", "-", stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate(script.encode())
    if proc.returncode:
        raise RepliesError(f"nft: {err.decode(errors='replace').strip()}")


async def _table_exists(table: str) -> bool:
    proc = await asyncio.create_subprocess_exec("nft", "list", "table", *table.split(),
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    return await proc.wait() == 0


def transparent_allowed() -> str | None:
    """None when this process may bind a foreign address, else why not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.setsockopt(socket.IPPROTO_IP, _IP_TRANSPARENT, 1)
        except OSError as exc:
            return f"IP_TRANSPARENT: {exc.strerror or exc} (needs CAP_NET_ADMIN)"
    return None


class ClientReplies:
    """The two tables, kept in step with the bridges of the node and its same-node endpoints."""

    def __init__(self) -> None:
        #: None while it works; else the one problem line (the node's address is used instead)
        self.problem: str | None = "not started"
        #: None while same-bridge replies are handed to the host; else why not (a user namespace
        #: may not rewrite link-layer headers): endpoints on the client's own bridge then see
        #: the node, as a hairpin connection does
        self.bridge_problem: str | None = None
        self._bridges: tuple[Bridge, ...] = ()
        #: the bridges' subnets as (network, mask) integers per family: an endpoint is looked
        #: at once per rule change, so the test must be cheap at 250,000 endpoints
        self._subnets: dict[int, tuple[tuple[int, int], ...]] = {4: (), 6: ()}
        #: endpoint (address, protocol, port) on a bridge subnet -> frontends using it; the
        #: others are never counted (a node without bridges counts nothing)
        self._counts: dict[Element, int] = {}
        #: the bridges changed: the Proxier counts again from its whole table
        self.needs_recount = False
        #: the elements the bridge set holds
        self._applied: frozenset[Element] = frozenset()
        self._dirty = False
        self._lock = asyncio.Lock()

    @property
    def enabled(self) -> bool:
        return self.problem is None

    async def start(self, links: NodeLinks) -> None:
        """Write both tables; on failure keep the reason in ``problem`` (the relay then keeps
        the node's address) and say it in one line."""
        self._take_bridges(links.bridges)
        problem = transparent_allowed()
        if problem is None and shutil.which("nft") is None:
            problem = "nft (nftables) not found"
        if problem is None:
            try:
                await capture.set_up()
                await _nft(render_inet_setup(capture.MARK))
            except (capture.CaptureError, RepliesError) as exc:
                problem = str(exc)
        self.problem = problem
        if problem is not None:
            log.error("endpoints see the node's address, not the client's: %s (--no-keep-client-address "
                      "says it is meant)", problem)
            return
        if await _table_exists(BRIDGE_TABLE):
            # A predecessor's (handover, crash): its endpoints serve the flows it still relays
            # until this process's first sync writes the table whole with its own.
            self._dirty = True
            return
        try:
            await self._write_whole()
        except RepliesError as exc:
            self.bridge_problem = str(exc)
            log.warning("endpoints on the client's own bridge see the node's address, not the client's: the "
                        "bridge table cannot be written: %s", exc)

    def set_bridges(self, bridges: tuple[Bridge, ...]) -> None:
        if bridges != self._bridges:
            self._take_bridges(bridges)
            self._counts.clear()
            self.needs_recount = True
            self._dirty = True

    def _take_bridges(self, bridges: tuple[Bridge, ...]) -> None:
        self._bridges = bridges
        subnets: dict[int, list[tuple[int, int]]] = {4: [], 6: []}
        for bridge in bridges:
            for text in bridge.networks:
                network = ipaddress.ip_network(text, strict=False)
                subnets[network.version].append((int(network.network_address), int(network.netmask)))
        self._subnets = {family: tuple(found) for family, found in subnets.items()}

    def _on_a_bridge(self, ip: str) -> bool:
        family, kind = (6, socket.AF_INET6) if ":" in ip else (4, socket.AF_INET)
        subnets = self._subnets[family]
        if not subnets:
            return False
        try:
            value = int.from_bytes(socket.inet_pton(kind, ip), "big")
        except OSError:
            return False
        return any(value & mask == network for network, mask in subnets)

    def _desired(self) -> frozenset[Element]:
        return frozenset(self._counts)

    def recount(self, endpoints: Iterable[Element]) -> None:
        """Count from scratch (after ``set_bridges``): every endpoint the rules name now."""
        self._counts.clear()
        self.needs_recount = False
        self.account((), endpoints)

    def account(self, endpoints_gone: Iterable[Element], endpoints_new: Iterable[Element]) -> None:
        if not self._subnets[4] and not self._subnets[6]:
            return
        counts, on_a_bridge = self._counts, self._on_a_bridge
        for element in endpoints_new:
            if on_a_bridge(element[0]):
                counts[element] = counts.get(element, 0) + 1
        for element in endpoints_gone:
            if not on_a_bridge(element[0]):
                continue
            left = counts.get(element, 0) - 1
            if left > 0:
                counts[element] = left
            else:
                counts.pop(element, None)

    async def sync(self) -> None:
        if not self.enabled or self.bridge_problem is not None:
            return
        async with self._lock:
            try:
                if self._dirty:
                    await self._write_whole()
                    return
                desired = self._desired()
                if desired != self._applied:
                    await _nft(render_changes(self._applied, desired))
                    self._applied = desired
            except RepliesError as exc:
                log.error("nftables (replies to clients' addresses): %s", exc)
                self._dirty = True  # written whole by the next sync

    async def _write_whole(self) -> None:
        desired = self._desired()
        await _nft(render_bridge_setup(self._bridges, desired))
        self._applied, self._dirty = desired, False

    async def stop(self, *, release: bool) -> None:
        """``release``: remove both tables (a successor that takes over keeps them)."""
        if release and self.problem is None:
            try:
                await _nft(teardown_script())
            except RepliesError as exc:
                log.warning("removing the client-reply tables: %s", exc)

"""nftables rules for what a listening socket cannot do: DROP, loadBalancerSourceRanges, and
the ports a VIP does not serve.

A listening socket cannot drop a SYN (the kernel completes the handshake before
accept), and no listener means "refused", so kube-proxy's DROP needs a packet
filter. kubeport owns one nftables table, ``inet kubeport``: sets of
(daddr . l4proto . dport) elements and, while any of them holds one, a base chain on
the input hook. Each sync sends one ``nft -f -`` batch holding only the changed
elements (atomic: all or nothing).

The chain is hooked only while it has something to drop: every packet the node
receives, relayed or not, walks a hooked chain (its set lookups cost the proxy CPU
and new connections per second in the new-connections benchmark). Most clusters never
need it (no Local policy without local endpoints, no loadBalancerSourceRanges).

* ``drop4``/``drop6``: every client is dropped (ClusterIP with iTP=Local).
* ``dropext4``/``dropext6``: only clients outside the pod CIDRs (``local4``/``local6``)
  and not the node itself (``fib saddr type local``) are dropped (eTP=Local).
* ``fw4``/``fw6``: LB VIP frontends with loadBalancerSourceRanges; a client whose
  (frontend . source) is not in ``fwallow4``/``fwallow6`` is dropped (kube-proxy's firewall
  chains, pkg/proxy/iptables/proxier.go syncProxyRules).
* ``services4``/``services6`` (the service CIDRs) and a chain on the forward hook: a
  packet the node would route on to one of their addresses is dropped, as kube-proxy's
  nftables mode drops traffic to unallocated ClusterIPs (pkg/proxy/nftables/proxier.go, the
  cluster-ips-check chain). Every ClusterIP in use is a local address here, so only
  unallocated ones are ever forwarded; without the drop, a pod asking for one sends it out
  through the node's default route. Only forwarded packets walk this chain, never those the
  proxy relays.

* ``capture4``/``capture6`` and ``reject4``/``reject6``: the externalIP and LoadBalancer
  frontends (proxy/host/capture.py). An externalIP is no local address of the node, since the
  whole address would then be taken from the host that owns it, on every port; only its
  service ports are taken: a packet to a served one is marked on the prerouting and output
  hooks and the mark routes it to a local socket; one to a refused port (no endpoint) is
  rejected where it would be forwarded or sent, as kube-proxy's REJECT. These chains too
  are hooked only while a set has an element.

* ``vips4``/``vips6`` and ``vipports4``/``vipports6``: the addresses kubeport makes local (the
  ClusterIPs, the DNS server's, externalIPs and LB IPs where they are not captured) and the
  (VIP . l4proto . dport) each serves. A VIP is a local route, so the kernel would deliver
  any port of it to any socket bound to the wildcard address (sshd, the health port):
  a packet to a VIP on a port it does not serve is rejected (TCP with a reset, the rest
  with ICMP port unreachable), as kube-proxy's nftables mode rejects unknown ports of
  cluster IPs (pkg/proxy/nftables/proxier.go, the cluster-ips set and its reject rule).
  ICMP passes: path-MTU and unreachable errors for relayed connections come to the VIP,
  and an echo reply exposes no socket. So does what the node sends itself (``iif lo``): a
  node process talking to a VIP uses the VIP as its own source, so the replies come to
  the VIP on the client's port; and the node reaches its own sockets on 127.0.0.1 anyway.
  Only a new flow is looked up (``ct state new``, as kube-proxy's nftables mode jumps to
  its cluster-ips-check chain: pkg/proxy/nftables/proxier.go ``nftablesJumpChains``): a
  flow refused at its first packet has no later ones, and one let in (a service port)
  needs no second look. This chain is hooked while any VIP exists; what it costs per new
  connection is measured in ``bench/vip_filter.py`` (bench/RESULTS.md).

The first sync of a run replaces the whole table, elements included, in one
transaction: a successor taking over from a running instance (seamless restart)
never leaves a moment where the table is empty, and ``start`` touches nothing.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import shutil
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable, Mapping, Protocol

from kubeport.proxy.host import capture
from kubeport.proxy.table import Frontend

log = logging.getLogger(__name__)

TABLE = "inet kubeport"
CHAIN = "input"
CHAIN_HOOK = "type filter hook input priority filter - 5; policy accept;"
_FRONTEND_KEY = "daddr . meta l4proto . th dport"
RULES = (
    f"ip {_FRONTEND_KEY} @drop4 drop",
    f"ip6 {_FRONTEND_KEY} @drop6 drop",
    f"ip {_FRONTEND_KEY} @dropext4 ip saddr != @local4 fib saddr type != local drop",
    f"ip6 {_FRONTEND_KEY} @dropext6 ip6 saddr != @local6 fib saddr type != local drop",
    f"ip {_FRONTEND_KEY} @fw4 ip {_FRONTEND_KEY} . ip saddr != @fwallow4 drop",
    f"ip6 {_FRONTEND_KEY} @fw6 ip6 {_FRONTEND_KEY} . ip6 saddr != @fwallow6 drop",
)
_MARK_RULE = "meta mark set meta mark | {mark:#010x}"
CAPTURE_CHAINS = (
    ("capture_in", "type filter hook prerouting priority mangle; policy accept;",
     (f"ip {_FRONTEND_KEY} @capture4 {_MARK_RULE}", f"ip6 {_FRONTEND_KEY} @capture6 {_MARK_RULE}")),
    ("capture_out", "type route hook output priority mangle; policy accept;",
     (f"ip {_FRONTEND_KEY} @capture4 {_MARK_RULE}", f"ip6 {_FRONTEND_KEY} @capture6 {_MARK_RULE}",
      f"ip {_FRONTEND_KEY} @reject4 reject", f"ip6 {_FRONTEND_KEY} @reject6 reject")),
    ("capture_fwd", "type filter hook forward priority filter - 5; policy accept;",
     (f"ip {_FRONTEND_KEY} @reject4 reject", f"ip6 {_FRONTEND_KEY} @reject6 reject")),
)
VIP_CHAIN = "vips"
VIP_REJECT_CHAIN = "vip_reject"
VIP_RULES = (
    "iif lo accept",
    "ct state != new accept",
    f"ip daddr @vips4 meta l4proto != icmp ip {_FRONTEND_KEY} != @vipports4 goto {VIP_REJECT_CHAIN}",
    f"ip6 daddr @vips6 meta l4proto != ipv6-icmp ip6 {_FRONTEND_KEY} != @vipports6 goto {VIP_REJECT_CHAIN}",
)
VIP_REJECT_RULES = ("meta l4proto tcp reject with tcp reset", "reject")
FORWARD_CHAIN = "forward"
FORWARD_HOOK = "type filter hook forward priority filter - 5; policy accept;"
FORWARD_RULES = ("ip daddr @services4 drop", "ip6 daddr @services6 drop")

#: frontend -> True when only non-local clients are dropped.
DropSet = Mapping[Frontend, bool]
#: LB VIP frontend -> the source CIDRs let in (normalised, non-overlapping).
AllowSet = Mapping[Frontend, tuple[str, ...]]
#: externalIP / LB frontend -> True when served (captured), False when refused (rejected).
CaptureSet = Mapping[Frontend, bool]




@dataclass(frozen=True)
class Vips:
    """The addresses kubeport makes local and the frontends served on them; the rest of each
    address's ports are rejected."""

    addresses: frozenset[str] = frozenset()
    ports: frozenset[Frontend] = frozenset()


NO_VIPS = Vips()


class FirewallError(RuntimeError):
    pass


def _set_name(frontend: Frontend, only_external: bool) -> str:
    return f"{'dropext' if only_external else 'drop'}{frontend.family}"


def _element(frontend: Frontend) -> str:
    return f"{frontend.ip} . {frontend.protocol.lower()} . {frontend.port}"


def _source(cidr: str) -> str:
    network = ipaddress.ip_network(cidr, strict=False)
    if network.prefixlen == network.max_prefixlen:
        return str(network.network_address)  # nft lists host ranges as addresses
    return str(network)


def _capture_set(frontend: Frontend, served: bool) -> str:
    return f"{'capture' if served else 'reject'}{frontend.family}"


def _capture_chains(mark: int) -> list[tuple[str, str, list[str]]]:
    return [(name, hook, [rule.format(mark=mark) for rule in rules]) for name, hook, rules in CAPTURE_CHAINS]


def _allow_elements(frontend: Frontend, sources: Iterable[str]) -> list[str]:
    return [f"{_element(frontend)} . {_source(cidr)}" for cidr in sources]


def _by_family(cidrs: Iterable[str]) -> dict[int, list[str]]:
    """Per family, the ranges merged: nft refuses overlapping elements of an interval set, and
    ServiceCIDRs may overlap each other and the flag's range (KEP-1880 grows a range that way)."""
    networks: dict[int, list] = {4: [], 6: []}
    for cidr in cidrs:
        network = ipaddress.ip_network(cidr, strict=False)
        networks[network.version].append(network)
    return {family: [str(n) for n in ipaddress.collapse_addresses(found)] for family, found in networks.items()}


def _vip_members(vips: Vips) -> dict[str, list[str]]:
    members: dict[str, list[str]] = {}
    for address in sorted(vips.addresses):
        members.setdefault(f"vips{6 if ':' in address else 4}", []).append(address)
    for frontend in sorted(vips.ports):
        members.setdefault(f"vipports{frontend.family}", []).append(_element(frontend))
    return members


def _vip_chains() -> list[tuple[str, str | None, tuple[str, ...]]]:
    return [(VIP_REJECT_CHAIN, None, VIP_REJECT_RULES), (VIP_CHAIN, CHAIN_HOOK, VIP_RULES)]


def render_setup(cluster_cidrs: Iterable[str], drops: DropSet | None = None, allowed: AllowSet | None = None,
                 service_cidrs: Iterable[str] = (), captured: CaptureSet | None = None, mark: int = 0,
                 vips: Vips = NO_VIPS) -> str:
    """The whole table with its elements, replacing any previous one, as one atomic batch."""
    drops, allowed, captured = drops or {}, allowed or {}, captured or {}
    local = _by_family(cluster_cidrs)
    services = _by_family(service_cidrs)
    members: dict[str, list[str]] = {}
    for frontend, only_external in sorted(drops.items()):
        members.setdefault(_set_name(frontend, only_external), []).append(_element(frontend))
    for frontend, sources in sorted(allowed.items()):
        members.setdefault(f"fw{frontend.family}", []).append(_element(frontend))
        members.setdefault(f"fwallow{frontend.family}", []).extend(_allow_elements(frontend, sources))
    for frontend, served in sorted(captured.items()):
        members.setdefault(_capture_set(frontend, served), []).append(_element(frontend))
    members.update(_vip_members(vips))

    def elements(name: str, values: list[str] | None = None) -> str:
        values = members.get(name) if values is None else values
        return f" elements = {{ {', '.join(values)} }};" if values else ""

    lines = [f"table {TABLE} {{}}", f"delete table {TABLE}", f"table {TABLE} {{"]
    for family, addr_type in ((4, "ipv4_addr"), (6, "ipv6_addr")):
        key = f"{addr_type} . inet_proto . inet_service"
        for name in (f"drop{family}", f"dropext{family}", f"fw{family}", f"capture{family}", f"reject{family}",
                     f"vipports{family}"):
            lines.append(f"  set {name} {{ type {key};{elements(name)} }}")
        lines.append(f"  set fwallow{family} {{ type {key} . {addr_type}; flags interval;"
                     f"{elements(f'fwallow{family}')} }}")
        lines.append(f"  set vips{family} {{ type {addr_type};{elements(f'vips{family}')} }}")
        lines.append(f"  set local{family} {{ type {addr_type}; flags interval;{elements('', local[family])} }}")
        lines.append(f"  set services{family} {{ type {addr_type}; flags interval;"
                     f"{elements('', services[family])} }}")
    if services[4] or services[6]:
        lines += [f"  chain {FORWARD_CHAIN} {{", f"    {FORWARD_HOOK}"]
        lines += [f"    {rule}" for rule in FORWARD_RULES]
        lines.append("  }")
    if drops or allowed:
        lines += [f"  chain {CHAIN} {{", f"    {CHAIN_HOOK}"]
        lines += [f"    {rule}" for rule in RULES]
        lines.append("  }")
    if captured:
        for name, hook, rules in _capture_chains(mark):
            lines += [f"  chain {name} {{", f"    {hook}", *(f"    {rule}" for rule in rules), "  }"]
    for name, hook, rules in _vip_chains():
        if hook is None or vips.addresses:  # the reject chain costs nothing until jumped to
            lines += [f"  chain {name} {{", *([f"    {hook}"] if hook else []),
                      *(f"    {rule}" for rule in rules), "  }"]
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_changes(current: DropSet, desired: DropSet, current_allowed: AllowSet | None = None,
                   desired_allowed: AllowSet | None = None, current_captured: CaptureSet | None = None,
                   desired_captured: CaptureSet | None = None, mark: int = 0,
                   current_vips: Vips = NO_VIPS, desired_vips: Vips = NO_VIPS) -> str:
    """The batch turning ``current`` into ``desired``; "" when they are the same."""
    current_allowed, desired_allowed = current_allowed or {}, desired_allowed or {}
    current_captured, desired_captured = current_captured or {}, desired_captured or {}
    deletes: list[tuple[str, str]] = []
    adds: list[tuple[str, str]] = []
    for frontend, only_external in sorted(current.items()):
        if desired.get(frontend) != only_external:
            deletes.append((_set_name(frontend, only_external), _element(frontend)))
    for frontend, only_external in sorted(desired.items()):
        if current.get(frontend) != only_external:
            adds.append((_set_name(frontend, only_external), _element(frontend)))
    for frontend in sorted(current_allowed.keys() | desired_allowed.keys()):
        old, new = current_allowed.get(frontend), desired_allowed.get(frontend)
        if old == new:
            continue
        allow = f"fwallow{frontend.family}"
        old_sources, new_sources = set(old or ()), set(new or ())
        deletes += [(allow, e) for e in _allow_elements(frontend, sorted(old_sources - new_sources))]
        adds += [(allow, e) for e in _allow_elements(frontend, sorted(new_sources - old_sources))]
        if new is None:
            deletes.append((f"fw{frontend.family}", _element(frontend)))
        elif old is None:
            adds.append((f"fw{frontend.family}", _element(frontend)))
    for frontend, served in sorted(current_captured.items()):
        if desired_captured.get(frontend) != served:
            deletes.append((_capture_set(frontend, served), _element(frontend)))
    for frontend, served in sorted(desired_captured.items()):
        if current_captured.get(frontend) != served:
            adds.append((_capture_set(frontend, served), _element(frontend)))
    if current_vips != desired_vips:
        gone = Vips(current_vips.addresses - desired_vips.addresses, current_vips.ports - desired_vips.ports)
        new = Vips(desired_vips.addresses - current_vips.addresses, desired_vips.ports - current_vips.ports)
        deletes += [(name, e) for name, values in _vip_members(gone).items() for e in values]
        adds += [(name, e) for name, values in _vip_members(new).items() for e in values]
    lines = [f"delete element {TABLE} {name} {{ {element} }}" for name, element in deletes]
    lines += [f"add element {TABLE} {name} {{ {element} }}" for name, element in adds]
    hooked, wanted = bool(current or current_allowed), bool(desired or desired_allowed)
    if wanted and not hooked:
        lines += [f"add chain {TABLE} {CHAIN} {{ {CHAIN_HOOK} }}"]
        lines += [f"add rule {TABLE} {CHAIN} {rule}" for rule in RULES]
    elif hooked and not wanted:
        lines += [f"flush chain {TABLE} {CHAIN}", f"delete chain {TABLE} {CHAIN}"]
    if desired_captured and not current_captured:
        for name, hook, rules in _capture_chains(mark):
            lines += [f"add chain {TABLE} {name} {{ {hook} }}", *(f"add rule {TABLE} {name} {rule}" for rule in rules)]
    elif current_captured and not desired_captured:
        for name, _, _ in CAPTURE_CHAINS:
            lines += [f"flush chain {TABLE} {name}", f"delete chain {TABLE} {name}"]
    if desired_vips.addresses and not current_vips.addresses:
        lines += [f"add chain {TABLE} {VIP_CHAIN} {{ {CHAIN_HOOK} }}",
                  *(f"add rule {TABLE} {VIP_CHAIN} {rule}" for rule in VIP_RULES)]
    elif current_vips.addresses and not desired_vips.addresses:
        lines += [f"flush chain {TABLE} {VIP_CHAIN}", f"delete chain {TABLE} {VIP_CHAIN}"]
    return "".join(line + "\n" for line in lines)


class Firewall(Protocol):
    #: externalIP and LB frontends are taken by port (capture.py), not as local addresses.
    capturing: bool

    async def start(self, cluster_cidrs: Iterable[str], service_cidrs: Iterable[str] = ()) -> None: ...
    #: the service ranges now (ServiceCIDRs come and go); True when they changed
    def set_service_cidrs(self, service_cidrs: Iterable[str]) -> bool: ...
    #: nft is there: the rules are programmed (else every port of a VIP reaches the node's sockets).
    enabled: bool

    async def sync(self, desired: DropSet, allowed: AllowSet | None = None,
                   captured: CaptureSet | None = None, vips: Vips = NO_VIPS) -> None: ...
    async def stop(self, *, release: bool = True) -> None: ...
    async def resync(self) -> None: ...


class NftFirewall:
    """The real one: runs ``nft -f -`` in the daemon's network namespace."""

    def __init__(self, nft: str = "nft", run: Callable[[str], Awaitable[None]] | None = None) -> None:
        """:param run: feeds a script to ``nft -f -`` (raising FirewallError on failure); by
            default a subprocess of ``nft``."""
        self._nft = nft
        self._run = run or self._run_nft
        self._cluster_cidrs: tuple[str, ...] = ()
        self._service_cidrs: tuple[str, ...] = ()
        #: what the kernel holds; None until this run has written the table (the first sync).
        self._current: tuple[dict[Frontend, bool], dict[Frontend, tuple[str, ...]], dict[Frontend, bool], Vips] | None
        self._current = None
        self.enabled = False
        self.capturing = False

    async def _run_nft(self, script: str) -> None:
        proc = await asyncio.create_subprocess_exec(
            self._nft, "-f", "-",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate(script.encode())
        if proc.returncode != 0:
            raise FirewallError(f"nft -f - failed ({proc.returncode}): {err.decode(errors='replace').strip()}")

    async def start(self, cluster_cidrs: Iterable[str], service_cidrs: Iterable[str] = ()) -> None:
        """Check for nft; the table itself is written by the first sync (a predecessor's stays until then)."""
        if shutil.which(self._nft) is None:
            log.error("nft not found: every port of a ClusterIP reaches the node's sockets bound to the wildcard "
                      "address, Local traffic policies without local endpoints refuse instead of drop, "
                      "loadBalancerSourceRanges are not enforced, unallocated ClusterIPs are routed on")
            return
        self._cluster_cidrs = tuple(cluster_cidrs)
        self._service_cidrs = tuple(service_cidrs)
        self._current = None
        self.enabled = True
        try:
            await capture.set_up()
        except capture.CaptureError as exc:
            log.error("externalIPs and LoadBalancer IPs become local addresses (every port of them): "
                      "no policy routing for their ports: %s", exc)
            return
        self.capturing = True

    def set_service_cidrs(self, service_cidrs: Iterable[str]) -> bool:
        """Take the service ranges now; the next sync writes the table whole when they changed
        (a ServiceCIDR added or gone is rare, and one batch keeps the change atomic)."""
        wanted = tuple(service_cidrs)
        if not self.enabled or wanted == self._service_cidrs:
            return False
        self._service_cidrs = wanted
        self._current = None
        return True

    async def sync(self, desired: DropSet, allowed: AllowSet | None = None,
                   captured: CaptureSet | None = None, vips: Vips = NO_VIPS) -> None:
        if not self.enabled:
            return
        allowed, captured = dict(allowed or {}), dict(captured or {})
        if self._current is None:
            script = render_setup(self._cluster_cidrs, desired, allowed, self._service_cidrs, captured, capture.MARK,
                                  vips)
        else:
            script = render_changes(self._current[0], desired, self._current[1], allowed, self._current[2], captured,
                                    capture.MARK, self._current[3], vips)
            if not script:
                return
        try:
            await self._run(script)  # atomic: on failure nothing changed
        except FirewallError:
            # The table may not be what this process thinks (deleted, flushed by hand): the
            # retry writes it whole, as kube-proxy's full sync after a failed one.
            self._current = None
            raise
        self._current = (dict(desired), allowed, captured, vips)

    async def resync(self) -> None:
        """The next sync writes the whole table again (and the capture routing is checked):
        what was changed behind this process's back is put right, as kube-proxy's full syncs."""
        if not self.enabled:
            return
        self._current = None
        if self.capturing:
            try:
                await capture.set_up()
            except capture.CaptureError as exc:
                raise FirewallError(f"policy routing for externalIP ports: {exc}") from exc

    async def stop(self, *, release: bool = True) -> None:
        """Remove the table; ``release=False`` (handover) leaves it to the successor."""
        if not self.enabled:
            return
        self.enabled = False
        capturing, self.capturing = self.capturing, False
        self._current = None
        if not release:
            return
        # Even when this run never wrote it: the table may be a killed predecessor's, adopted.
        # "add" first makes the delete succeed when there is none (nft 1.0.6 has no "destroy").
        try:
            await self._run(f"add table {TABLE}\ndelete table {TABLE}\n")
        except FirewallError as exc:
            log.warning("removing nftables table %s: %s", TABLE, exc)
        if capturing:
            await capture.tear_down()

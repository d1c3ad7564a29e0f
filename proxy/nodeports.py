"""Which node addresses NodePorts listen on: kube-proxy's --nodeport-addresses
(pkg/proxy/util/nodeport_addresses.go NewNodePortAddresses).

Pure. Tokens are CIDRs or the KEP-6032 keywords ``primary`` (the Node object's
primary IP per family), ``localhost`` (the loopback CIDRs) and ``all`` (every local
address but loopback); keywords and CIDRs may be combined.

Loopback addresses carry NodePorts only when the list names them (``localhost``, or a
CIDR such as ``127.0.0.0/8``): kube-proxy's nftables mode never serves them, and
KEP-6032's localhost proxy starts only for an explicit loopback entry (``all`` and the
match-all a family falls back to do not count).

A family whose entries match no local address gets nothing: no NodePorts and no
health-check node ports (pkg/proxy/healthcheck/service_health.go listens on the same
addresses); :class:`NodePortSelection` keeps that apart from a family matching all, whose
health-check ports take the wildcard.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Iterable, Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

KEYWORDS = ("primary", "localhost", "all")
_LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
_MATCH_ALL = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))
_LINK_LOCAL_V6 = ipaddress.ip_network("fe80::/10")


@dataclass(frozen=True, slots=True)
class NodePortSpec:
    keywords: frozenset[str]
    cidrs: tuple[Network, ...]


def parse_nodeport_addresses(value: str | Sequence[str]) -> NodePortSpec:
    """Parse the flag value (``"primary"``, ``"all"``, ``"10.0.0.0/8,localhost"`` or a list of tokens)."""
    tokens = value.split(",") if isinstance(value, str) else list(value)
    tokens = [t.strip() for t in tokens]
    if not tokens or any(not t for t in tokens):
        raise ValueError(f"empty entry in {','.join(tokens)!r}")
    keywords = set()
    cidrs: list[Network] = []
    for token in tokens:
        if token in KEYWORDS:
            keywords.add(token)
            continue
        try:
            cidrs.append(ipaddress.ip_network(token, strict=False))
        except ValueError:
            raise ValueError(
                f"{token!r} is neither a CIDR nor one of {', '.join(KEYWORDS)}"
            ) from None
    return NodePortSpec(frozenset(keywords), tuple(cidrs))


def _is_match_all(network: Network) -> bool:
    return network.prefixlen == 0


def nodeport_networks(spec: NodePortSpec, primary_ips: Iterable[str]) -> tuple[Network, ...]:
    """The CIDRs a node address must fall in to carry NodePorts.

    Only CIDRs, or ``primary`` alone (kube-proxy's own forms): a family without any CIDR
    matches every address of that family (NewNodePortAddresses: that family gets 0.0.0.0/0
    or ::/0), so ``primary`` on a node with an IPv4 InternalIP only, or with no Node object,
    serves the other family, or both, on every non-loopback address, as kube-proxy does. Combined
    tokens (KEP-6032), families are exactly what the tokens name.
    """
    networks = list(spec.cidrs)
    if "all" in spec.keywords:
        networks.extend(_MATCH_ALL)
    if "localhost" in spec.keywords:
        networks.extend(_LOOPBACK)
    if "primary" in spec.keywords:
        for address in primary_ips:
            ip = ipaddress.ip_address(address)
            if not ip.is_loopback:
                networks.append(ipaddress.ip_network(ip))
    if not spec.keywords or (spec.keywords == {"primary"} and not spec.cidrs):
        families = {n.version for n in networks}
        networks.extend(n for n in _MATCH_ALL if n.version not in families)
    return tuple(networks)


#: What a health-check node port binds for a match-all family (service_health.go: ``0.0.0.0:<port>``).
WILDCARDS = {4: "0.0.0.0", 6: "::"}


@dataclass(frozen=True, slots=True)
class NodePortSelection:
    """What --nodeport-addresses selects on this node, per family.

    A family can match *all* its addresses (a zero CIDR, or the fallback of a family the
    list does not name) or only named CIDRs; when those match no local address, the
    family gets no NodePorts and no health-check node ports (as kube-proxy): an
    empty ``addresses`` is never "everything".
    """

    #: local addresses NodePorts bind to, sorted (IPv4 first).
    addresses: tuple[str, ...]
    #: families (4, 6) matching every address: kube-proxy's MatchAll.
    match_all: frozenset[int] = frozenset()
    #: (family, its CIDRs) for each family that is not match-all and matched no local address.
    unmatched: tuple[tuple[int, tuple[Network, ...]], ...] = ()

    @property
    def health_check_addresses(self) -> tuple[str, ...]:
        """Where health-check node ports listen (service_health.go): the family's wildcard when it
        matches all (and has an address here), else its matched addresses; none for no match."""
        hosts = []
        for family in (4, 6):
            matched = [a for a in self.addresses if (":" in a) == (family == 6)]
            if matched and family in self.match_all:
                hosts.append(WILDCARDS[family])
            else:
                hosts.extend(matched)
        return tuple(hosts)

    def problems(self, tokens: str | Sequence[str]) -> list[str]:
        """One line per family whose CIDRs match no local address (kube-proxy logs an error)."""
        flag = tokens if isinstance(tokens, str) else ",".join(tokens)
        return [
            f"nodePortAddresses {flag!r}: no local IPv{family} address in {', '.join(map(str, cidrs))}: "
            f"no NodePorts and no health-check node ports on IPv{family}"
            for family, cidrs in self.unmatched
        ]


def select_nodeport_addresses(
    spec: NodePortSpec | str | Sequence[str],
    primary_ips: Iterable[str],
    interface_addresses: Iterable[str],
    exclude: Iterable[str] = (),
) -> tuple[str, ...]:
    """The local addresses NodePorts bind to, sorted (IPv4 first): :func:`nodeport_selection`'s."""
    return nodeport_selection(spec, primary_ips, interface_addresses, exclude).addresses


def nodeport_selection(
    spec: NodePortSpec | str | Sequence[str],
    primary_ips: Iterable[str],
    interface_addresses: Iterable[str],
    exclude: Iterable[str] = (),
) -> NodePortSelection:
    """The local addresses NodePorts bind to, and which families match all or nothing.

    ``interface_addresses`` are the node's addresses as listed from its links (an
    address must exist locally to be bound, like kube-proxy's interface scan);
    ``exclude`` are addresses kubeport added itself (VIPs are not node addresses).
    IPv6 link-local addresses are skipped: binding them needs a scope.
    """
    if not isinstance(spec, NodePortSpec):
        spec = parse_nodeport_addresses(spec)
    networks = nodeport_networks(spec, primary_ips)
    excluded = {str(ipaddress.ip_address(a)) for a in exclude}
    chosen: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    present: set[int] = set()
    for address in interface_addresses:
        ip = ipaddress.ip_address(address)
        present.add(ip.version)
        if str(ip) in excluded or ip in _LINK_LOCAL_V6:
            continue
        if any(ip.version == n.version and ip in n and not (ip.is_loopback and _is_match_all(n))
               for n in networks):
            chosen.add(ip)
    match_all = frozenset(n.version for n in networks if _is_match_all(n))
    matched = {ip.version for ip in chosen}
    unmatched = tuple(
        (family, tuple(n for n in networks if n.version == family))
        for family in (4, 6)
        # A family the node has no address of at all (IPv6 disabled) is not served: not an error.
        if family in present and family not in match_all and family not in matched
        and any(n.version == family for n in networks)
    )
    return NodePortSelection(
        tuple(str(ip) for ip in sorted(chosen, key=lambda ip: (ip.version, ip))), match_all, unmatched
    )

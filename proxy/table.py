"""The forwarding table: snapshot + node identity -> desired frontends. Pure.

A frontend is one (address, port, protocol) the node answers on. Its rule says
which service port it belongs to and what clients get, following kube-proxy's
per-frontend use of the endpoint sets (pkg/proxy/iptables/proxier.go syncProxyRules, and
the nftables proxier's fixtures in pkg/proxy/nftables/proxier_test.go):

* REFUSE: no usable endpoint anywhere -> no listener, the kernel refuses.
* DROP: a Local traffic policy and no local endpoint -> clients time out
  (nftables); for external frontends with eTP=Local, pod and host clients are
  still short-circuited to the cluster set (``local_client_endpoints``).
* FORWARD: ``endpoints`` for ordinary clients, ``local_client_endpoints`` (when
  not None) for clients from the pod CIDRs or the node itself.

Like kube-proxy, each IP family is its own proxier: a frontend only uses
endpoints of its own family, and a service is served only in the families of
its clusterIPs.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterable, Mapping

from kubeport.endpoints.topology import EndpointSets, categorize_endpoints
from kubeport.endpoints.types import (
    PortEndpoint,
    PortSpec,
    ServiceInfo,
    ServiceName,
    ServicePortName,
    ServiceState,
    Snapshot,
)


class Action(enum.Enum):
    FORWARD = "forward"
    DROP = "drop"
    REFUSE = "refuse"


class FrontendKind(enum.Enum):
    CLUSTER_IP = "ClusterIP"
    EXTERNAL_IP = "ExternalIP"
    LOAD_BALANCER = "LoadBalancer"
    NODE_PORT = "NodePort"


@dataclass(frozen=True, slots=True, order=True)
class Frontend:
    ip: str
    port: int
    protocol: str  # TCP | UDP | SCTP

    @property
    def family(self) -> int:
        return 6 if ":" in self.ip else 4

    def __str__(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"{host}:{self.port}/{self.protocol}"


@dataclass(frozen=True, slots=True)
class FrontendRule:
    port_name: ServicePortName
    kind: FrontendKind
    action: Action
    #: endpoints for ordinary clients (empty unless FORWARD). Built as PortEndpoints; the
    #: Proxier binds them to its per-endpoint states (same ``ip``, ``port``, ``key``).
    endpoints: tuple[PortEndpoint, ...] = ()
    #: eTP=Local short-circuit: clients from the pod CIDRs or this node use these. None: no split.
    local_client_endpoints: tuple[PortEndpoint, ...] | None = None
    #: ClientIP session affinity timeout in seconds, 0: none.
    affinity_timeout: int = 0
    #: LB VIP frontends with loadBalancerSourceRanges: the only sources let in (normalised CIDRs);
    #: None: every source (kube-proxy applies them to VIP-mode LB IPs only: proxier.go syncProxyRules).
    source_ranges: tuple[str, ...] | None = None
    #: TCP frontends of a service annotated kubeport.io/proxy-protocol: "v2": each relayed
    #: connection opens with a PROXY protocol v2 header (proxyprotocol.py)
    proxy_protocol: bool = False

    @property
    def needs_listener(self) -> bool:
        return self.action is Action.FORWARD or (
            self.action is Action.DROP and bool(self.local_client_endpoints)
        )

    @property
    def drops_only_external(self) -> bool:
        """DROP applies to clients outside the pod CIDRs and the node (eTP=Local)."""
        return self.action is Action.DROP and self.local_client_endpoints is not None


@dataclass(frozen=True, slots=True)
class TableContext:
    node_name: str
    zone: str | None = None
    #: addresses NodePorts listen on (see nodeports.select_nodeport_addresses).
    nodeport_addresses: tuple[str, ...] = ()
    #: frontends owned by someone else (the DNS server's address:53): never proxied.
    reserved: frozenset[Frontend] = frozenset()
    #: the node's primary IPs (kube-proxy's nodeIP per family), for loadBalancerSourceRanges.
    node_ips: tuple[str, ...] = ()


def _family(address: str) -> int:
    return 6 if ":" in address else 4


def _of_family(addresses: Iterable[str], family: int) -> tuple[str, ...]:
    return tuple(a for a in addresses if _family(a) == family)


def allowed_sources(
    ranges: Iterable[str], family: int, lb_ips: Iterable[str], node_ips: Iterable[str]
) -> tuple[str, ...] | None:
    """The sources an LB VIP of ``family`` lets in; None: no restriction (kube-proxy's proxier.go).

    Only ranges of the frontend's family count (each family is its own proxier); with none,
    the VIP is open. When a range holds the node's own IP, the LB VIPs themselves are
    allowed too: the node reaching its own VIP arrives with the VIP as source
    (kube-proxy's ``allowFromNode``). Overlaps are merged (an nftables interval set needs that).
    """
    networks = []
    for text in ranges:
        try:
            network = ipaddress.ip_network(text.strip(), strict=False)
        except ValueError:
            continue  # the API validation rejects it before it gets here
        if network.version == family:
            networks.append(network)
    if not networks:
        return None
    node = [ipaddress.ip_address(ip) for ip in node_ips if _family(ip) == family]
    if any(ip in network for ip in node for network in networks):
        networks += [ipaddress.ip_network(ip) for ip in lb_ips]
    return tuple(str(n) for n in ipaddress.collapse_addresses(networks))


def _rule(
    port_name: ServicePortName,
    kind: FrontendKind,
    sets: EndpointSets,
    *,
    local_policy: bool,
    short_circuit: bool,
    affinity: int,
    proxy_protocol: bool = False,
) -> FrontendRule:
    """One frontend's behaviour from the endpoint sets (REJECT, DROP or forward, as syncProxyRules)."""
    if not sets.has_any:
        return FrontendRule(port_name, kind, Action.REFUSE, affinity_timeout=affinity, proxy_protocol=proxy_protocol)
    chosen = sets.local if local_policy else sets.cluster
    local_clients = (sets.cluster or ()) if short_circuit else None
    if not chosen:
        return FrontendRule(port_name, kind, Action.DROP, (), local_clients, affinity, proxy_protocol=proxy_protocol)
    return FrontendRule(port_name, kind, Action.FORWARD, chosen, local_clients, affinity,
                        proxy_protocol=proxy_protocol)


def _endpoint_sets(
    info: ServiceInfo,
    port: PortSpec,
    endpoints: tuple[PortEndpoint, ...],
    family: int,
    ctx: TableContext,
    assume_external: bool = False,
) -> tuple[EndpointSets, bool]:
    """The port's endpoint sets in one family's proxier, and whether eTP=Local applies to it."""
    externally_accessible = assume_external or bool(
        port.node_port
        or _of_family(info.external_ips, family)
        or _of_family(info.load_balancer_ips, family)
    )
    external_local = info.external_policy_local and externally_accessible
    sets = categorize_endpoints(
        tuple(e for e in endpoints if _family(e.ip) == family),
        node_name=ctx.node_name,
        zone=ctx.zone,
        internal_local=info.internal_policy_local,
        external_local=external_local,
        externally_accessible=externally_accessible,
    )
    return sets, external_local


def _port_rules(
    info: ServiceInfo,
    port: PortSpec,
    endpoints: tuple[PortEndpoint, ...],
    family: int,
    ctx: TableContext,
) -> dict[Frontend, FrontendRule]:
    port_name = info.port_name(port)
    external_ips = _of_family(info.external_ips, family)
    lb_ips = _of_family(info.load_balancer_ips, family)
    node_ips = _of_family(ctx.nodeport_addresses, family) if port.node_port else ()
    sets, external_local = _endpoint_sets(info, port, endpoints, family, ctx)
    affinity = info.affinity_timeout
    # the header is a TCP stream's first bytes; a datagram (UDP) or SCTP port has no such place
    proxy_protocol = info.proxy_protocol and port.protocol == "TCP"
    internal = _rule(
        port_name, FrontendKind.CLUSTER_IP, sets,
        local_policy=info.internal_policy_local, short_circuit=False, affinity=affinity,
        proxy_protocol=proxy_protocol,
    )
    rules: dict[Frontend, FrontendRule] = {}
    for ip in _of_family(info.cluster_ips, family):
        rules.setdefault(Frontend(ip, port.port, port.protocol), internal)
    external_sources = (
        (FrontendKind.EXTERNAL_IP, external_ips, port.port),
        (FrontendKind.LOAD_BALANCER, lb_ips, port.port),
        (FrontendKind.NODE_PORT, node_ips, port.node_port),
    )
    for kind, ips, number in external_sources:
        if not ips:
            continue
        rule = _rule(
            port_name, kind, sets,
            local_policy=external_local, short_circuit=external_local, affinity=affinity,
            proxy_protocol=proxy_protocol,
        )
        # Without endpoints kube-proxy builds no source-range firewall (usesFWChain needs
        # hasEndpoints): every client is refused rather than outsiders timing out.
        if (kind is FrontendKind.LOAD_BALANCER and info.load_balancer_source_ranges
                and rule.action is not Action.REFUSE):
            sources = allowed_sources(info.load_balancer_source_ranges, family, lb_ips, ctx.node_ips)
            if sources is not None:
                rule = dataclasses.replace(rule, source_ranges=sources)
        for ip in ips:
            rules.setdefault(Frontend(ip, number, port.protocol), rule)
    return rules


def _served_families(info: ServiceInfo) -> list[int]:
    return sorted({_family(ip) for ip in info.cluster_ips})


def service_rules(state: ServiceState | None, ctx: TableContext) -> dict[Frontend, FrontendRule]:
    """Every frontend of one service (empty when it is not proxied or gone)."""
    if state is None or not state.service.proxied:
        return {}
    info = state.service
    families = _served_families(info)
    rules: dict[Frontend, FrontendRule] = {}
    for port in info.ports:
        endpoints = state.endpoints_for_port(port)
        for family in families:
            for frontend, rule in _port_rules(info, port, endpoints, family, ctx).items():
                if frontend not in ctx.reserved:
                    rules.setdefault(frontend, rule)
    return rules


def local_policy_drops(state: ServiceState | None, ctx: TableContext) -> dict[int, tuple[int, int]]:
    """{family (4, 6): (internal, external)}: the service's ports DROPping for want of a local
    endpoint, for the families where any does (kube-proxy labels the count ``ip_family``).

    What kube-proxy's sync_proxy_rules_no_local_endpoints_total counts
    (pkg/proxy/metrics/metrics.go SyncProxyRulesNoLocalEndpointsTotal): one per service
    port and proxier family where it installs the "has no local endpoints"
    DROP, i.e. the port has endpoints but its Local-policy set, terminating fallback
    included, is empty. Per port, not per frontend: an eTP=Local port counts once however
    many NodePort, externalIP and LB addresses it has, even on a node without any, and
    even with none at all yet (a LoadBalancer without node ports waiting for its ingress
    IP): kube-proxy decides eTP=Local for the whole Service (ExternalPolicyLocal).
    """
    if state is None or not state.service.proxied:
        return {}
    info = state.service
    if not (info.internal_policy_local or info.external_policy_local):
        return {}  # most services: no endpoint sets to build
    drops: dict[int, tuple[int, int]] = {}
    for port in info.ports:
        endpoints = state.endpoints_for_port(port)
        for family in _served_families(info):
            sets, _ = _endpoint_sets(info, port, endpoints, family, ctx, assume_external=info.external_policy_local)
            if not sets.has_any or sets.local:
                continue  # REJECT (no endpoint at all), or served
            internal, external = drops.get(family, (0, 0))
            drops[family] = (internal + info.internal_policy_local, external + info.external_policy_local)
    return drops


def build_table(snapshot: Snapshot, ctx: TableContext) -> dict[Frontend, FrontendRule]:
    """The whole table at once (tests, full resyncs); conflicts resolved like ForwardingTable."""
    table = ForwardingTable()
    for name in sorted(snapshot.services):
        table.update(name, service_rules(snapshot.services[name], ctx))
    return dict(table.rules)


@dataclass(frozen=True, slots=True)
class RuleChange:
    frontend: Frontend
    old: FrontendRule | None
    new: FrontendRule | None


@dataclass(frozen=True, slots=True)
class Conflict:
    frontend: Frontend
    winner: ServiceName
    loser: ServiceName

    def __str__(self) -> str:
        return f"{self.frontend} is claimed by {self.winner} and {self.loser}; {self.winner} keeps it"


class ForwardingTable:
    """The desired table, updated one service at a time.

    Two services may claim the same frontend (an externalIP another service
    also uses): the smallest ServiceName wins, deterministically, and takes
    over when the holder lets go. Claims are indexed so that an update costs
    what it changes, and ``conflicts`` what is contested, never the whole table.
    """

    __slots__ = ("rules", "_holder", "_contested", "_by_service")

    def __init__(self) -> None:
        self.rules: dict[Frontend, FrontendRule] = {}
        #: the service whose rule each frontend carries.
        self._holder: dict[Frontend, ServiceName] = {}
        #: every claimant, only for frontends two or more services claim (rare: kept apart).
        self._contested: dict[Frontend, set[ServiceName]] = {}
        self._by_service: dict[ServiceName, dict[Frontend, FrontendRule]] = {}

    def services(self) -> frozenset[ServiceName]:
        return frozenset(self._by_service)

    def service(self, name: ServiceName) -> Mapping[Frontend, FrontendRule]:
        return self._by_service.get(name, _NO_RULES)

    def update(self, name: ServiceName, rules: Mapping[Frontend, FrontendRule]) -> list[RuleChange]:
        """Replace one service's frontends; the effective changes, by frontend."""
        by_service = self._by_service
        old = by_service.pop(name, _NO_RULES)
        if rules:
            by_service[name] = dict(rules)
        changes = []
        for frontend in [f for f in old if f not in rules or old[f] != rules[f]] + [f for f in rules if f not in old]:
            before = self.rules.get(frontend)
            winner = self._reclaim(frontend, name, frontend in rules)
            after = by_service[winner][frontend] if winner is not None else None
            if after is None:
                self.rules.pop(frontend, None)
            else:
                self.rules[frontend] = after
            if before != after:
                changes.append(RuleChange(frontend, before, after))
        return changes

    def _reclaim(self, frontend: Frontend, name: ServiceName, claims: bool) -> ServiceName | None:
        """Record whether ``name`` claims ``frontend``; the claimant that wins it now, if any."""
        contenders = self._contested.get(frontend)
        holder = self._holder.get(frontend)
        if contenders is None:
            if holder is None or holder == name:  # uncontested: the common case, no set built
                winner = name if claims else None
                if winner is None:
                    self._holder.pop(frontend, None)
                else:
                    self._holder[frontend] = winner
                return winner
            if not claims:
                return holder
            contenders = self._contested[frontend] = {holder}
        if claims:
            contenders.add(name)
        else:
            contenders.discard(name)
        winner = min(contenders)
        self._holder[frontend] = winner
        if len(contenders) < 2:
            del self._contested[frontend]
        return winner

    def conflicts(self) -> list[Conflict]:
        found = []
        for frontend in sorted(self._contested):
            claimants = sorted(self._contested[frontend])
            found.extend(Conflict(frontend, claimants[0], loser) for loser in claimants[1:])
        return found


_NO_RULES: Mapping[Frontend, FrontendRule] = MappingProxyType({})

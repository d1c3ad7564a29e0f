"""Which endpoints a service port may use on this node: kube-proxy's CategorizeEndpoints.

Restated from ``pkg/proxy/topology.go`` (CategorizeEndpoints, topologyModeFromHints; the
terminating fallback of KEP-1669). Pure: the inputs are
the port's endpoints (as :func:`~kubeport.endpoints.types.endpoints_for_port` builds
them, sorted by ``IP:port``), the service's traffic policies and this node's identity.
Feature choices come in as arguments, never from globals.

``None`` in :class:`EndpointSets` means "this port never uses this kind of set";
``()`` means "it does, but nothing is usable" (kube-proxy returns nil for the local
set in that case; its callers treat nil and empty alike, and so may ours).
"""

from __future__ import annotations

from dataclasses import dataclass

from kubeport.endpoints.types import EndpointInfo, PortEndpoint

#: Topology modes (the values kube-proxy uses internally; "" is "no topology").
NO_TOPOLOGY = ""
PREFER_SAME_ZONE = "PreferSameZone"
PREFER_SAME_NODE = "PreferSameNode"


@dataclass(frozen=True, slots=True)
class EndpointSets:
    #: endpoints for cluster-wide traffic; None when the port never uses the cluster set.
    cluster: tuple[PortEndpoint, ...] | None
    #: endpoints on this node for Local policies; None when the port never uses the local
    #: set, () when it does but nothing local is usable (treat both as "nothing local").
    local: tuple[PortEndpoint, ...] | None
    #: union of the two (what per-endpoint state such as affinity is kept for).
    all_reachable: tuple[PortEndpoint, ...]
    #: some endpoint anywhere is usable: False means "refuse" (kube-proxy's REJECT).
    has_any: bool


def uses_cluster_endpoints(*, internal_local: bool, externally_accessible: bool) -> bool:
    """serviceport.go UsesClusterEndpoints: eTP=Local still needs the cluster set (its short-circuit)."""
    return not internal_local or externally_accessible


def uses_local_endpoints(*, internal_local: bool, external_local: bool, externally_accessible: bool) -> bool:
    """serviceport.go UsesLocalEndpoints: eTP only counts on an externally accessible port."""
    return internal_local or (external_local and externally_accessible)


def categorize_endpoints(
    endpoints: tuple[PortEndpoint, ...],
    *,
    node_name: str,
    zone: str | None,
    internal_local: bool,
    external_local: bool,
    externally_accessible: bool,
    prefer_same_node: bool = True,
) -> EndpointSets:
    """kube-proxy's CategorizeEndpoints (pkg/proxy/topology.go).

    :param node_name: this node ("" never matches an endpoint's nodeName).
    :param zone: this node's ``topology.kubernetes.io/zone``; None or "" = no zone.
    :param internal_local: ``internalTrafficPolicy: Local``.
    :param external_local: ``externalTrafficPolicy: Local``.
    :param externally_accessible: the port's per-port rule (nodePort, VIP-mode LB IP or
        externalIP), :meth:`ServiceInfo.externally_accessible`.
    :param prefer_same_node: the ``PreferSameTrafficDistribution`` gate (GA in 1.35):
        honour ``forNodes`` hints.
    """
    uses_cluster = uses_cluster_endpoints(
        internal_local=internal_local, externally_accessible=externally_accessible
    )
    uses_local = uses_local_endpoints(
        internal_local=internal_local,
        external_local=external_local,
        externally_accessible=externally_accessible,
    )
    if not endpoints:
        return EndpointSets(
            cluster=() if uses_cluster else None,
            local=() if uses_local else None,
            all_reachable=(),
            has_any=False,
        )
    zone = zone or ""

    mode = NO_TOPOLOGY
    cluster: tuple[PortEndpoint, ...] | None = None
    has_any = False
    if uses_cluster:
        mode = topology_mode_from_hints(endpoints, node_name, zone, prefer_same_node=prefer_same_node)
        cluster = tuple(
            e for e in endpoints if e.endpoint.ready and _available_for_topology(e.endpoint, mode, node_name, zone)
        )
        if not cluster:
            # A mode is only chosen when some ready endpoint matches it, so an empty set here
            # means nothing is ready anywhere: fall back to serving-terminating (KEP-1669),
            # ignoring topology.
            cluster = tuple(e for e in endpoints if e.endpoint.serving and e.endpoint.terminating)
        has_any = bool(cluster)

    if not uses_local:
        return EndpointSets(cluster=cluster, local=None, all_reachable=cluster or (), has_any=has_any)

    local_ready: list[PortEndpoint] = []
    local_terminating: list[PortEndpoint] = []
    for candidate in endpoints:
        info = candidate.endpoint
        if info.ready:
            has_any = True
            if _is_local(info, node_name):
                local_ready.append(candidate)
        elif info.serving and info.terminating:
            has_any = True
            if _is_local(info, node_name):
                local_terminating.append(candidate)
    # The local set falls back to local serving-terminating endpoints on its own, whatever
    # the cluster set did; topology hints never apply to it.
    local = tuple(local_ready or local_terminating)

    if cluster is None:
        return EndpointSets(cluster=None, local=local, all_reachable=local, has_any=has_any)
    if mode == NO_TOPOLOGY and not (local_terminating and not local_ready):
        # cluster holds every ready endpoint, local only ready ones: cluster is the union.
        return EndpointSets(cluster=cluster, local=local, all_reachable=cluster, has_any=has_any)
    return EndpointSets(cluster=cluster, local=local, all_reachable=_union(endpoints, cluster, local), has_any=has_any)


def topology_mode_from_hints(
    endpoints: tuple[PortEndpoint, ...], node_name: str, zone: str, *, prefer_same_node: bool = True
) -> str:
    """kube-proxy's topologyModeFromHints (pkg/proxy/topology.go), decided over READY endpoints only.

    PreferSameNode when every ready endpoint has node hints and one names this node (and
    the gate is on); else PreferSameZone when every ready endpoint has zone hints and one
    names this zone; else no topology. The proxy never reads trafficDistribution or the
    topology annotation itself (KEP-4444): hints are used whenever they are present.
    """
    has_ready = False
    all_node_hints = True
    for_node = False
    all_zone_hints = True
    for_zone = False
    for candidate in endpoints:
        info = candidate.endpoint
        if not info.ready:
            continue
        has_ready = True
        if not info.node_hints:
            all_node_hints = False
        elif node_name in info.node_hints:
            for_node = True
        if not info.zone_hints:
            all_zone_hints = False
        elif zone in info.zone_hints:
            for_zone = True
    if not has_ready:
        return NO_TOPOLOGY
    if prefer_same_node and all_node_hints and for_node:
        return PREFER_SAME_NODE
    if all_zone_hints and for_zone:
        return PREFER_SAME_ZONE
    return NO_TOPOLOGY


def _available_for_topology(info: EndpointInfo, mode: str, node_name: str, zone: str) -> bool:
    if mode == NO_TOPOLOGY:
        return True
    if mode == PREFER_SAME_NODE:
        return info.node_hints is not None and node_name in info.node_hints
    return info.zone_hints is not None and zone in info.zone_hints


def _is_local(info: EndpointInfo, node_name: str) -> bool:
    return bool(node_name) and info.node_name == node_name


def _union(
    endpoints: tuple[PortEndpoint, ...],
    cluster: tuple[PortEndpoint, ...],
    local: tuple[PortEndpoint, ...],
) -> tuple[PortEndpoint, ...]:
    """Cluster and local merged by IP:port, in the input's (sorted) order."""
    keys = {e.key for e in cluster}
    keys.update(e.key for e in local)
    return tuple(e for e in endpoints if e.key in keys)

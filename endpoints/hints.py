"""Manifest mode: what the EndpointSlice controller would have written, hints above all.

In manifest mode no cluster's EndpointSlice controller writes the slices, so
:func:`as_the_controller_writes` (a ``ClusterState(slice_transform=...)``) plays its part, for
the slices written by hand and those made from Pods
(:mod:`~kubeport.endpoints.controllers.endpointslice`) alike:

* ``publishNotReadyAddresses: true`` -> every endpoint is ``ready`` (the controller writes
  ``ready = publishNotReadyAddresses || (podReady && !terminating)``, podToEndpoint): DNS
  publishes them and the proxy uses them, as with a real controller, while both read
  nothing but ``ready`` (from an API server a slice the controller did not write keeps
  its own conditions, as CoreDNS and kube-proxy see it);
* hints for services that ask for them, as the EndpointSlice controller writes them
  (staging/src/k8s.io/endpointslice: utils.go hintsEnabled, trafficdist/trafficdist.go,
  topologycache/topologycache.go):

* ``service.kubernetes.io/topology-mode: Auto`` (or the deprecated
  ``topology-aware-hints``, which wins when present; exactly ``Auto``/``auto``) ->
  the proportional-CPU allocation of ``topologycache`` with all its safeguards. The
  annotation takes precedence over ``trafficDistribution`` (KEP-4444), also when it
  ends up disabling hints.
* else ``spec.trafficDistribution`` ``PreferClose``/``PreferSameZone`` -> every ready
  endpoint gets ``forZones: [its zone]``; ``PreferSameNode`` adds ``forNodes: [its node]``
  (``trafficdist``). Unknown values count as unset.
* else nothing is touched.

Hints already written in a slice are the user's (or a real controller's) and are kept
as they are: a slice in which any endpoint carries hints passes through untouched; only
slices without any hint are filled. Hints are computed per address family; FQDN slices
are never touched.

Differences from the controller, on purpose:

* "ready" is kube-proxy's reading (a missing condition counts as ready). The controller
  always writes the condition; hand-written manifests often omit it, and an endpoint the
  proxy uses but that carried no hint would switch hints off for the whole service.
* Where the controller depends on Go map iteration order (which zone gives or receives
  first on ties, which receiving zone an endpoint moves to) this module walks zones in
  sorted name order, so the result is a pure function of its inputs. Endpoints are
  re-hinted in slice-name order, then endpoint order.
* Hints present in kept slices are counted per zone for the Auto allocation (as the
  controller counts unchanged slices) but never re-validated or removed.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Iterable, Mapping

from kubeport.endpoints.types import EndpointInfo, NodeInfo, ServiceInfo, SliceInfo

PREFER_CLOSE = "PreferClose"
PREFER_SAME_ZONE = "PreferSameZone"
PREFER_SAME_NODE = "PreferSameNode"
#: trafficDistribution values the controller acts on (PreferSame* since 1.33, GA 1.35).
VALID_TRAFFIC_DISTRIBUTIONS = frozenset({PREFER_CLOSE, PREFER_SAME_ZONE, PREFER_SAME_NODE})

#: topologycache's overloadThreshold: no zone may get more than 20 % above its share.
OVERLOAD_THRESHOLD = 0.2

# The controller's TopologyAwareHintsDisabled event messages (topologycache/event.go).
NO_ZONE_SPECIFIED = "One or more endpoints do not have a zone specified"
NO_ALLOCATED_HINTS_FOR_ZONES = "No hints allocated for zones"
INSUFFICIENT_NODE_INFO = (
    "Insufficient Node information: allocatable CPU or zone not specified on one or more nodes"
)
NODES_READY_IN_ONE_ZONE_ONLY = "Nodes only ready in one zone"
INSUFFICIENT_NUMBER_OF_ENDPOINTS = "Insufficient number of endpoints"
MIN_ALLOCATION_EXCEEDS_OVERLOAD_THRESHOLD = (
    "Unable to allocate minimum required endpoints to each zone without exceeding overload threshold"
)


class HintsDisabled(Exception):
    """The Auto heuristic refuses to hint; the message is the controller's event text."""


@dataclass(frozen=True, slots=True)
class Allocation:
    """How many endpoints one zone should get (topologycache ``allocation``)."""

    minimum: int
    maximum: int
    desired: float


@dataclass(frozen=True, slots=True)
class AutoHints:
    slices: tuple[SliceInfo, ...]
    #: one "<event message>, addressType: <family>" per family whose hints were disabled.
    disabled: tuple[str, ...] = ()


def hints_enabled(topology_mode: str | None) -> bool:
    """The controller's hintsEnabled: exactly ``Auto`` or ``auto``."""
    return topology_mode in ("Auto", "auto")


def as_the_controller_writes(
    service: ServiceInfo, slices: tuple[SliceInfo, ...], nodes: Mapping[str, NodeInfo]
) -> tuple[SliceInfo, ...]:
    """The manifest-mode SliceTransform: readiness as published, then hints (of ready endpoints)."""
    return fill_hints(service, published_ready(service, slices), nodes)


def published_ready(service: ServiceInfo, slices: tuple[SliceInfo, ...]) -> tuple[SliceInfo, ...]:
    """Every endpoint ready when the service publishes not-ready addresses; else untouched."""
    if not service.publish_not_ready_addresses:
        return slices
    return tuple(
        slice_ if all(e.ready for e in slice_.endpoints) else replace(
            slice_, endpoints=tuple(e if e.ready else replace(e, ready=True) for e in slice_.endpoints))
        for slice_ in slices
    )


def fill_hints(
    service: ServiceInfo, slices: tuple[SliceInfo, ...], nodes: Mapping[str, NodeInfo]
) -> tuple[SliceInfo, ...]:
    """Hints, for services that ask for them (see module docstring)."""
    if hints_enabled(service.topology_mode):
        return auto_hints(slices, nodes.values()).slices
    if service.traffic_distribution in VALID_TRAFFIC_DISTRIBUTIONS:
        return traffic_distribution_hints(service.traffic_distribution, slices)
    return slices


# --- trafficDistribution (trafficdist.go) --------------------------------------------------


def traffic_distribution_hints(value: str, slices: tuple[SliceInfo, ...]) -> tuple[SliceInfo, ...]:
    """Own-zone (and for PreferSameNode own-node) hints on every ready endpoint (trafficdist.go)."""
    same_node = value == PREFER_SAME_NODE
    filled = tuple(
        slice_ if not _fillable(slice_) else _with_endpoints(slice_, _same_place_hints(slice_.endpoints, same_node))
        for slice_ in slices
    )
    return slices if filled == slices else filled


def _same_place_hints(endpoints: tuple[EndpointInfo, ...], same_node: bool) -> tuple[EndpointInfo, ...]:
    out = []
    for endpoint in endpoints:
        if endpoint.ready:
            zone_hints = frozenset((endpoint.zone,)) if endpoint.zone else None
            node_hints = frozenset((endpoint.node_name,)) if same_node and endpoint.node_name else None
            endpoint = replace(endpoint, zone_hints=zone_hints, node_hints=node_hints)
        out.append(endpoint)
    return tuple(out)


# --- topology-mode: Auto (topologycache) -----------------------------------------------------


def zone_cpu_ratios(nodes: Iterable[NodeInfo]) -> dict[str, float] | None:
    """Each zone's share of allocatable CPU (TopologyCache.SetNodes); None = not enough info.

    Control-plane and not-Ready nodes are skipped. Any remaining node without a zone or
    CPU makes the whole table unusable, as does a total of zero or fewer than two zones.
    """
    cpu_by_zone: Counter[str] = Counter()
    total = 0
    for node in nodes:
        if node.control_plane or not node.ready:
            continue
        if not node.zone or node.allocatable_cpu_millis <= 0:
            return None
        cpu_by_zone[node.zone] += node.allocatable_cpu_millis
        total += node.allocatable_cpu_millis
    if total == 0 or len(cpu_by_zone) < 2:
        return None
    return {zone: cpu / total for zone, cpu in cpu_by_zone.items()}


def allocations(ratios: Mapping[str, float] | None, ready_endpoints: int) -> dict[str, Allocation]:
    """Minimum/maximum/desired endpoints per zone (getAllocations); raises HintsDisabled."""
    if ratios is None:
        raise HintsDisabled(INSUFFICIENT_NODE_INFO)
    if len(ratios) < 2:
        raise HintsDisabled(NODES_READY_IN_ONE_ZONE_ONLY)
    counts = f"({ready_endpoints} endpoints, {len(ratios)} zones)"
    if len(ratios) > ready_endpoints:
        raise HintsDisabled(f"{INSUFFICIENT_NUMBER_OF_ENDPOINTS} {counts}")
    minimums: dict[str, int] = {}
    desired: dict[str, float] = {}
    remaining = ready_endpoints
    for zone in sorted(ratios):
        share = ratios[zone] * float(ready_endpoints)
        # Same float expression as Go, so rounding at the ceiling matches bit for bit.
        minimum = math.ceil(share * (1 / (1 + OVERLOAD_THRESHOLD)))
        minimums[zone] = minimum
        desired[zone] = max(share, float(minimum))
        remaining -= minimum
        if remaining < 0:
            raise HintsDisabled(f"{MIN_ALLOCATION_EXCEEDS_OVERLOAD_THRESHOLD} {counts}")
    spare = remaining  # ready_endpoints - sum(minimums)
    return {zone: Allocation(minimums[zone], minimums[zone] + spare, desired[zone]) for zone in minimums}


def giving_and_receiving_zones(
    desired: Mapping[str, float], hinted: Mapping[str, int]
) -> tuple[dict[str, int], dict[str, int]]:
    """Whole endpoints each zone gives away / receives (getGivingAndReceivingZones).

    Repeatedly pair the zone with the largest surplus with the one with the largest
    deficit, until one side is empty, both are below 1, or either is below 0.5.
    """
    surplus: dict[str, float] = {}
    deficit: dict[str, float] = {}
    for zone in sorted(desired):
        have = float(hinted.get(zone, 0))
        if have > desired[zone]:
            surplus[zone] = have - desired[zone]
        elif have < desired[zone]:
            deficit[zone] = desired[zone] - have
    giving: Counter[str] = Counter()
    receiving: Counter[str] = Counter()
    while True:
        giver, to_give = _most(surplus)
        taker, to_take = _most(deficit)
        if giver is None or taker is None or (to_give < 1.0 and to_take < 1.0) or to_give < 0.5 or to_take < 0.5:
            break
        giving[giver] += 1
        surplus[giver] -= 1
        receiving[taker] += 1
        deficit[taker] -= 1
    return dict(giving), dict(receiving)


def _most(values: Mapping[str, float]) -> tuple[str | None, float]:
    """The largest strictly positive value; ties go to the first zone in sorted order."""
    best: str | None = None
    most = 0.0
    for zone in sorted(values):
        if values[zone] > most:
            best, most = zone, values[zone]
    return best, most


def auto_hints(slices: tuple[SliceInfo, ...], nodes: Iterable[NodeInfo]) -> AutoHints:
    """topology-mode Auto over a service's slices (topologycache.go TopologyCache.AddHints)."""
    ratios = zone_cpu_ratios(nodes)
    replaced: dict[str, SliceInfo] = {}
    disabled: list[str] = []
    for family in sorted({s.address_type for s in slices if s.address_type != "FQDN"}):
        family_slices = [s for s in slices if s.address_type == family]
        try:
            replaced.update(_auto_hints_for_family(family_slices, ratios))
        except HintsDisabled as why:
            disabled.append(f"{why}, addressType: {family}")
    if not replaced:
        return AutoHints(slices, tuple(disabled))
    filled = tuple(replaced.get(s.name, s) for s in slices)
    return AutoHints(slices if filled == slices else filled, tuple(disabled))


def _auto_hints_for_family(
    slices: list[SliceInfo], ratios: Mapping[str, float] | None
) -> dict[str, SliceInfo]:
    """New slices (by name) for the fillable slices of one address family."""
    fillable = [s for s in slices if _fillable(s)]
    if not fillable:
        return {}
    ready_total = sum(1 for s in slices for e in s.endpoints if e.ready)
    allocs = allocations(ratios, ready_total)
    hinted: Counter[str] = Counter()
    for slice_ in slices:
        if not _fillable(slice_):
            for endpoint in slice_.endpoints:
                if endpoint.ready and endpoint.zone_hints:
                    hinted.update(endpoint.zone_hints)

    # Step 1: every ready endpoint starts hinted for its own zone.
    assigned: dict[tuple[str, int], str] = {}
    for slice_ in fillable:
        for index, endpoint in enumerate(slice_.endpoints):
            if not endpoint.ready:
                continue
            if not endpoint.zone:
                raise HintsDisabled(NO_ZONE_SPECIFIED)
            assigned[(slice_.name, index)] = endpoint.zone
            hinted[endpoint.zone] += 1

    # Steps 2-3: move whole endpoints from zones over their share to zones under it.
    giving, receiving = giving_and_receiving_zones({z: a.desired for z, a in allocs.items()}, hinted)
    _redistribute(fillable, assigned, giving, receiving, hinted)
    if not hinted:  # no zone was ever counted (the controller checks the map's length)
        raise HintsDisabled(NO_ALLOCATED_HINTS_FOR_ZONES)
    return {s.name: _with_endpoints(s, _zone_hinted(s, assigned)) for s in fillable}


def _redistribute(
    fillable: list[SliceInfo],
    assigned: dict[tuple[str, int], str],
    giving: dict[str, int],
    receiving: dict[str, int],
    hinted: Counter[str],
) -> None:
    for slice_ in fillable:
        for index, endpoint in enumerate(slice_.endpoints):
            if not endpoint.ready or endpoint.zone is None:
                continue
            if not giving or not receiving:
                return
            if giving.get(endpoint.zone, 0) <= 0:
                continue
            taker = min(receiving)  # the controller picks by map order; we pick by name
            assigned[(slice_.name, index)] = taker
            _take_one(giving, endpoint.zone)
            _take_one(receiving, taker)
            hinted[taker] += 1
            hinted[endpoint.zone] -= 1


def _take_one(counts: dict[str, int], zone: str) -> None:
    if counts[zone] == 1:
        del counts[zone]
    else:
        counts[zone] -= 1


def _zone_hinted(slice_: SliceInfo, assigned: Mapping[tuple[str, int], str]) -> tuple[EndpointInfo, ...]:
    out = []
    for index, endpoint in enumerate(slice_.endpoints):
        zone = assigned.get((slice_.name, index))
        if zone is not None:
            endpoint = replace(endpoint, zone_hints=frozenset((zone,)), node_hints=None)
        out.append(endpoint)
    return tuple(out)


# --- helpers ------------------------------------------------------------------------------


def _fillable(slice_: SliceInfo) -> bool:
    """An IP slice nobody has hinted yet (hints already present are kept as they are)."""
    if slice_.address_type == "FQDN":
        return False
    return not any(e.zone_hints or e.node_hints for e in slice_.endpoints)


def _with_endpoints(slice_: SliceInfo, endpoints: tuple[EndpointInfo, ...]) -> SliceInfo:
    return slice_ if endpoints == slice_.endpoints else replace(slice_, endpoints=endpoints)

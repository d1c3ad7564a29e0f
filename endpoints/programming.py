"""Where a change's programming latency starts, read from two Snapshots.

The proxy (kube-proxy's network_programming_duration_seconds) and DNS (CoreDNS's
coredns_kubernetes_dns_programming_duration_seconds) both measure from the same moments:
one per EndpointSlice added or changed, from the EndpointSlice controller's
last-change-trigger-time annotation when it is later than ``not_before`` (what came before
the consumer started is not its to measure), else, for slices that carry none
(manifests), from when the change reached kubeport.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from kubeport.endpoints.types import ServiceName, SliceInfo, Snapshot


def programming_starts(old: Snapshot, new: Snapshot, not_before: float,
                       names: Iterable[ServiceName] | None = None) -> Iterator[tuple[ServiceName, float]]:
    """(service, when the change began) per EndpointSlice added or changed in ``names``
    (by default every service changed since ``old``). A removed service observes nothing,
    nor does a Service-only change: its slices' trigger times cover it."""
    for name, _, started in slice_programming_starts(old, new, not_before, names):
        yield name, started


def slice_programming_starts(old: Snapshot, new: Snapshot, not_before: float,
                             names: Iterable[ServiceName] | None = None
                             ) -> Iterator[tuple[ServiceName, SliceInfo, float]]:
    """:func:`programming_starts` with the slice each moment is read from: the proxy labels
    its observation with the slice's address family, as kube-proxy's per-family proxiers
    each observe the slices of their own family (``pkg/proxy/endpointslicecache.go``)."""
    for name in new.changed_since(old) if names is None else names:
        state = new.services.get(name)
        if state is None:
            continue
        before = old.services.get(name)
        held = {s.name: s for s in before.slices} if before is not None else {}
        for slice_ in state.slices:
            if held.get(slice_.name) == slice_:
                continue
            if slice_.trigger_time is not None:
                if slice_.trigger_time > not_before:
                    yield name, slice_, slice_.trigger_time
            elif new.changed_at is not None:
                yield name, slice_, new.changed_at

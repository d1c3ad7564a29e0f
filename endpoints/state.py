"""ClusterState: merges what the sources report into immutable, versioned snapshots.

Sources call ``upsert``/``delete``/``mark_synced`` (cheap: convert and record which
services are now dirty), then ``commit`` once per batch. ``commit`` rebuilds only the
dirty services, publishes a new :class:`Snapshot` if anything really changed, and wakes
the subscribers (proxy, DNS). A no-op update publishes nothing.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections import Counter
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

from kubeport.endpoints.interfaces import Entry, Journal, Saved
from kubeport.endpoints.types import NodeInfo, PodInfo, ServiceInfo, ServiceName, ServiceState, SliceInfo, Snapshot

if TYPE_CHECKING:
    from kubeport.endpoints import convert, model
else:
    convert = model = None  # imported by the first upsert (_import_models)

log = logging.getLogger(__name__)


def _import_models() -> None:
    """The API models and their conversion, at the first object a source gives: building the
    pydantic models is a noticeable part of a start, which a daemon serving its last applied
    state (restored without them) spends after its first answers."""
    global convert, model
    from kubeport.endpoints import convert, model

#: Rewrites a service's slices before publication (manifest mode fills topology hints
#: the way the EndpointSlice controller would). Must be pure.
SliceTransform = Callable[[ServiceInfo, tuple[SliceInfo, ...], Mapping[str, NodeInfo]], tuple[SliceInfo, ...]]

#: The slices a controller writes for a service from the Pods of its namespace (manifest
#: mode's EndpointSlice controller), () for a service it leaves alone. Must be pure.
PodSlices = Callable[[ServiceInfo, Iterable[PodInfo], Mapping[str, NodeInfo]], tuple[SliceInfo, ...]]

#: The kinds that must complete a first list before the state is "synced".
REQUIRED_KINDS = frozenset({"Service", "EndpointSlice"})


class ClusterState:
    def __init__(
        self,
        node_name: str,
        *,
        implicit_namespaces: bool = False,
        slice_transform: SliceTransform | None = None,
        pod_slices: PodSlices | None = None,
        required_kinds: Iterable[str] = REQUIRED_KINDS,
        clock: Callable[[], float] = time.time,
        service_cidrs: Iterable[str] = (),
    ) -> None:
        """
        :param node_name: this node (its Node object gives zone and addresses).
        :param implicit_namespaces: a namespace exists as soon as any object lives in it
            (manifest mode, where nobody writes Namespace objects).
        :param slice_transform: applied to every service's slices when building its state.
        :param pod_slices: the slices of services with a selector, from the Pods upserted;
            added to the slices upserted for the service, before ``slice_transform``.
        :param service_cidrs: ``--service-cluster-ip-range``, the default ServiceCIDR: the
            snapshots' ``service_cidrs`` are these and every ServiceCIDR object's.
        """
        self.node_name = node_name
        self._clock = clock
        #: when the oldest change not yet committed arrived (network programming latency).
        self._pending_since: float | None = None
        self._implicit_namespaces = implicit_namespaces
        self._slice_transform = slice_transform
        self._pod_slices = pod_slices
        self._required_kinds = frozenset(required_kinds)
        self._synced_kinds: set[str] = set()

        self._services: dict[ServiceName, ServiceInfo] = {}
        #: (namespace, slice name) -> (owning service, slim slice)
        self._slices: dict[tuple[str, str], tuple[ServiceName | None, SliceInfo]] = {}
        self._slices_by_service: dict[ServiceName, dict[str, SliceInfo]] = {}
        self._nodes: dict[str, NodeInfo] = {}
        self._pods: dict[tuple[str, str], PodInfo] = {}
        #: (namespace, label key, value) -> the Pods carrying it, by name
        self._pods_by_label: dict[tuple[str, str, str], dict[str, PodInfo]] = {}
        #: (namespace, label key, value) -> the services whose selector has that pair (kept for
        #: the EndpointSlice controller, ``pod_slices``, alone)
        self._selecting: dict[tuple[str, str, str], set[ServiceName]] = {}
        self._with_selector: set[ServiceName] = set()
        self._pods_dirty = False
        self._explicit_namespaces: set[str] = set()
        #: the labels of the Namespace objects that have any
        self._namespace_labels: dict[str, tuple[tuple[str, str], ...]] = {}
        self._namespace_refs: Counter[str] = Counter()

        self._states: dict[ServiceName, ServiceState] = {}
        self._dirty: set[ServiceName] = set()
        self._nodes_dirty = False
        self._namespaces_dirty = False
        self._flag_cidrs = tuple(str(ipaddress.ip_network(c)) for c in service_cidrs)
        #: ServiceCIDR name -> its spec.cidrs
        self._service_cidrs: dict[str, tuple[str, ...]] = {}

        self._snapshot = Snapshot(generation=0, service_cidrs=self._flag_cidrs)
        self._published = asyncio.Event()

        #: where each change is also recorded (the last applied state, kept for a restart)
        self._journal: Journal | None = None
        #: restored from a saved state and not yet confirmed by the source, per kind: what the
        #: kind's first sync has not mentioned is deleted then
        self._unconfirmed: dict[str, set[tuple[str, str]]] = {}
        self._restored_at: float | None = None

    # --- reading ----------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    async def wait_newer(self, generation: int) -> Snapshot:
        """The latest snapshot once its generation is greater than ``generation``."""
        while self._snapshot.generation <= generation:
            event = self._published
            await event.wait()
        return self._snapshot

    # --- writing (sources) --------------------------------------------------------

    def upsert(self, obj: model.KubeObject) -> None:
        if model is None:
            _import_models()
        self._note_arrival()
        value: Any
        # Cluster-scoped kinds are held under "" (keys(), the last applied state): the model
        # defaults metadata.namespace to "default", as kubectl does for a namespaced object.
        cluster_scoped = isinstance(obj, (model.Node, model.Namespace, model.ServiceCIDR))
        key = ("" if cluster_scoped else obj.metadata.namespace or "", obj.metadata.name)
        if isinstance(obj, model.Service):
            value = convert.service_info(obj)
            self._upsert_service(value)
        elif isinstance(obj, model.EndpointSlice):
            value = (obj.service_name, convert.slice_info(obj))
            self._upsert_slice(obj.metadata.namespace, *value)
        elif isinstance(obj, model.Node):
            value = convert.node_info(obj)
            self._upsert_node(value)
        elif isinstance(obj, model.Pod):
            value = convert.pod_info(obj)
            self._upsert_pod(value)
        elif isinstance(obj, model.PodAddresses):
            value = convert.pod_addresses(obj)
            self._upsert_pod(value)
        elif isinstance(obj, model.Namespace):
            value = tuple(sorted(obj.metadata.labels.items()))
            self._upsert_namespace(obj.metadata.name, value)
        elif isinstance(obj, model.ServiceCIDR):
            value = convert.service_cidrs(obj)
            self._service_cidrs[obj.metadata.name] = value
        else:  # pragma: no cover - the type union is closed
            raise TypeError(f"unsupported object {type(obj).__name__}")
        if self._unconfirmed:
            self._unconfirmed.get(obj.kind, set()).discard(key)
        if self._journal is not None:
            self._journal.record(obj.kind, key, value)

    def delete(self, kind: str, namespace: str, name: str) -> None:
        self._note_arrival()
        if self._unconfirmed:
            self._unconfirmed.get(kind, set()).discard((namespace, name))
        if self._journal is not None:
            self._journal.record(kind, (namespace, name), None)
        if kind == "Service":
            key = ServiceName(namespace, name)
            held_service = self._services.pop(key, None)
            if held_service is not None:
                self._unref_namespace(namespace)
                self._dirty.add(key)
                self._unselect(held_service)
        elif kind == "EndpointSlice":
            held = self._slices.pop((namespace, name), None)
            if held is not None:
                owner, _ = held
                self._unref_namespace(namespace)
                if owner is not None:
                    self._detach_slice(owner, name)
        elif kind == "Node":
            if self._nodes.pop(name, None) is not None:
                self._nodes_dirty = True
        elif kind == "Namespace":
            if name in self._explicit_namespaces:
                self._explicit_namespaces.discard(name)
                self._namespace_labels.pop(name, None)
                self._namespaces_dirty = True
        elif kind == "ServiceCIDR":
            self._service_cidrs.pop(name, None)
        elif kind == "Pod":
            held_pod = self._pods.pop((namespace, name), None)
            if held_pod is not None:
                self._unindex_pod(held_pod)
                self._unref_namespace(namespace)

    def keys(self, kind: str) -> set[tuple[str, str]]:
        """(namespace, name) of every held object of a kind ("" namespace if cluster-scoped)."""
        if kind == "Service":
            return {(k.namespace, k.name) for k in self._services}
        if kind == "EndpointSlice":
            return set(self._slices)
        if kind == "Node":
            return {("", n) for n in self._nodes}
        if kind == "Namespace":
            return {("", n) for n in self._explicit_namespaces}
        if kind == "Pod":
            return set(self._pods)
        if kind == "ServiceCIDR":
            return {("", n) for n in self._service_cidrs}
        raise ValueError(kind)

    def mark_synced(self, kind: str) -> None:
        # What was restored and the kind's first complete view did not mention is gone.
        for namespace, name in sorted(self._unconfirmed.pop(kind, ())):
            self.delete(kind, namespace, name)
        self._synced_kinds.add(kind)

    # --- the last applied state ---------------------------------------------------

    def keep_in(self, journal: Journal) -> None:
        """Record every change in ``journal`` from now on."""
        self._journal = journal
        journal.attach(self.entries)

    def entries(self) -> Iterator[Entry]:
        """Everything held now, as the last applied state keeps it: the maps are copied at the
        call (a consistent moment, at C speed), the entries made as they are read."""
        return self._entries_of(list(self._services.items()), list(self._slices.items()),
                                list(self._nodes.items()), list(self._pods.items()),
                                [(name, self._namespace_labels.get(name, ())) for name in self._explicit_namespaces],
                                list(self._service_cidrs.items()))

    @staticmethod
    def _entries_of(services, slices, nodes, pods, namespaces, service_cidrs=()) -> Iterator[Entry]:
        for name, info in services:
            yield "Service", (name.namespace, name.name), info
        for key, (owner, info) in slices:
            yield "EndpointSlice", key, (owner.name if owner is not None else None, info)
        for name, node in nodes:
            yield "Node", ("", name), node
        for key, pod in pods:
            yield "Pod", key, pod
        for name, labels in namespaces:
            yield "Namespace", ("", name), labels
        for name, cidrs in service_cidrs:
            yield "ServiceCIDR", ("", name), cidrs

    def restore(self, saved: Saved) -> None:
        """Hold what ``saved`` holds until the source's first sync confirms or replaces it;
        the snapshots until then carry ``restored_at`` (servable, not synced)."""
        for (kind, (namespace, name)), value in saved.entries.items():
            if kind == "Service":
                self._upsert_service(value)
            elif kind == "EndpointSlice":
                self._upsert_slice(namespace, *value)
            elif kind == "Node":
                self._upsert_node(value)
            elif kind == "Pod":
                self._upsert_pod(value)
            elif kind == "Namespace":
                self._upsert_namespace(name, value)
            elif kind == "ServiceCIDR":
                self._service_cidrs[name] = value
            else:
                continue
            self._unconfirmed.setdefault(kind, set()).add((namespace, name))
        self._restored_at = saved.saved_at

    @property
    def synced(self) -> bool:
        return self._required_kinds <= self._synced_kinds

    def commit(self) -> Snapshot | None:
        """Publish the pending changes as a new snapshot; None if nothing changed."""
        previous = self._snapshot
        synced = self.synced
        changed_at, self._pending_since = self._pending_since, None
        if self._nodes_dirty and self._slice_transform is not None:
            # Hints may depend on every node's zone and CPU: recompute services that use them.
            self._dirty.update(
                name
                for name, info in self._services.items()
                if info.traffic_distribution is not None or info.topology_mode is not None
            )
        if self._nodes_dirty and self._pod_slices is not None:
            # Endpoints take their zone from their Pod's Node.
            self._dirty.update(self._with_selector)
        changed = set()
        for name in self._dirty:
            state = self._build(name)
            held = self._states.get(name)
            if state == held:
                continue
            if state is None:
                del self._states[name]
            else:
                self._states[name] = state
            changed.add(name)
        self._dirty.clear()

        node = self._nodes.get(self.node_name)
        node_changed = node != previous.node
        nodes_dirty, self._nodes_dirty = self._nodes_dirty, False
        namespaces, namespace_labels = previous.namespaces, previous.namespace_labels
        if self._namespaces_dirty:
            namespaces = frozenset(self._explicit_namespaces | set(self._namespace_refs))
            if self._namespace_labels != previous.namespace_labels:
                namespace_labels = MappingProxyType(dict(self._namespace_labels))
            self._namespaces_dirty = False
        if synced:
            self._restored_at = None
        pods_changed, self._pods_dirty = self._pods_dirty, False
        service_cidrs = self._service_ranges()
        if service_cidrs == previous.service_cidrs:
            service_cidrs = previous.service_cidrs
        if not changed and not node_changed and not nodes_dirty and namespaces == previous.namespaces \
                and namespace_labels is previous.namespace_labels \
                and synced == previous.synced and not pods_changed \
                and (None if synced else self._restored_at) == previous.restored_at \
                and service_cidrs is previous.service_cidrs:
            return None
        services = previous.services
        if changed:
            services = MappingProxyType(dict(self._states))
        self._snapshot = Snapshot(
            generation=previous.generation + 1,
            services=services,
            namespaces=namespaces,
            namespace_labels=namespace_labels,
            node=node,
            nodes=MappingProxyType(dict(self._nodes)) if nodes_dirty else previous.nodes,
            pods=MappingProxyType(dict(self._pods)) if pods_changed else previous.pods,
            pods_changed=pods_changed,
            synced=synced,
            restored_at=None if synced else self._restored_at,
            changed=frozenset(changed),
            node_changed=node_changed,
            changed_at=changed_at,
            service_cidrs=service_cidrs,
        )
        self._published.set()
        self._published = asyncio.Event()
        return self._snapshot

    # --- internals ------------------------------------------------------------------

    def _service_ranges(self) -> tuple[str, ...]:
        """The flag's ranges, then each ServiceCIDR's by name, each range once."""
        ranges = dict.fromkeys(self._flag_cidrs)
        for name in sorted(self._service_cidrs):
            ranges.update(dict.fromkeys(self._service_cidrs[name]))
        return tuple(ranges)

    def _note_arrival(self) -> None:
        if self._pending_since is None:
            self._pending_since = self._clock()

    def _build(self, name: ServiceName) -> ServiceState | None:
        info = self._services.get(name)
        if info is None:
            return None
        by_name = self._slices_by_service.get(name, {})
        slices = tuple(by_name[k] for k in sorted(by_name))
        if self._pod_slices is not None and info.selector_labels is not None:
            # The Pods carrying the selector's rarest pair: the controller checks the rest.
            namespace = info.name.namespace
            pods = min((self._pods_by_label.get((namespace, key, value), {}) for key, value in info.selector_labels),
                       key=len).values()
            generated = self._pod_slices(info, pods, self._nodes)
            if generated:
                slices = tuple(sorted(slices + generated, key=lambda s: s.name))
        if self._slice_transform is not None:
            slices = self._slice_transform(info, slices, self._nodes)
        held = self._states.get(name)
        if held is not None and held.service == info and held.slices == slices:
            return held  # keep identity: "unchanged" is an `is` check downstream
        return ServiceState(info, slices)

    def _upsert_node(self, info: NodeInfo) -> None:
        if self._nodes.get(info.name) != info:
            self._nodes[info.name] = info
            self._nodes_dirty = True

    def _upsert_namespace(self, name: str, labels: tuple[tuple[str, str], ...] = ()) -> None:
        if name not in self._explicit_namespaces:
            self._explicit_namespaces.add(name)
            self._namespaces_dirty = True
        if self._namespace_labels.get(name, ()) != labels:
            if labels:
                self._namespace_labels[name] = labels
            else:
                del self._namespace_labels[name]
            self._namespaces_dirty = True

    def _upsert_service(self, info: ServiceInfo) -> None:
        held = self._services.get(info.name)
        if held == info:
            return
        if held is None:
            self._ref_namespace(info.name.namespace)
        else:
            self._unselect(held)
        self._services[info.name] = info
        self._dirty.add(info.name)
        # Only the EndpointSlice controller makes a service's state depend on Pods; without
        # it the index would grow with every service that has a selector, for nothing.
        if info.selector_labels is not None and self._pod_slices is not None:
            self._with_selector.add(info.name)
            for key, value in info.selector_labels:
                self._selecting.setdefault((info.name.namespace, key, value), set()).add(info.name)

    def _unselect(self, info: ServiceInfo) -> None:
        if info.selector_labels is None or self._pod_slices is None:
            return
        self._with_selector.discard(info.name)
        for key, value in info.selector_labels:
            pair = (info.name.namespace, key, value)
            names = self._selecting.get(pair)
            if names is not None:
                names.discard(info.name)
                if not names:
                    del self._selecting[pair]

    def _upsert_pod(self, info: PodInfo) -> None:
        key = (info.namespace, info.name)
        held = self._pods.get(key)
        if info.created is None:
            # The API server stamps creationTimestamp; a hand-written Pod is created when first read.
            info = replace(info, created=held.created if held is not None else _rfc3339_now(self._clock()))
        if held == info:
            return
        if held is None:
            self._ref_namespace(info.namespace)
        else:
            self._unindex_pod(held)
        self._pods[key] = info
        for pair in info.labels.items():
            self._pods_by_label.setdefault((info.namespace, *pair), {})[info.name] = info
        self._pods_dirty = True
        self._pod_touched(info)

    def _unindex_pod(self, pod: PodInfo) -> None:
        """Take a version of the Pod out of the label index; the services it matched are dirty."""
        for pair in pod.labels.items():
            index_key = (pod.namespace, *pair)
            bucket = self._pods_by_label.get(index_key)
            if bucket is not None:
                bucket.pop(pod.name, None)
                if not bucket:
                    del self._pods_by_label[index_key]
        self._pods_dirty = True
        self._pod_touched(pod)

    def _pod_touched(self, pod: PodInfo) -> None:
        """Mark dirty the services whose selector matches this version of the Pod."""
        labels = pod.labels
        candidates: set[ServiceName] = set()
        for pair in labels.items():
            candidates.update(self._selecting.get((pod.namespace, *pair), ()))
        for name in candidates:
            selector = self._services[name].selector_labels
            if selector is not None and all(labels.get(k) == v for k, v in selector):
                self._dirty.add(name)

    def _upsert_slice(self, namespace: str, service: str | None, info: SliceInfo) -> None:
        key = (namespace, info.name)
        owner = ServiceName(namespace, service) if service else None
        if owner is not None and (held_service := self._services.get(owner)) is not None:
            owner = held_service.name  # one ServiceName object per service, not one per slice too
        held = self._slices.get(key)
        if held == (owner, info):
            return
        if held is None:
            self._ref_namespace(namespace)
        elif held[0] is not None and held[0] != owner:
            self._detach_slice(held[0], info.name)  # relabelled to another service
        self._slices[key] = (owner, info)
        if owner is not None:
            self._slices_by_service.setdefault(owner, {})[info.name] = info
            self._dirty.add(owner)

    def _detach_slice(self, owner: ServiceName, slice_name: str) -> None:
        by_name = self._slices_by_service.get(owner)
        if by_name is not None and by_name.pop(slice_name, None) is not None:
            if not by_name:
                del self._slices_by_service[owner]
            self._dirty.add(owner)

    def _ref_namespace(self, namespace: str) -> None:
        if not self._implicit_namespaces:
            return
        self._namespace_refs[namespace] += 1
        if self._namespace_refs[namespace] == 1:
            self._namespaces_dirty = True

    def _unref_namespace(self, namespace: str) -> None:
        if not self._implicit_namespaces:
            return
        self._namespace_refs[namespace] -= 1
        if self._namespace_refs[namespace] <= 0:
            del self._namespace_refs[namespace]
            self._namespaces_dirty = True


def _rfc3339_now(moment: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))

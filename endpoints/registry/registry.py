"""The embedded API server of manifest mode: validation, allocation, persistence.

``Registry.admit(obj)`` does what the API server does on create/update: validates,
and for a Service fills in uid, creationTimestamp, ipFamilies/ipFamilyPolicy,
ClusterIPs, nodePorts and healthCheckNodePort, persisting them so the same Service
gets the same values after a reload or a restart. A refused object raises
:class:`Invalid` and changes nothing: the earlier holder of a contested value keeps
it, and the refused Service keeps whatever it had before.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import math
import random
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from typing import Callable, Protocol

from kubeport.endpoints import model
from kubeport.endpoints.fielderrors import FieldError, Invalid, invalid
from kubeport.endpoints.registry.allocation import (
    AllocationFailed,
    ServiceAllocations,
    Transaction,
    allocate_service,
    resolve_ip_families,
)
from kubeport.endpoints.registry.allocators import AllocationError, PortAllocator, ServiceCIDRAllocator
from kubeport.endpoints.registry.store import AllocationStore, ServiceAllocation, ServiceCIDRRecord
from kubeport.endpoints.validation import validate, validate_service

__all__ = ["Admitter", "FieldError", "Invalid", "Registry", "dns_service_ip"]


class Admitter(Protocol):
    """What a source needs of the registry (the manifest source admits through it)."""

    def admit(self, obj: model.KubeObject) -> model.KubeObject: ...

    def release(self, kind: str, namespace: str, name: str) -> None: ...

    def allocated_services(self) -> set[tuple[str, str]]: ...

    #: persists the admissions inside as one write (one batch of files)
    def grouped_writes(self) -> AbstractContextManager[None]: ...

    #: the ServiceCIDRs whose deletion has finished since the last call (their ranges are free)
    def take_finished_service_cidrs(self) -> list[str]: ...

    #: every ServiceCIDR the registry holds (a restart: those no file declares any more)
    def service_cidrs(self) -> dict[str, ServiceCIDRRecord]: ...


log = logging.getLogger(__name__)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_FAMILY = {4: "IPv4", 6: "IPv6"}
_TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def dns_service_ip(cidr: Network) -> str:
    """The 10th address of the range: kubeadm's kube-dns ClusterIP (10.96.0.10 for 10.96.0.0/12)."""
    return str(cidr.network_address + 10)


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Registry:
    def __init__(
        self,
        store: AllocationStore,
        service_cidrs: list[Network],
        node_port_range: tuple[int, int],
        rng: random.Random | None = None,
        *,
        now: Callable[[], datetime] = _utcnow,
    ) -> None:
        """
        :param store: where allocations persist; every stored allocation is re-reserved here.
        :param service_cidrs: ``--service-cluster-ip-range``: one CIDR, or two of different
            families for dual-stack; the first is the primary family. They are the default
            ServiceCIDR ("kubernetes"); ServiceCIDR objects add ranges (:meth:`admit`), and
            those stored are taken again before the Services' allocations.
        :param node_port_range: ``--service-node-port-range``, inclusive.
        :param rng: randomness for dynamic picks and uids (inject a seeded one in tests).
        :param now: the clock for creationTimestamp.
        """
        cidrs = [ipaddress.ip_network(c) for c in service_cidrs]
        if not 1 <= len(cidrs) <= 2 or len({c.version for c in cidrs}) != len(cidrs):
            raise ValueError(f"service CIDRs must be one CIDR or two of different families, got {service_cidrs}")
        self._store = store
        self._rng = rng or random.Random()
        self._now = now
        self.dns_ip = dns_service_ip(cidrs[0])
        self._default_cidrs = tuple(str(c) for c in cidrs)
        self._ips: dict[str, ServiceCIDRAllocator] = {}
        for cidr in cidrs:
            # kube-dns's address stays out of dynamic picks in every range that holds it
            allocator = ServiceCIDRAllocator(_FAMILY[cidr.version], self._rng, reserved=[self.dns_ip])
            allocator.default_owner = model.DEFAULT_SERVICE_CIDR_NAME
            allocator.add(str(cidr), model.DEFAULT_SERVICE_CIDR_NAME)
            self._ips[allocator.family] = allocator
        self._ports = PortAllocator(*node_port_range, rng=self._rng)
        self._records: dict[tuple[str, str], ServiceAllocation] = {}
        #: ClusterIP -> "namespace/name" of the Service holding it.
        self._ip_owners: dict[str, str] = {}
        #: the ServiceCIDR objects (not the default one), by name
        self._service_cidrs: dict[str, ServiceCIDRRecord] = {}
        self._finished: list[str] = []
        self._load()

    @property
    def families(self) -> list[str]:
        """The configured IP families, primary first."""
        return list(self._ips)

    # --- start-up ---------------------------------------------------------------------

    def _load(self) -> None:
        for cidr_record in self._store.load_service_cidrs():
            self._hold_service_cidr(cidr_record)
        for record in self._store.load():
            kept = self._reserve(record)
            self._records[(record.namespace, record.name)] = kept
            for ip in kept.cluster_ips:
                self._ip_owners[ip] = kept.key
        log.debug("re-reserved the allocations of %d services", len(self._records))

    def _reserve(self, record: ServiceAllocation) -> ServiceAllocation:
        """Re-take a stored record's values; drop (and log) those the current ranges refuse."""
        ips = []
        for ip in record.cluster_ips:
            allocator = self._allocator_for(ip)
            if self._try(record, ip, allocator.reserve if allocator else None):
                ips.append(ip)
        kept_ports = {p for p in record.held_ports() if self._try(record, p, self._ports.allocate)}
        return ServiceAllocation(
            namespace=record.namespace,
            name=record.name,
            uid=record.uid,
            creation_timestamp=record.creation_timestamp,
            cluster_ips=tuple(ips),
            node_ports=tuple(p for p in record.node_ports if p.node_port in kept_ports),
            health_check_node_port=record.health_check_node_port if record.health_check_node_port in kept_ports else 0,
        )

    @staticmethod
    def _try(record: ServiceAllocation, value: object, allocate: Callable | None) -> bool:
        try:
            if allocate is None:
                raise AllocationError("not an IP of a configured family")
            allocate(value)
            return True
        except AllocationError as exc:
            log.warning("stored allocation %s of Service %s dropped: %s", value, record.key, exc)
            return False

    def _allocator_for(self, ip: str) -> ServiceCIDRAllocator | None:
        try:
            return self._ips.get(_FAMILY[ipaddress.ip_address(ip).version])
        except ValueError:
            return None

    # --- queries ----------------------------------------------------------------------

    def service_cluster_ips(self) -> set[str]:
        """Every allocated ClusterIP."""
        return set(self._ip_owners)

    def allocation(self, namespace: str, name: str) -> ServiceAllocation | None:
        return self._records.get((namespace, name))

    def usage(self) -> dict[str, int]:
        """How many values are taken: {"nodePorts": n, "IPv4": n[, "IPv6": n]} (status, metrics)."""
        counts = {"nodePorts": self._ports.used}
        counts.update({family: allocator.used for family, allocator in self._ips.items()})
        return counts

    def allocated_services(self) -> set[tuple[str, str]]:
        """(namespace, name) of every Service holding allocations, e.g. to release the ones
        whose manifests disappeared while the daemon was down."""
        return set(self._records)

    # --- admission ----------------------------------------------------------------------

    def grouped_writes(self) -> AbstractContextManager[None]:
        """The store writes of the admissions inside share one transaction
        (:meth:`AllocationStore.grouped`)."""
        return self._store.grouped()

    def admit(self, obj: model.KubeObject) -> model.KubeObject:
        """Validate ``obj``; for a Service, allocate and return a completed copy.

        Raises :class:`Invalid` (every problem, API-server style) and then changes nothing.
        Raises :class:`~kubeport.endpoints.registry.store.StoreError` if the store cannot be written.
        """
        if isinstance(obj, model.Service):
            admitted = self._admit_service(obj)
            self._finish_service_cidrs()  # the Service may have let go of a ClusterIP
            return admitted
        if isinstance(obj, model.ServiceCIDR):
            return self._admit_service_cidr(obj)
        errors = validate(obj, self._ip_owners)
        if errors:
            raise Invalid(obj.kind, obj.metadata.name, errors)
        return obj

    def _admit_service(self, svc: model.Service) -> model.Service:
        spec = svc.spec
        errors = validate_service(svc)
        if errors:
            raise Invalid("Service", svc.metadata.name, errors)
        key = (svc.metadata.namespace, svc.metadata.name)
        prev = self._records.get(key)
        headless = (spec.cluster_ips or [spec.cluster_ip])[0] == "None"
        txn = Transaction(self._ports, self._ips)
        try:
            families = resolve_ip_families(spec, self.families, headless)
            allocated = allocate_service(spec, headless, families, prev, txn)
        except AllocationFailed as exc:
            txn.rollback()
            raise Invalid("Service", svc.metadata.name, exc.errors) from None
        except BaseException:
            txn.rollback()
            raise
        record = self._record(svc, prev, allocated)
        if record != prev:
            try:
                self._store.put(record)
            except BaseException:
                txn.rollback()
                raise
        txn.commit()
        self._remember(key, prev, record)
        return _completed(svc, record, allocated, headless)

    def _record(
        self, svc: model.Service, prev: ServiceAllocation | None, allocated: ServiceAllocations
    ) -> ServiceAllocation:
        if prev is not None:
            uid, created = prev.uid, prev.creation_timestamp
        else:
            # The API server ignores uid and creationTimestamp sent by a client.
            uid = uuid4_text(self._rng.getrandbits(128))
            created = _timestamp_text(self._now())
        return ServiceAllocation(
            namespace=svc.metadata.namespace,
            name=svc.metadata.name,
            uid=uid,
            creation_timestamp=created,
            cluster_ips=allocated.cluster_ips,
            node_ports=allocated.node_port_records(svc.spec),
            health_check_node_port=allocated.health_check_node_port,
        )

    def _remember(self, key: tuple[str, str], prev: ServiceAllocation | None, record: ServiceAllocation) -> None:
        for ip in prev.cluster_ips if prev else ():
            self._ip_owners.pop(ip, None)
        for ip in record.cluster_ips:
            self._ip_owners[ip] = record.key
        self._records[key] = record

    # --- deletion -------------------------------------------------------------------------

    def release(self, kind: str, namespace: str, name: str) -> None:
        """The object was deleted: a Service frees its allocations, a ServiceCIDR starts its
        deletion (:meth:`take_finished_service_cidrs` says when it is over). Idempotent."""
        if kind == "ServiceCIDR":
            self._release_service_cidr(name)
            return
        if kind != "Service":
            return
        record = self._records.get((namespace, name))
        if record is None:
            return
        self._store.delete(namespace, name)
        del self._records[(namespace, name)]
        for port in record.held_ports():
            self._ports.release(port)
        for ip in record.cluster_ips:
            self._ip_owners.pop(ip, None)
            allocator = self._allocator_for(ip)
            if allocator is not None:
                allocator.release(ip)
        self._finish_service_cidrs()

    # --- ServiceCIDRs (KEP-1880) ------------------------------------------------------------

    def service_cidrs(self) -> dict[str, ServiceCIDRRecord]:
        return dict(self._service_cidrs)

    def take_finished_service_cidrs(self) -> list[str]:
        finished, self._finished = self._finished, []
        return finished

    def _admit_service_cidr(self, obj: model.ServiceCIDR) -> model.ServiceCIDR:
        """ValidateServiceCIDR, then ValidateServiceCIDRUpdate's immutable spec.cidrs
        (pkg/apis/networking/validation); the default one is the flag's and nothing else."""
        name = obj.metadata.name
        errors = validate(obj)
        cidrs = tuple(obj.spec.cidrs)
        if not errors:
            held = self._service_cidrs.get(name)
            before = self._default_cidrs if name == model.DEFAULT_SERVICE_CIDR_NAME else held and held.cidrs
            if before and cidrs != before:
                errors.append(invalid("spec.cidrs", list(cidrs), "field is immutable"))
        if errors:
            raise Invalid("ServiceCIDR", name, errors)
        if name == model.DEFAULT_SERVICE_CIDR_NAME:
            return obj  # the flag's ranges, held from the start
        held = self._service_cidrs.get(name)
        if held is None or held.terminating:
            record = ServiceCIDRRecord(name, cidrs)
            self._store.put_service_cidr(record)
            self._hold_service_cidr(record)
        return obj

    def _hold_service_cidr(self, record: ServiceCIDRRecord) -> None:
        self._service_cidrs[record.name] = record
        for cidr in record.cidrs:
            allocator = self._ips.get(_FAMILY[ipaddress.ip_network(cidr).version])
            if allocator is not None:  # a family the cluster does not serve allocates nothing
                allocator.add(cidr, record.name, ready=not record.terminating)

    def _release_service_cidr(self, name: str) -> None:
        """The servicecidrs controller's deletion: not ready at once (no new ClusterIP from it),
        gone once no Service holds an address only it contains (its finalizer removed)."""
        held = self._service_cidrs.get(name)
        if held is None or held.terminating:
            return
        record = ServiceCIDRRecord(name, held.cidrs, terminating=True)
        self._store.put_service_cidr(record)
        self._service_cidrs[name] = record
        for cidr, allocator in self._range_allocators(record):
            allocator.set_ready(cidr, name, False)
        self._finish_service_cidrs()

    def _range_allocators(self, record: ServiceCIDRRecord) -> list[tuple[str, ServiceCIDRAllocator]]:
        found = []
        for cidr in record.cidrs:
            allocator = self._ips.get(_FAMILY[ipaddress.ip_network(cidr).version])
            if allocator is not None:
                found.append((cidr, allocator))
        return found

    def _finish_service_cidrs(self) -> None:
        for name, record in list(self._service_cidrs.items()):
            if not record.terminating:
                continue
            ranges = self._range_allocators(record)
            if any(allocator.in_use(cidr) for cidr, allocator in ranges):
                continue
            self._store.delete_service_cidr(name)
            del self._service_cidrs[name]
            for cidr, allocator in ranges:
                allocator.remove(cidr, name)
            self._finished.append(name)
            log.info("ServiceCIDR %s: deleted, no Service holds an address of %s any more", name,
                     ", ".join(record.cidrs))


def _completed(
    svc: model.Service, record: ServiceAllocation, allocated: ServiceAllocations, headless: bool
) -> model.Service:
    """A copy of ``svc`` with every allocated field filled in, as the API server returns it.

    Only the changed parts are copied (a deep copy would cost most of an admission);
    the rest is shared with ``svc``, which nobody mutates.
    """
    spec = svc.spec
    spec_update: dict[str, object] = {
        "ports": [
            port.model_copy(update={"node_port": node_port or None})
            for port, node_port in zip(spec.ports, allocated.node_ports)
        ],
        "health_check_node_port": allocated.health_check_node_port or None,
    }
    if allocated.families is not None:
        spec_update["ip_families"] = list(allocated.families.families)
        spec_update["ip_family_policy"] = allocated.families.policy
        ips = ["None"] if headless else list(record.cluster_ips)
        spec_update["cluster_ip"], spec_update["cluster_ips"] = ips[0], ips
    metadata = svc.metadata.model_copy(
        update={"uid": record.uid, "creation_timestamp": _timestamp_value(record.creation_timestamp)}
    )
    return svc.model_copy(update={"metadata": metadata, "spec": spec.model_copy(update=spec_update)})


def uuid4_text(bits: int) -> str:
    """``str(uuid.UUID(int=bits, version=4))``, without building the UUID (a first load makes thousands)."""
    bits = (bits & ~(0xC000 << 48) | 0x8000 << 48) & ~(0xF000 << 64) | 4 << 76
    hexa = "%032x" % bits
    return f"{hexa[:8]}-{hexa[8:12]}-{hexa[12:16]}-{hexa[16:20]}-{hexa[20:]}"


@functools.lru_cache(maxsize=4)
def _timestamp_text_of_second(second: int) -> str:
    return datetime.fromtimestamp(second, timezone.utc).strftime(_TIMESTAMP_FORMAT)


def _timestamp_text(moment: datetime) -> str:
    """RFC 3339 text of ``moment`` to the second; the services admitted in one second share it."""
    return _timestamp_text_of_second(math.floor(moment.timestamp()))


@functools.lru_cache(maxsize=4)
def _timestamp_value(text: str) -> datetime:
    return datetime.fromisoformat(text)

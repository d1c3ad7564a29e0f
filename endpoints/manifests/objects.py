"""The objects of a manifest directory: which file holds each, admission into the cluster
state, and deletion of what no file declares any more.

Last good state wins, object by object:
- an object that fails validation or admission keeps its previous version, if any;
- an object a file no longer declares is deleted at the end of the batch, unless another
  file takes it over, or a document of the file may still stand for it (a :class:`Claim`:
  ``kind: Servce``, a group typo, a document broken before its name is known): then it
  keeps its last good version, and a problem line says why.

Per object only the digest of the applied version is kept; no API objects are held.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from kubeport.endpoints import model
from kubeport.endpoints.fielderrors import Invalid
from kubeport.endpoints.manifests.holders import Holders
from kubeport.endpoints.manifests.parse import Claim, ObjectKey, ParsedFile, ParsedObject, describe
from kubeport.endpoints.registry.registry import Admitter
from kubeport.endpoints.registry.store import StoreError
from kubeport.endpoints.state import ClusterState

log = logging.getLogger(__name__)

SOURCE_KINDS = ("Namespace", "Node", "ServiceCIDR", "Service", "EndpointSlice", "Pod")
#: Admission order inside a chunk: a ServiceCIDR before the Services allocated from it, a Service
#: before the slices that must not use its ClusterIP.
_KIND_ORDER = {kind: rank for rank, kind in enumerate(SOURCE_KINDS)}


@dataclass(slots=True)
class Progress:
    """What the current batch did so far."""

    done: set[str] = field(default_factory=set)
    retried: set[str] = field(default_factory=set)
    #: files read again to take over an object another file let go of
    reread: set[str] = field(default_factory=set)
    #: objects whose holder stopped declaring them (another file may take them over)
    dropped: set[ObjectKey] = field(default_factory=set)
    #: allocations may have been freed (an object deleted, a Service re-admitted)
    freed: bool = False


@dataclass(slots=True)
class FileApply:
    """What one read of a file declares and how its objects fared, chunk after chunk."""

    path: str
    #: every key the file declares, valid or not
    keys: set[ObjectKey] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    #: held by the file and applied at an older version: this read's version was invalid or refused
    stale: set[ObjectKey] = field(default_factory=set)
    #: declared, and no version of them applied from this file (invalid or refused newcomers)
    unapplied: set[ObjectKey] = field(default_factory=set)
    #: an object was refused at admission: worth another try once something is freed
    retry: bool = False
    #: at start-up, the keys the file declared before the restart (None: all it declares now);
    #: it holds the others only until a file that declared them before takes them back
    known: frozenset[ObjectKey] | None = None

    def tentative(self, key: ObjectKey) -> bool:
        return self.known is not None and key not in self.known


class ManifestObjects:
    def __init__(self, registry: Admitter, state: ClusterState, holders: Holders, *, duplicate_note: str = "") -> None:
        """:param duplicate_note: added to each ``declared also in`` line (``kubeport check`` says how it chose)."""
        self.registry = registry
        self.state = state
        self.holders = holders
        self.duplicate_note = duplicate_note
        #: digest of the version in the state, per object
        self.applied: dict[ObjectKey, bytes] = {}
        #: objects whose last validated version had unknown fields: validated again at every read,
        #: so that their warnings stay listed
        self.warned: set[ObjectKey] = set()

    def is_applied(self, path: str, key: ObjectKey, digest: bytes) -> bool:
        """Is this version of ``key``, from ``path``, the one in the state (no need to validate it)?"""
        return self.holders.holder(key) == path and self.applied.get(key) == digest and key not in self.warned

    def apply_chunk(self, read: FileApply, chunk: ParsedFile, progress: Progress) -> None:
        """Hold and admit a chunk's objects."""
        path = read.path
        read.problems.extend(chunk.problems)
        read.claims.extend(chunk.claims)
        read.skipped.extend(chunk.skipped)
        admissions: list[ParsedObject] = []
        for obj in chunk.objects:
            key = obj.key
            if key in read.keys:
                read.problems.append(f"{path}: {describe(key)}: declared more than once in this file, {obj.where} ignored")
                continue
            read.keys.add(key)
            if obj.obj is not None:
                (self.warned.add if obj.warned else self.warned.discard)(key)
            if not self.holders.hold(path, key, tentative=read.tentative(key)):
                read.problems.append(f"{path}: {describe(key)}: declared also in {self.holders.claimant(key)}, "
                                     f"ignored{self.duplicate_note}")
            elif self.applied.get(key) != obj.digest:
                admissions.append(obj)
        for key in chunk.invalid_keys - read.keys:
            read.keys.add(key)
            # A broken declaration still holds its object, at its last good version.
            held = self.holders.hold(path, key, tentative=read.tentative(key))
            (read.stale if held and key in self.applied else read.unapplied).add(key)
        for obj in sorted(admissions, key=lambda o: _KIND_ORDER[o.key[0]]):
            error = self._admit(obj, progress)
            if error:
                read.problems.extend(f"{path}: {line}" for line in error)
                read.retry = True
                (read.stale if obj.key in self.applied else read.unapplied).add(obj.key)

    def finish(self, read: FileApply, before: frozenset[ObjectKey], progress: Progress) -> None:
        """The file was read to the end: what it declared ``before`` and no longer does is let go
        of, unless one of its documents may still stand for it."""
        gone = before - read.keys
        if read.claims and gone:
            for key in sorted(gone):
                if self.holders.holder(key) != read.path or key not in self.applied:
                    continue  # another file's, or never in: nothing to keep
                claim = next((claim for claim in read.claims if claim.matches(key)), None)
                if claim is not None:
                    read.keys.add(key)
                    read.stale.add(key)
                    read.problems.append(f"{read.path}: {describe(key)}: last good version kept: {claim.reason}")
            gone = before - read.keys
        progress.dropped |= self.holders.drop(read.path, gone)

    def _admit(self, parsed: ParsedObject, progress: Progress) -> list[str]:
        """Admit one object into the state; the problem lines if refused."""
        assert parsed.obj is not None  # only unchanged objects skip validation
        try:
            admitted = self.registry.admit(parsed.obj)
        except Invalid as exc:
            return exc.lines()
        except StoreError as exc:
            return [f"{describe(parsed.key)}: {exc}"]
        self.state.upsert(admitted)
        if parsed.key[0] == "Service" and parsed.key in self.applied:
            progress.freed = True  # a changed Service may have let go of a ClusterIP or nodePort
            self._finish_service_cidrs()
        elif parsed.key[0] == "ServiceCIDR":
            progress.freed = True  # a new range: Services refused for a full one may fit now
        self.applied[parsed.key] = parsed.digest
        return []

    def release(self, progress: Progress) -> None:
        """Delete the dropped objects that no file took over."""
        for key in progress.dropped:
            if key in self.holders or self.applied.pop(key, None) is None:
                continue  # taken over (updated in place), or it never got in
            self.warned.discard(key)
            kind, namespace, name = key
            if kind != "ServiceCIDR":  # a ServiceCIDR stays a service range until its deletion is over
                self.state.delete(kind, namespace, name)
            progress.freed = True
            try:
                self.registry.release(kind, namespace, name)
            except StoreError as exc:
                log.error("%s: allocations not released: %s", describe(key), exc)
        progress.dropped.clear()
        self._finish_service_cidrs()

    def _finish_service_cidrs(self) -> None:
        """The ServiceCIDRs whose deletion is over (no Service holds an address of theirs) leave
        the state: pkg/controller/servicecidrs removes the finalizer, the object goes."""
        for name in self.registry.take_finished_service_cidrs():
            self.state.delete("ServiceCIDR", "", name)

    def release_undeclared(self, progress: Progress) -> None:
        """Free what Services deleted while the daemon was down still hold in the store.

        Call once every file has parsed: a file broken at start-up may declare them."""
        for namespace, name in self.registry.allocated_services():
            if ("Service", namespace, name) not in self.holders:
                log.info("releasing the allocations of Service %s/%s: no manifest declares it", namespace, name)
                self.registry.release("Service", namespace, name)
                progress.freed = True
        for name, record in self.registry.service_cidrs().items():
            if ("ServiceCIDR", "", name) in self.holders:
                continue
            if not record.terminating:
                log.info("ServiceCIDR %s: no manifest declares it: deleted once no Service holds its addresses", name)
                self.registry.release("ServiceCIDR", "", name)
                progress.freed = True
            # Still a service range while it is being deleted (the last applied state may not have it).
            self.state.upsert(model.ServiceCIDR.model_validate(
                {"metadata": {"name": name}, "spec": {"cidrs": list(record.cidrs)}}))
        self._finish_service_cidrs()

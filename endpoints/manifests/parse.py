"""Manifest files -> API objects. Pure: text in, objects and problem lines out.

What loads is what ``kubectl apply -f DIR -R`` loads: ``*.yaml``, ``*.yml`` and
``*.json`` files, multi-document YAML, concatenated JSON values, ``kind: List`` and
typed lists (``ServiceList`` with kind-less items, as the API server prints them).
Kinds other than Service, EndpointSlice, Pod, Node, Namespace and ServiceCIDR are skipped, except a
kind the core, discovery.k8s.io or networking.k8s.io group does not have (``kind: Servce``): kubectl refuses those (``no
matches for kind``), and so does kubeport. Every problem is one line naming the file, the
object and the field path in API (camelCase) style:
``web.yaml: Service "web": spec.ports[0].port: Input should be a valid integer``.
Fields the Kubernetes type does not have are reported as warnings (the object still loads).

A document that cannot stand for an object of its own (broken before its name or kind is
known, or of a kind or API group kubeport does not read) leaves a :class:`Claim`: an object
the file held and no longer declares is kept if a claim may stand for it (a typo in ``kind``
must not delete the Service it was).
"""

from __future__ import annotations

import json
import sys
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from kubeport.endpoints import model
from kubeport.endpoints.manifests import yaml_nodes
from kubeport.endpoints.manifests.documents import BadList, Candidate, SyntaxProblem, objects, syntax_text
from kubeport.endpoints.manifests.unknown_fields import unknown_fields

#: (kind, namespace, name); namespace is "" for cluster-scoped kinds.
ObjectKey = tuple[str, str, str]

#: Tells the parser an object with this key and digest is already applied, so it need
#: not be validated again (a reload of a large file re-validates only what changed).
UnchangedCheck = Callable[[ObjectKey, bytes], bool]

#: The API group each kind we read is served from, and the versions we understand.
_KIND_GROUPS = {"Service": "", "Node": "", "Namespace": "", "Pod": "", "EndpointSlice": "discovery.k8s.io",
                "ServiceCIDR": "networking.k8s.io"}
_GROUP_VERSIONS = {"": ("v1",), "discovery.k8s.io": ("v1",), "networking.k8s.io": ("v1",)}
#: Every kind of those groups (k8s.io/api core/v1 and discovery/v1 register.go): any other
#: kind in them is a typo, which kubectl refuses (``no matches for kind "Servce" in version "v1"``).
_GROUP_KINDS = {
    "": frozenset({
        "Pod", "PodList", "PodStatusResult", "PodTemplate", "PodTemplateList", "ReplicationController",
        "ReplicationControllerList", "Service", "ServiceList", "ServiceProxyOptions", "Node", "NodeList",
        "NodeProxyOptions", "Endpoints", "EndpointsList", "Binding", "Event", "EventList", "List", "LimitRange",
        "LimitRangeList", "ResourceQuota", "ResourceQuotaList", "Namespace", "NamespaceList", "ServiceAccount",
        "ServiceAccountList", "Secret", "SecretList", "PersistentVolume", "PersistentVolumeList",
        "PersistentVolumeClaim", "PersistentVolumeClaimList", "PodAttachOptions", "PodLogOptions", "PodExecOptions",
        "PodPortForwardOptions", "PodProxyOptions", "ComponentStatus", "ComponentStatusList", "SerializedReference",
        "RangeAllocation", "ConfigMap", "ConfigMapList", "Status",
    }),
    "discovery.k8s.io": frozenset({"EndpointSlice", "EndpointSliceList"}),
    # networking/v1 register.go
    "networking.k8s.io": frozenset({
        "Ingress", "IngressList", "IngressClass", "IngressClassList", "NetworkPolicy", "NetworkPolicyList",
        "IPAddress", "IPAddressList", "ServiceCIDR", "ServiceCIDRList",
    }),
}
_READ_KINDS = {group: frozenset(k for k, g in _KIND_GROUPS.items() if g == group) for group in _GROUP_VERSIONS}


@dataclass(frozen=True, slots=True)
class Claim:
    """A document that may stand for an object the file held, though it declares none that
    loads: broken before its key is known, or of a kind or API group kubeport does not read.
    None matches anything."""

    kinds: frozenset[str] | None
    namespace: str | None
    name: str | None
    #: why, for the line that says the object is kept: "document 2 may declare it (see its problem)"
    reason: str

    def matches(self, key: ObjectKey) -> bool:
        kind, namespace, name = key
        return (
            (self.kinds is None or kind in self.kinds)
            and (self.name is None or name == self.name)
            and (self.namespace is None or namespace in ("", self.namespace))  # "": cluster-scoped
        )


@dataclass(frozen=True, slots=True)
class ParsedObject:
    key: ObjectKey
    #: digest of the object's raw content: equal digests mean an unchanged object.
    digest: bytes
    #: the validated object; None when the ``unchanged`` check said it is already applied.
    obj: model.KubeObject | None
    #: where in the file ("document 2", "document 1, item 3"), for messages.
    where: str
    #: it has fields its type does not have (warnings): checked again at every read, not skipped as unchanged.
    warned: bool = False


@dataclass(frozen=True, slots=True)
class ParsedFile:
    objects: tuple[ParsedObject, ...] = ()
    #: one line per problem, each starting with the file's path.
    problems: tuple[str, ...] = ()
    #: "apps/v1 Deployment web" for every object of a kind we do not read.
    skipped: tuple[str, ...] = ()
    #: objects the file declares that failed validation: they keep their previous version.
    invalid_keys: frozenset[ObjectKey] = frozenset()
    #: the file as a whole could not be parsed: every object it held before is kept.
    failed: bool = False
    #: documents that may stand for an object the file held (see :class:`Claim`).
    claims: tuple[Claim, ...] = ()

    @property
    def keys(self) -> frozenset[ObjectKey]:
        """Every key the file declares (valid or not)."""
        return frozenset(o.key for o in self.objects) | self.invalid_keys


def describe(key: ObjectKey) -> str:
    """``Service "web"`` (default namespace), ``Service "demo/web"``, ``Node "node-a"``."""
    kind, namespace, name = key
    if namespace and namespace != "default":
        return f'{kind} "{namespace}/{name}"'
    return f'{kind} "{name}"'


# --- parsing ------------------------------------------------------------------------------

#: Validated objects per chunk of a streamed file: bounds the API objects alive at once.
CHUNK_OBJECTS = 256


def parse_manifest(path: str, text: str, *, unchanged: UnchangedCheck | None = None) -> ParsedFile:
    """Parse one manifest file. ``path`` only names the file in problem lines."""
    chunks = list(iter_manifest(path, text, unchanged=unchanged))
    if chunks[-1].failed:
        return chunks[-1]
    return ParsedFile(
        tuple(o for c in chunks for o in c.objects),
        tuple(p for c in chunks for p in c.problems),
        tuple(s for c in chunks for s in c.skipped),
        frozenset(k for c in chunks for k in c.invalid_keys),
        claims=tuple(claim for c in chunks for claim in c.claims),
    )


def iter_manifest(
    path: str, text: str, *, unchanged: UnchangedCheck | None = None, chunk_objects: int = CHUNK_OBJECTS,
    as_json: bool = False,
) -> Iterator[ParsedFile]:
    """Parse one manifest file in chunks of at most ``chunk_objects`` validated objects.

    Documents are parsed lazily, so a syntax error after the first chunk ends the
    iteration with a ``failed`` chunk (check the syntax first to rule that out).
    ``as_json`` reads the text as JSON whatever the path's extension.
    """
    collector = _Collector(path, unchanged)
    try:
        for candidate, where in objects(path, text, as_json=as_json):
            collector.add(candidate, where)
            if len(collector.objects) >= chunk_objects:
                yield collector.flush()
    except (SyntaxProblem, yaml_nodes.YAMLError, RecursionError) as exc:
        yield ParsedFile(problems=(f"{path}: {syntax_text(exc)}",), failed=True)
        return
    yield collector.flush()


def declared_values(path: str, text: str, *, as_json: bool = False) -> Iterator[tuple[ObjectKey, Any]]:
    """(key, raw value) of each object of a kind kubeport reads, first declaration of a key
    only, not validated. Raises as :func:`iter_manifest` fails (a syntax error)."""
    collector = _Collector(path, None)
    seen: set[ObjectKey] = set()
    for candidate, where in objects(path, text, as_json=as_json):
        routed = collector._route(candidate, where)
        if routed is not None and routed[0] not in seen:
            seen.add(routed[0])
            yield routed[0], candidate.build()  # type: ignore[union-attr]
        collector.flush()  # its problems are not wanted here


class _Collector:
    """Accumulates the objects and problems of one file, document by document."""

    def __init__(self, path: str, unchanged: UnchangedCheck | None) -> None:
        self.path = path
        self.unchanged = unchanged
        self.objects: list[ParsedObject] = []
        self.invalid: set[ObjectKey] = set()
        self.problems: list[str] = []
        self.skipped: list[str] = []
        self.claims: list[Claim] = []

    def flush(self) -> ParsedFile:
        """What was collected since the last flush."""
        chunk = ParsedFile(tuple(self.objects), tuple(self.problems), tuple(self.skipped), frozenset(self.invalid),
                           claims=tuple(self.claims))
        self.objects, self.problems, self.skipped, self.invalid, self.claims = [], [], [], set(), []
        return chunk

    def problem(self, subject: str, message: str) -> None:
        """Record a problem line (returns None, for ``return self.problem(...)``)."""
        self.problems.append(f"{self.path}: {subject}: {message}")

    def add(self, candidate: Candidate | BadList, where: str) -> None:
        routed = self._route(candidate, where)
        if routed is None:
            return
        key, subject = routed
        assert isinstance(candidate, Candidate)
        digest = candidate.digest()
        if self.unchanged is not None and self.unchanged(key, digest):
            self.objects.append(ParsedObject(key, digest, None, where))
            return
        built = candidate.build()
        unknown = unknown_fields(key[0], built)
        for field in unknown:
            self.problem(subject, f'warning: unknown field "{field}"')
        try:
            obj = model.KIND_MODELS[key[0]].model_validate(built)
        except ValidationError as exc:
            self.problems.extend(f"{self.path}: {subject}: {line}" for line in validation_lines(exc))
            self.invalid.add(key)
            return
        self.objects.append(ParsedObject(key, digest, obj, where, bool(unknown)))  # type: ignore[arg-type]

    def _route(self, candidate: Candidate | BadList, where: str) -> tuple[ObjectKey, str] | None:
        """(key, how messages name it) of an object to read; None when it is skipped or
        broken before validation (recorded here)."""
        if isinstance(candidate, BadList):
            self._claim(None, None, None, where)
            return self.problem(f"{where}: {candidate.kind}", "items: must be a list")
        raw = candidate.head
        if not isinstance(raw, dict):
            self._claim(None, None, None, where)
            return self.problem(where, f"expected an object, got {_json_type(raw)}")
        kind, api_version = raw.get("kind"), raw.get("apiVersion")
        if not isinstance(kind, str) or not kind:
            self._claim(None, *_raw_name(raw), where)
            return self.problem(where, "Object 'Kind' is missing")
        if api_version is not None and not isinstance(api_version, str):
            return self._broken(kind, raw, where, "apiVersion: must be a string")
        group = _group(api_version)
        if kind not in _KIND_GROUPS or group not in (None, _KIND_GROUPS[kind]):
            return self._skip(kind, api_version, group, raw, where)
        problem = _version_problem(kind, api_version)
        meta = raw.get("metadata")
        if problem is None and meta is not None and not isinstance(meta, dict):
            problem = f"metadata: expected an object, got {_json_type(meta)}"
        key = _raw_key(kind, raw)
        if problem is None and not key[2]:
            problem = "metadata.name: Required value"
        if problem is not None:
            return self._broken(kind, raw, where, problem)
        return key, describe(key)

    def _broken(self, kind: str, raw: dict[str, Any], where: str, problem: str) -> None:
        """An object broken before validation: invalid if its key is known (it keeps its last
        good version, as one that fails validation), else a claim on what it may be."""
        key = _raw_key(kind, raw) if kind in _KIND_GROUPS else None
        if key is not None and key[2]:
            self.invalid.add(key)
            return self.problem(describe(key), problem)
        namespace, name = _raw_name(raw)
        self._claim(frozenset({kind}) if kind in _KIND_GROUPS else None, namespace, name, where)
        return self.problem(f"{where}: {kind}", problem)

    def _skip(self, kind: str, api_version: str | None, group: str | None, raw: dict[str, Any], where: str) -> None:
        """An object of a kind (or a namesake kind in an API group) kubeport does not read."""
        namespace, name = _raw_name(raw)
        if group in _GROUP_KINDS and kind not in _GROUP_KINDS[group]:
            # A typo (`Servce`): kubectl refuses it; it may stand for an object of ours of that group.
            self._claim(_READ_KINDS[group], namespace, name, where)
            subject = describe((kind, namespace or "default", name)) if name else f"{where}: {kind}"
            return self.problem(subject, f'no matches for kind "{kind}" in version "{api_version}"')
        if kind in _KIND_GROUPS:
            # A namesake kind of another group (a Knative Service), or a typo in the group.
            read = _supported(_KIND_GROUPS[kind])
            self.claims.append(Claim(frozenset({kind}), namespace, name, f'{where} declares it with apiVersion '
                                     f'"{api_version}", which kubeport does not read (it reads {kind} from {read})'))
        elif group is None:
            # No apiVersion and a kind kubeport does not read: kubectl refuses it (apiVersion not set).
            self.claims.append(Claim(None, namespace, name, f'{where} declares it as kind "{kind}", which kubeport '
                                     "does not read"))
        self.skipped.append(f"{api_version or ''} {kind} {name or ''}".strip())
        return None

    def _claim(self, kinds: frozenset[str] | None, namespace: str | None, name: str | None, where: str) -> None:
        self.claims.append(Claim(kinds, namespace, name, f"{where} may declare it (see its problem)"))


def _group(api_version: str | None) -> str | None:
    return None if api_version is None else api_version.rpartition("/")[0]


def _version_problem(kind: str, api_version: str | None) -> str | None:
    if api_version is None:
        return None  # hand-written manifests may leave it out; the kind is unambiguous
    group, _, version = api_version.rpartition("/")
    if version in _GROUP_VERSIONS[group]:
        return None
    return f'apiVersion "{api_version}" is not supported for {kind} (use {_supported(group)})'


def _supported(group: str) -> str:
    return ", ".join(f"{group}/{v}".lstrip("/") for v in _GROUP_VERSIONS[group])


def _raw_name(raw: dict[str, Any]) -> tuple[str | None, str | None]:
    """(namespace, name) as far as they are known: None when not. The namespace defaults to
    "default" once a name is known (a cluster-scoped key matches any, see ``Claim.matches``)."""
    meta = raw.get("metadata")
    if not isinstance(meta, dict):
        return None, None
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None, None
    namespace = meta.get("namespace")
    return (namespace if isinstance(namespace, str) and namespace else "default"), name


def _raw_key(kind: str, raw: dict[str, Any]) -> ObjectKey:
    meta = raw.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    name = meta.get("name")
    name = name if isinstance(name, str) else ""
    kind = sys.intern(kind)  # held per object for as long as it lives: one copy of each kind
    if kind in model.CLUSTER_SCOPED_KINDS:
        return (kind, "", name)
    namespace = meta.get("namespace")
    return (kind, sys.intern(namespace) if isinstance(namespace, str) and namespace else "default", name)


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return type(value).__name__


# --- pydantic errors in API style ----------------------------------------------------------


def _union_fields() -> frozenset[str]:
    """Aliases of fields typed as a union of several types (pydantic adds a tag per member)."""
    found: set[str] = set()
    for cls in vars(model).values():
        if not (isinstance(cls, type) and issubclass(cls, model.ApiModel)):
            continue
        for name, field in cls.model_fields.items():
            origin = typing.get_origin(field.annotation)
            if origin in (typing.Union, types.UnionType):
                members = [a for a in typing.get_args(field.annotation) if a is not type(None)]
                if len(members) > 1:
                    found.add(field.alias or name)
    return frozenset(found)


_UNION_FIELDS = _union_fields()


def field_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as the API prints field paths: ``spec.ports[0].port``."""
    path = ""
    previous: int | str | None = None
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif previous in _UNION_FIELDS or "[" in part:
            pass  # pydantic's union-member or validator tag, not a field
        else:
            path += f".{part}" if path else part
        previous = part
    return path or "(object)"


def validation_lines(exc: ValidationError) -> list[str]:
    """One ``path: message`` line per failing field (union members merged)."""
    messages: dict[str, list[str]] = {}
    for error in exc.errors(include_url=False):
        path = field_path(error["loc"])
        text = "Required value" if error["type"] == "missing" else error["msg"]
        value = error.get("input")
        if error["type"] != "missing" and isinstance(value, (str, int, float, bool)):
            shown = json.dumps(value) if len(str(value)) <= 40 else json.dumps(str(value)[:40] + "...")
            text += f" (got {shown})"
        if text not in messages.setdefault(path, []):
            messages[path].append(text)
    return [f"{path}: {' or '.join(texts)}" for path, texts in messages.items()]

"""Manifest files -> API objects. Pure: text in, objects and problem lines out.

What loads is what ``kubectl apply -f DIR -R`` loads: ``*.yaml``, ``*.yml`` and
``*.json`` files, multi-document YAML, concatenated JSON values, ``kind: List`` and
typed lists (``ServiceList`` with kind-less items, as the API server prints them).
Kinds other than Service, EndpointSlice, Node and Namespace are skipped. Every problem
is one line naming the file, the object and the field path in API (camelCase) style:
``web.yaml: Service "web": spec.ports[0].port: Input should be a valid integer``.
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

from . import manifest_yaml, model
from .manifest_docs import BadList, Candidate, SyntaxProblem, objects, syntax_text

#: (kind, namespace, name); namespace is "" for cluster-scoped kinds.
ObjectKey = tuple[str, str, str]

#: Tells the parser an object with this key and digest is already applied, so it need
#: not be validated again (a reload of a large file re-validates only what changed).
UnchangedCheck = Callable[[ObjectKey, bytes], bool]

#: The API group each kind we read is served from, and the versions we understand.
_KIND_GROUPS = {"Service": "", "Node": "", "Namespace": "", "EndpointSlice": "discovery.k8s.io"}
_GROUP_VERSIONS = {"": ("v1",), "discovery.k8s.io": ("v1",)}


@dataclass(frozen=True, slots=True)
class ParsedObject:
    key: ObjectKey
    #: digest of the object's raw content: equal digests mean an unchanged object.
    digest: bytes
    #: the validated object; None when the ``unchanged`` check said it is already applied.
    obj: model.KubeObject | None
    #: where in the file ("document 2", "document 1, item 3"), for messages.
    where: str


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
    )


def iter_manifest(
    path: str, text: str, *, unchanged: UnchangedCheck | None = None, chunk_objects: int = CHUNK_OBJECTS
) -> Iterator[ParsedFile]:
    """Parse one manifest file in chunks of at most ``chunk_objects`` validated objects.

    Documents are parsed lazily, so a syntax error after the first chunk ends the
    iteration with a ``failed`` chunk (check the syntax first to rule that out).
    """
    collector = _Collector(path, unchanged)
    try:
        for candidate, where in objects(path, text):
            collector.add(candidate, where)
            if len(collector.objects) >= chunk_objects:
                yield collector.flush()
    except (SyntaxProblem, manifest_yaml.YAMLError, RecursionError) as exc:
        yield ParsedFile(problems=(f"{path}: {syntax_text(exc)}",), failed=True)
        return
    yield collector.flush()


class _Collector:
    """Accumulates the objects and problems of one file, document by document."""

    def __init__(self, path: str, unchanged: UnchangedCheck | None) -> None:
        self.path = path
        self.unchanged = unchanged
        self.objects: list[ParsedObject] = []
        self.invalid: set[ObjectKey] = set()
        self.problems: list[str] = []
        self.skipped: list[str] = []

    def flush(self) -> ParsedFile:
        """What was collected since the last flush."""
        chunk = ParsedFile(tuple(self.objects), tuple(self.problems), tuple(self.skipped), frozenset(self.invalid))
        self.objects, self.problems, self.skipped, self.invalid = [], [], [], set()
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
        try:
            obj = model.KIND_MODELS[key[0]].model_validate(candidate.build())
        except ValidationError as exc:
            self.problems.extend(f"{self.path}: {subject}: {line}" for line in validation_lines(exc))
            self.invalid.add(key)
            return
        self.objects.append(ParsedObject(key, digest, obj, where))  # type: ignore[arg-type]

    def _route(self, candidate: Candidate | BadList, where: str) -> tuple[ObjectKey, str] | None:
        """(key, how messages name it) of an object to read; None when it is skipped or
        broken before validation (recorded here)."""
        if isinstance(candidate, BadList):
            return self.problem(f"{where}: {candidate.kind}", "items: must be a list")
        raw = candidate.head
        if not isinstance(raw, dict):
            return self.problem(where, f"expected an object, got {_json_type(raw)}")
        kind, api_version = raw.get("kind"), raw.get("apiVersion")
        if not isinstance(kind, str) or not kind:
            return self.problem(where, "Object 'Kind' is missing")
        if api_version is not None and not isinstance(api_version, str):
            return self.problem(f"{where}: {kind}", "apiVersion: must be a string")
        key = _raw_key(kind, raw)
        if kind not in _KIND_GROUPS or _group(api_version) not in (None, _KIND_GROUPS[kind]):
            # Not ours; with another group, a namesake kind (e.g. a Knative Service).
            self.skipped.append(f"{api_version or ''} {kind} {key[2]}".strip())
            return None
        subject = describe(key) if key[2] else f"{where}: {kind}"
        meta = raw.get("metadata")
        problem = _version_problem(kind, api_version)
        if problem is None and meta is not None and not isinstance(meta, dict):
            problem = f"metadata: expected an object, got {_json_type(meta)}"
        if problem is None and not key[2]:
            problem = "metadata.name: Required value"
        return (key, subject) if problem is None else self.problem(subject, problem)


def _group(api_version: str | None) -> str | None:
    return None if api_version is None else api_version.rpartition("/")[0]


def _version_problem(kind: str, api_version: str | None) -> str | None:
    if api_version is None:
        return None  # hand-written manifests may leave it out; the kind is unambiguous
    group, _, version = api_version.rpartition("/")
    if version in _GROUP_VERSIONS[group]:
        return None
    supported = ", ".join(f"{group}/{v}".lstrip("/") for v in _GROUP_VERSIONS[group])
    return f'apiVersion "{api_version}" is not supported for {kind} (use {supported})'


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

"""The kube-apiserver's JSON wire format: list responses, watch events, Status objects.

Bytes go straight into the models of :mod:`kubeport.endpoints.model` in one pydantic-core
pass (no intermediate dicts). Only when that fails do we fall back to ``json.loads`` and
validate item by item, so that one invalid object is reported by name and field and the
rest of the list or stream still applies (last good state wins for the bad one).

The results are small immutable facts (:class:`Applied`, :class:`Deleted`,
:class:`Bookmarked`, :class:`WatchFailed`, :class:`Rejected`); nothing here does I/O.
"""

from __future__ import annotations

import contextlib
import gc
import json
from dataclasses import dataclass
from typing import Annotated, Any, Generic, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel

from kubeport.endpoints.model import CLUSTER_SCOPED_KINDS, ApiModel, KubeObject

#: Annotation on the BOOKMARK that ends the initial events of a watch-list (KEP-3157).
INITIAL_EVENTS_END = "k8s.io/initial-events-end"

ObjectKey = tuple[str, str]  # (namespace or "" when cluster-scoped, name)


class WireError(ValueError):
    """The bytes are not the API's JSON at all (a corrupt stream, not an invalid object)."""


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class ListMeta(_Wire):
    resource_version: str = ""
    continue_: str | None = Field(None, alias="continue")
    remaining_item_count: int | None = None


class StatusCause(_Wire):
    reason: str = ""
    message: str = ""
    field: str = ""


class StatusDetails(_Wire):
    name: str = ""
    group: str = ""
    kind: str = ""
    retry_after_seconds: int | None = None
    causes: list[StatusCause] = Field(default_factory=list)


class Status(_Wire):
    """metav1.Status: what the API server sends for every failure."""

    status: str = ""
    message: str = ""
    reason: str = ""
    code: int = 0
    details: StatusDetails | None = None
    metadata: ListMeta = Field(default_factory=ListMeta)


class _BookmarkMeta(_Wire):
    resource_version: str = ""
    annotations: dict[str, str] | None = None


class _BookmarkObject(_Wire):
    # Only metadata is meaningful: the rest of a bookmark object is the zero value of
    # its kind (an EndpointSlice bookmark has addressType "", which the model rejects).
    metadata: _BookmarkMeta = Field(default_factory=_BookmarkMeta)


T = TypeVar("T", bound=ApiModel)


class _ListBody(_Wire, Generic[T]):
    metadata: ListMeta = Field(default_factory=ListMeta)
    items: list[T] | None = None


class _Change(_Wire, Generic[T]):
    type: Literal["ADDED", "MODIFIED", "DELETED"]
    object: T


class _Bookmark(_Wire):
    type: Literal["BOOKMARK"]
    object: _BookmarkObject


class _Error(_Wire):
    type: Literal["ERROR"]
    object: Status


# --- the facts a parse yields ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Applied:
    """ADDED or MODIFIED: the object as it now is."""

    type: str
    obj: KubeObject
    key: ObjectKey
    resource_version: str


@dataclass(frozen=True, slots=True)
class Deleted:
    key: ObjectKey
    resource_version: str


@dataclass(frozen=True, slots=True)
class Bookmarked:
    resource_version: str
    initial_events_end: bool


@dataclass(frozen=True, slots=True)
class WatchFailed:
    """An ERROR event: the server ends the watch with this Status."""

    status: Status


@dataclass(frozen=True, slots=True)
class Rejected:
    """An object the server sent that does not validate: reported, not applied."""

    type: str
    key: ObjectKey
    resource_version: str
    problem: str


WatchEvent = Union[Applied, Deleted, Bookmarked, WatchFailed, Rejected]


@dataclass(frozen=True, slots=True)
class ListPage:
    items: tuple[KubeObject, ...]
    rejected: tuple[Rejected, ...]
    resource_version: str
    continue_token: str | None
    remaining_item_count: int | None


_STATUS = TypeAdapter(Status)


def parse_status(body: bytes) -> Status | None:
    """The Status in an error response body; None when the body is not one (a proxy's HTML)."""
    try:
        status = _STATUS.validate_json(body)
    except ValidationError:
        return None
    return status


#: metav1.CauseTypeResourceVersionTooLarge, and the message older servers send instead.
CAUSE_RESOURCE_VERSION_TOO_LARGE = "ResourceVersionTooLarge"
TOO_LARGE_RESOURCE_VERSION = "Too large resource version"


def is_too_large_resource_version(code: int, status: Status | None) -> bool:
    """The held resourceVersion is newer than anything the server has (etcd restored from a
    backup, a lagging watch cache): client-go's ``isTooLargeResourceVersionError``. The cause
    is checked whatever the code; the messages only on a 504 Timeout, as client-go does."""
    if status is None:
        return False
    causes = status.details.causes if status.details is not None else []
    if any(cause.reason == CAUSE_RESOURCE_VERSION_TOO_LARGE for cause in causes):
        return True
    if code != 504 and status.reason != "Timeout":
        return False
    return (any(cause.message == TOO_LARGE_RESOURCE_VERSION for cause in causes)
            or TOO_LARGE_RESOURCE_VERSION in status.message)


class WireParser:
    """Parses one kind's list responses and watch events."""

    def __init__(self, kind: str, model: type[ApiModel]) -> None:
        self.kind = kind
        self._model = model
        self._cluster_scoped = kind in CLUSTER_SCOPED_KINDS
        event_union = Union[_Change[model], _Bookmark, _Error]  # type: ignore[valid-type]
        self._events: TypeAdapter[Any] = TypeAdapter(Annotated[event_union, Field(discriminator="type")])
        self._list: TypeAdapter[Any] = TypeAdapter(_ListBody[model])  # type: ignore[valid-type]

    def key(self, obj: Any) -> ObjectKey:
        meta = obj.metadata
        return ("" if self._cluster_scoped else meta.namespace, meta.name)

    # --- watch events ------------------------------------------------------------------

    def event(self, line: bytes) -> WatchEvent:
        try:
            parsed = self._events.validate_json(line)
        except ValidationError:
            return self._event_slow(line)
        if isinstance(parsed, _Change):
            obj = parsed.object
            rv = obj.metadata.resource_version or ""
            if parsed.type == "DELETED":
                return Deleted(self.key(obj), rv)
            return Applied(parsed.type, obj, self.key(obj), rv)
        if isinstance(parsed, _Bookmark):
            meta = parsed.object.metadata
            end = (meta.annotations or {}).get(INITIAL_EVENTS_END) == "true"
            return Bookmarked(meta.resource_version, end)
        return WatchFailed(parsed.object)

    def _event_slow(self, line: bytes) -> WatchEvent:
        raw = _loads(line)
        if not isinstance(raw, dict) or not isinstance(raw.get("object"), dict):
            raise WireError(f"watch event without an object: {_excerpt(line)}")
        kind = raw.get("type")
        obj = raw["object"]
        if kind == "ERROR":
            # A Status that does not validate is still an error ending the watch.
            return WatchFailed(Status(message=str(obj.get("message", "")), code=_int(obj.get("code"))))
        if kind not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
            raise WireError(f"unknown watch event type {kind!r}: {_excerpt(line)}")
        key, rv = self._raw_key(obj)
        if kind == "DELETED":
            return Deleted(key, rv)  # the object is gone whatever its content
        return Rejected(kind, key, rv, self._problem(obj, key))

    # --- lists ---------------------------------------------------------------------------

    def list_page(self, body: bytes) -> ListPage:
        # Hundreds of new objects trigger the cyclic GC over and over, scanning everything
        # held: more than half the parse time. The models have no cycles; pause it here.
        with _gc_paused():
            try:
                parsed = self._list.validate_json(body)
            except ValidationError:
                return self._list_slow(body)
        meta = parsed.metadata
        items = tuple(parsed.items or ())
        return ListPage(items, (), meta.resource_version, meta.continue_ or None, meta.remaining_item_count)

    def _list_slow(self, body: bytes) -> ListPage:
        raw = _loads(body)
        if not isinstance(raw, dict):
            raise WireError(f"{self.kind} list is not an object: {_excerpt(body)}")
        meta = ListMeta.model_validate(raw.get("metadata") or {})
        items: list[KubeObject] = []
        rejected: list[Rejected] = []
        for item in raw.get("items") or ():
            if not isinstance(item, dict):
                continue
            try:
                items.append(self._model.model_validate(item))  # type: ignore[arg-type]
            except ValidationError:
                key, rv = self._raw_key(item)
                rejected.append(Rejected("LIST", key, rv, self._problem(item, key)))
        return ListPage(tuple(items), tuple(rejected), meta.resource_version, meta.continue_ or None,
                        meta.remaining_item_count)

    # --- helpers ---------------------------------------------------------------------------

    def _raw_key(self, obj: dict[str, Any]) -> tuple[ObjectKey, str]:
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        namespace = "" if self._cluster_scoped else str(meta.get("namespace") or "default")
        return (namespace, str(meta.get("name") or "")), str(meta.get("resourceVersion") or "")

    def _problem(self, obj: dict[str, Any], key: ObjectKey) -> str:
        name = f"{key[0]}/{key[1]}" if key[0] else key[1]
        try:
            self._model.model_validate(obj)
        except ValidationError as exc:
            return f"{self.kind} {name}: {describe_validation_error(exc)}"
        return f"{self.kind} {name}: invalid"  # pragma: no cover - validated above


def describe_validation_error(exc: ValidationError) -> str:
    """'spec.ports[0].protocol: Input should be ...' for the first error, + how many more."""
    errors = exc.errors()
    first = errors[0]
    path = ""
    for part in first["loc"]:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    text = f"{path or '(object)'}: {first['msg']}"
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more)"
    return text


@contextlib.contextmanager
def _gc_paused():
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _loads(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:
        raise WireError(f"not JSON ({exc}): {_excerpt(data)}") from None


def _excerpt(data: bytes, limit: int = 120) -> str:
    text = data[:limit].decode("utf-8", "replace")
    return text + ("..." if len(data) > limit else "")


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0

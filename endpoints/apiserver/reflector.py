"""client-go's reflector rules, pure: which resourceVersion a list asks for, whether it
pages, and what an error status means for the next attempt (``tools/cache/reflector.go``).

The informer (:mod:`.informer`) does the I/O; everything it decides from a resourceVersion
or an error status is here, tested table-driven, with the vocabulary of its loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from kubeport.endpoints.apiserver.wire import ObjectKey, Status, is_too_large_resource_version
from kubeport.endpoints.model import KubeObject


def list_resource_version(last_seen: str, unavailable: bool) -> str:
    """client-go's ``relistResourceVersion``: "0" for the first list (served from the watch
    cache), the last version seen for a relist (not older than it), "" (the latest, from
    etcd) once the server said that version is gone or too large."""
    if unavailable:
        return ""
    return last_seen or "0"


def watch_list_resource_version(last_seen: str, unavailable: bool) -> str:
    """client-go's ``rewatchResourceVersion``, for a streaming list: "" at first."""
    return "" if unavailable else last_seen


def page_limit(resource_version: str, page_size: int) -> int:
    """The first page's ``limit``. At a given version the watch cache serves a list whole
    only without a limit (it ignores the limit for "0"), so client-go drops paging for
    those relists rather than send them to etcd; "" and "0" page."""
    return page_size if resource_version in ("", "0") else 0


def list_params(selector: dict[str, str], *, resource_version: str, limit: int,
                continue_token: str | None) -> dict[str, str]:
    """One list request's query; a continued list names no resourceVersion (the token holds it)."""
    params = dict(selector)
    if limit:
        params["limit"] = str(limit)
    if continue_token:
        params["continue"] = continue_token
    elif resource_version:
        params["resourceVersion"] = resource_version
    return params


def version_unavailable(code: int, status: Status | None) -> bool:
    """410 Gone/Expired, or a resourceVersion newer than the server has: list again."""
    return code == 410 or is_too_large_resource_version(code, status)


@dataclass(frozen=True, slots=True)
class Reaction:
    """What an error status means for the next attempt."""

    #: list again before watching
    relist: bool = False
    #: ...at resourceVersion "": the version held is not there (client-go's
    #: setIsLastSyncResourceVersionUnavailable)
    unavailable: bool = False
    #: an operator must act (credentials, RBAC, a missing API)
    problem: bool = False
    #: the server's Retry-After, a floor on the backoff (None: ignore it)
    retry_after: float | None = None


def react(code: int, status: Status | None, *, verb: str, retry_after: float | None) -> Reaction:
    """client-go's reflector: a watch ending with a 4xx relists; 410 on a watch relists at
    the last version (the watch cache holds newer ones), a too-large version or a failed
    list at "". Retry-After counts for 429 and 5xx (client-go's ``checkWait``)."""
    floor = retry_after if code == 429 or code >= 500 else None
    if version_unavailable(code, status):
        return Reaction(relist=True, unavailable=code != 410 or verb == "list", retry_after=floor)
    if code in (401, 403, 404):
        return Reaction(problem=True)
    relist = verb == "watch" and 400 <= code < 500 and code != 429
    return Reaction(relist=relist, retry_after=floor)


@dataclass(frozen=True, slots=True)
class WatchListFailure:
    """What a failed streaming list means (client-go's ``fallbackToList``)."""

    #: list + watch this round
    fall_back: bool
    #: ...and from now on, for this connection: the failure is the feature's
    remember: bool = False
    #: list at "" (the version held is gone or not there yet)
    unavailable: bool = False


def watch_list_failure(code: int | None, status: Status | None, *, answered: bool) -> WatchListFailure:
    """client-go's reflector falls back to a plain list on any error of a watch-list attempt
    ("making progress is better than deadlocking"). ``code`` is the HTTP status or the
    Status of an ERROR event (None: the stream ended or stalled before its end bookmark,
    or a line did not parse); ``answered`` is False when the server could not be reached.

    Remembered are the failures that come from the server and concern the streaming list:
    a rejection (422/400 without the WatchList feature), a 500 (an etcd without progress
    notifications), any other error status or ERROR event, an early end, a stall. Not: an
    unreachable server (a list would fail alike; retried after the backoff), 401/403/404
    (reported as they are: a list gets the same answer), a gone or too large version (that
    round lists, at "")."""
    if not answered or code in (401, 403, 404):
        return WatchListFailure(fall_back=False)
    if code is not None and version_unavailable(code, status):
        return WatchListFailure(fall_back=True, unavailable=True)
    return WatchListFailure(fall_back=True, remember=True)


# --- the informer's vocabulary --------------------------------------------------------------


class Sink(Protocol):
    """What the informer writes to (ClusterState)."""

    def upsert(self, obj: KubeObject) -> None: ...
    def delete(self, kind: str, namespace: str, name: str) -> None: ...
    def keys(self, kind: str) -> set[tuple[str, str]]: ...
    def mark_synced(self, kind: str) -> None: ...
    def commit(self) -> Any: ...


@dataclass
class Listing:
    """What a list or a watch-list's initial events delivered so far. Objects are applied as
    they arrive (newer states, never older); what vanished is deleted at the end."""

    seen: set[ObjectKey] = field(default_factory=set)
    problems: dict[ObjectKey, str] = field(default_factory=dict)


class Relist(Exception):
    """The held resourceVersion is gone (410: ``expired``) or not there yet (``too_large``):
    list again; ``unavailable``: not at that version either (``resourceVersion=""``)."""

    def __init__(self, reason: str, *, unavailable: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.unavailable = unavailable


class Restart(Exception):
    """The watch stream ended abnormally; ``reason`` names how (cut, stall)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason

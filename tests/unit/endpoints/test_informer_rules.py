"""client-go's reflector rules (endpoints/apiserver/reflector.py), table-driven: the resourceVersion a
list asks for, its paging, and what an error status means for the next attempt.

Sources: k8s.io/client-go/tools/cache/reflector.go (relistResourceVersion,
rewatchResourceVersion, isTooLargeResourceVersionError, the pager's PageSize rules) and
tools/pager (a continued list names no resourceVersion).
"""

from __future__ import annotations

import pytest

from kubeport.endpoints.apiserver.wire import Status, StatusCause, StatusDetails, is_too_large_resource_version
from kubeport.endpoints.apiserver.reflector import (
    Reaction,
    WatchListFailure,
    list_params,
    list_resource_version,
    page_limit,
    react,
    version_unavailable,
    watch_list_failure,
    watch_list_resource_version,
)


def _status(code: int, reason: str = "", message: str = "", causes: tuple[tuple[str, str], ...] = (),
            retry: int | None = None) -> Status:
    details = StatusDetails(causes=[StatusCause(reason=r, message=m) for r, m in causes], retry_after_seconds=retry)
    return Status(code=code, reason=reason, message=message, details=details)


TOO_LARGE = _status(504, "Timeout", "Too large resource version: 2000, current: 1010",
                    (("ResourceVersionTooLarge", "Too large resource version"),), retry=1)


@pytest.mark.parametrize("last_seen, unavailable, expected", [
    ("", False, "0"),
    ("1234", False, "1234"),
    ("1234", True, ""),
    ("", True, ""),
], ids=["first_list_from_watch_cache__rv0", "relist_not_older_than_last_seen",
        "unavailable_lists_latest_from_etcd", "unavailable_before_first_list"])
def test_list_resource_version__relistResourceVersion(last_seen, unavailable, expected):
    assert list_resource_version(last_seen, unavailable) == expected


@pytest.mark.parametrize("last_seen, unavailable, expected", [
    ("", False, ""), ("1234", False, "1234"), ("1234", True, ""),
], ids=["first_watch_list_latest", "rewatch_list_not_older_than_last_seen", "unavailable_latest"])
def test_watch_list_resource_version__rewatchResourceVersion(last_seen, unavailable, expected):
    assert watch_list_resource_version(last_seen, unavailable) == expected


@pytest.mark.parametrize("resource_version, page_size, expected", [
    ("0", 500, 500),
    ("", 500, 500),
    ("1234", 500, 0),
    ("0", 0, 0),
], ids=["rv0_pages__watch_cache_ignores_limit", "etcd_list_pages", "relist_at_rv_whole_from_watch_cache",
        "paging_off"])
def test_page_limit__client_go_pager_page_size(resource_version, page_size, expected):
    assert page_limit(resource_version, page_size) == expected


@pytest.mark.parametrize("resource_version, limit, token, expected", [
    ("0", 500, None, {"limit": "500", "resourceVersion": "0"}),
    ("0", 500, "tok", {"limit": "500", "continue": "tok"}),
    ("1234", 0, None, {"resourceVersion": "1234"}),
    ("", 500, None, {"limit": "500"}),
    ("0", 0, None, {"resourceVersion": "0"}),
], ids=["first_page", "continued_page_names_no_rv__pager", "relist_at_rv", "latest_from_etcd",
        "full_list_if_expired_keeps_rv"])
def test_list_params(resource_version, limit, token, expected):
    selector = {"fieldSelector": "metadata.name=node-a"}
    assert list_params(selector, resource_version=resource_version, limit=limit, continue_token=token) == {
        **selector, **expected}


@pytest.mark.parametrize("code, status, expected", [
    (504, TOO_LARGE, True),
    (504, _status(504, "Timeout", "x", (("ResourceVersionTooLarge", ""),)), True),
    (500, _status(500, "InternalError", "x", (("ResourceVersionTooLarge", ""),)), True),
    (504, _status(504, "Timeout", "x", (("", "Too large resource version"),)), True),
    (504, _status(504, "Timeout", "Too large resource version: 5, current: 3"), True),
    (504, _status(504, "Timeout", "request timed out"), False),
    (500, _status(500, "InternalError", "Too large resource version"), False),
    (504, None, False),
], ids=["cause_reason__1_19_plus", "cause_reason_only", "cause_reason_any_code", "cause_message__1_17_to_1_18",
        "message__before_1_17", "other_timeout", "message_needs_timeout", "no_status_html_proxy"])
def test_is_too_large_resource_version__isTooLargeResourceVersionError(code, status, expected):
    assert is_too_large_resource_version(code, status) is expected


@pytest.mark.parametrize("code, status, verb, retry_after, expected", [
    (410, _status(410, "Expired"), "watch", None, Reaction(relist=True)),
    (410, _status(410, "Expired"), "list", None, Reaction(relist=True, unavailable=True)),
    (504, TOO_LARGE, "watch", 1.0, Reaction(relist=True, unavailable=True, retry_after=1.0)),
    (429, _status(429, "TooManyRequests"), "watch", 3.0, Reaction(retry_after=3.0)),
    (503, _status(503, "ServiceUnavailable"), "watch", 5.0, Reaction(retry_after=5.0)),
    (500, _status(500, "InternalError"), "watch", None, Reaction()),
    (400, _status(400, "BadRequest"), "watch", 7.0, Reaction(relist=True)),
    (400, _status(400, "BadRequest"), "list", None, Reaction()),
    (401, _status(401, "Unauthorized"), "watch", None, Reaction(problem=True)),
    (403, _status(403, "Forbidden"), "list", None, Reaction(problem=True)),
    (404, None, "watch", None, Reaction(problem=True)),
], ids=["watch_410_relists_at_last_rv__isExpiredError", "list_410_lists_latest",
        "too_large_relists_latest__setIsLastSyncResourceVersionUnavailable", "429_retry_after_floor",
        "5xx_retry_after_floor__checkWait", "500_backs_off_resumes", "watch_4xx_relists",
        "list_4xx_retried", "401_reported", "403_reported", "404_reported"])
def test_react_to_an_error_status(code, status, verb, retry_after, expected):
    assert react(code, status, verb=verb, retry_after=retry_after) == expected


def test_version_unavailable_is_410_or_too_large():
    assert version_unavailable(410, None) and version_unavailable(504, TOO_LARGE)
    assert not version_unavailable(504, _status(504, "Timeout", "etcdserver: request timed out"))


NO_PROGRESS_NOTIFY = _status(500, "InternalError", "a watch stream was requested by the client but the required "
                             "storage feature RequestWatchProgress is disabled")
FALL_BACK = WatchListFailure(fall_back=True, remember=True)


@pytest.mark.parametrize("code, status, answered, expected", [
    (500, NO_PROGRESS_NOTIFY, True, FALL_BACK),
    (422, _status(422, "Invalid", "sendInitialEvents: Forbidden"), True, FALL_BACK),
    (400, _status(400, "BadRequest"), True, FALL_BACK),
    (503, _status(503, "ServiceUnavailable"), True, FALL_BACK),
    (429, _status(429, "TooManyRequests"), True, FALL_BACK),
    (None, None, True, FALL_BACK),
    (410, _status(410, "Expired"), True, WatchListFailure(fall_back=True, unavailable=True)),
    (504, TOO_LARGE, True, WatchListFailure(fall_back=True, unavailable=True)),
    (504, None, True, FALL_BACK),
    (401, _status(401, "Unauthorized"), True, WatchListFailure(fall_back=False)),
    (403, _status(403, "Forbidden"), True, WatchListFailure(fall_back=False)),
    (404, None, True, WatchListFailure(fall_back=False)),
    (None, None, False, WatchListFailure(fall_back=False)),
], ids=["etcd_without_progress_notify__cacher_RequestWatchProgress", "feature_off_422", "feature_off_400",
        "any_5xx", "429", "ended_or_stalled_before_the_end_bookmark", "gone_version_lists_latest_this_round",
        "too_large_lists_latest_this_round", "timeout_not_too_large", "401_reported", "403_reported",
        "404_reported", "unreachable_retried_as_is"])
def test_any_error_of_a_streaming_list_falls_back__fallbackToList(code, status, answered, expected):
    """client-go: "falling back to the standard LIST/WATCH semantics because making progress is
    better than deadlocking"; kubeport remembers it when the failure is the feature's."""
    assert watch_list_failure(code, status, answered=answered) == expected

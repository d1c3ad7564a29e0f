"""The shapes of a real kube-apiserver's output, for the fake server: resources, Status
objects (with the real messages), watch-event lines, bookmarks, continue tokens, lists."""

from __future__ import annotations

import base64
import json
from typing import Any

# plural -> (group, version, kind, namespaced)
RESOURCES: dict[str, tuple[str, str, str, bool]] = {
    "services": ("", "v1", "Service", True),
    "endpointslices": ("discovery.k8s.io", "v1", "EndpointSlice", True),
    "nodes": ("", "v1", "Node", False),
    "namespaces": ("", "v1", "Namespace", False),
    "pods": ("", "v1", "Pod", True),
    "configmaps": ("", "v1", "ConfigMap", True),
    # networking.k8s.io/v1 since 1.33 (KEP-1880; v1beta1 in 1.31-1.32), cluster-scoped
    "servicecidrs": ("networking.k8s.io", "v1", "ServiceCIDR", False),
}
PLURALS = {kind: plural for plural, (_, _, kind, _) in RESOURCES.items()}
EXPIRED_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new "
    "list without the continue parameter, or use the continue token in this response to retrieve the "
    "remainder of the results. Continuing with the provided token results in an inconsistent list - objects "
    "that were created, modified, or deleted between the time the first chunk was returned and now may show "
    "up in the list."
)
WATCH_LIST_DISABLED = "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"
# The zero value of each kind's other fields, as a bookmark object prints them.
_BOOKMARK_BODY: dict[str, dict[str, Any]] = {
    "EndpointSlice": {"addressType": "", "endpoints": None},
    "Service": {"spec": {}, "status": {"loadBalancer": {}}},
    "Node": {"spec": {}, "status": {"daemonEndpoints": {"kubeletEndpoint": {"Port": 0}}, "nodeInfo": {}}},
    "Namespace": {"spec": {}, "status": {}},
    "ConfigMap": {},  # data and binaryData are omitempty
    "ServiceCIDR": {"spec": {}, "status": {}},
}


def api_version(plural: str) -> str:
    group, version, _, _ = RESOURCES[plural]
    return f"{group}/{version}" if group else version


def status(code: int, reason: str, message: str, details: dict | None = None,
           metadata: dict | None = None) -> dict[str, Any]:
    """A metav1.Status as the API server serializes it (field order included)."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": metadata or {},
                            "status": "Failure", "message": message, "reason": reason}
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def injected_status(code: int, retry_after: int | None) -> dict[str, Any]:
    if code == 429:
        return status(429, "TooManyRequests", "Too many requests, please try again later.",
                      {"retryAfterSeconds": retry_after or 1})
    if code == 500:
        return status(500, "InternalError", "Internal error occurred: etcdserver: request timed out",
                      {"causes": [{"message": "etcdserver: request timed out"}]})
    if code == 503:
        return status(503, "ServiceUnavailable", "the server is currently unable to handle the request")
    if code == 410:
        return status(410, "Expired", "The resourceVersion for the provided watch is too old.")
    return status(code, "BadRequest", f"injected {code}")


def forbidden(plural: str, verb: str, user: str) -> dict[str, Any]:
    group = RESOURCES[plural][0]
    qualified = f"{plural}.{group}" if group else plural
    message = (f'{qualified} is forbidden: User "{user}" cannot {verb} resource "{plural}" '
               f'in API group "{group}" at the cluster scope')
    return status(403, "Forbidden", message, {"group": group, "kind": plural} if group else {"kind": plural})


def watch_list_rejected() -> dict[str, Any]:
    return status(422, "Invalid", f'ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: '
                                  f"{WATCH_LIST_DISABLED}",
                  {"group": "meta.k8s.io", "kind": "ListOptions", "causes": [
                      {"reason": "FieldValueForbidden", "message": f"Forbidden: {WATCH_LIST_DISABLED}",
                       "field": "sendInitialEvents"}]})


def event_line(event_type: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"


def bookmark_line(plural: str, resource_version: int, initial_end: bool = False) -> bytes:
    kind = RESOURCES[plural][2]
    metadata: dict[str, Any] = {"resourceVersion": str(resource_version), "creationTimestamp": None}
    if initial_end:
        metadata["annotations"] = {"k8s.io/initial-events-end": "true"}
    obj = {"kind": kind, "apiVersion": api_version(plural), "metadata": metadata, **_BOOKMARK_BODY[kind]}
    return event_line("BOOKMARK", obj)


def encode_continue(resource_version: int, start: str) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": resource_version, "start": start}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    state = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    return state["rv"], state["start"]


def list_body(plural: str, items: list[dict[str, Any]], metadata: dict[str, Any]) -> dict[str, Any]:
    """<Kind>List: items carry neither kind nor apiVersion in a real list response."""
    return {"kind": f"{RESOURCES[plural][2]}List", "apiVersion": api_version(plural), "metadata": metadata,
            "items": [{k: v for k, v in obj.items() if k not in ("kind", "apiVersion")} for obj in items]}

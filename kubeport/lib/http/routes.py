"""Routes: exact paths and ``{name}`` patterns with their methods, matched as Go's ServeMux
(404 for an unknown path, 405 with ``Allow`` for a known one with another method)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from kubeport.lib.http.request import Request
from kubeport.lib.http.response import TEXT_PLAIN, Response

Handler = Callable[[Request], Awaitable[Response]]

NOT_FOUND = Response(404, b"404 page not found\n",
                     (("Content-Type", TEXT_PLAIN), ("X-Content-Type-Options", "nosniff")))


@dataclass(frozen=True, slots=True)
class _Route:
    methods: frozenset[str] | None
    segments: tuple[str, ...]
    handler: Handler


class Routes:
    """Exact paths, and paths with ``{name}`` segments (one non-empty segment each); methods.

    A route for GET answers HEAD too (Go's ServeMux); ``methods=None`` answers any method.
    Exact paths win over patterns; patterns match in the order added.
    """

    def __init__(self) -> None:
        self._exact: dict[str, list[_Route]] = {}
        self._patterns: list[_Route] = []

    def add(self, path: str, handler: Handler, methods: Iterable[str] | None = ("GET",)) -> None:
        allowed = None if methods is None else frozenset(methods)
        if allowed is not None and "GET" in allowed:
            allowed = allowed | {"HEAD"}
        segments = tuple(path.split("/"))
        route = _Route(allowed, segments, handler)
        if any(_is_parameter(segment) for segment in segments):
            self._patterns.append(route)
        else:
            self._exact.setdefault(path, []).append(route)

    def match(self, method: str, path: str) -> tuple[Handler, dict[str, str]] | Response:
        """The handler for ``method path`` and its parameters, or the 404/405 to answer."""
        allowed: set[str] = set()
        for route in self._exact.get(path, ()):
            if route.methods is None or method in route.methods:
                return route.handler, {}
            allowed |= route.methods
        segments = path.split("/")
        for route in self._patterns:
            params = _match_segments(route.segments, segments)
            if params is None:
                continue
            if route.methods is None or method in route.methods:
                return route.handler, params
            allowed |= route.methods
        if allowed:
            return Response(405, b"Method Not Allowed\n", (
                ("Allow", ", ".join(sorted(allowed))), ("Content-Type", TEXT_PLAIN),
                ("X-Content-Type-Options", "nosniff")))
        return NOT_FOUND


def _is_parameter(segment: str) -> bool:
    return len(segment) > 2 and segment.startswith("{") and segment.endswith("}")


def _match_segments(pattern: Sequence[str], segments: Sequence[str]) -> dict[str, str] | None:
    if len(pattern) != len(segments):
        return None
    params: dict[str, str] = {}
    for want, got in zip(pattern, segments):
        if _is_parameter(want):
            if not got:
                return None
            params[want[1:-1]] = got
        elif want != got:
            return None
    return params


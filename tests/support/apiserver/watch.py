"""The watch side of the fake kube-apiserver (server.py): its open watches and the
stream each one writes, as a real server's watch looks to a client.

A watch is a chunked response of JSON event lines: a prelude the server decides from its
store, then the events published while the watch is open, BOOKMARKs on a quiet stream
(when the client allows them), a clean end at ``timeoutSeconds`` (or at the server's own
watch timeout), and the misbehaviours tests inject: an event cut mid-line, a silent
stream, an ERROR event then the end. Also the ``fieldSelector`` both lists and watches use.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from .shapes import bookmark_line

#: A parsed fieldSelector: (path of the field, value), or None for every object.
#: conditions that must all hold: (field path, value) each; None selects everything
Selector = tuple[tuple[tuple[str, ...], str], ...] | None
#: the fields the real API server selects on for the resources served (spec.nodeName: Pods)
FIELDS = ("metadata.name", "metadata.namespace", "spec.nodeName")


def parse_selector(text: str | None) -> Selector:
    if not text:
        return None
    field_name, sep, value = text.partition("=")
    if not sep or field_name not in FIELDS:
        raise ValueError(f'"{field_name}" is not a known field selector: only '
                         + ", ".join(f'"{known}"' for known in FIELDS))
    return ((tuple(field_name.split(".")), value),)


def in_namespace(selector: Selector, namespace: str | None) -> Selector:
    """A namespaced request (``/api/v1/namespaces/NS/PLURAL``) sees that namespace's objects
    only: the registry lists the key prefix of that namespace
    (staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go NamespaceKeyFunc)."""
    if namespace is None:
        return selector
    return (*(selector or ()), (("metadata", "namespace"), namespace))


def selected(obj: dict[str, Any], selector: Selector) -> bool:
    if selector is None:
        return True
    for path, wanted in selector:
        value: Any = obj
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        if value != wanted:
            return False
    return True


class WatchedServer(Protocol):
    """What open streams read from their server while they run: its resourceVersion now
    (for bookmarks) and its settings, which a test may change at any time."""

    rv: int
    bookmark_interval: float | None
    watch_timeout: float | None


@dataclass(eq=False)
class Watch:
    plural: str
    selector: Selector
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    cut_next: bool = False
    stalled: bool = False


class WatchStreams:
    """The open watches of one server; each is fed through its queue of
    ("event", line) | ("bookmark",) | ("end",) | ("stop",) items."""

    def __init__(self, server: WatchedServer) -> None:
        self._server = server
        self._watches: set[Watch] = set()

    def of(self, plural: str) -> list[Watch]:
        return [w for w in self._watches if w.plural == plural]

    def publish(self, plural: str, line: bytes, obj: dict[str, Any]) -> None:
        for watch in self.of(plural):
            if selected(obj, watch.selector):
                watch.queue.put_nowait(("event", line))

    def stop_all(self) -> None:
        for watch in list(self._watches):
            watch.queue.put_nowait(("stop",))

    async def serve(self, request: web.Request, watch: Watch, prelude: list[bytes], closing: bool,
                    params: dict[str, str]) -> web.StreamResponse:
        """Write ``prelude``, then (unless ``closing``) stream ``watch`` until it ends.

        The watch is registered before the first await: called right after the prelude was
        decided, no event published in between is missed."""
        if not closing:
            self._watches.add(watch)
        response = web.StreamResponse(headers={"Content-Type": "application/json",
                                               "Cache-Control": "no-cache, private"})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            if prelude:
                await response.write(b"".join(prelude))
            if not closing:
                await self._stream(request, response, watch, params)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._watches.discard(watch)
        return response

    async def _stream(self, request: web.Request, response: web.StreamResponse, watch: Watch,
                      params: dict[str, str]) -> None:
        server = self._server
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(int(params.get("timeoutSeconds") or 1800), server.watch_timeout or 1800)
        bookmarks = params.get("allowWatchBookmarks") == "true"
        while True:
            timeout = deadline - loop.time()
            if bookmarks and server.bookmark_interval is not None:
                timeout = min(timeout, server.bookmark_interval)
            if timeout <= 0:
                return  # timeoutSeconds reached: a clean end of the stream
            try:
                item = await asyncio.wait_for(watch.queue.get(), timeout)
            except TimeoutError:
                item = ("bookmark",) if loop.time() < deadline else ("end",)
            if item[0] in ("stop", "end"):
                return
            if watch.stalled or (item[0] == "bookmark" and not bookmarks):
                continue
            line = item[1] if item[0] == "event" else bookmark_line(watch.plural, server.rv)
            if watch.cut_next:
                await response.write(line[: len(line) // 2])
                request.transport.close()  # no terminating chunk: the client sees a cut
                return
            await response.write(line)

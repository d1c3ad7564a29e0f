"""An in-process kube-apiserver that speaks the real list/watch protocol, on 127.0.0.1 only.

Each behaviour, and where the real one comes from (paths in kubernetes/kubernetes):

- lists: ``kind: <Kind>List``, ``metadata.resourceVersion`` as a string, paging with
  ``limit`` and an opaque ``continue`` token (base64 JSON, as
  staging/src/k8s.io/apiserver/pkg/storage/continue.go encodes it) over a consistent
  snapshot, ``remainingItemCount``; items without kind/apiVersion (the list's own
  serialisation); ``fieldSelector`` metadata.name; the namespaced path
  ``/api/v1/namespaces/NS/PLURAL`` (ConfigMaps in kube-system); an expired token gets 410 Expired with the
  message of storage/errors.go. Objects as the server stores them (objects.py: uid,
  creationTimestamp, managedFields, defaults the API server fills in).
- watches: chunked JSON lines ``{"type":...,"object":...}`` (endpoints/handlers/watch.go);
  ADDED/MODIFIED/DELETED replayed from a history after ``resourceVersion``; BOOKMARKs when
  allowed, about every minute on a quiet watch (the watch cache's bookmark timer,
  storage/cacher/cacher.go); the clean end of a watch at ``timeoutSeconds`` or at the
  server's own limit (``--min-request-timeout``: 30-60 min, endpoints/handlers/get.go);
  ``ERROR`` with a 410 Expired Status for a version older than the watch cache holds
  (storage/cacher/watch_cache.go, sent through cacher.go's newErrWatcher).
- watch-list (``sendInitialEvents=true``, KEP-3157) ended by the BOOKMARK annotated
  ``k8s.io/initial-events-end``; its rejection when the WatchList feature is off (422
  Invalid, the message of endpoints/handlers/get.go's validation); on an etcd without
  progress notifications (before 3.4.31 / 3.5.13) the 500 InternalError ERROR event "the
  required storage feature RequestWatchProgress is disabled" (cacher.go Watch).
- a restart (``go_down`` / ``come_up``): connections refused meanwhile; the new watch cache
  starts at the current revision, so a watch from an older version gets the 410 ERROR event;
  with compaction a list at such a version fails with 410 too (etcd3/store.go GetList). A
  graceful stop (``graceful_stop``): the listener closes at once, open watches go on for the
  shutdown timeout (60 s), then are cut (server/genericapiserver.go). An upgrade changes what
  ``/version`` answers (server/routes/version.go).
- authentication and authorisation: bearer tokens and client certificates (401 Unauthorized
  otherwise, as authentication/request/bearertoken and x509 answer; a token that is
  replaced, as a bound service-account token is when it rotates, is refused from then on);
  RBAC denial: 403 with the real message (endpoints/handlers/responsewriters/errors.go
  forbiddenMessage); 429 Too Many Requests with Retry-After (API Priority and Fairness,
  server/filters/priority-and-fairness.go); a 500; "Too large resource version" (504, with
  Retry-After 1: storage/errors.go NewTooLargeResourceVersionError).
- the faults a network or a proxy in front of it causes: a connection cut mid-line, a
  silent stream, a request held before its response headers, a streaming list that ends
  before its end bookmark, a client certificate no longer accepted.

This module holds the store, lists, faults and authentication; the open watches and the
stream each one writes are in watch.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .shapes import (
    EXPIRED_CONTINUE,
    PLURALS,
    RESOURCES,
    bookmark_line,
    decode_continue,
    encode_continue,
    event_line,
    forbidden,
    injected_status,
    list_body,
    status,
    watch_list_rejected,
)
from .watch import Selector, Watch, WatchStreams, in_namespace, parse_selector, selected

DEFAULT_USER = "system:serviceaccount:kube-system:kubeport"


def too_large_status(requested: int, current: int) -> dict[str, Any]:
    """What the API server answers for a resourceVersion newer than it has (after waiting
    ~3 s for its watch cache): apiserver's storage.NewTooLargeResourceVersionError."""
    return status(504, "Timeout", f"Too large resource version: {requested}, current: {current}",
                  {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                   "retryAfterSeconds": 1})


@dataclass(frozen=True)
class Request:
    verb: str  # list | watch
    plural: str
    params: dict[str, str]


@dataclass
class _Fault:
    code: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


class FakeApiServer:
    def __init__(self, *, token: str | None = "kubeport-test-token", tls: ssl.SSLContext | None = None,
                 watch_list: bool = True, bookmark_interval: float | None = 60.0,
                 watch_timeout: float | None = None, user: str = DEFAULT_USER, progress_notify: bool = True,
                 port: int = 0, version: str = "v1.32.0") -> None:
        """
        :param watch_list: serve sendInitialEvents (else 422, as without the WatchList gate).
        :param progress_notify: etcd supports progress notifications (RequestWatchProgress);
            without, streaming lists get the API server's 500 ERROR event.
        :param port: listen on this port (0: a free one); ``come_up`` listens on it again.
        :param bookmark_interval: send a BOOKMARK on quiet watches this often (the real
            server: about every minute); None: never.
        :param watch_timeout: end every watch cleanly after this long, whatever the
            client's timeoutSeconds (the server's --min-request-timeout).
        :param version: the ``gitVersion`` ``/version`` answers; ``come_up`` may change it.
        """
        self.version = version
        self.token = token
        self.watch_list = watch_list
        self.progress_notify = progress_notify
        self.port = port
        self.bookmark_interval = bookmark_interval
        self.watch_timeout = watch_timeout
        self.expire_continue = 0
        self._end_early: dict[str, int] = defaultdict(int)
        self.user = user
        #: users (token or certificate CN) answered 401 although their credentials are valid
        self.refused_users: set[str] = set()
        self.requests: list[Request] = []
        self.rv = 1000
        self._tls = tls
        self._objects: dict[str, dict[tuple[str, str], dict]] = defaultdict(dict)
        self._history: list[tuple[int, str, str, dict]] = []
        self._compacted = 0  # watches from older versions: 410 (compaction, or a new watch cache)
        self._list_compacted = 0  # lists at older versions: 410 (etcd compacted them)
        self._snapshots: dict[tuple[str, Selector, int], list[dict]] = {}
        self._streams = WatchStreams(self)
        self._faults: dict[tuple[str, str], deque[_Fault]] = defaultdict(deque)
        self._forbidden: set[tuple[str, str]] = set()
        self._holds: dict[tuple[str, str], asyncio.Event] = {}
        self._runner: web.AppRunner | None = None
        self._draining: web.AppRunner | None = None
        self._drain_cut: asyncio.TimerHandle | None = None
        self.url = ""

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self, sock: socket.socket | None = None) -> "FakeApiServer":
        """Listen on 127.0.0.1 (a free port), or on ``sock``: a bound socket, e.g. one made
        inside another network namespace (a socket keeps the namespace it was created in)."""
        app = web.Application()
        app.router.add_get("/version", self._version)
        app.router.add_get("/api/v1/{plural}", self._handle)
        app.router.add_get("/api/v1/namespaces/{namespace}/{plural}", self._handle)
        app.router.add_get("/apis/{group}/{version}/{plural}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        if sock is None:
            site: web.BaseSite = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self._tls)
        else:
            site = web.SockSite(self._runner, sock, ssl_context=self._tls)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.port = port
        host = f"[{host}]" if ":" in host else host
        self.url = f"{'https' if self._tls else 'http'}://{host}:{port}"
        return self

    async def stop(self) -> None:
        self._streams.stop_all()
        for event in self._holds.values():
            event.set()
        await self._finish_drain()
        if self._runner is not None:
            await self._runner.cleanup()

    async def graceful_stop(self, grace: float = 60.0) -> None:
        """SIGTERM to the API server: the listener closes at once (new connections are
        refused), open watches go on and still get events, and ``grace`` seconds later the
        process exits and cuts them.

        The real sequence (staging/src/k8s.io/apiserver/pkg/server/genericapiserver.go,
        preparedGenericAPIServer.RunWithContext): after ``--shutdown-delay-duration``
        (0 by default) the HTTP server's Shutdown closes the listeners and waits for active
        requests, watches included, for ``ShutdownTimeout`` (60 s by default,
        ``--shutdown-watch-termination-grace-period`` extends it for watches); then the
        process ends. Its watch cache keeps following etcd meanwhile, so the open watches
        keep delivering what other API servers write.
        """
        runner, self._runner = self._runner, None
        if runner is None:
            return
        for site in runner.sites:
            server = getattr(site, "_server", None)  # the asyncio.Server: close its listener only
            if server is not None:
                server.close()
        self._draining = runner
        loop = asyncio.get_running_loop()
        self._drain_cut = loop.call_later(grace, lambda: asyncio.ensure_future(self._finish_drain()))

    async def _finish_drain(self) -> None:
        """The gracefully stopping process exits: what it still serves is cut."""
        if self._drain_cut is not None:
            self._drain_cut.cancel()
            self._drain_cut = None
        runner, self._draining = self._draining, None
        if runner is not None:
            self._streams.stop_all()
            await runner.cleanup()

    async def go_down(self) -> None:
        """The API server process exits: open watches end, new connections are refused."""
        await self.stop()
        self._runner = None

    async def come_up(self, *, compact: bool = False, sock: socket.socket | None = None,
                      version: str | None = None, progress_notify: bool | None = None) -> None:
        """The API server starts again on the same port (or on ``sock``, bound to it), with
        what etcd holds; a gracefully stopping one (``graceful_stop``) has exited first. An
        upgrade gives a new ``version`` (and perhaps an etcd with ``progress_notify``).

        Its watch cache is new: it is filled by a list at the current revision and holds no
        older event, so a watch from an older resourceVersion gets an ERROR event with 410
        "too old resource version: <rv> (<oldest>)" (the cacher's watchCache,
        staging/src/k8s.io/apiserver/pkg/storage/cacher/watch_cache.go, served through
        newErrWatcher in cacher.go). With ``compact``, etcd compacted its history meanwhile:
        a list at an older version that reaches etcd fails with 410 "The resourceVersion for
        the provided list is too old." (GetList in
        staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go, the message from
        etcd3/errors.go); here every list at such a version does.
        """
        await self._finish_drain()
        if version is not None:
            self.version = version
        if progress_notify is not None:
            self.progress_notify = progress_notify
        # The revision moved on meanwhile (leases, events: writes of objects not watched here).
        self.rv += 1
        self._compacted = self.rv
        self._history.clear()
        self._snapshots.clear()
        if compact:
            self._list_compacted = self.rv
        await self.start(sock)

    async def __aenter__(self) -> "FakeApiServer":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- the store ------------------------------------------------------------------------

    def apply(self, obj: dict[str, Any]) -> int:
        """Create or update (ADDED / MODIFIED); the new resourceVersion."""
        plural = PLURALS[obj["kind"]]
        key = self._key(plural, obj["metadata"])
        event = "MODIFIED" if key in self._objects[plural] else "ADDED"
        self.rv += 1
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._objects[plural][key] = obj
        self._publish(plural, event, obj)
        return self.rv

    def delete(self, kind: str, namespace: str, name: str) -> int:
        plural = PLURALS[kind]
        obj = self._objects[plural].pop((namespace if RESOURCES[plural][3] else "", name))
        self.rv += 1
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["resourceVersion"] = str(self.rv)  # as the real DELETED event carries
        self._publish(plural, "DELETED", obj)
        return self.rv

    def compact(self) -> None:
        """Forget the history (etcd compaction): older watches and continue tokens get 410."""
        self._compacted = self.rv
        self._history.clear()
        self._snapshots.clear()

    # --- faults ---------------------------------------------------------------------------

    def fail(self, plural: str, verb: str, code: int, *, times: int = 1, retry_after: int | None = None) -> None:
        """The next ``times`` requests (verb list|watch) answer this error status."""
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
        body = injected_status(code, retry_after)
        for _ in range(times):
            self._faults[(plural, verb)].append(_Fault(code, body, headers))

    def fail_too_large(self, plural: str, verb: str, *, times: int = 1) -> None:
        """The next ``times`` requests get 504 "Too large resource version" (etcd restored
        from a backup older than what the client holds)."""
        body = too_large_status(self.rv + 1000, self.rv)
        for _ in range(times):
            self._faults[(plural, verb)].append(_Fault(504, body, {"Retry-After": "1"}))

    def error_watches(self, plural: str, body: dict[str, Any]) -> None:
        """Open watches get an ERROR event with this Status, then end."""
        for watch in self._streams.of(plural):
            watch.queue.put_nowait(("event", event_line("ERROR", body)))
            watch.queue.put_nowait(("end",))

    def end_initial_events_early(self, plural: str, *, times: int = 1) -> None:
        """The next ``times`` streaming lists end cleanly before their end bookmark (a proxy
        cutting long responses at a size or time limit)."""
        self._end_early[plural] += times

    def forbid(self, plural: str, verb: str) -> None:
        self._forbidden.add((plural, verb))

    def permit(self, plural: str, verb: str) -> None:
        self._forbidden.discard((plural, verb))

    def hold(self, plural: str, verb: str) -> asyncio.Event:
        """The next such request waits until the returned event is set."""
        event = asyncio.Event()
        self._holds[(plural, verb)] = event
        return event

    def cut_watches(self, plural: str) -> None:
        """Open watches write half of their next event, then the connection is closed."""
        for watch in self._streams.of(plural):
            watch.cut_next = True

    def stall_watches(self, plural: str) -> None:
        """Open watches go silent: no event, no bookmark, no close."""
        for watch in self._streams.of(plural):
            watch.stalled = True

    def bookmark(self, plural: str) -> None:
        for watch in self._streams.of(plural):
            watch.queue.put_nowait(("bookmark",))

    def open_watches(self, plural: str) -> int:
        return len(self._streams.of(plural))

    def count(self, plural: str, verb: str) -> int:
        return sum(1 for r in self.requests if r.plural == plural and r.verb == verb)

    # --- HTTP -----------------------------------------------------------------------------

    async def _version(self, request: web.Request) -> web.Response:
        """``/version`` (staging/src/k8s.io/apiserver/pkg/server/routes/version.go): readable
        by anyone, authenticated or not (the ``system:public-info-viewer`` ClusterRole)."""
        major, minor = self.version.lstrip("v").split(".")[:2]
        return web.json_response({"major": major, "minor": minor, "gitVersion": self.version,
                                  "gitCommit": "0" * 40, "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                                  "goVersion": "go1.23.4", "compiler": "gc", "platform": "linux/amd64"})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        plural = request.match_info["plural"]
        group = request.match_info.get("group", "")
        known = RESOURCES.get(plural)
        if known is None or known[0] != group or request.match_info.get("version", "v1") != known[1]:
            return self._error(404, status(404, "NotFound", "the server could not find the requested resource",
                                          {}))
        params = dict(request.query)
        verb = "watch" if params.get("watch") in ("true", "1") else "list"
        self.requests.append(Request(verb, plural, params))
        user = self._authenticate(request)
        if user is None or user in self.refused_users:
            return self._error(401, status(401, "Unauthorized", "Unauthorized"))
        hold = self._holds.pop((plural, verb), None)
        if hold is not None:
            await hold.wait()
        if (plural, verb) in self._forbidden:
            return self._error(403, forbidden(plural, verb, user))
        if self._faults[(plural, verb)]:
            fault = self._faults[(plural, verb)].popleft()
            return self._error(fault.code, fault.body, fault.headers)
        try:
            selector = in_namespace(parse_selector(params.get("fieldSelector")),
                                    request.match_info.get("namespace"))
        except ValueError as exc:
            return self._error(400, status(400, "BadRequest", str(exc)))
        if verb == "list":
            return self._list(plural, params, selector)
        return await self._watch(request, plural, params, selector)

    def _authenticate(self, request: web.Request) -> str | None:
        header = request.headers.get("Authorization", "")
        if self.token is not None and header == f"Bearer {self.token}":
            return self.user
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        if peer:
            subject = dict(item for rdn in peer["subject"] for item in rdn)
            return subject.get("commonName")
        return None

    @staticmethod
    def _error(code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
        return web.json_response(body, status=code, headers=headers)

    # --- list -----------------------------------------------------------------------------

    def _list(self, plural: str, params: dict[str, str], selector: Selector) -> web.Response:
        limit = int(params.get("limit") or 0)
        token = params.get("continue")
        asked = params.get("resourceVersion", "")
        if not token and asked not in ("", "0") and int(asked) < self._list_compacted:
            return self._error(410, status(410, "Expired", "The resourceVersion for the provided list is too old."))
        if token:
            rv, start = decode_continue(token)
            items = self._snapshots.get((plural, selector, rv))
            if self.expire_continue > 0:
                self.expire_continue -= 1
                items = None
            if items is None:
                return self._error(410, status(410, "Expired", EXPIRED_CONTINUE, metadata={"continue": token}))
        else:
            rv, start = self.rv, ""
            items = sorted((obj for obj in self._objects[plural].values() if selected(obj, selector)),
                           key=self._etcd_key)
            if limit and len(items) > limit:
                # later pages are served from this consistent snapshot (one per kind and selector)
                self._snapshots[(plural, selector, rv)] = items
        remaining = [obj for obj in items if self._etcd_key(obj) >= start]
        page = remaining[:limit] if limit else remaining
        metadata: dict[str, Any] = {"resourceVersion": str(rv)}
        if limit and len(remaining) > limit:
            metadata["continue"] = encode_continue(rv, self._etcd_key(page[-1]) + "\x00")
            metadata["remainingItemCount"] = len(remaining) - limit
        return web.json_response(list_body(plural, page, metadata))

    # --- watch ----------------------------------------------------------------------------

    async def _watch(self, request: web.Request, plural: str, params: dict[str, str],
                     selector: Selector) -> web.StreamResponse:
        initial = params.get("sendInitialEvents") == "true"
        if initial and not self.watch_list:
            return self._error(422, watch_list_rejected())
        if initial and not self.progress_notify:
            # Cacher.Watch (staging/src/k8s.io/apiserver/pkg/storage/cacher/cacher.go): a
            # watch-list needs storage.RequestWatchProgress (etcd >= 3.4.31 / 3.5.13); without
            # it the watch is a newErrWatcher: HTTP 200, one ERROR event, a 500 InternalError
            # Status (the error is no StatusError), then the end of the stream.
            error = status(500, "InternalError", "a watch stream was requested by the client but the required "
                           "storage feature RequestWatchProgress is disabled")
            return await self._streams.serve(request, Watch(plural, selector), [event_line("ERROR", error)], True,
                                             params)
        # Decide what comes first and register (serve does, before its first await), with no
        # await in between: no event is missed.
        prelude, closing = self._prelude(plural, params, selector, initial)
        if initial and self._end_early[plural] > 0:
            self._end_early[plural] -= 1
            prelude, closing = prelude[:-1], True
        return await self._streams.serve(request, Watch(plural, selector), prelude, closing, params)

    def _prelude(self, plural: str, params: dict[str, str], selector: Selector,
                 initial: bool) -> tuple[list[bytes], bool]:
        rv_param = params.get("resourceVersion", "")
        if initial or rv_param in ("", "0"):
            # "Get State and Start at Most Recent": synthetic ADDED events for what exists.
            lines = [event_line("ADDED", obj) for _, obj in sorted(self._objects[plural].items())
                     if selected(obj, selector)]
            if initial:
                lines.append(bookmark_line(plural, self.rv, initial_end=True))
            return lines, False
        rv = int(rv_param)
        if rv < self._compacted:
            error = status(410, "Expired", f"too old resource version: {rv} ({self._compacted})")
            return [event_line("ERROR", error)], True
        return [event_line(event, obj) for at, p, event, obj in self._history
                if p == plural and at > rv and selected(obj, selector)], False

    # --- helpers --------------------------------------------------------------------------

    def _publish(self, plural: str, event: str, obj: dict[str, Any]) -> None:
        self._history.append((self.rv, plural, event, obj))
        self._streams.publish(plural, event_line(event, obj), obj)

    def _key(self, plural: str, metadata: dict[str, Any]) -> tuple[str, str]:
        return (metadata.get("namespace", "default") if RESOURCES[plural][3] else "", metadata["name"])

    @staticmethod
    def _etcd_key(obj: dict[str, Any]) -> str:
        meta = obj["metadata"]
        return f"{meta['namespace']}/{meta['name']}" if "namespace" in meta else meta["name"]


"""Informer semantics for one resource: list, then watch from the list's resourceVersion.

client-go's Reflector (``tools/cache/reflector.go``), for asyncio:

- The first list and every relist are a *replace*: every listed object is upserted as it
  arrives (page by page when paged) and, at the end, every held object no longer listed
  is deleted. ClusterState compares slim forms, so a relist after ``410 Gone``
  changes nothing that did not change.
- Streaming list (KEP-3157 watch-list: ``sendInitialEvents=true``,
  ``resourceVersionMatch=NotOlderThan``, ``allowWatchBookmarks``) when the server has it:
  the initial events are such a list, ended by the BOOKMARK annotated
  ``k8s.io/initial-events-end: "true"``. As client-go's reflector ("making progress is
  better than deadlocking"), *any* error of a streaming list falls back to a paged list
  (``limit``/``continue``) plus a watch: an error status (422/400 without the WatchList
  feature; 500 "the required storage feature RequestWatchProgress is disabled" from an API
  server on an etcd without progress notifications), an ERROR event, a stream that ends
  or stalls before the end bookmark, a malformed line. The fallback is remembered until the
  API server's version (``/version`` gitVersion, asked again at each relist) changes: an upgraded server, perhaps on a newer etcd, gets the streaming list tried
  again; a restarted kubeport tries it again too. Not remembered, as they say nothing
  about the feature: a gone or too large resourceVersion (that round lists, at ""), and
  failures to connect (the server is not there); 401, 403 and 404 are reported as they are
  (a list would get the same answer).
- A watch resumes from the last resourceVersion seen (events and bookmarks) after a
  clean end, a cut or a stall, so nothing is lost and nothing applied twice. ``410``
  (an ERROR event or the HTTP status) means that version is gone, a "Too large resource
  version" that it is not there yet: relist. Which version a list asks for, and what an
  error status means, are client-go's rules, in :mod:`.reflector`.
- Failures back off (capped exponential with jitter, short while the outage is young, see
  :mod:`.backoff`); Retry-After is a floor on the delay. A 410 / "too old resource
  version" / too large version is not a failure: the relist follows after a short jitter.
  A completed list resets the failure count. A watch whose response or next byte does not come
  within ``stall_timeout`` (a healthy watch gets a bookmark about once a minute) is given
  up and reopened.
- Changes are committed once per batch: after all the events that arrived together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from typing import Awaitable, Callable

import aiohttp

from kubeport.endpoints.apiserver.backoff import BackoffPolicy
from kubeport.endpoints.apiserver.client import ApiConnection, ApiServerConfigError, ApiStatusError
from kubeport.endpoints.apiserver.reflector import (
    Listing,
    Relist,
    Restart,
    Sink,
    WatchListFailure,
    list_params,
    list_resource_version,
    page_limit,
    react,
    version_unavailable,
    watch_list_failure,
    watch_list_resource_version,
)
from kubeport.endpoints.apiserver.resources import Resource, ResourceStats
from kubeport.endpoints.apiserver.wire import (
    Applied,
    Bookmarked,
    Deleted,
    ObjectKey,
    Rejected,
    WatchFailed,
    WireError,
    WireParser,
)
from kubeport.endpoints.model import KubeObject

log = logging.getLogger(__name__)

#: client-go asks watches to end after a random 5..10 minutes, spreading reconnects.
WATCH_TIMEOUT_RANGE = (300, 600)
#: A watch that ends cleanly this soon without a single event is a failure (client-go's
#: "very short watch"): reconnecting at once would spin against a misbehaving proxy.
SHORT_WATCH_SECONDS = 1.0
#: Failures to reach the server at all (refused, unreachable, cut before a response).
CONNECT_ERRORS = (aiohttp.ClientConnectionError, OSError, asyncio.TimeoutError)
#: Failures of one request that a retry may cure.
TRANSIENT_ERRORS = (aiohttp.ClientError, OSError, asyncio.TimeoutError, WireError)


def describe_watch_list_failure(exc: Exception) -> str:
    """How a streaming list failed, in one line for the log and `kubeport get status`."""
    if isinstance(exc, ApiStatusError):
        return f"{exc.code} {exc.reason}: {exc.message}" if exc.message else f"{exc.code} {exc.reason}".strip()
    if isinstance(exc, Restart):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class Informer:
    def __init__(
        self,
        resource: Resource,
        sink: Sink,
        connection: ApiConnection,
        *,
        backoff: BackoffPolicy,
        stall_timeout: float,
        page_size: int,
        watch_list: bool,
        on_problem: Callable[[str, str | None], None],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rand: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.resource = resource
        self.stats = ResourceStats(resource.kind)
        #: objects the server sent that do not validate (their last good version is kept)
        self.object_problems: dict[ObjectKey, str] = {}
        self._sink = sink
        self._conn = connection
        self._backoff = backoff
        self._stall_timeout = stall_timeout
        self._page_size = page_size
        self._watch_list = watch_list
        self._on_problem = on_problem
        self._sleep = sleep
        self._rand = rand
        self._clock = clock
        self._parser = WireParser(resource.kind, resource.model)
        self._rv = ""  # the last resourceVersion seen: of a list, an event or a bookmark
        self._list_due = True
        #: client-go's isLastSyncResourceVersionUnavailable: list from etcd (RV "") next.
        self._rv_unavailable = False
        self._initial: Listing | None = None  # a watch-list's initial events so far
        self._failures = 0
        self._failing_since = 0.0  # monotonic time of the first of the current failures
        #: the API server version the remembered fallback was decided on ("" unknown)
        self._fallback_version: str | None = None

    async def run(self) -> None:
        """List and watch forever; every failure is retried and the last good state kept."""
        while True:
            delay = 0.0
            try:
                if self._list_due:
                    await self._list_and_watch()
                else:
                    await self._stream(initial=False)
                self._succeeded()  # a clean end: the server's timeoutSeconds
            except Relist as exc:
                self._relist(unavailable=exc.unavailable, cause=exc.reason)
                delay = self._relist_delay(None)
            except Restart as exc:
                log.info("%s watch %s; resuming from resourceVersion %s", self.resource.plural, exc, self._rv)
                delay = self._next_delay(None)
            except ApiStatusError as exc:
                delay = self._failed(exc)
            except ApiServerConfigError as exc:  # no new session (a certificate rotated half-way)
                self.stats.failures["config"] += 1
                self._on_problem(self.resource.kind, f"{self.resource.kind}: {exc}")
                delay = self._next_delay(None)
            except TRANSIENT_ERRORS as exc:
                log.warning("%s: %s: %s", self.resource.plural, type(exc).__name__, exc)
                self.stats.failures[type(exc).__name__] += 1
                delay = self._next_delay(None)
            except Exception:
                # A bug must not end the node's data plane: keep serving, relist later.
                log.exception("%s: unexpected error; relisting after a pause", self.resource.plural)
                self.stats.failures["internal"] += 1
                self._relist(unavailable=False, cause="internal")
                delay = self._next_delay(None)
            if delay > 0:
                await self._sleep(delay)

    # --- listing ------------------------------------------------------------------------

    async def _list_and_watch(self) -> None:
        if self._watch_list and self.stats.watch_list is False:
            await self._forget_fallback_if_upgraded()
        if self._watch_list and self.stats.watch_list is not False:
            try:
                await self._stream(initial=True)
                return
            except ApiServerConfigError:
                raise
            except Exception as exc:
                if not self._list_due:
                    raise  # the initial events had ended: an error of the watch that followed
                if not self._watch_list_failed(exc):
                    raise
                if self.stats.watch_list is False and self._fallback_version is None:
                    self._fallback_version = await self._conn.server_version()
        await self._paged_list()
        await self._stream(initial=False)

    async def _paged_list(self) -> None:
        listing = Listing()
        token: str | None = None
        rv = list_resource_version(self._rv, self._rv_unavailable)
        limit = page_limit(rv, self._page_size)
        while True:
            params = list_params(self._selector(), resource_version=rv, limit=limit, continue_token=token)
            try:
                body = await self._conn.get_bytes(self.resource.path, params, verb="list")
            except ApiStatusError as exc:
                if token and exc.code == 410:
                    # The continue token expired mid-list: client-go's FullListIfExpired.
                    listing, token, limit = Listing(), None, 0
                elif rv and version_unavailable(exc.code, exc.status):
                    # client-go lists again at once, from etcd: resourceVersion "".
                    log.info("%s: list at resourceVersion %s: %s; listing the latest", self.resource.plural, rv, exc)
                    self.stats.failures[str(exc.code)] += 1
                    self._rv_unavailable = True
                    listing, token, rv, limit = Listing(), None, "", self._page_size
                else:
                    raise
                continue
            page = self._parser.list_page(body)
            for obj in page.items:
                self._apply(listing, obj, self._parser.key(obj))
            listing.problems.update((r.key, r.problem) for r in page.rejected)
            token = page.continue_token
            if not token:
                self._finish_list(listing, page.resource_version)
                return

    def _apply(self, listing: Listing, obj: KubeObject, key: ObjectKey) -> None:
        problem = self._upsert(obj, key)
        if problem is None:
            listing.seen.add(key)
        else:
            listing.problems[key] = problem

    def _upsert(self, obj: KubeObject, key: ObjectKey) -> str | None:
        """Hand one object to the state; one it cannot take is reported (the problem), not fatal."""
        try:
            self._sink.upsert(obj)
        except Exception as exc:
            name = f"{key[0]}/{key[1]}" if key[0] else key[1]
            problem = f"{self.resource.kind} {name}: not applied: {type(exc).__name__}: {exc}"
            log.error("%s (keeping the last good version)", problem)
            return problem
        return None

    def _finish_list(self, listing: Listing, resource_version: str) -> None:
        kind = self.resource.kind
        present = listing.seen | set(listing.problems)  # invalid but present: keep the last good version
        for namespace, name in self._sink.keys(kind) - present:
            self._sink.delete(kind, namespace, name)
        self.object_problems = listing.problems
        for problem in listing.problems.values():
            log.warning("%s (keeping the last good version)", problem)
        self._sink.mark_synced(kind)
        self._sink.commit()
        self._list_due = self._rv_unavailable = False
        self._succeeded()
        stats = self.stats
        if stats.lists > 0:
            stats.relists += 1
            stats.last_relist = self._clock()
        stats.lists += 1
        stats.synced = True
        stats.last_sync = self._clock()
        self._set_rv(resource_version)
        self._on_problem(kind, None)

    # --- watching -----------------------------------------------------------------------

    async def _stream(self, *, initial: bool) -> None:
        params = self._selector()
        low, high = WATCH_TIMEOUT_RANGE
        params.update(watch="true", allowWatchBookmarks="true", timeoutSeconds=str(int(low + self._rand() * (high - low))))
        if initial:
            params.update(sendInitialEvents="true", resourceVersionMatch="NotOlderThan")
        rv = watch_list_resource_version(self._rv, self._rv_unavailable) if initial else self._rv
        if rv:
            params["resourceVersion"] = rv
        async with contextlib.AsyncExitStack() as stack:
            response = await self._open_watch(stack, params)
            self.stats.watches += 1
            if initial:
                self.stats.watch_list = True
            self._on_problem(self.resource.kind, None)
            self._initial = Listing() if initial else None
            opened = time.monotonic()
            reason: str | None = "timeout"
            try:
                await self._consume(response)
            except (Relist, Restart) as exc:
                reason = exc.reason
                raise
            except asyncio.CancelledError:
                reason = None
                raise
            except Exception:
                reason = "error"
                raise
            finally:
                self._initial = None
                if reason is not None:
                    self._count_restart(reason)
                if time.monotonic() - opened >= self._backoff.reset_after:
                    self._succeeded()  # a long healthy stream: back off afresh next time

    async def _open_watch(self, stack: contextlib.AsyncExitStack, params: dict[str, str]) -> aiohttp.ClientResponse:
        """The watch response. Its headers are waited for no longer than any later read: a
        load balancer that took the connection for a hung server would hold it forever."""
        timer = asyncio.timeout(self._stall_timeout)
        try:
            async with timer:
                return await stack.enter_async_context(
                    self._conn.stream(self.resource.path, params, verb="watch"))
        except TimeoutError:
            if not timer.expired():
                raise  # the connect timeout: a connection failure, not a stall
            self._count_restart("stall")
            raise Restart("stall", f"no response for {self._stall_timeout:g}s") from None

    def _count_restart(self, reason: str) -> None:
        self.stats.watch_restarts += 1
        self.stats.restart_reasons[reason] += 1

    async def _consume(self, response: aiohttp.ClientResponse) -> None:
        pending = b""
        content = response.content
        opened = time.monotonic()
        received = False
        while True:
            try:
                async with asyncio.timeout(self._stall_timeout):
                    chunk = await content.readany()
            except TimeoutError:
                raise Restart("stall", f"no data for {self._stall_timeout:g}s") from None
            except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, ConnectionError) as exc:
                raise Restart("cut", str(exc) or type(exc).__name__) from None
            if not chunk:
                if pending.strip():
                    raise Restart("cut", "the stream ended mid-event")
                if self._initial is not None:
                    raise Restart("cut", "the stream ended before the initial events did")
                if not received and time.monotonic() - opened < SHORT_WATCH_SECONDS:
                    raise Restart("short", "a very short watch, ended with no event")
                return
            if b"\n" not in chunk:
                pending += chunk
                continue
            received = True
            # Neither the chunk nor its lines stay in this frame while it awaits the next one:
            # after the initial events they are the last large buffers read, and would stay
            # held by each watch for as long as it waits.
            pending = self._handle_batch(pending + chunk)
            chunk = b""

    def _handle_batch(self, data: bytes) -> bytes:
        """Apply the complete lines of ``data``; the incomplete last one, to be continued."""
        lines = data.split(b"\n")
        pending = lines.pop()
        changed = False
        try:
            for line in lines:
                if line.strip():
                    changed |= self._handle(line)
        finally:
            if changed:  # one commit per batch, also when a later line ends the stream
                self._sink.commit()
        return pending

    def _handle(self, line: bytes) -> bool:
        """Apply one event; True when it may have changed the state."""
        event = self._parser.event(line)
        stats = self.stats
        if isinstance(event, Bookmarked):
            stats.events["BOOKMARK"] += 1
            if self._initial is None:
                self._set_rv(event.resource_version)
            elif event.initial_events_end:
                listing, self._initial = self._initial, None
                self._finish_list(listing, event.resource_version)
            return False
        if isinstance(event, WatchFailed):
            stats.events["ERROR"] += 1
            code = event.status.code
            if version_unavailable(code, event.status):
                log.info("%s watch: %s; relisting", self.resource.plural, event.status.message)
                # A version gone while the initial events were still coming: not "at" it either.
                raise Relist("expired" if code == 410 else "too_large",
                             unavailable=code != 410 or self._initial is not None)
            raise ApiStatusError(code, event.status, verb="watch", path=self.resource.path)
        stats.events["DELETED" if isinstance(event, Deleted) else event.type] += 1
        stats.last_event = self._clock()
        if isinstance(event, Rejected):
            if self._initial is not None:
                self._initial.problems[event.key] = event.problem
                return False
            log.warning("%s (keeping the last good version)", event.problem)
            self.object_problems[event.key] = event.problem
        elif self._initial is not None:
            if isinstance(event, Applied):  # (a DELETED cannot come before the end bookmark)
                self._apply(self._initial, event.obj, event.key)
            return False
        elif isinstance(event, Applied):
            problem = self._upsert(event.obj, event.key)
            if problem is None:
                self.object_problems.pop(event.key, None)
            else:
                self.object_problems[event.key] = problem
        else:
            self._sink.delete(self.resource.kind, *event.key)
            self.object_problems.pop(event.key, None)
        self._set_rv(event.resource_version)
        return True

    # --- failures -----------------------------------------------------------------------

    def _failed(self, exc: ApiStatusError) -> float:
        """React to an error status; the delay before the next attempt."""
        self.stats.failures[str(exc.code)] += 1
        reaction = react(exc.code, exc.status, verb=exc.verb, retry_after=exc.retry_after)
        if exc.code == 404 and self.resource.optional:
            # An API server older than the resource (ServiceCIDRs before 1.33): there is none
            # to read, which is no problem; asked again at the backoff's pace (an upgrade).
            if self.stats.failures["404"] == 1:
                log.info("%s: not served by this API server (%s): none read", self.resource.plural, self.resource.path)
            return self._next_delay(reaction.retry_after)
        if reaction.problem:
            self._on_problem(self.resource.kind, self.resource.forbidden_problem(exc))
        elif exc.code != 429:
            log.log(logging.INFO if exc.code == 410 else logging.WARNING, "%s: %s%s", self.resource.plural, exc,
                    "; relisting" if reaction.relist else "")
        if reaction.relist:
            self._relist(unavailable=reaction.unavailable, cause=f"{exc.code} {exc.reason}".strip())
        if version_unavailable(exc.code, exc.status):
            return self._relist_delay(reaction.retry_after)  # a signal, not a failure
        return self._next_delay(reaction.retry_after)

    def _watch_list_failed(self, exc: Exception) -> bool:
        """A streaming list failed before its end bookmark: True to list this round
        (client-go's fallbackToList), and from now on when the failure is the feature's."""
        stats = self.stats
        if isinstance(exc, Relist):  # a gone version in an ERROR event of the initial events
            failure = WatchListFailure(fall_back=True, unavailable=True)
        elif isinstance(exc, ApiStatusError):
            failure = watch_list_failure(exc.code, exc.status, answered=True)
        else:
            failure = watch_list_failure(None, None, answered=not isinstance(exc, CONNECT_ERRORS))
        if not failure.fall_back:
            return False
        if isinstance(exc, ApiStatusError):
            stats.failures[str(exc.code)] += 1
        self._rv_unavailable |= failure.unavailable
        if failure.remember:
            reason = describe_watch_list_failure(exc)
            stats.watch_list = False
            stats.watch_list_fallback = reason
            self._fallback_version = None  # asked next, or at the next list if the server does not answer
            log.warning("%s: the streaming list failed (%s); falling back to list + watch until the API server's "
                        "version changes", self.resource.plural, reason)
        return True

    async def _forget_fallback_if_upgraded(self) -> None:
        """client-go remembers its fallback for the reflector's life; a node agent outlives
        API server upgrades, so the streaming list is tried again when the version changed."""
        version = await self._conn.server_version()
        if version is None:
            return
        if self._fallback_version is None:
            self._fallback_version = version
        elif version != self._fallback_version:
            log.info("%s: the API server is now %s (was %s); trying the streaming list again",
                     self.resource.plural, version, self._fallback_version)
            self.stats.watch_list = None
            self.stats.watch_list_fallback = ""
            self._fallback_version = None

    def _relist(self, *, unavailable: bool, cause: str) -> None:
        self._list_due = True
        self._rv_unavailable |= unavailable
        self.stats.relist_cause = cause

    def _relist_delay(self, retry_after: float | None) -> float:
        delay = self._backoff.relist_delay(self._rand(), retry_after)
        self.stats.backoff = delay
        return delay

    def _next_delay(self, retry_after: float | None) -> float:
        now = time.monotonic()
        if self._failures == 0:
            self._failing_since = now
        self._failures += 1
        delay = self._backoff.delay(self._failures, self._rand(), retry_after, outage=now - self._failing_since)
        self.stats.backoff = delay
        return delay

    def _succeeded(self) -> None:
        self._failures = 0
        self.stats.backoff = 0.0

    def _set_rv(self, resource_version: str) -> None:
        if resource_version:
            self._rv = resource_version
            self.stats.resource_version = resource_version

    def _selector(self) -> dict[str, str]:
        if self.resource.field_selector:
            return {"fieldSelector": self.resource.field_selector}
        return {}


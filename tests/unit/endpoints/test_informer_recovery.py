"""How the informer recovers, against the fake API server: responses that never come,
"Too large resource version", 410 loops, Retry-After, and the resourceVersion each list
asks for (client-go's reflector: k8s.io/client-go/tools/cache/reflector.go).

Delays are recorded by an injected sleep (which only yields), so backoff sequences are
checked exactly and nothing waits for real; every wait is on a condition with a deadline.
"""

from __future__ import annotations

import asyncio

import pytest

from kubeport.endpoints.apiserver.source import BackoffPolicy
from kubeport.endpoints.types import ServiceName

from support.apiserver import objects as k8s
from support.apiserver.harness import running, seed, snapshot_where, synced, tls  # noqa: F401 (fixtures)
from support.apiserver.server import too_large_status
from support.apiserver.shapes import status
from support.wait import until

#: jitter off: the delays are exactly 10 ms doubling; a relist after 410 waits 4 ms times rand
STEPS = BackoffPolicy(initial=0.01, cap=1.0, jitter=0.0, relist_jitter=0.004)
#: the random number of the tests that check relist delays: 2 ms before each relist
HALF = {"rand": lambda: 0.5}
EXPIRED = status(410, "Expired", "too old resource version: 1000 (1010)")
LATE = ServiceName("default", "late")


class Delays(list):
    """An injectable sleep that records each delay and only yields."""

    async def __call__(self, seconds: float) -> None:
        self.append(seconds)
        await asyncio.sleep(0)


def list_params(server, plural: str = "services") -> list[dict[str, str]]:
    return [r.params for r in server.requests if r.plural == plural and r.verb == "list"]


async def watching(server, source, state, plural: str = "services") -> None:
    """Synced, and the watch that follows the list is open (it is the list with watch-list)."""
    await synced(state, source)
    await until(lambda: server.open_watches(plural) == 1, f"the {plural} watch")


# --- responses that never come ------------------------------------------------------------------


async def test_a_watch_whose_response_headers_never_come_is_given_up_as_a_stall(running):
    """A load balancer accepted the connection for a hung API server: bounded by the stall timeout."""
    server, source, state = await running(server_options={"bookmark_interval": 0.05}, stall_timeout=0.3)
    await watching(server, source, state)
    server.hold("services", "watch")           # the reconnect gets no response headers
    server.cut_watches("services")
    server.bookmark("services")
    await until(lambda: server.count("services", "watch") == 2, "the reconnect")
    server.apply(k8s.service("late", cluster_ip="10.96.0.50"))
    await snapshot_where(state, lambda s: LATE in s.services, "the service after the stalled reconnect")
    stats = source.stats["Service"]
    assert stats.restart_reasons["stall"] == 1 and stats.relists == 0
    resumed = [r.params for r in server.requests if r.plural == "services" and r.verb == "watch"][-1]
    assert "sendInitialEvents" not in resumed and resumed["resourceVersion"]


async def test_a_streaming_list_whose_response_never_comes_falls_back_to_list__fallbackToList(running):
    """client-go's reflector falls back to a plain list on any error of a watch-list attempt."""
    server, source, state = await running(server_options={"bookmark_interval": 0.05}, stall_timeout=0.3)
    server.hold("services", "watch")           # before the source's first request
    await synced(state, source)
    await until(lambda: server.open_watches("services") == 1, "the watch after the list")
    stats = source.stats["Service"]
    assert stats.restart_reasons["stall"] == 1 and stats.lists == 1 and server.count("services", "list") == 1
    assert stats.watch_list is False and stats.watch_list_fallback.startswith("stall")
    initial = [r.params for r in server.requests if r.plural == "services" and "sendInitialEvents" in r.params]
    assert len(initial) == 1


@pytest.mark.parametrize("fault", ["500", "503", "429", "error_event", "ended_early"])
async def test_any_failure_of_a_streaming_list_falls_back_and_is_remembered__fallbackToList(running, fault):
    """client-go's reflector: any error of a watch-list attempt lists instead; kubeport keeps
    to list + watch for the connection, also over the reconnects and relists after it."""
    server, source, state = await running(server_options={"bookmark_interval": 0.05}, seeded=False)
    if fault == "error_event":
        server.progress_notify = False
    elif fault == "ended_early":
        server.end_initial_events_early("services")
    else:
        server.fail("services", "watch", int(fault), retry_after=0 if fault == "429" else None)
    seed(server)
    await watching(server, source, state)
    stats = source.stats["Service"]
    assert stats.watch_list is False and stats.watch_list_fallback
    server.error_watches("services", EXPIRED)                # a relist
    await until(lambda: stats.relists == 1 and server.open_watches("services") == 1, "the relist's watch")
    server.cut_watches("services")                           # a reconnect
    server.bookmark("services")
    await until(lambda: stats.restart_reasons["cut"] == 1 and server.open_watches("services") == 1,
                     "the reconnect")
    streaming = [r for r in server.requests if r.plural == "services" and "sendInitialEvents" in r.params]
    assert len(streaming) == 1 and server.count("services", "list") == 2


# --- "Too large resource version" -------------------------------------------------------------------


async def test_too_large_resource_version_on_a_watch_relists_the_latest__isTooLargeResourceVersionError(running):
    """etcd restored from an older backup: the held version is never coming; list at RV ""."""
    delays = Delays()
    server, source, state = await running(server_options={"watch_list": False}, backoff=STEPS, sleep=delays)
    await watching(server, source, state)
    server.fail_too_large("services", "watch")
    server.cut_watches("services")
    server.bookmark("services")
    await until(lambda: source.stats["Service"].relists == 1, "the relist")
    server.apply(k8s.service("late", cluster_ip="10.96.0.50"))
    await snapshot_where(state, lambda s: LATE in s.services, "events after the relist")
    assert list_params(server)[-1] == {"limit": "500"}     # the latest, from etcd, paged
    assert source.stats["Service"].failures["504"] == 1
    assert delays == [0.01, 1.0]                            # the cut; then Retry-After: 1 as a floor


async def test_too_large_in_a_watch_error_event_relists_the_latest(running):
    server, source, state = await running(backoff=STEPS, sleep=Delays())
    await watching(server, source, state)
    server.error_watches("services", too_large_status(5000, server.rv))
    await until(lambda: source.stats["Service"].relists == 1, "the relist")
    stats = source.stats["Service"]
    assert stats.restart_reasons["too_large"] == 1
    relist = [r.params for r in server.requests if r.plural == "services" and "sendInitialEvents" in r.params][-1]
    assert "resourceVersion" not in relist


# --- 410 and Retry-After go through the backoff ----------------------------------------------------------


async def test_persistent_410_relists_promptly__a_gone_version_is_no_failure(running):
    delays = Delays()
    server, source, state = await running(server_options={"watch_list": False}, backoff=STEPS, sleep=delays,
                                          **HALF)
    await watching(server, source, state)
    server.fail("services", "watch", 410, times=3)          # every relist's watch: 410 again
    server.error_watches("services", EXPIRED)               # a healthy stream ends with 410
    await until(lambda: source.stats["Service"].relists == 4, "four relists")
    await until(lambda: server.open_watches("services") == 1, "a watch that holds")
    # Each list succeeded: no failure backoff grows, every relist waits only its jitter.
    assert delays == [0.002] * 4
    assert source.stats["Service"].failures["410"] == 3


async def test_a_single_410_after_a_healthy_stream_relists_after_a_jitter_only(running):
    delays = Delays()
    server, source, state = await running(backoff=STEPS, sleep=delays, **HALF)
    await watching(server, source, state)
    server.error_watches("services", EXPIRED)
    await until(lambda: source.stats["Service"].relists == 1, "the relist")
    assert delays == [0.002] and source.stats["Service"].restart_reasons["expired"] == 1
    assert source.stats["Service"].relist_cause == "expired"


async def test_retry_after_zero_does_not_spin__retry_after_is_a_floor(running):
    delays = Delays()
    server, source, state = await running(backoff=STEPS, sleep=delays)
    await watching(server, source, state)
    server.fail("services", "watch", 429, times=2, retry_after=0)
    server.cut_watches("services")
    server.bookmark("services")
    await until(lambda: source.stats["Service"].failures["429"] == 2, "both 429s")
    await until(lambda: server.open_watches("services") == 1, "the watch again")
    assert delays == [0.01, 0.02, 0.04]                     # the cut, then each 429 backs off further


async def test_retry_after_above_the_backoff_is_waited_for(running):
    delays = Delays()
    server, source, state = await running(backoff=STEPS, sleep=delays)
    await watching(server, source, state)
    server.fail("services", "watch", 503, retry_after=2)
    server.cut_watches("services")
    server.bookmark("services")
    await until(lambda: server.open_watches("services") == 1 and source.stats["Service"].failures["503"],
                     "the watch again")
    assert delays == [0.01, 2.0]


# --- the resourceVersion of lists ------------------------------------------------------------------------


async def test_lists_ask_for_rv0_then_the_last_seen_then_the_latest__relistResourceVersion(running):
    server, source, state = await running(server_options={"watch_list": False}, page_size=2, backoff=STEPS,
                                          sleep=Delays())
    await watching(server, source, state)
    assert list_params(server) == [{"limit": "2", "resourceVersion": "0"}]   # the watch cache serves it
    server.bookmark("services")
    await until(lambda: source.stats["Service"].resource_version == str(server.rv), "the bookmark")
    held = source.stats["Service"].resource_version
    server.error_watches("services", EXPIRED)
    await until(lambda: source.stats["Service"].relists == 1, "the relist after 410")
    await until(lambda: server.open_watches("services") == 1, "the watch after it")
    # Not older than what was seen, whole (paging would bypass the watch cache).
    assert list_params(server)[-1] == {"resourceVersion": held}
    server.fail_too_large("services", "watch")
    server.cut_watches("services")
    server.bookmark("services")
    await until(lambda: source.stats["Service"].relists == 2, "the relist after too large")
    await until(lambda: server.open_watches("services") == 1, "the watch after it")
    assert list_params(server)[-1] == {"limit": "2"}
    server.error_watches("services", EXPIRED)                # a list succeeded: RV-based relists again
    await until(lambda: source.stats["Service"].relists == 3, "the third relist")
    assert "resourceVersion" in list_params(server)[-1]


@pytest.mark.parametrize("fault", ["410", "too_large"], ids=["list_410__expired", "list_too_large"])
async def test_a_list_at_an_unavailable_version_lists_the_latest_at_once(running, fault):
    delays = Delays()
    server, source, state = await running(server_options={"watch_list": False}, backoff=STEPS, sleep=delays,
                                          **HALF)
    await watching(server, source, state)
    if fault == "410":
        server.fail("services", "list", 410)
    else:
        server.fail_too_large("services", "list")
    held = source.stats["Service"].resource_version
    server.error_watches("services", EXPIRED)
    await until(lambda: source.stats["Service"].relists == 1, "the relist")
    assert list_params(server)[1:] == [{"resourceVersion": held}, {"limit": "500"}]
    assert delays == [0.002]                                 # the retry at "" did not wait


async def test_an_expired_continue_token_lists_whole_at_the_same_version__FullListIfExpired(running):
    server, source, state = await running(server_options={"watch_list": False}, page_size=1)
    server.expire_continue = 1
    await synced(state, source)
    [expired] = [p for p in ("services", "endpointslices", "namespaces") if len(list_params(server, p)) == 3]
    first, continued, full = list_params(server, expired)
    assert first == {"limit": "1", "resourceVersion": "0"}
    assert continued == {"limit": "1", "continue": continued["continue"]}   # a continued page names no RV
    assert full == {"resourceVersion": "0"}                                  # whole, at the same version

"""Serving, at the start of a primary instance, the last state an earlier process applied
(kept by :mod:`kubeport.survival.laststate`), until the source has synced: a restarted
daemon answers at once from what it served before, unless that is too old to trust."""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import TYPE_CHECKING

from kubeport import components, gctuning
from kubeport.config import KubeportConfiguration
from kubeport.endpoints.state import ClusterState
from kubeport.survival.laststate import LastState

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from kubeport.statusview import StatusView

log = logging.getLogger("kubeport.daemon")

#: how long the source waits for every part to serve the restored state before it starts
#: anyway (a part that cannot apply it retries meanwhile)
RESTORED_VIEW_WAIT_S = 2.0
#: serving the last applied state, how often a source that cannot be built is tried again
SOURCE_RETRY_S = 2.0


def restore_last_state(state: ClusterState, last_state: LastState, max_age: float) -> float | None:
    """Restore and commit what ``last_state`` keeps into ``state``, unless it is older than
    ``max_age`` seconds (lastStateMaxAge; 0: never). Returns the Unix time it was kept at,
    None when nothing was restored. With something restored the cyclic collector stays off
    until the parts serve it (:mod:`kubeport.gctuning`)."""
    return gctuning.restoring(lambda: _restore(state, last_state, max_age))


def _restore(state: ClusterState, last_state: LastState, max_age: float) -> float | None:
    saved = last_state.load()
    if saved is None:
        return None
    if max_age <= 0 or saved.age() > max_age:
        log.info("the last applied state in %s is from %s, older than %ss (lastStateMaxAge): not served",
                 last_state.directory, iso(saved.saved_at), f"{max_age:g}")
        return None
    state.restore(saved)
    snapshot = state.commit()
    log.info("serving the last applied state from %s (%d services) until the source has synced",
             iso(saved.saved_at), len(snapshot.services) if snapshot is not None else 0)
    return saved.saved_at


def iso(at: float) -> str:
    """A Unix time as RFC 3339 in UTC, to the second (``2026-12-04T20:30:00Z``)."""
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).isoformat(timespec="seconds").replace(
        "+00:00", "Z")


async def run_source_after_restore(config: KubeportConfiguration, state: ClusterState, registry: CollectorRegistry,
                                   view: StatusView, restored_view_applied: asyncio.Event) -> None:
    """The source of a start that serves a restored state: built once the consumers serve
    that (or after RESTORED_VIEW_WAIT_S, should one of them fail to apply it), since its
    imports and connects would hold the loop before the first answer; a source that cannot
    be built is tried again meanwhile (a volume that is not mounted yet may well come)."""
    try:
        await asyncio.wait_for(restored_view_applied.wait(), RESTORED_VIEW_WAIT_S)
    except TimeoutError:
        log.warning("the last applied state is not served by every part after %ss: starting the source",
                    RESTORED_VIEW_WAIT_S)
        gctuning.restored_view_late()
    await asyncio.get_running_loop().run_in_executor(None, components.import_source_modules, config)
    while True:
        try:
            view.source = source = components.build_source(config, state, registry, view.dns)
            break
        except components.ComponentError as exc:
            if view.source_problem != str(exc):
                log.error("%s: serving the last applied state meanwhile, trying again every %gs",
                          exc, SOURCE_RETRY_S)
            view.source_problem = str(exc)
            await asyncio.sleep(SOURCE_RETRY_S)
    if view.source_problem is not None:
        log.info("the source is built: %s", config.source_kind)
        view.source_problem = None
    await source.run()


async def keep_last_state(state: ClusterState, last_state: LastState, ready: asyncio.Event) -> None:
    """Write the last applied state from the first complete view on (``ready``): during the
    cold start its first (whole) write would compete with the start for the CPU."""
    await ready.wait()
    # Only now: the first base holds everything anyway, and recording the first sync's
    # objects one by one would leave holes in the heap.
    state.keep_in(last_state)
    try:
        await last_state.run()
    except Exception as exc:  # noqa: BLE001 - a copy that cannot be kept never stops the serving
        last_state.problem = f"cannot keep the last applied state in {last_state.directory}: {exc}"
        log.exception("%s", last_state.problem)

"""The node's addresses and nftables table put right in full, as kube-proxy's full syncs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Awaitable, Callable

log = logging.getLogger(__name__)

#: kube-proxy's proxyutil.FullSyncPeriod: its rules are rewritten in full at least this often.
FULL_SYNC_PERIOD = 3600.0
#: kube-proxy's default syncPeriod: a failed sync is retried (in full) this soon.
RETRY_PERIOD = 30.0


async def keep_host_in_sync(proxier: Any, requested: asyncio.Event, allowed: Callable[[], bool],
                            addresses_moved: Callable[[], Awaitable[None]] | None = None,
                            synced: Callable[..., None] | None = None) -> None:
    """Resync the host every FULL_SYNC_PERIOD, RETRY_PERIOD after a failure, and at once when
    ``requested`` (SIGHUP): an address or rule removed behind kubeport's back comes back.
    ``allowed()`` false (not synced yet, another instance beside this one) skips a turn.
    A SIGHUP reads the node's own addresses again too (they are otherwise followed by
    :func:`follow_node_addresses`): NodePorts follow them, then ``addresses_moved()``.
    Each resync is a full sync for the metrics: ``synced(seconds, full=True, failed=...)``."""
    loop = asyncio.get_running_loop()
    last = loop.time()
    while True:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(requested.wait(), RETRY_PERIOD)
        if requested.is_set():
            await _read_node_addresses(proxier, addresses_moved)
        if not (requested.is_set() or proxier.host_problems or loop.time() - last >= FULL_SYNC_PERIOD):
            continue
        requested.clear()
        last = loop.time()
        if not allowed():
            continue
        started = loop.time()
        failed = True
        try:
            await proxier.resync_host()
            failed = proxier.host_problems
        except Exception:  # the next period retries; a failure must not end the daemon
            log.exception("full sync of the node's addresses and nftables table failed")
        if synced is not None:
            synced(loop.time() - started, full=True, failed=failed)


async def follow_node_addresses(proxier: Any, changed: Callable[[], Awaitable[None]],
                                addresses_moved: Callable[[], Awaitable[None]] | None = None) -> None:
    """Read the node's own addresses again each time ``changed()`` returns (an address or link
    event, proxy/host/address_events.py), as kube-proxy reads them at every sync: NodePorts
    and then the health-check node ports (``addresses_moved()``) follow."""
    while True:
        await changed()
        await _read_node_addresses(proxier, addresses_moved)


async def _read_node_addresses(proxier: Any, addresses_moved: Callable[[], Awaitable[None]] | None) -> None:
    try:
        if await proxier.refresh_node_addresses() and addresses_moved is not None:
            await addresses_moved()
    except Exception:
        log.exception("reading the node's addresses again failed")

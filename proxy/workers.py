"""Relay workers: this process's Proxier plus ``workers - 1`` child processes fed the same snapshots.

Every listener is bound with SO_REUSEPORT, so each relay process opens its own socket
on every frontend and the kernel spreads new connections and UDP clients over them
(by the 4-tuple; by the client address for affinity frontends, see steering.py).
This process keeps the control plane (source, ClusterState, DNS) and everything that
exists once per node: VIP addresses and the nftables table. The children only relay:
their Proxier has no firewall, and its address manager (SharedAddresses) only reads the
node addresses this process sends.

The children are started fresh (``python -P -m kubeport.proxy.worker FD``), not forked
from a process with threads and an event loop. Each talks to this process over a
socketpair, in the messages of :mod:`.worker_messages`.

``apply`` sends only the services that changed since the last snapshot sent, and
returns once every child has applied it. Statistics come back every
``worker_stats_interval`` seconds (only what changed) and are summed per service port,
so the merged ``stats`` lag by up to that interval.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import sys
from types import MappingProxyType
from typing import Any, Awaitable, Callable, Iterable, Mapping

from kubeport.endpoints.types import ServicePortName, Snapshot
from kubeport.proxy.config import ProxyConfig
from kubeport.proxy.proxier import Proxier
from kubeport.proxy.stats import ServicePortStats
from kubeport.proxy.table import Frontend, FrontendRule
from kubeport.proxy.worker_messages import (
    SAME_NODE,
    Abort,
    Applied,
    Apply,
    Failed,
    Start,
    Started,
    Stats,
    Stop,
    Stopped,
    ToWorker,
    receive,
    send,
)

log = logging.getLogger(__name__)

class ProxyWorkerError(RuntimeError):
    """A worker process failed or exited; the message names it."""


def create_proxier(config: ProxyConfig, node_name: str, **kwargs: Any) -> "Proxier | ProxyWorkers":
    """The daemon's one call: a Proxier, or ProxyWorkers when ``config.workers`` > 1."""
    if config.workers > 1:
        return ProxyWorkers(config, node_name, **kwargs)
    return Proxier(config, node_name, **kwargs)


def _log_setup() -> tuple[bool, int]:
    """(JSON?, level) of this process's logging, for the children to match."""
    root = logging.getLogger()
    json_format = any(type(h.formatter).__name__ == "JsonFormatter" for h in root.handlers)
    return json_format, root.getEffectiveLevel()


class _Child:
    """One worker process and its channel."""

    def __init__(self, index: int, process: asyncio.subprocess.Process, reader, writer) -> None:
        self.index = index
        self.process = process
        self.reader = reader
        self.writer = writer
        self.stats: dict[ServicePortName, ServicePortStats] = {}
        self.problems: list[str] = []
        self.applied: dict[int, asyncio.Future] = {}
        self.started: asyncio.Future = asyncio.get_running_loop().create_future()
        self.stopped: asyncio.Future = asyncio.get_running_loop().create_future()
        self.reading: asyncio.Task | None = None


class ProxyWorkers:
    """Proxier's interface over N relay processes (``config.workers``), this one included."""

    def __init__(self, config: ProxyConfig, node_name: str, **kwargs: Any) -> None:
        self.config = config
        self.node_name = node_name
        self._local = Proxier(config, node_name, **kwargs)
        self._children: list[_Child] = []
        self._failed: asyncio.Future | None = None
        self._sent: Snapshot | None = None
        self._sent_addresses: tuple[str, ...] | None = None
        self._seq = 0
        self._ready = asyncio.Event()
        self._abort_forwarder: asyncio.Task | None = None

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self, extra_addresses: Iterable[str] = (),
                    reserved_frontends: Iterable[Frontend] | None = None) -> None:
        extra = tuple(extra_addresses)
        await self._local.start(extra, reserved_frontends)
        self._failed = asyncio.get_running_loop().create_future()
        json_format, level = _log_setup()
        for index in range(1, self.config.workers):
            child = await self._spawn(index)
            self._children.append(child)
            seed = None if self.config.seed is None else self.config.seed + index  # not in lockstep
            child_config = dataclasses.replace(self.config, firewall=False, seed=seed)
            await send(child.writer, Start(child_config, self.node_name, extra,
                                           tuple(self._local.reserved_frontends), index, json_format, level))
        try:
            await asyncio.gather(*(child.started for child in self._children))
        except ProxyWorkerError:
            await self.stop(0.0)
            raise
        log.info("proxy: %d relay processes share the listeners", self.config.workers)

    async def _spawn(self, index: int) -> _Child:
        parent_end, child_end = socket.socketpair()
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-P", "-m", "kubeport.proxy.worker", str(child_end.fileno()),
                pass_fds=(child_end.fileno(),),
            )
        finally:
            child_end.close()
        reader, writer = await asyncio.open_connection(sock=parent_end)
        child = _Child(index, process, reader, writer)
        child.reading = asyncio.create_task(self._read(child), name=f"proxy-worker-{index}")
        return child

    async def _read(self, child: _Child) -> None:
        while (message := await receive(child.reader)) is not None:
            match message:
                case Stats(changed, gone):
                    child.stats.update(changed)
                    for name in gone:
                        child.stats.pop(name, None)
                case Applied(seq, problems):
                    child.problems = problems
                    waiter = child.applied.pop(seq, None)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(None)
                case Started():
                    child.started.set_result(None)
                case Stopped():
                    child.stopped.set_result(None)
                case Failed(reason):
                    self._fail(ProxyWorkerError(f"proxy worker {child.index}: {reason}"))
        if not child.stopped.done():
            error = ProxyWorkerError(f"proxy worker {child.index} (pid {child.process.pid}) exited")
            for future in (child.started, *child.applied.values()):
                if not future.done():
                    future.set_exception(error)
            child.stopped.set_result(None)
            self._fail(error)

    def _fail(self, error: ProxyWorkerError) -> None:
        log.error("%s", error)
        if self._failed is not None and not self._failed.done():
            self._failed.set_exception(error)

    async def stop(self, grace: float = 0.0, *, abort: asyncio.Event | None = None, release: bool = True,
                   hand_over: bool | None = None, keep_if: Callable[[], Awaitable[bool]] | None = None) -> None:
        """As Proxier.stop, in every process; the children are gone when it returns."""
        live = [c for c in self._children if not c.stopped.done()]
        for child in live:
            await _send_quietly(child, Stop(grace, not release if hand_over is None else hand_over))
        if abort is not None and live:
            self._abort_forwarder = asyncio.create_task(self._forward_abort(abort, live))
        try:
            await self._local.stop(grace, abort=abort, release=release, hand_over=hand_over, keep_if=keep_if)
            if live:
                await asyncio.wait([c.stopped for c in live], timeout=grace + 5.0)
        finally:
            if self._abort_forwarder is not None:
                self._abort_forwarder.cancel()
            await self._reap()

    async def _forward_abort(self, abort: asyncio.Event, children: list[_Child]) -> None:
        await abort.wait()
        for child in children:
            await _send_quietly(child, Abort())

    async def _reap(self) -> None:
        for child in self._children:
            child.writer.close()
            try:
                await asyncio.wait_for(child.process.wait(), 5.0)
            except asyncio.TimeoutError:
                log.warning("proxy worker %d did not exit: killed", child.index)
                child.process.kill()
                await child.process.wait()
            if child.reading is not None:
                child.reading.cancel()
        self._children.clear()

    async def wait_failed(self) -> None:
        """Raises the first error of this process's Proxier or of any worker."""
        local = asyncio.ensure_future(self._local.wait_failed())
        try:
            await asyncio.wait({local, self._failed}, return_when=asyncio.FIRST_COMPLETED)
            for done in (local, self._failed):
                if done.done():
                    done.result()
        finally:
            local.cancel()

    async def wait_ready(self) -> None:
        await self._ready.wait()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    # --- snapshots --------------------------------------------------------------------------

    async def apply(self, snapshot: Snapshot) -> None:
        """Apply here, then in every worker (only what changed); returns when all have."""
        await self._local.apply(snapshot)
        if not snapshot.servable or not self._local.ready:
            return
        message = self._delta(snapshot)
        if message is not None:
            waiters = []
            for child in self._children:
                waiter = asyncio.get_running_loop().create_future()
                child.applied[message.seq] = waiter
                waiters.append(waiter)
                await send(child.writer, message)
            await asyncio.gather(*waiters)
        self._ready.set()

    def _delta(self, snapshot: Snapshot) -> Apply | None:
        sent = self._sent
        changed = snapshot.changed_since(sent)
        node = SAME_NODE if sent is not None and snapshot.node is sent.node else snapshot.node
        addresses = self._local.node_addresses
        if addresses == self._sent_addresses:
            addresses = None
        if not changed and node is SAME_NODE and addresses is None and sent is not None:
            return None
        self._sent, self._sent_addresses = snapshot, self._local.node_addresses
        self._seq += 1
        states = {name: snapshot.services.get(name) for name in changed}
        return Apply(self._seq, snapshot.servable, node, states, addresses)

    # --- views ------------------------------------------------------------------------------

    @property
    def stats(self) -> Mapping[ServicePortName, ServicePortStats]:
        """Per service port, summed over the processes (the workers' part as of their last report)."""
        merged = {}
        for name, local in self._local.stats.items():
            total = dataclasses.replace(local)
            for child in self._children:
                other = child.stats.get(name)
                if other is not None:
                    for field in ServicePortStats.__slots__:
                        setattr(total, field, getattr(total, field) + getattr(other, field))
            merged[name] = total
        return MappingProxyType(merged)

    @property
    def rules(self) -> Mapping[Frontend, FrontendRule]:
        return self._local.rules

    @property
    def listening(self) -> frozenset[Frontend]:
        return self._local.listening

    @property
    def node_addresses(self) -> tuple[str, ...]:
        return self._local.node_addresses

    @property
    def host_problems(self) -> bool:
        return self._local.host_problems

    async def refresh_node_addresses(self) -> bool:
        if not await self._local.refresh_node_addresses():
            return False
        if self._sent is not None:
            await self.apply(self._sent)  # the workers get the new addresses
        return True

    async def resync_host(self) -> None:
        await self._local.resync_host()  # the children hold no addresses or table

    @property
    def nodeport_addresses(self) -> tuple[str, ...]:
        return self._local.nodeport_addresses

    @property
    def health_check_addresses(self) -> tuple[str, ...]:
        return self._local.health_check_addresses

    @property
    def problems(self) -> list[str]:
        found = self._local.problems
        for child in self._children:
            found += [f"worker {child.index}: {p}" for p in child.problems if p not in found]
        return found

    @property
    def pids(self) -> tuple[int, ...]:
        """The worker processes' ids (this process not included)."""
        return tuple(c.process.pid for c in self._children)

    @property
    def workers(self) -> int:
        """Relay processes running now, this one included."""
        return 1 + sum(1 for c in self._children if not c.stopped.done())


async def _send_quietly(child: _Child, message: ToWorker) -> None:
    try:
        await send(child.writer, message)
    except (ConnectionError, RuntimeError):
        pass  # already gone: its reader reports it

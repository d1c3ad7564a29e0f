"""Relay workers: ``workers`` child processes fed the same snapshots, and this process's
Proxier for the node.

Every listener is bound with SO_REUSEPORT, so each relay process opens its own socket
on every frontend and the kernel spreads new connections and UDP clients over them
(by the 4-tuple; by the client address for affinity frontends, see steering.py).
This process keeps the control plane (source, ClusterState, DNS) and everything that
exists once per node: VIP addresses and the nftables table. It relays nothing itself
(its Proxier opens no listener, ServedElsewhere): a connection it held would die with it,
and the workers' outlive it. The children only relay: their Proxier has no firewall, and
its address manager (SharedAddresses) only reads the node addresses this process sends.

A worker outlives this process's crash (workers/worker.py): it relays on with its last table and
waits to be adopted. At its start this process looks for such orphans of the node
(``orphan_addresses``), adopts up to ``workers`` of them over their socket with the usual
Start (answered ``Started(adopted=True)``) and a whole first Apply, and starts only the rest.

The children are started fresh (``python -P -m kubeport.relayworker FD``), not forked
from a process with threads and an event loop. Each talks to this process over a
socketpair, in the messages of :mod:`.messages`.

``apply`` sends only the services that changed since the last snapshot sent, and
returns once every child has applied it. Statistics come back every
``worker_stats_interval`` seconds (only what changed) and are summed per service port,
so the merged ``stats`` lag by up to that interval.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import socket
import sys
from types import MappingProxyType
from typing import Any, Awaitable, Callable, Iterable, Mapping, Sequence

from kubeport.endpoints.types import ServicePortName, Snapshot
from kubeport.lib.heldsockets import HOLDER_FD_ENV, NOT_HELD, HeldSockets
from kubeport.proxy.config import ProxyConfig
from kubeport.proxy.proxier import Proxier
from kubeport.proxy.relays import Relays
from kubeport.proxy.stats import ServicePortStats
from kubeport.proxy.table import Frontend, FrontendRule
from kubeport.proxy.workers.messages import (
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
    encode,
    orphan_addresses,
    receive,
    send,
    trusted_peer,
)

log = logging.getLogger(__name__)

class ProxyWorkerError(RuntimeError):
    """A worker process failed or exited; the message names it."""


#: a worker process without a holder (-P: the working directory's kubeport/ is not imported)
WORKER_COMMAND = (sys.executable, "-P", "-m", "kubeport.proxy.workers.worker")


def create_proxier(config: ProxyConfig, node_name: str, *, hold: HeldSockets = NOT_HELD,
                   worker_command: Sequence[str] = WORKER_COMMAND, **kwargs: Any) -> Relays:
    """The daemon's one call: a Proxier, or ProxyWorkers when ``config.workers`` > 1."""
    if config.workers > 1:
        return ProxyWorkers(config, node_name, hold=hold, worker_command=worker_command, **kwargs)
    return Proxier(config, node_name, hold=hold, **kwargs)


def _log_setup() -> tuple[bool, int]:
    """(JSON?, level) of this process's logging, for the children to match."""
    root = logging.getLogger()
    json_format = any(type(h.formatter).__name__ == "JsonFormatter" for h in root.handlers)
    return json_format, root.getEffectiveLevel()


#: how long an orphan worker has to answer an adoption
ADOPTION_TIMEOUT_S = 2.0
#: a worker that dies is started again, unless this many died within CRASH_WINDOW_S: then it fails
CRASH_LOOP = 3
CRASH_WINDOW_S = 60.0


class _Child:
    """One worker process and its channel (``process`` is None for an adopted orphan: not our child)."""

    def __init__(self, index: int, process: asyncio.subprocess.Process | None, reader, writer,
                 pid: int | None = None) -> None:
        self.index = index
        self.process = process
        self.pid = process.pid if process is not None else pid
        self.adopted = process is None
        self.reader = reader
        self.writer = writer
        self.stats: dict[ServicePortName, ServicePortStats] = {}
        #: the counters of the workers that held this index before and died (counters never go down)
        self.base: dict[ServicePortName, ServicePortStats] = {}
        self.problems: list[str] = []
        self.applied: dict[int, asyncio.Future] = {}
        self.started: asyncio.Future = asyncio.get_running_loop().create_future()
        self.stopped: asyncio.Future = asyncio.get_running_loop().create_future()
        self.reading: asyncio.Task | None = None


class ProxyWorkers:
    """Proxier's interface over N relay processes (``config.workers``) and this one's node programming."""

    def __init__(self, config: ProxyConfig, node_name: str, *, hold: HeldSockets = NOT_HELD,
                 worker_command: Sequence[str] = WORKER_COMMAND, **kwargs: Any) -> None:
        """``worker_command``: how a worker process is started (its channel's descriptor is
        appended); one started with a channel to the holder must take it from the
        environment (``HOLDER_FD_ENV``) and hold its listeners under its slot."""
        self.config = config
        self.node_name = node_name
        self._hold = hold
        self._worker_command = tuple(worker_command)
        self._local = Proxier(config, node_name, relay=False, **kwargs)
        self._children: list[_Child] = []
        self._failed: asyncio.Future | None = None
        self._sent: Snapshot | None = None
        self._sent_addresses: tuple[str, ...] | None = None
        self._seq = 0
        self._ready = asyncio.Event()
        self._abort_forwarder: asyncio.Task | None = None
        self._start_args: tuple | None = None
        self._stopping = False
        #: when workers died and were started again (monotonic), for the crash loop
        self._crashes: list[float] = []
        self.replaced = 0
        self._replacing: set[asyncio.Task] = set()

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self, extra_addresses: Iterable[str] = (),
                    reserved_frontends: Iterable[Frontend] | None = None) -> None:
        extra = tuple(extra_addresses)
        await self._local.start(extra, reserved_frontends)
        self._failed = asyncio.get_running_loop().create_future()
        self._start_args = (extra, *_log_setup())
        start_message = self._start_message
        for address in orphan_addresses(self.node_name):
            if len(self._children) == self.config.workers:
                break  # the others drain and exit once their wait is over
            child = await self._adopt(address, len(self._children) + 1, start_message)
            if child is not None:
                self._children.append(child)
        adopted = len(self._children)
        for index in range(adopted + 1, self.config.workers + 1):
            child = await self._spawn(index)
            self._children.append(child)
            await send(child.writer, start_message(index))
        try:
            await asyncio.gather(*(child.started for child in self._children))
        except ProxyWorkerError:
            await self.stop(0.0)
            raise
        if adopted:
            log.info("proxy: adopted %d relay workers of the previous daemon (pids %s) with their connections",
                     adopted, ", ".join(str(c.pid) for c in self._children if c.adopted))
        log.info("proxy: %d relay processes share the listeners", self.config.workers)

    def _start_message(self, index: int) -> Start:
        extra, json_format, level = self._start_args
        seed = None if self.config.seed is None else self.config.seed + index  # not in lockstep
        # The workers bind the client's address as this process found it can (it writes the tables).
        child_config = dataclasses.replace(self.config, firewall=False, seed=seed,
                                           keep_client_address=self._local.keeps_client,
                                           keep_client_address_on_bridge=self._local.keeps_client_on_bridge)
        return Start(child_config, self.node_name, extra, tuple(self._local.reserved_frontends), index,
                     json_format, level)

    async def _adopt(self, address: str, index: int, start_message: Callable[[int], Start]) -> _Child | None:
        """The orphan worker listening on ``address``, adopted as worker ``index``; None if it
        does not answer (it took another daemon, or exited) or is not of this user."""
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, address), ADOPTION_TIMEOUT_S)
            pid = trusted_peer(sock)
            if pid is None:
                raise PermissionError("held by another user")
            reader, writer = await asyncio.open_connection(sock=sock)
        except (OSError, asyncio.TimeoutError) as exc:
            sock.close()
            log.info("proxy: the orphan worker on @%s cannot be adopted: %s", address.lstrip("\0"), exc or "timeout")
            return None
        child = _Child(index, None, reader, writer, pid)
        child.reading = asyncio.create_task(self._read(child), name=f"proxy-worker-{index}")
        try:
            await send(writer, start_message(index))
            await asyncio.wait_for(asyncio.shield(child.started), ADOPTION_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError, ProxyWorkerError) as exc:
            log.info("proxy: the orphan worker pid %d did not answer its adoption: %s", pid, exc or "timeout")
            child.reading.cancel()
            writer.close()
            return None
        return child

    async def _spawn(self, index: int) -> _Child:
        parent_end, child_end = socket.socketpair()
        # Its listeners held across a crash under the worker's slot, as this process's are.
        holder = self._hold.channel_for_worker(index)
        passed = (child_end.fileno(),) if holder is None else (child_end.fileno(), holder.fileno())
        env = None if holder is None else {**os.environ, HOLDER_FD_ENV: str(holder.fileno())}
        try:
            process = await asyncio.create_subprocess_exec(
                *self._worker_command, str(child_end.fileno()), pass_fds=passed, env=env,
            )
        finally:
            child_end.close()
            if holder is not None:
                holder.close()
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
                    if not child.started.done():
                        child.started.set_result(None)
                case Stopped():
                    child.stopped.set_result(None)
                case Failed(reason):
                    self._fail(ProxyWorkerError(f"proxy worker {child.index}: {reason}"))
        if not child.stopped.done():
            error = ProxyWorkerError(f"proxy worker {child.index} (pid {child.pid}) exited")
            child.stopped.set_result(None)
            if child.adopted and not child.started.done():
                child.started.set_exception(error)  # an orphan gone while adopted: one is started instead
                return
            if self._may_replace(child):
                for waiter in child.applied.values():  # its replacement gets the whole view
                    if not waiter.done():
                        waiter.set_result(None)
                log.error("%s: its connections are lost; starting another (the other workers' are kept)", error)
                task = asyncio.create_task(self._replace(child), name=f"proxy-worker-{child.index}-again")
                self._replacing.add(task)
                task.add_done_callback(self._replacing.discard)
                return
            for future in (child.started, *child.applied.values()):
                if not future.done():
                    future.set_exception(error)
            self._fail(error)

    def _may_replace(self, child: _Child) -> bool:
        """A worker that served and died is started again, unless workers die in a loop."""
        if self._stopping or not child.started.done() or child.started.exception() is not None:
            return False
        now = asyncio.get_running_loop().time()
        self._crashes = [at for at in self._crashes if now - at < CRASH_WINDOW_S] + [now]
        return len(self._crashes) < CRASH_LOOP

    async def _replace(self, dead: _Child) -> None:
        child = None
        try:
            child = await self._spawn(dead.index)
            await send(child.writer, self._start_message(dead.index))
            await asyncio.wait_for(asyncio.shield(child.started), 30.0)
        except (OSError, asyncio.TimeoutError, ProxyWorkerError) as exc:
            self._fail(ProxyWorkerError(f"proxy worker {dead.index} cannot be started again: {exc or 'timeout'}"))
            return
        except asyncio.CancelledError:  # stopping meanwhile
            if child is not None:
                child.writer.close()
                child.process.kill()
            raise
        sent = self._sent
        if sent is not None:
            # Written, not awaited, before it joins the others: no delta can come in between.
            self._seq += 1
            child.writer.write(encode(Apply(self._seq, sent.servable, sent.node, dict(sent.services),
                                            self._sent_addresses, whole=True)))
        child.base = _summed(dead.base, dead.stats)
        for gone in child.base.values():  # its connections and flows died with it
            gone.active = gone.udp_flows = 0
        self._children[self._children.index(dead)] = child
        self.replaced += 1
        log.info("proxy worker %d started again (pid %d)", dead.index, child.pid)

    def _fail(self, error: ProxyWorkerError) -> None:
        log.error("%s", error)
        if self._failed is not None and not self._failed.done():
            self._failed.set_exception(error)

    async def stop(self, grace: float = 0.0, *, abort: asyncio.Event | None = None, release: bool = True,
                   hand_over: bool | None = None, keep_if: Callable[[], Awaitable[bool]] | None = None) -> None:
        """As Proxier.stop, in every process; the children are gone when it returns."""
        self._stopping = True
        for task in list(self._replacing):
            task.cancel()
        await asyncio.gather(*self._replacing, return_exceptions=True)
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
                if child.process is not None:
                    await asyncio.wait_for(child.process.wait(), 5.0)
                else:  # not our child: its end of the channel closes as it exits
                    await asyncio.wait_for(asyncio.shield(child.stopped), 5.0)
                    await asyncio.wait_for(_exited(child.pid), 5.0)
            except asyncio.TimeoutError:
                log.warning("proxy worker %d did not exit: killed", child.index)
                if child.process is not None:
                    child.process.kill()
                    await child.process.wait()
                else:
                    _kill(child.pid)
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

    @property
    def tcp_relay(self) -> str:  # each worker opens its own sockmap, as this process did
        return self._local.tcp_relay

    @property
    def client_address(self) -> str:  # this process programs the replies' tables for every worker
        return self._local.client_address

    @property
    def pod_traffic(self) -> str:  # this process attaches the connect() programs, for the whole node
        return self._local.pod_traffic

    @property
    def connects_balanced(self) -> Mapping[ServicePortName, int]:
        return self._local.connects_balanced

    @property
    def worker_status(self) -> str:
        """One line for `kubeport get status`: the relay processes and those adopted."""
        live = [c for c in self._children if not c.stopped.done()]
        adopted = [c for c in live if c.adopted]
        line = f"{len(live)} relay processes, {len(adopted)} adopted from the previous daemon"
        line += f" (pids {', '.join(str(c.pid) for c in adopted)})" if adopted else ""
        return line + (f", {self.replaced} started again after a crash" if self.replaced else "")

    async def apply(self, snapshot: Snapshot) -> None:
        """Apply here, then in every worker (only what changed); returns when all have."""
        await self._local.apply(snapshot)
        if not snapshot.servable or not self._local.ready:
            return
        message = self._delta(snapshot)
        if message is not None:
            waiters = []
            for child in list(self._children):
                if child.stopped.done():
                    continue  # dead: the one started in its place gets the whole view
                waiter = asyncio.get_running_loop().create_future()
                child.applied[message.seq] = waiter
                waiters.append(waiter)
                try:
                    await send(child.writer, message)
                except ConnectionError:
                    pass  # dying: its reader settles the waiter
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
        return Apply(self._seq, snapshot.servable, node, states, addresses, whole=sent is None)

    # --- views ------------------------------------------------------------------------------

    @property
    def stats(self) -> Mapping[ServicePortName, ServicePortStats]:
        """Per service port, summed over the processes (the workers' part as of their last report)."""
        merged = {}
        for name, local in self._local.stats.items():
            total = dataclasses.replace(local)
            for child in self._children:
                for other in (child.stats.get(name), child.base.get(name)):
                    if other is not None:
                        _add(total, other)
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
        """The worker processes' ids."""
        return tuple(c.pid for c in self._children)

    @property
    def workers(self) -> int:
        """Relay processes running now."""
        return sum(1 for c in self._children if not c.stopped.done())


def _add(total: ServicePortStats, other: ServicePortStats) -> None:
    for field in ServicePortStats.__slots__:
        setattr(total, field, getattr(total, field) + getattr(other, field))


def _summed(*parts: Mapping[ServicePortName, ServicePortStats]) -> dict[ServicePortName, ServicePortStats]:
    total: dict[ServicePortName, ServicePortStats] = {}
    for part in parts:
        for name, stats in part.items():
            if name in total:
                _add(total[name], stats)
            else:
                total[name] = dataclasses.replace(stats)
    return total


async def _exited(pid: int) -> None:
    while _alive(pid):
        await asyncio.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def _send_quietly(child: _Child, message: ToWorker) -> None:
    try:
        await send(child.writer, message)
    except (ConnectionError, RuntimeError):
        pass  # already gone: its reader reports it

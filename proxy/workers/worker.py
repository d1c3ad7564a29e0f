"""A relay worker process's loop: started by parent.py as ``python -P -m kubeport.relayworker FD``,
which hands it its channel to the socket holder.

It runs a Proxier without addresses or firewall of its own, applies the snapshots the
parent sends over the socketpair FD, reports statistics, and stops when told.

A parent gone without a Stop (killed, crashed: EOF on the channel) is the control plane's
crash, not the data plane's: the worker keeps its listeners, connections, UDP flows and last
table, and waits on an abstract Unix socket named after the node and its pid for the next
daemon to adopt it (parent.py). If none comes within ``ADOPTION_GRACE_S`` it stops accepting,
lets its connections end (up to ``ORPHAN_DRAIN_S``), and exits.
SIGINT, SIGTERM and SIGHUP are ignored: a terminal's Ctrl-C or systemd's stop reach the whole
process group, and draining is the parent's call. An orphan ends at SIGTERM, resetting its
connections: it comes from what stops the unit or the pod, which a restart waits for.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from types import MappingProxyType

import uvloop

from kubeport.endpoints.types import ServiceName, ServicePortName, ServiceState, Snapshot
from kubeport.lib.heldsockets import NOT_HELD, HeldSockets
from kubeport.proxy.host.addresses import SharedAddresses
from kubeport.proxy.proxier import Proxier
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
    orphan_address,
    receive,
    send,
    trusted_peer,
)

log = logging.getLogger(__name__)


class SnapshotMirror:
    """Rebuilds the parent's snapshots from the changes it sends, with consecutive generations
    (so the Proxier's ``changed_since`` takes the cheap path) and a node object that stays the
    same object until it changes (so the table context is not recomputed for nothing)."""

    def __init__(self) -> None:
        self.services: dict[ServiceName, ServiceState] = {}
        self.node = None
        self.generation = 0

    def update(self, synced: bool, node, states: dict, *, whole: bool = False) -> Snapshot:
        node_changed = node is not SAME_NODE
        if node_changed:
            self.node = node
        if whole:  # an adopting daemon's view: what it does not name is gone
            states = {**dict.fromkeys(self.services.keys() - states.keys()), **states}
        for name, state in states.items():
            if state is None:
                self.services.pop(name, None)
            else:
                self.services[name] = state
        self.generation += 1
        return Snapshot(
            generation=self.generation,
            services=MappingProxyType(self.services),
            node=self.node,
            synced=synced,
            changed=frozenset(states),
            node_changed=node_changed,
        )


class StatsReporter:
    """Sends the counters that changed since the last report, and the ports that went away."""

    def __init__(self, proxier: Proxier) -> None:
        self._proxier = proxier
        self._last: dict[ServicePortName, tuple] = {}

    def changes(self) -> tuple[dict, list] | None:
        current = {name: (stats, tuple(stats.as_dict().values())) for name, stats in self._proxier.stats.items()}
        changed = {name: stats for name, (stats, values) in current.items() if self._last.get(name) != values}
        gone = [name for name in self._last if name not in current]
        self._last = {name: values for name, (_, values) in current.items()}
        return (changed, gone) if changed or gone else None


#: a worker whose parent died waits this long for the next daemon to adopt it
ADOPTION_GRACE_S = 30.0
#: then it stops accepting, and its connections have this long to end before they are reset
ORPHAN_DRAIN_S = 300.0


class Link:
    """The channel to the current parent; replaced when a new daemon adopts the worker."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.reporter: StatsReporter | None = None

    async def send(self, message) -> None:
        if self.writer.is_closing():
            return  # orphaned: what the parent missed, a new one gets whole
        try:
            await send(self.writer, message)
        except (ConnectionError, RuntimeError):
            pass  # the parent is gone: what it missed, a new one gets whole


async def serve(fd: int, hold: HeldSockets = NOT_HELD, adoption_grace: float = ADOPTION_GRACE_S,
                orphan_drain: float = ORPHAN_DRAIN_S) -> None:
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_connection(sock=sock)
    start = await receive(reader)
    if not isinstance(start, Start):
        return
    _configure_logging(start.index, start.log_json, start.log_level)
    config = start.config
    shared = SharedAddresses()
    proxier = Proxier(config, start.node_name, addresses=shared, firewall=None, hold=hold)
    startup = logging.getLogger("kubeport.proxy.proxier")
    startup.setLevel(logging.ERROR)  # what start() has to say (SCTP support), the parent said
    await proxier.start(start.extra_addresses, start.reserved_frontends)
    startup.setLevel(logging.NOTSET)
    link = Link(reader, writer)
    await link.send(Started())
    mirror = SnapshotMirror()
    abort = asyncio.Event()
    # SIGTERM is the parent's call while there is one; an orphan's is from what stops the unit
    # or the pod (systemd's KillMode=control-group after the daemon died): leave at once.
    terminated = asyncio.Event()
    orphaned = [False]

    def on_terminate() -> None:
        if orphaned[0]:
            terminated.set()
            abort.set()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_terminate)
    tasks = [
        asyncio.create_task(_report_stats(proxier, link, config.worker_stats_interval)),
        asyncio.create_task(_report_failure(proxier, link)),
    ]
    stopping: asyncio.Task | None = None
    held_settled = False
    try:
        while True:
            while (message := await receive(link.reader)) is not None:
                match message:
                    case Apply(seq, synced, node, states, addresses, whole):
                        if addresses is not None:
                            shared.node_addresses = tuple(addresses)
                            proxier.invalidate_node_addresses()
                        snapshot = mirror.update(synced, node, states, whole=whole)
                        await proxier.apply(snapshot)
                        if snapshot.servable and not held_settled:
                            # Every listener of this view is open: what the holder kept for
                            # this slot's previous worker and nobody serves now is closed.
                            held_settled = True
                            hold.release_unadopted()
                        await link.send(Applied(seq, proxier.problems))
                    case Start(index=index, log_json=log_json, log_level=log_level):  # an adoption
                        _configure_logging(index, log_json, log_level)
                        link.reporter = None  # the new parent has none of the counters yet
                        await link.send(Started(adopted=True))
                    case Stop(grace, hand_over) if stopping is None:
                        stopping = asyncio.create_task(_stop(proxier, link, grace, abort, hand_over))
                    case Abort():
                        abort.set()
            link.writer.close()
            if stopping is not None:
                abort.set()  # the parent stopped waiting for the drain: reset what is left at once
                break
            # The parent died without a word: its relays keep their connections and table
            # until the next daemon adopts this process.
            orphaned[0] = True
            adopted = await _wait_for_adoption(start.node_name, proxier, adoption_grace, terminated)
            if adopted is None:
                if terminated.is_set():
                    log.warning("SIGTERM and no daemon: resetting %d connections, exiting", proxier.open_connections)
                else:
                    log.warning("no daemon adopted this worker within %gs: draining its %d connections, then exiting",
                                adoption_grace, proxier.open_connections)
                stopping = asyncio.create_task(_stop(proxier, link, orphan_drain, abort, False))
                break
            orphaned[0] = False
            link.reader, link.writer = adopted
        await stopping
    finally:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
        for task in tasks:
            task.cancel()
        link.writer.close()


async def _wait_for_adoption(node_name: str, proxier: Proxier, grace: float, terminated: asyncio.Event):
    """The channel of the daemon that adopts this worker, or None once ``grace`` is over or
    ``terminated`` is set."""
    address = orphan_address(node_name, os.getpid())
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
    listener.setblocking(False)
    try:
        listener.bind(address)
        listener.listen(4)
    except OSError as exc:
        listener.close()
        log.error("the daemon is gone and %s cannot be bound (%s): no daemon can adopt this worker",
                  address.lstrip("\0"), exc)
        return None
    log.warning("the daemon is gone: relaying on (%d connections) and waiting %gs on @%s to be adopted",
                proxier.open_connections, grace, address.lstrip("\0"))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    try:
        while (left := deadline - loop.time()) > 0 and not terminated.is_set():
            accepting = asyncio.ensure_future(loop.sock_accept(listener))
            ending = asyncio.ensure_future(terminated.wait())
            await asyncio.wait((accepting, ending), timeout=left, return_when=asyncio.FIRST_COMPLETED)
            ending.cancel()
            if not accepting.done():
                accepting.cancel()
                await asyncio.gather(accepting, return_exceptions=True)
                return None
            try:
                conn, _ = accepting.result()
            except OSError:
                continue
            try:
                pid = trusted_peer(conn)
            except OSError:
                pid = None
            if pid is None:
                conn.close()  # not root nor this user: nobody to take orders from
                continue
            log.info("adopted by the daemon pid %d", pid)
            return await asyncio.open_connection(sock=conn)
        return None
    finally:
        listener.close()  # the name goes with it: a second daemon cannot adopt this worker too


async def _stop(proxier: Proxier, link: Link, grace: float, abort: asyncio.Event, hand_over: bool) -> None:
    # A child holds no addresses or table of its own (the parent does): never a release here.
    await proxier.stop(grace, abort=abort, release=False, hand_over=hand_over)
    await link.send(Stopped())


async def _report_stats(proxier: Proxier, link: Link, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        if link.reporter is None:
            link.reporter = StatsReporter(proxier)
        changes = link.reporter.changes()
        if changes is not None:
            await link.send(Stats(*changes))


async def _report_failure(proxier: Proxier, link: Link) -> None:
    try:
        await proxier.wait_failed()
    except Exception as exc:  # the parent decides what a failure means
        await link.send(Failed(f"{type(exc).__name__}: {exc}"))


def _configure_logging(index: int, json_format: bool, level: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_format:
        from kubeport.lib.logformat import JsonFormatter

        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s %(levelname)s %(name)s [worker {index}]: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def main(argv: list[str], hold: HeldSockets = NOT_HELD) -> int:
    """A worker process: ``argv[1]`` is its channel to the parent; ``hold`` its channel to
    the socket holder, if it was given one (kubeport/relayworker.py)."""
    # SIGHUP too: `systemctl kill -s HUP` and pkill reach every process; reloading is the parent's.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    uvloop.run(serve(int(argv[1]), hold))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

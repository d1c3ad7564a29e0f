"""A relay worker process: ``python -P -m kubeport.proxy.worker FD`` (started by workers.py).

It runs a Proxier without addresses or firewall of its own, applies the snapshots the
parent sends over the socketpair FD, reports statistics, and stops when told (or at
once, resetting its connections, when the parent is gone: EOF on the channel).
SIGINT and SIGTERM are ignored: a terminal's Ctrl-C or systemd's stop reach the whole
process group, and draining is the parent's call.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
from types import MappingProxyType

import uvloop

from kubeport.endpoints.types import ServiceName, ServicePortName, ServiceState, Snapshot
from kubeport.proxy.host.addresses import SharedAddresses
from kubeport.proxy.proxier import Proxier
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
    receive,
    send,
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

    def update(self, synced: bool, node, states: dict) -> Snapshot:
        node_changed = node is not SAME_NODE
        if node_changed:
            self.node = node
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


async def serve(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_connection(sock=sock)
    start = await receive(reader)
    if not isinstance(start, Start):
        return
    _configure_logging(start.index, start.log_json, start.log_level)
    config = start.config
    shared = SharedAddresses()
    proxier = Proxier(config, start.node_name, addresses=shared, firewall=None)
    startup = logging.getLogger("kubeport.proxy.proxier")
    startup.setLevel(logging.ERROR)  # what start() has to say (SCTP support), the parent said
    await proxier.start(start.extra_addresses, start.reserved_frontends)
    startup.setLevel(logging.NOTSET)
    await send(writer, Started())
    mirror = SnapshotMirror()
    abort = asyncio.Event()
    tasks = [
        asyncio.create_task(_report_stats(proxier, writer, config.worker_stats_interval)),
        asyncio.create_task(_report_failure(proxier, writer)),
    ]
    stopping: asyncio.Task | None = None
    try:
        while (message := await receive(reader)) is not None:
            match message:
                case Apply(seq, synced, node, states, addresses):
                    if addresses is not None:
                        shared.node_addresses = tuple(addresses)
                        proxier.invalidate_node_addresses()
                    await proxier.apply(mirror.update(synced, node, states))
                    await send(writer, Applied(seq, proxier.problems))
                case Stop(grace, hand_over) if stopping is None:
                    stopping = asyncio.create_task(_stop(proxier, writer, grace, abort, hand_over))
                case Abort():
                    abort.set()
        abort.set()  # the parent is gone: reset what is left at once
        if stopping is None:
            stopping = asyncio.create_task(_stop(proxier, writer, 0.0, abort, False))
        await stopping
    finally:
        for task in tasks:
            task.cancel()
        writer.close()


async def _stop(proxier: Proxier, writer: asyncio.StreamWriter, grace: float, abort: asyncio.Event,
                hand_over: bool) -> None:
    # A child holds no addresses or table of its own (the parent does): never a release here.
    await proxier.stop(grace, abort=abort, release=False, hand_over=hand_over)
    try:
        await send(writer, Stopped())
    except (ConnectionError, RuntimeError):
        pass


async def _report_stats(proxier: Proxier, writer: asyncio.StreamWriter, interval: float) -> None:
    reporter = StatsReporter(proxier)
    while True:
        await asyncio.sleep(interval)
        changes = reporter.changes()
        if changes is not None:
            await send(writer, Stats(*changes))


async def _report_failure(proxier: Proxier, writer: asyncio.StreamWriter) -> None:
    try:
        await proxier.wait_failed()
    except Exception as exc:  # the parent decides what a failure means
        await send(writer, Failed(f"{type(exc).__name__}: {exc}"))


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


def main(argv: list[str]) -> int:
    # SIGHUP too: `systemctl kill -s HUP` and pkill reach every process; reloading is the parent's.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    uvloop.run(serve(int(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

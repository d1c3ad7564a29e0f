"""Seamless restart: one kubeport instance per node and network namespace, and the handover.

The running instance holds an abstract Unix socket named after the node (abstract
names are per network namespace, so namespaces and nodes never collide). A new
instance that finds the name taken starts anyway: every listener of kubeport binds with
SO_REUSEPORT, so both serve side by side. Once the new instance is ready it asks the
old one to leave; the old one stops accepting (the kernel migrates its queued
connections to the new listeners when ``net.ipv4.tcp_migrate_req`` is 1), drains, and
exits without removing the service addresses, which the new instance adopts. The new
instance then takes the name. From its start until then, the new instance keeps a
connection to the old one open (``arrived``): should the old one be stopped before the
handover, it too leaves the addresses and rules in place, for the instance that is coming.

A pod must not exit after handing over (the kubelet would restart it, and the restarted
process would take the node back): with ``--after-handover wait`` the old process waits for
the SIGTERM that deletes its pod. The DaemonSet's ``maxSurge`` starts the new pod beside
the old one, and deletes the old one once the new one is ready: readiness is then the new
process's own, a :class:`ReadyFile`, present only once it has taken the node over.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
from pathlib import Path
from typing import Awaitable, Callable

log = logging.getLogger(__name__)

ARRIVED = b"arrived\n"
TAKEOVER = b"takeover\n"
ACK = b"leaving\n"
MIGRATE_SYSCTL = "/proc/sys/net/ipv4/tcp_migrate_req"


def instance_address(node_name: str) -> str:
    return f"\0kubeport/{node_name}"


def enable_request_migration(path: str = MIGRATE_SYSCTL) -> bool:
    """Ask the kernel to hand a closing listener's queued connections to its SO_REUSEPORT
    siblings instead of resetting them (Linux >= 5.14). False if it cannot be set."""
    try:
        with open(path, "w") as sysctl:
            sysctl.write("1")
        return True
    except OSError as exc:
        log.info("cannot set %s (%s): connections queued on a listener when it closes "
                 "during a handover will be reset", path, exc.strerror or exc)
        return False


class Instance:
    """This process's claim on the node; a predecessor, if one is running, is asked to leave."""

    def __init__(self, node_name: str, on_takeover: Callable[[], Awaitable[None] | None]) -> None:
        self._address = instance_address(node_name)
        self._on_takeover = on_takeover
        self._server: asyncio.AbstractServer | None = None
        self.predecessor = False
        #: successors starting beside this instance (each holds a connection open until it takes over)
        self.successors = 0
        self._link: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def claim(self) -> bool:
        """Take the name if it is free. False: another instance holds it (a handover start)."""
        # The socket is made by hand: uvloop's unix helpers refuse abstract names.
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self._address)
        except OSError as exc:
            listener.close()
            if exc.errno != errno.EADDRINUSE:
                raise
            self.predecessor = True
            return False
        listener.listen(4)
        listener.setblocking(False)
        self._server = await asyncio.start_unix_server(self._serve, sock=listener)
        return True

    async def announce(self, timeout: float = 2.0) -> None:
        """Tell the predecessor a successor is starting (see the module's docstring)."""
        try:
            self._link = await asyncio.wait_for(self._connect(), timeout)
            self._link[1].write(ARRIVED)
            await self._link[1].drain()
        except (OSError, asyncio.TimeoutError) as exc:
            log.info("handover: cannot reach the running instance (%s); it will be asked to leave later", exc)

    async def predecessor_gone(self) -> None:
        """Return once the announced predecessor has gone (exited, crashed) before the handover:
        it writes nothing on the link until asked, so its end closing is all that can come."""
        if self._link is None:
            await asyncio.Event().wait()  # not announced: nothing to watch
        try:
            await self._link[0].read()
        except OSError:
            pass

    async def take_over_once(self, ready: asyncio.Event) -> None:
        """Take over once ``ready`` is set, or at once if the predecessor has gone before."""
        waiters = (asyncio.ensure_future(ready.wait()), asyncio.ensure_future(self.predecessor_gone()))
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)  # take_over reads the same link
        await self.take_over()

    async def take_over(self, timeout: float = 10.0) -> None:
        """Ask the predecessor to leave, then hold the name once it has let go."""
        link, self._link = self._link, None
        try:
            reader, writer = link or await asyncio.wait_for(self._connect(), timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            log.info("handover: no predecessor answered (%s); taking the name", exc)
        else:
            try:
                writer.write(TAKEOVER)
                await writer.drain()
                answer = await asyncio.wait_for(reader.readline(), timeout)
            except (OSError, asyncio.TimeoutError):
                answer = b""
            finally:
                writer.close()
            if answer == ACK:
                log.info("handover: the previous instance is leaving")
            else:
                log.info("handover: the previous instance is gone; taking the name")
        await self._claim_when_free(timeout)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(client, self._address)
        except BaseException:
            client.close()
            raise
        return await asyncio.open_unix_connection(sock=client)

    async def _claim_when_free(self, timeout: float) -> None:
        # The predecessor lets go of the name before it acknowledges, so this is
        # immediate unless it died half-way; then retry until the deadline.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not await self.claim():
            if loop.time() > deadline:
                raise RuntimeError("handover: the previous instance never released the node")
            await asyncio.sleep(0.05)
        self.predecessor = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        announced = False
        try:
            request = await asyncio.wait_for(reader.readline(), 5.0)
            if request == ARRIVED:
                announced = True
                self.successors += 1
                log.info("handover: a new instance is starting on this node; it will take over once ready")
                request = await reader.readline()  # its takeover, or EOF should it fail to start
            if request == TAKEOVER:
                log.info("handover: a new instance is taking over; leaving")
                self.release()
                writer.write(ACK)
                await writer.drain()
                result = self._on_takeover()
                if result is not None:
                    await result
        except (OSError, asyncio.TimeoutError):
            pass
        except asyncio.CancelledError:
            # The process ends while a successor's connection waits. Nothing awaits this task,
            # and asyncio's stream callback would log the cancellation as an error (3.11).
            pass
        finally:
            if announced:
                self.successors -= 1
            writer.close()

    def release(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def claimed_by_another(self) -> bool:
        """After :meth:`release`: whether a new instance holds the node's name now."""
        return self._server is None and _name_in_use(self._address)


def abstract_name_in_use(node_name: str) -> bool:
    """Whether some instance holds the node's name in this network namespace."""
    return _name_in_use(instance_address(node_name))


def _name_in_use(address: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(address)
        return True
    except OSError:
        return False
    finally:
        probe.close()


class ReadyFile:
    """A pod's own readiness: a file present while this process serves the node and is ready.

    In a DaemonSet with ``maxSurge``, the new pod starts beside the old one on the node's
    network (``hostNetwork``), and both listen on the same /readyz port: an HTTP probe may be
    answered by the other pod. The kubelet deletes the old pod once the new one is ready, so
    the new pod must not look ready before it has taken the node over. A file in the pod's own
    filesystem, read by an exec probe, belongs to one process only.
    """

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._present = False
        if path is not None:
            # Left by this container's previous process (killed, OOM): not this one's readiness.
            for stale in (path, *path.parent.glob(f".{path.name}.*")):
                with contextlib.suppress(OSError):
                    stale.unlink()

    def update(self, ready: bool) -> None:
        if self._path is None or ready == self._present:
            return
        try:
            if ready:
                scratch = self._path.with_name(f".{self._path.name}.{os.getpid()}")
                scratch.write_text(f"{os.getpid()}\n")
                scratch.rename(self._path)  # never a half-written file for the probe
            else:
                self._path.unlink(missing_ok=True)
        except OSError as exc:
            log.error("readiness file %s: %s", self._path, exc.strerror or exc)
            return
        self._present = ready

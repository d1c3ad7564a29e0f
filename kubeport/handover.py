"""Seamless restart: one kubeport instance per node and network namespace, and the handover.

The running instance holds an abstract Unix socket named after the node (abstract
names are per network namespace, so namespaces and nodes never collide). A new
instance that finds the name taken starts anyway: every listener of kubeport binds with
SO_REUSEPORT, so both serve side by side. Once the new instance is ready it asks the
old one to leave; the old one stops accepting (the kernel migrates its queued
connections to the new listeners when ``net.ipv4.tcp_migrate_req`` is 1), drains, and
exits without removing the service addresses, which the new instance adopts. The new
instance then takes the name.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from typing import Awaitable, Callable

log = logging.getLogger(__name__)

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

    async def take_over(self, timeout: float = 10.0) -> None:
        """Ask the predecessor to leave, then hold the name once it has let go."""
        try:
            reader, writer = await asyncio.wait_for(self._connect(), timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            log.info("handover: no predecessor answered (%s); taking the name", exc)
        else:
            writer.write(TAKEOVER)
            await writer.drain()
            try:
                await asyncio.wait_for(reader.readline(), timeout)
            finally:
                writer.close()
            log.info("handover: the previous instance is leaving")
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
        try:
            request = await asyncio.wait_for(reader.readline(), 5.0)
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
        finally:
            writer.close()

    def release(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


def abstract_name_in_use(node_name: str) -> bool:
    """Whether some instance holds the node's name in this network namespace (for tests)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(instance_address(node_name))
        return True
    except OSError:
        return False
    finally:
        probe.close()

"""Seamless restart: one kubeport instance per node and network namespace, and the handover.

The running instance holds an abstract Unix socket named after the node (abstract
names are per network namespace, so namespaces and nodes never collide). A new
instance that finds the name taken starts anyway: every listener of kubeport binds with
SO_REUSEPORT, so both serve side by side. Once the new instance is ready it asks the
old one to leave; the old one stops accepting (the kernel migrates its queued
connections to the new listeners when ``net.ipv4.tcp_migrate_req`` is 1), drains, and
exits without removing the service addresses, which the new instance adopts. The new
instance then takes the name.

The conversation, one line each way, on a connection the new instance opens at its start
and keeps until it takes over::

    new -> old   arrived <generation>
    old -> new   wait                      (take over once ready)
               | refused                   (the old one is of a later generation: never)
    new -> old   takeover                  (once ready)
    old -> new   leaving

The old instance closing the connection means it is gone, or stopping on its own (SIGTERM:
after its DNS lame duck it releases the name and closes every such connection): the new
one takes the node at once, synced or not, rather than leave it unserved. A generation
(``--handover-generation``, a DaemonSet's ``pod-template-generation``) keeps an old pod's
restarted container from taking the node back from the new pod during a rollout.

A pod must not exit after handing over (the kubelet would restart it, and the restarted
process would take the node back): with ``--after-handover wait`` the old process waits for
the SIGTERM that deletes its pod. The DaemonSet's ``maxSurge`` starts the new pod beside
the old one, and deletes the old one once the new one is ready: readiness is then the new
process's own (kubeport.readiness), present only once it has taken the node over.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from typing import Awaitable, Callable

log = logging.getLogger(__name__)

ARRIVED = b"arrived"
WAIT = b"wait\n"
REFUSED = b"refused\n"
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

    def __init__(self, node_name: str, on_takeover: Callable[[], Awaitable[None] | None],
                 generation: int = 0) -> None:
        self._address = instance_address(node_name)
        self._on_takeover = on_takeover
        self.generation = generation
        self._server: asyncio.AbstractServer | None = None
        self.predecessor = False
        #: the predecessor is of a later generation: wait for it to go, never ask it to
        self.refused = False
        #: successors starting beside this instance (each holds a connection open until it takes over)
        self.successors = 0
        self._successor_links: set[asyncio.StreamWriter] = set()
        self._leaving = False
        #: successors told to take the node when this instance left on its own
        self.left_to = 0
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

    def status(self) -> dict[str, object]:
        """For `kubeport get status`: where this instance stands among those on the node."""
        return {"generation": self.generation, "holdsNode": self._server is not None,
                "predecessor": self.predecessor, "refused": self.refused, "successors": self.successors}

    # --- the new instance ------------------------------------------------------------------

    async def announce(self, timeout: float = 2.0) -> None:
        """Tell the predecessor a successor is starting, and learn whether it may take over."""
        try:
            reader, writer = await asyncio.wait_for(self._connect(), timeout)
            writer.write(b"%s %d\n" % (ARRIVED, self.generation))
            answer = await asyncio.wait_for(reader.readline(), timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            log.info("handover: cannot reach the running instance (%s); it will be asked to leave later", exc)
            return
        if answer not in (WAIT, REFUSED):  # a version without announcements: ask it at ready time
            writer.close()
            return
        self._link = reader, writer
        self.refused = answer == REFUSED
        if self.refused:
            log.warning("handover: the instance serving this node is of a later generation; this one "
                        "(generation %d) serves beside it and takes the node only if it goes", self.generation)

    async def predecessor_gone(self) -> None:
        """Return once the announced predecessor has gone (exited, crashed, stopping on its
        own): it writes nothing more on the link until asked, so its end closing is all
        that can come."""
        if self._link is None:
            await asyncio.Event().wait()  # not announced: nothing to watch
        try:
            await self._link[0].read()
        except OSError:
            pass

    async def take_over_once(self, ready: asyncio.Event) -> None:
        """Take over once ``ready`` is set (unless refused), or at once if the predecessor goes."""
        while True:
            waiters = [asyncio.ensure_future(self.predecessor_gone())]
            if not self.refused:
                waiters.append(asyncio.ensure_future(ready.wait()))
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)  # take_over reads the same link
            if await self.take_over():
                return
            # Two instances started beside one: the other took the node first. Follow it.
            log.info("handover: another new instance holds the node now; taking it from that one")
            await self.announce()

    async def take_over(self, timeout: float = 10.0) -> bool:
        """Ask the predecessor to leave, then hold the name once it has let go. False: another
        instance holds it now (it took the node first)."""
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
        return await self._claim_when_free(timeout)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(client, self._address)
        except BaseException:
            client.close()
            raise
        return await asyncio.open_unix_connection(sock=client)

    async def _claim_when_free(self, timeout: float) -> bool:
        # The predecessor lets go of the name before it acknowledges (or before it closes the
        # link when it leaves on its own), so this is immediate unless it died half-way (its
        # socket goes with its process) or another instance claimed the name first.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not await self.claim():
            if loop.time() > deadline or await self._holder_answers():
                return False
            await asyncio.sleep(0.05)
        self.predecessor = self.refused = False
        return True

    async def _holder_answers(self) -> bool:
        """Whether the name's holder is a live instance (it answers an announcement), not a
        predecessor on its way out."""
        try:
            reader, writer = await asyncio.wait_for(self._connect(), 1.0)
        except (OSError, asyncio.TimeoutError):
            return False
        try:
            writer.write(b"%s %d\n" % (ARRIVED, self.generation))
            return await asyncio.wait_for(reader.readline(), 1.0) in (WAIT, REFUSED)
        except (OSError, asyncio.TimeoutError):
            return False
        finally:
            writer.close()

    # --- the instance serving the node --------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        announced = False
        try:
            request = await asyncio.wait_for(reader.readline(), 5.0)
            if request.startswith(ARRIVED) and not self._leaving:
                announced = True
                self.successors += 1
                self._successor_links.add(writer)
                writer.write(self._answer_arrival(request))
                request = await reader.readline()  # its takeover, or EOF should it fail to start
            if request == TAKEOVER:
                log.info("handover: a new instance is taking over; leaving")
                self.release()
                writer.write(ACK)
                await writer.drain()
                result = self._on_takeover()
                if result is not None:
                    await result
        except (OSError, asyncio.TimeoutError, ValueError):
            pass
        except asyncio.CancelledError:
            # The process ends while a successor's connection waits. Nothing awaits this task,
            # and asyncio's stream callback would log the cancellation as an error (3.11).
            pass
        finally:
            if announced:
                self.successors -= 1
                self._successor_links.discard(writer)
            writer.close()

    def _answer_arrival(self, request: bytes) -> bytes:
        fields = request.split()
        generation = int(fields[1]) if len(fields) > 1 else 0
        if generation < self.generation:
            log.warning("handover: an instance of an earlier generation (%d, this one %d) started on this "
                        "node; it will not take the node over", generation, self.generation)
            return REFUSED
        log.info("handover: a new instance is starting on this node; it will take over once ready")
        return WAIT

    def leave(self) -> None:
        """Stopping on its own: let go of the name, and let the successors starting beside
        this instance take the node now (they see their connection close)."""
        self._leaving = True
        self.release()
        self.left_to = len(self._successor_links)
        for writer in list(self._successor_links):
            writer.close()

    def release(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def another_serves_the_node(self) -> bool:
        """Asked by a stopping instance once its drain is over: the addresses and rules stay
        if another instance serves the node now (it adopted them, and would not add them back)."""
        if self.predecessor:  # never took the node over: they are its holder's
            log.info("the previous instance still serves this node: leaving it the addresses and rules")
            return True
        if await self.claimed_by_another(wait=2.0 if self.left_to else 0.0):
            log.info("a new instance serves this node now: leaving it the addresses and rules")
            return True
        return False

    async def claimed_by_another(self, wait: float = 0.0) -> bool:
        """After :meth:`release`: whether another instance holds the node's name now (or
        within ``wait`` seconds: a successor just told to take it)."""
        if self._server is not None:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while not _name_in_use(self._address):
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True


async def idle_until(signalled: asyncio.Event, node_name: str, interval: float = 2.0) -> bool:
    """After handing over: True once ``signalled``; False as soon as no instance has held the
    node for two checks in a row (the one that took over is gone, nothing serves the node)."""
    free = 0
    while free < 2:
        try:
            await asyncio.wait_for(signalled.wait(), interval)
            return True
        except asyncio.TimeoutError:
            free = 0 if abstract_name_in_use(node_name) else free + 1
    return False


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

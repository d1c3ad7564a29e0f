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

Only kubeport may take part: each end checks the other's credentials (``SO_PEERCRED``) before
a message counts, and trusts root and the daemon's own user only (:func:`trusted`). Any local
user can bind an abstract name, though (abstract names have no permissions). A connection
from another user is closed unread, and is a problem line. A name held by another user's
process (a squatter) is a problem line too, and the new instance serves the node beside it
(every listener binds with SO_REUSEPORT), retrying to take the name until the squatter is
gone; until then the node cannot be handed over. docs/handover.md says why kubeport does not
hide the name instead.

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
import os
import socket
import struct
from dataclasses import dataclass
from typing import Awaitable, Callable

log = logging.getLogger(__name__)

ARRIVED = b"arrived"
WAIT = b"wait\n"
REFUSED = b"refused\n"
TAKEOVER = b"takeover\n"
ACK = b"leaving\n"


def instance_address(node_name: str) -> str:
    return f"\0kubeport/{node_name}"


_CREDENTIALS = struct.Struct("3i")


@dataclass(frozen=True, slots=True)
class Peer:
    """The process at the other end of a Unix socket (``SO_PEERCRED``: as it connected or listened)."""

    pid: int
    uid: int
    gid: int

    def __str__(self) -> str:
        return f"pid {self.pid} (uid {self.uid})" if self.uid >= 0 else "a process that accepts no connection"


#: the holder of a name that does not accept (a full backlog): its credentials cannot be known
UNRESPONSIVE = Peer(0, -1, -1)


def peer_of(sock: socket.socket) -> Peer:
    return Peer(*_CREDENTIALS.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)))


def trusted(peer: Peer) -> bool:
    """Root, or the user this daemon runs as: who could run kubeport here."""
    return peer.uid == 0 or peer.uid == os.geteuid()


class UntrustedPeer(OSError):
    """The other end of a handover connection is not root nor this daemon's user."""


def holder_of(address: str) -> Peer | None:
    """Who holds an abstract name; None when nobody does."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)  # a holder that never accepts must not block this
    try:
        probe.connect(address)
        return peer_of(probe)
    except BlockingIOError:
        return UNRESPONSIVE
    except OSError:
        return None
    finally:
        probe.close()


def display_name(address: str) -> str:
    """An abstract name as ``ss -x`` and /proc/net/unix show it."""
    return "@" + address.lstrip("\0")


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
        #: the name is held by a process that is not kubeport (not root nor this daemon's user)
        self.squatter: Peer | None = None
        #: connections refused for their credentials: count, and the last peer
        self._refused_peers = 0
        self._last_refused: Peer | None = None
        self._logged_uids: set[int] = set()

    @property
    def problems(self) -> list[str]:
        name = display_name(self._address)
        found = []
        if self.squatter is not None:
            found.append(f"handover: the node's socket {name} is held by {self.squatter}, which is not kubeport "
                         f"(root or uid {os.geteuid()}): serving beside it; this node cannot be handed over "
                         "until it is gone")
        if self._last_refused is not None:
            found.append(f"handover: refused {self._refused_peers} connection(s) to {name} from other users, the "
                         f"last from {self._last_refused}: only root or uid {os.geteuid()} may hand this node over")
        return found

    async def claim(self) -> bool:
        """Take the name if it is free. False: another instance holds it (a handover start),
        or a squatter does (:attr:`squatter`: serve beside it)."""
        # The socket is made by hand: uvloop's unix helpers refuse abstract names.
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self._address)
        except OSError as exc:
            listener.close()
            if exc.errno != errno.EADDRINUSE:
                raise
            holder = holder_of(self._address)
            if holder is not None and not trusted(holder):
                if self.squatter is None:
                    log.error("handover: %s is held by %s, which is not kubeport: serving this node beside it",
                              display_name(self._address), holder)
                self.squatter = holder
                self.predecessor = False
                return False
            self.predecessor = True
            return False
        listener.listen(4)
        listener.setblocking(False)
        self._server = await asyncio.start_unix_server(self._serve, sock=listener)
        if self.squatter is not None:
            log.info("handover: the squatter on %s is gone; this instance holds the name", display_name(self._address))
            self.squatter = None
        return True

    async def keep_claiming(self, interval: float = 2.0) -> None:
        """Serving beside a squatter: take the name once it lets go (a new instance can then take over)."""
        while self.squatter is not None and self._server is None:
            await asyncio.sleep(interval)
            if not await self.claim() and self.squatter is None:
                return  # a kubeport holds it now: that one serves the node, as after a handover

    def status(self) -> dict[str, object]:
        """For `kubeport get status`: where this instance stands among those on the node."""
        return {"generation": self.generation, "holdsNode": self._server is not None,
                "predecessor": self.predecessor, "refused": self.refused, "successors": self.successors,
                "squatter": None if self.squatter is None else str(self.squatter)}

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
            holder = peer_of(client)
            if not trusted(holder):
                self.squatter = holder
                raise UntrustedPeer(f"{display_name(self._address)} is held by {holder}, which is not kubeport")
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
            if self.squatter is not None:
                break  # it took the name the predecessor let go: serve beside it
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
            if not self._admits(writer):
                return
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

    def _admits(self, writer: asyncio.StreamWriter) -> bool:
        """Whether the peer may talk to this instance at all; a refusal is a problem line."""
        sock = writer.get_extra_info("socket")
        try:
            peer = peer_of(sock)
        except (OSError, AttributeError):
            return False
        if trusted(peer):
            return True
        self._refused_peers += 1
        self._last_refused = peer
        if peer.uid not in self._logged_uids:  # once per user: a flood of connections is no flood of lines
            self._logged_uids.add(peer.uid)
            log.warning("handover: refused a connection from %s on %s: only root or uid %d may hand this node "
                        "over", peer, display_name(self._address), os.geteuid())
        return False

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
    """Whether some instance of kubeport holds the node's name in this network namespace."""
    return _name_in_use(instance_address(node_name))


def _name_in_use(address: str) -> bool:
    """Held by an instance of kubeport (a squatter serves nothing)."""
    holder = holder_of(address)
    return holder is not None and trusted(holder)

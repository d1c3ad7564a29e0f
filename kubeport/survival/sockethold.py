"""Listening sockets held by the supervisor (kubeport/survival/supervisor.py) across a crash of the
daemon: the daemon's side of the channel.

Every service listener and DNS socket the daemon binds is also sent to the supervisor
(SCM_RIGHTS over a SOCK_SEQPACKET pair): both then refer to the same kernel socket, so when
the daemon dies the socket stays open, the kernel goes on completing handshakes into its
accept queue and queueing datagrams, and the next daemon gets every held socket back at its
start and adopts those it serves again, instead of binding new ones. What it does not serve
again is closed once it has applied its first view (a held socket nobody accepts on would
take connections of its SO_REUSEPORT group and never answer them).

A socket the daemon closes for good is released first: the supervisor's copy would keep it
open otherwise (a closed listener must reset its queue, or hand it to a successor).

Relay workers (``--workers N``) bind listeners of their own (SO_REUSEPORT): each gets a
channel of its own to the supervisor, made by the daemon (``channel_for_worker``), and its
sockets are held under its slot (``worker-<slot>/<label>``). A worker that crashes leaves
its sockets held, so the connections the kernel gives them wait for the worker started in
its slot, which adopts them, instead of being reset with the closed socket; after a restart
of the whole unit each new worker adopts its slot's. The daemon's first view settled, the
sockets of slots no worker serves any more are closed (``settled``).

Without the supervisor (no ``KUBEPORT_SOCKET_HOLDER_FD`` in the environment) every call is a
no-op. Messages are one JSON object each, with the descriptors of a ``hold`` or of a batch of
held sockets attached.
"""

from __future__ import annotations

import array
import json
import logging
import os
import socket
from typing import Any, Callable

from kubeport.lib.heldsockets import HOLDER_FD_ENV

log = logging.getLogger(__name__)

ENV = HOLDER_FD_ENV
#: descriptors per message: the kernel's SCM_MAX_FD is 253
BATCH = 250
MESSAGE_BYTES = 1 << 20


def worker_prefix(slot: int) -> str:
    """How the holder names the sockets of relay worker ``slot``."""
    return f"worker-{slot}/"


def worker_slot(label: str) -> int | None:
    """The worker slot a held label belongs to; None for the daemon's own sockets."""
    if not label.startswith("worker-"):
        return None
    slot, _, _ = label[len("worker-"):].partition("/")
    return int(slot) if slot.isdigit() else None


def send(chan: socket.socket, message: dict[str, Any], fds: list[int] = ()) -> None:
    data = json.dumps(message).encode()
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    chan.sendmsg([data], ancillary)


def receive_with_fds(sock: socket.socket, size: int) -> tuple[bytes, list[int]]:
    """One message of up to ``size`` bytes and the descriptors attached to it (SCM_RIGHTS)."""
    fds = array.array("i")
    data, ancillary, _flags, _addr = sock.recvmsg(size, socket.CMSG_SPACE(BATCH * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    return data, list(fds)


def receive(chan: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and its descriptors; (None, []) at the end of the channel."""
    data, fds = receive_with_fds(chan, MESSAGE_BYTES)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), fds


class SocketHold:
    def __init__(self, chan: socket.socket | None) -> None:
        self._chan = chan
        #: held sockets handed back at start, not adopted yet: label -> socket
        self._offered: dict[str, socket.socket] = {}
        self._broken = False
        self.adopted = 0
        #: the relay worker slots given a channel of their own
        self._worker_slots: set[int] = set()
        #: where the holder keeps the sockets beyond itself (systemd's store, a sidecar's), if anywhere
        self.store: str | None = None
        self.held_at_start = 0
        if chan is not None:
            self._receive_offer()

    @classmethod
    def from_environment(cls) -> "SocketHold":
        fd = os.environ.pop(ENV, None)
        if fd is None:
            return cls(None)
        try:
            chan = socket.socket(fileno=int(fd))
        except (OSError, ValueError) as exc:
            log.error("the socket holder's channel %s is unusable (%s): sockets are not held", fd, exc)
            return cls(None)
        chan.setblocking(True)
        chan.set_inheritable(False)  # relay workers are no party to it
        return cls(chan)

    @property
    def active(self) -> bool:
        return self._chan is not None and not self._broken

    def _receive_offer(self) -> None:
        send(self._chan, {"op": "hello", "pid": os.getpid()})
        while True:
            message, fds = receive(self._chan)
            if message is None or message["op"] == "end":
                self.store = (message or {}).get("store")
                break
            for label, fd in zip(message["labels"], fds):
                self._offered[label] = socket.socket(fileno=fd)
        self.held_at_start = len(self._offered)
        if self._offered:
            log.info("socket holder: %d sockets held across the restart", len(self._offered))

    def status(self) -> dict[str, Any]:
        """`kubeport get status`'s socketHold."""
        return {"active": self.active, "store": self.store, "heldAtStart": self.held_at_start,
                "adopted": self.adopted}

    def adopt(self, label: str) -> socket.socket | None:
        """The held socket for ``label`` (still held for the next restart), or None."""
        sock = self._offered.pop(label, None)
        if sock is not None:
            self.adopted += 1
        return sock

    def adopt_or_bind(self, label: str, bind: Callable[[], socket.socket]) -> socket.socket:
        """The held socket for ``label``, else ``bind()``'s, handed to the holder to keep."""
        sock = self.adopt(label)
        if sock is None:
            sock = bind()
            self.keep(label, sock)
        return sock

    def keep(self, label: str, sock: socket.socket) -> None:
        """Hold ``sock`` (just bound) across a crash."""
        self._send({"op": "hold", "label": label}, [sock.fileno()])

    def release(self, label: str) -> None:
        """``label``'s socket is being closed for good: the holder's copy goes first."""
        self._send({"op": "release", "label": label})

    def release_unadopted(self) -> int:
        """Close what was held for the previous process and is not served now; the holder
        then closes the sockets of worker slots nobody serves."""
        left, self._offered = self._offered, {}
        for label, sock in left.items():
            self._send({"op": "release", "label": label})
            sock.close()
        if left:
            log.info("socket holder: %d held sockets no longer served, closed", len(left))
        self._send({"op": "settled", "slots": sorted(self._worker_slots)})
        return len(left)

    def channel_for_worker(self, slot: int) -> socket.socket | None:
        """The end of a new channel to the holder that relay worker ``slot`` is started
        with (as ``ENV``); None without a holder. The caller closes it once passed."""
        if not self.active:
            return None
        holders_end, workers_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._send({"op": "worker", "slot": slot}, [holders_end.fileno()])
        finally:
            holders_end.close()
        if not self.active:
            workers_end.close()
            return None
        self._worker_slots.add(slot)
        return workers_end

    def _send(self, message: dict[str, Any], fds: list[int] = ()) -> None:
        if not self.active:
            return
        try:
            send(self._chan, message, fds)
        except OSError as exc:
            self._broken = True
            log.error("the socket holder is gone (%s): sockets are no longer held across a crash", exc)


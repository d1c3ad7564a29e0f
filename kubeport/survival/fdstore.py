"""``kubeport fd-store DIR``: a file descriptor store for a pod, as systemd keeps one for a
unit (``FileDescriptorStoreMax=``), so that the sockets the supervisor holds outlive the
kubeport container itself.

A container ends with its first process, and with it every socket the supervisor
(``--hold-sockets``, kubeport/survival/supervisor.py) held: the kubelet starts the container again, but
meanwhile the node refuses every connection and query. Run as a second container of the pod
(a native sidecar, started before kubeport and kept while the pod lives), sharing DIR (an
emptyDir) with kubeport's container and the node's network namespace (hostNetwork), this
process keeps a copy of every held socket: connections and queries wait in their queues
while kubeport's container is restarted, and its next supervisor (``--fd-store DIR``) takes
them back.

The protocol is systemd's where it has one (sd_notify(3)): datagrams on ``DIR/notify`` with
``FDSTORE=1`` and ``FDNAME=`` and the descriptors attached, or ``FDSTOREREMOVE=1`` and
``FDNAME=``. systemd gives the descriptors back at exec; a sidecar cannot, so a supervisor
connects to ``DIR/fetch`` (SOCK_SEQPACKET) and gets every stored descriptor in the socket
hold's batches (kubeport/survival/sockethold.py), then the connection is closed.

Kept small for the supervisor's reason: nothing of the daemon is imported, so that it is not
what crashes. DIR is created mode 0700; only what may write there may store.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import sys
from pathlib import Path

from kubeport.survival.sockethold import BATCH, receive_with_fds, send

log = logging.getLogger("kubeport.survival.fdstore")

NOTIFY = "notify"
FETCH = "fetch"
#: systemd's FileDescriptorStoreMax= of the shipped unit
DEFAULT_MAX = 65536
_MESSAGE = 4096


def fd_name_valid(name: str) -> bool:
    """systemd's fdname_is_valid (src/basic/fd-util.c): printable ASCII, no ':', 1-255 long."""
    return 0 < len(name) <= 255 and name.isascii() and name.isprintable() and ":" not in name


class FdStore:
    def __init__(self, directory: Path, maximum: int = DEFAULT_MAX) -> None:
        self.directory = directory
        self.maximum = maximum
        self.stored: dict[str, list[socket.socket]] = {}
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(directory, 0o700)
        self.notify = self._bind(socket.SOCK_DGRAM, NOTIFY)
        self.notify.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.fetch = self._bind(socket.SOCK_SEQPACKET, FETCH)
        self.fetch.listen(8)

    def _bind(self, kind: int, name: str) -> socket.socket:
        path = self.directory / name
        path.unlink(missing_ok=True)  # a previous store's, gone with its process
        sock = socket.socket(socket.AF_UNIX, kind | socket.SOCK_CLOEXEC)
        sock.bind(str(path))
        return sock

    @property
    def count(self) -> int:
        return sum(len(fds) for fds in self.stored.values())

    def handle_notify(self) -> None:
        """One datagram: store or remove, as systemd's service_add_fd_store / FDSTOREREMOVE."""
        data, fds = receive_with_fds(self.notify, _MESSAGE)
        fields = dict(line.partition("=")[::2] for line in data.decode(errors="replace").splitlines())
        name = fields.get("FDNAME", "stored")
        if not fd_name_valid(name):
            log.warning("a descriptor name that is not valid (%r): ignored", name[:80])
        elif fields.get("FDSTOREREMOVE") == "1":
            for sock in self.stored.pop(name, []):
                sock.close()
        elif fields.get("FDSTORE") == "1":
            kept = self.stored.setdefault(name, [])
            while fds and self.count < self.maximum:
                kept.append(socket.socket(fileno=fds.pop(0)))
            if fds:
                log.warning("the store is full (%d descriptors): %s not kept", self.maximum, name)
            if not kept:
                del self.stored[name]
        for fd in fds:  # not kept
            os.close(fd)

    def handle_fetch(self) -> None:
        """A supervisor at its start: every stored descriptor, with its name."""
        conn, _ = self.fetch.accept()
        try:
            entries = [(name, sock) for name, socks in self.stored.items() for sock in socks]
            for start in range(0, len(entries), BATCH):
                batch = entries[start:start + BATCH]
                send(conn, {"op": "held", "labels": [name for name, _ in batch]}, [s.fileno() for _, s in batch])
            send(conn, {"op": "end"})
            log.info("%d stored sockets handed to a starting supervisor", len(entries))
        except OSError as exc:
            log.warning("a supervisor left before it had every stored socket: %s", exc)
        finally:
            conn.close()

    def serve(self) -> int:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: None)
        log.info("keeping the held sockets of %s (up to %d)", self.directory, self.maximum)
        while True:
            readable, _, _ = select.select([self.notify, self.fetch, wake_r], [], [])
            if wake_r in readable:
                if os.read(wake_r, 64):
                    log.info("stopping: %d stored sockets closed", self.count)
                    return 0
            if self.notify in readable:
                self.handle_notify()
            if self.fetch in readable:
                self.handle_fetch()


def run(directory: Path, maximum: int = DEFAULT_MAX) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return FdStore(directory, maximum).serve()

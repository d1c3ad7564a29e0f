"""systemd's service notifications (sd_notify(3)): one datagram per message to the
``AF_UNIX`` socket named by ``$NOTIFY_SOCKET`` (a path, or an abstract name written with a
leading ``@``), and the watchdog's period from ``$WATCHDOG_USEC``.

What systemd reads (systemd.service(5), sd_notify(3)): ``READY=1`` ends the start of a
``Type=notify`` unit; ``STATUS=`` is shown by ``systemctl status``; ``WATCHDOG=1`` must come
at least every ``WatchdogSec`` or the unit is killed (and restarted with ``Restart=``);
``STOPPING=1`` says the stop has begun. Without ``$NOTIFY_SOCKET`` every call does nothing.

The file descriptor store (``FDSTORE=1`` with ``FDNAME=``, the descriptors attached as
SCM_RIGHTS; ``FDSTOREREMOVE=1``): systemd keeps the descriptors a service sends it while the
unit lives, through restarts by ``Restart=``, and passes them to each new main process as
socket activation does (``$LISTEN_PID``, ``$LISTEN_FDS`` from descriptor 3 on,
``$LISTEN_FDNAMES``; sd_listen_fds(3)). It is flushed when the unit stops. A unit enables it
with ``FileDescriptorStoreMax=``, which systemd 254 and later also pass as ``$FDSTORE``; a
process cannot ask for it otherwise, so the store is used only when ``$FDSTORE`` is set (the
shipped unit sets it for older systemd): to a unit without a store systemd would answer
every descriptor with a warning in its journal.
"""

from __future__ import annotations

import array
import os
import socket
from typing import Mapping, MutableMapping
from urllib.parse import quote, unquote

_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def socket_address(value: str) -> str | None:
    """$NOTIFY_SOCKET as ``socket.connect`` takes it: ``@name`` is the abstract ``\\0name``."""
    if not value or value[0] not in "/@":
        return None  # systemd also knows vsock: addresses; a service on a host never gets one
    return "\0" + value[1:] if value[0] == "@" else value


#: sd_listen_fds(3): the first passed descriptor
LISTEN_FDS_START = 3
_LISTEN_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


def fd_name(label: str) -> str:
    """``label`` as an FDNAME: systemd refuses a name with ``:`` or control characters, or
    longer than 255 (fdname_is_valid); percent-encoding keeps it readable and reversible."""
    return quote(label, safe="/@.-_[]")


def label_of(name: str) -> str:
    return unquote(name)


def listen_fds(environ: MutableMapping[str, str], pid: int) -> list[tuple[str, int]]:
    """The descriptors systemd passed this process (``$LISTEN_FDS`` from 3 on, meant for
    ``$LISTEN_PID``) with their names, marked close-on-exec; the variables are removed, as
    sd_listen_fds(unset_environment=1) does, so no child takes them for its own."""
    owner, count, names = (environ.pop(name, "") for name in _LISTEN_VARIABLES)
    if not count.isdigit() or owner != str(pid):
        return []
    listed = names.split(":") if names else []
    passed = []
    for index in range(int(count)):
        fd = LISTEN_FDS_START + index
        os.set_inheritable(fd, False)
        passed.append((listed[index] if index < len(listed) else "unknown", fd))
    return passed


def fd_store_size(environ: Mapping[str, str]) -> int:
    """How many descriptors the unit's store takes (``$FDSTORE``); 0: no store."""
    value = environ.get("FDSTORE", "")
    return int(value) if value.isdigit() else 0


def watchdog_period(environ: Mapping[str, str], pid: int) -> float | None:
    """Seconds between pings: half of WATCHDOG_USEC, as sd_watchdog_enabled(3) advises; None
    when the watchdog is off or meant for another process (WATCHDOG_PID)."""
    usec = environ.get("WATCHDOG_USEC", "")
    owner = environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (owner and owner != str(pid)):
        return None
    return int(usec) / 2e6


class Notifier:
    def __init__(self, address: str | None, watchdog: float | None = None) -> None:
        self.address = address
        self.watchdog = watchdog if address else None
        self.sent = 0
        self.failed = 0
        self._socket: socket.socket | None = None
        self._blocking: socket.socket | None = None

    @classmethod
    def from_environment(cls, environ: MutableMapping[str, str] | None = None) -> Notifier:
        """Read, then remove, the variables (sd_notify's ``unset_environment``): processes this
        one starts (relay workers) must not speak for the service."""
        environ = os.environ if environ is None else environ
        notifier = cls(socket_address(environ.get("NOTIFY_SOCKET", "")), watchdog_period(environ, os.getpid()))
        for name in _VARIABLES:
            environ.pop(name, None)
        return notifier

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *assignments: str) -> bool:
        """Send ``READY=1``, ``STATUS=...`` (one datagram, newline-separated); False if it
        could not be sent. Never blocks: a full socket buffer drops the message."""
        if self.address is None:
            return False
        message = "\n".join(assignments).encode()
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._socket.setblocking(False)
            self._socket.sendto(message, self.address)
        except OSError:
            self.failed += 1
            return False
        self.sent += 1
        return True

    def store_fds(self, name: str, fds: list[int]) -> bool:
        """Put ``fds`` in the unit's descriptor store under ``name`` (sd_pid_notify_with_fds).
        Blocking, unlike ``notify``: a descriptor dropped here would not be there at the
        restart it is kept for, and systemd reads its socket at once."""
        return self._send_blocking(f"FDSTORE=1\nFDNAME={name}".encode(), fds)

    def remove_fds(self, name: str) -> bool:
        """Close every descriptor the store holds under ``name``."""
        return self._send_blocking(f"FDSTOREREMOVE=1\nFDNAME={name}".encode(), [])

    def _send_blocking(self, message: bytes, fds: list[int]) -> bool:
        if self.address is None:
            return False
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        try:
            if self._blocking is None:
                self._blocking = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._blocking.sendmsg([message], ancillary, 0, self.address)
        except OSError:
            self.failed += 1
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        for sock in (self._socket, self._blocking):
            if sock is not None:
                sock.close()
        self._socket = self._blocking = None

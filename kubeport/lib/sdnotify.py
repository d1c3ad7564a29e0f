"""systemd's service notifications (sd_notify(3)): one datagram per message to the
``AF_UNIX`` socket named by ``$NOTIFY_SOCKET`` (a path, or an abstract name written with a
leading ``@``), and the watchdog's period from ``$WATCHDOG_USEC``.

What systemd reads (systemd.service(5), sd_notify(3)): ``READY=1`` ends the start of a
``Type=notify`` unit; ``STATUS=`` is shown by ``systemctl status``; ``WATCHDOG=1`` must come
at least every ``WatchdogSec`` or the unit is killed (and restarted with ``Restart=``);
``STOPPING=1`` says the stop has begun. Without ``$NOTIFY_SOCKET`` every call does nothing.
"""

from __future__ import annotations

import os
import socket
from typing import Mapping, MutableMapping

_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def socket_address(value: str) -> str | None:
    """$NOTIFY_SOCKET as ``socket.connect`` takes it: ``@name`` is the abstract ``\\0name``."""
    if not value or value[0] not in "/@":
        return None  # systemd also knows vsock: addresses; a service on a host never gets one
    return "\0" + value[1:] if value[0] == "@" else value


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

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None

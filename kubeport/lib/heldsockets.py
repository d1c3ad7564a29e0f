"""What a listener asks of the socket holder, as a protocol the parts bind through.

Every listening socket the proxy and DNS open (service listeners, UDP frontends, DNS's UDP
and TCP sockets) is opened by :meth:`HeldSockets.adopt_or_bind`: the socket an earlier
process of this unit kept under the same label is adopted (its queued connections and
datagrams are served now), else a new one is bound and handed to the holder to keep across
a crash. The holder itself is kubeport's (``kubeport.survival.sockethold``); the parts only
see this protocol, and without a holder :data:`NOT_HELD` simply binds.
"""

from __future__ import annotations

import socket
from typing import Any, Callable, Protocol

#: the environment variable that gives a process started with a channel to the holder its descriptor
HOLDER_FD_ENV = "KUBEPORT_SOCKET_HOLDER_FD"


class HeldSockets(Protocol):
    def adopt_or_bind(self, label: str, bind: Callable[[], socket.socket]) -> socket.socket:
        """The socket held for ``label``, else ``bind()``'s, now held under ``label``."""
        ...

    def release(self, label: str) -> None:
        """``label``'s socket is being closed for good: the holder's copy goes first."""
        ...

    def release_unadopted(self) -> int:
        """Close what was held for the previous process and is not served now."""
        ...

    def channel_for_worker(self, slot: int) -> socket.socket | None:
        """A channel of its own for relay worker ``slot`` (None without a holder)."""
        ...

    def status(self) -> dict[str, Any]:
        ...


class NotHeld:
    """No holder: sockets are bound, and close with the process."""

    def adopt_or_bind(self, label: str, bind: Callable[[], socket.socket]) -> socket.socket:
        return bind()

    def release(self, label: str) -> None:
        pass

    def release_unadopted(self) -> int:
        return 0

    def channel_for_worker(self, slot: int) -> socket.socket | None:
        return None

    def status(self) -> dict[str, Any]:
        return {"active": False, "store": None, "heldAtStart": 0, "adopted": 0}


NOT_HELD: HeldSockets = NotHeld()

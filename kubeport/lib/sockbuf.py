"""Receive buffers of UDP sockets that take bursts (the DNS server, the UDP relay's frontends)."""

from __future__ import annotations

import logging
import socket

log = logging.getLogger(__name__)

#: room for a burst of first datagrams while their flows (or answers) are made: the kernel's
#: default (~208 KiB) drops a few hundred new clients' datagrams arriving at once.
RECEIVE_BUFFER = 4 << 20


def enlarge_receive_buffer(sock: socket.socket, size: int = RECEIVE_BUFFER) -> None:
    """Best effort: SO_RCVBUFFORCE passes net.core.rmem_max with CAP_NET_ADMIN (the daemon
    has it), else SO_RCVBUF up to that cap."""
    for option in (getattr(socket, "SO_RCVBUFFORCE", None), socket.SO_RCVBUF):
        if option is None:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, size)
            return
        except OSError as error:
            log.debug("cannot enlarge a UDP receive buffer: %s", error)

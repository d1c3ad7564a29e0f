"""The node's addresses followed by rtnetlink events: RTM_NEWADDR/RTM_DELADDR and link changes
(RTM_NEWLINK/RTM_DELLINK), so NodePorts and health-check node ports open on an address as
it comes up (DHCP at boot, a second NIC) and close as it goes, instead of at the next poll.

A netlink socket joined to the address and link multicast groups, read on the event loop
(``loop.add_reader``; pyroute2's asyncio socket cannot run on uvloop, whose datagram
transport refuses AF_NETLINK); only the message types are read (netlink.py). An event only says "look
again": the addresses are then dumped whole (netlink.py), so a lost event costs nothing but
time, and a receive buffer overflow (ENOBUFS) counts as a change.

The VIPs are routes, not addresses (addresses.py): adding them, however many, raises no event here.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket

from kubeport.proxy.host.netlink import RTM_DELADDR, RTM_DELLINK, RTM_NEWADDR, RTM_NEWLINK, message_types

log = logging.getLogger(__name__)

# The rtnetlink multicast groups (include/uapi/linux/rtnetlink.h RTMGRP_*).
RTMGRP_LINK, RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR = 0x1, 0x10, 0x100
GROUPS = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR
EVENTS = frozenset({RTM_NEWADDR, RTM_DELADDR, RTM_NEWLINK, RTM_DELLINK})
_RECEIVE_BUFFER = 1 << 20


class AddressEvents:
    """``await changed()`` returns once an address or link changed since the last return."""

    def __init__(self) -> None:
        self._socket: socket.socket | None = None
        self._changed = asyncio.Event()
        self.events = 0

    def open(self) -> None:
        """Join the groups; OSError if netlink cannot be read here."""
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC,
                             socket.NETLINK_ROUTE)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RECEIVE_BUFFER)
            sock.bind((0, GROUPS))
        except OSError:
            sock.close()
            raise
        self._socket = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        assert self._socket is not None
        while True:
            try:
                data = self._socket.recv(65536)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:  # events were dropped: look again
                    self._changed.set()
                    continue
                raise
            for kind in message_types(data):
                if kind in EVENTS:
                    self.events += 1
                    self._changed.set()

    async def changed(self) -> None:
        await self._changed.wait()
        self._changed.clear()

    def close(self) -> None:
        if self._socket is not None:
            asyncio.get_running_loop().remove_reader(self._socket.fileno())
            self._socket.close()
            self._socket = None

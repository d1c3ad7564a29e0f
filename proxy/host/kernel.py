"""What this kernel offers the proxy, asked once: SCTP sockets, migration of queued connections."""

from __future__ import annotations

import socket


def sctp_supported() -> bool:
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_SCTP).close()
    except OSError:
        return False
    return True


def requests_migrate(path: str = "/proc/sys/net/ipv4/tcp_migrate_req") -> bool:
    """Does a closing listener hand its queued connections to its SO_REUSEPORT siblings?"""
    try:
        with open(path) as sysctl:
            return sysctl.read().strip() == "1"
    except OSError:
        return False

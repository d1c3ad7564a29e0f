"""What the daemon's process and its relay workers say to each other over their socketpair.

Length-prefixed pickles of these frozen dataclasses (and the slim types inside them): both
ends are the same kubeport, started from the same installation, so pickle's only risk, a
peer that is not us, does not arise (the socketpair is made before the worker starts and
inherited by it alone; an adoption's connection counts only from root or the same user,
``SO_PEERCRED``, who could run kubeport itself).

    parent -> worker   Start, then Apply* and at the end Stop, possibly Abort
    worker -> parent   Started, Applied (one per Apply), Stats (every interval), Failed, Stopped

A worker whose parent died (its channel ends without a Stop) goes on relaying and listens on
an abstract Unix socket, :func:`orphan_address`; the next daemon finds it there
(:func:`orphan_addresses`) and adopts it with the same conversation over that connection,
its first Apply ``whole``.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import struct
from dataclasses import dataclass
from typing import Any, Mapping, Union

from kubeport.endpoints.types import NodeInfo, ServiceName, ServicePortName, ServiceState
from kubeport.lib.version import __version__
from kubeport.proxy.config import ProxyConfig
from kubeport.proxy.stats import ServicePortStats
from kubeport.proxy.table import Frontend

_HEADER = struct.Struct("!I")


class _SameNode:
    """The node did not change since the last Apply (None is a node value too: no Node object)."""

    def __repr__(self) -> str:
        return "SAME_NODE"

    def __reduce__(self) -> str:
        return "SAME_NODE"  # unpickles as this module's one instance, so `is` holds across processes


SAME_NODE = _SameNode()


# --- parent -> worker -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start:
    config: ProxyConfig
    node_name: str
    #: addresses made local beside the VIPs (the DNS addresses)
    extra_addresses: tuple[str, ...]
    #: frontends the daemon serves itself (DNS): never a listener of the relay
    reserved_frontends: tuple[Frontend, ...]
    #: 1.. for the log lines' "[worker N]"
    index: int
    log_json: bool
    log_level: int


@dataclass(frozen=True, slots=True)
class Apply:
    seq: int
    #: the snapshot is servable (the source's whole view, or the last applied state)
    synced: bool
    node: NodeInfo | None | _SameNode
    #: the services changed since the previous Apply; None: deleted
    states: Mapping[ServiceName, ServiceState | None]
    #: the node's own addresses when they changed, else None
    node_addresses: tuple[str, ...] | None
    #: ``states`` is every service: a service the worker holds beyond them is gone (an adoption)
    whole: bool = False


@dataclass(frozen=True, slots=True)
class Stop:
    grace: float
    hand_over: bool


@dataclass(frozen=True, slots=True)
class Abort:
    """End the drain of a Stop now."""


# --- worker -> parent -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Started:
    #: the worker outlived its previous parent, and serves on with its connections
    adopted: bool = False


@dataclass(frozen=True, slots=True)
class Applied:
    seq: int
    problems: list[str]


@dataclass(frozen=True, slots=True)
class Stats:
    changed: Mapping[ServicePortName, ServicePortStats]
    gone: list[ServicePortName]


@dataclass(frozen=True, slots=True)
class Failed:
    message: str


@dataclass(frozen=True, slots=True)
class Stopped:
    pass


ToWorker = Union[Start, Apply, Stop, Abort]
ToParent = Union[Started, Applied, Stats, Failed, Stopped]


#: a daemon adopts workers of its own version only: the messages are pickles of its own types
_ORPHANS = "kubeport/{node}/worker/" + __version__ + "/"


def orphan_address(node_name: str, pid: int) -> str:
    """Where a worker whose parent died waits to be adopted (per network namespace, as every
    abstract name), by a daemon of the same version."""
    return "\0" + _ORPHANS.format(node=node_name) + str(pid)


def orphan_addresses(node_name: str, unix_table: str = "/proc/net/unix") -> list[str]:
    """The orphan workers of ``node_name`` listening in this network namespace, by pid."""
    prefix = "@" + _ORPHANS.format(node=node_name)
    try:
        with open(unix_table) as table:
            lines = table.read().splitlines()[1:]
    except OSError:
        return []
    found = set()
    for line in lines:
        fields = line.split()
        # Num RefCount Protocol Flags Type St Inode Path; St 01 (unconnected) with the listening flag
        if len(fields) >= 8 and fields[7].startswith(prefix) and int(fields[3], 16) & 0x10000:
            found.add("\0" + fields[7][1:])
    return sorted(found)


def trusted_peer(sock: socket.socket) -> int | None:
    """The pid at the other end of a Unix socket if it is root or this process's user, else None:
    any local user may bind or connect to an abstract name."""
    creds = struct.Struct("3i")
    pid, uid, _ = creds.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, creds.size))
    return pid if uid in (0, os.geteuid()) else None


def encode(message: ToWorker | ToParent) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


async def send(writer: asyncio.StreamWriter, message: ToWorker | ToParent) -> None:
    writer.write(encode(message))
    await writer.drain()


async def receive(reader: asyncio.StreamReader) -> Any:
    """The next message; None at EOF (the other process is gone)."""
    try:
        header = await reader.readexactly(_HEADER.size)
        return pickle.loads(await reader.readexactly(_HEADER.unpack(header)[0]))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None

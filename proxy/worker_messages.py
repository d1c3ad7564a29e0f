"""What the daemon's process and its relay workers say to each other over their socketpair.

Length-prefixed pickles of these frozen dataclasses (and the slim types inside them): both
ends are the same kubeport, started from the same installation, so pickle's only risk, a
peer that is not us, does not arise (the socketpair is made before the worker starts and
inherited by it alone).

    parent -> worker   Start, then Apply* and at the end Stop, possibly Abort
    worker -> parent   Started, Applied (one per Apply), Stats (every interval), Failed, Stopped
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from dataclasses import dataclass
from typing import Any, Mapping, Union

from kubeport.endpoints.types import NodeInfo, ServiceName, ServicePortName, ServiceState
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
    pass


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


async def send(writer: asyncio.StreamWriter, message: ToWorker | ToParent) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    writer.write(_HEADER.pack(len(payload)) + payload)
    await writer.drain()


async def receive(reader: asyncio.StreamReader) -> Any:
    """The next message; None at EOF (the other process is gone)."""
    try:
        header = await reader.readexactly(_HEADER.size)
        return pickle.loads(await reader.readexactly(_HEADER.unpack(header)[0]))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None

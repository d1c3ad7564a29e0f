"""The seams of the data flow: a Source feeds the ClusterState, a Consumer follows its snapshots,
a Journal keeps what the state holds across a restart.

    Source (manifests | kube-apiserver) -> ClusterState -> Snapshot -> Consumer (proxy | dns)

The daemon wires one source and two consumers through these protocols only (and, for
what only one of the consumers does, :mod:`kubeport.consumers`' ``ProxyConsumer`` and
``DnsConsumer``): it never asks which source or consumer it holds. Implementations:

- :class:`~kubeport.endpoints.manifests.source.ManifestSource`,
  :class:`~kubeport.endpoints.apiserver.source.ApiServerSource`;
- :class:`~kubeport.proxy.service.ProxyService`, :class:`~kubeport.dns.server.DnsServer`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Protocol

from kubeport.endpoints.types import Snapshot


class Source(Protocol):
    """Writes what it reads into a ClusterState (upsert, delete, mark synced, commit)."""

    #: "manifests" or "apiserver": the ``kind`` of ``kubeport get status``'s source section
    kind: str

    async def run(self) -> None:
        """Load everything, commit the first synced snapshot, then follow changes until cancelled.
        Raises only for what no retry can fix (a configuration that cannot work)."""
        ...

    @property
    def problems(self) -> list[str]:
        """Every current problem, one line each, naming the file or object and the field."""
        ...

    def status(self) -> dict[str, Any]:
        """Progress for ``kubeport get status`` (JSON values): what was read, per resource or file."""
        ...


class Consumer(Protocol):
    """Turns snapshots into a data plane. Each consumer follows on its own task, so a slow one
    never delays the other; a failed apply is retried, the last good state kept meanwhile."""

    #: "proxy" or "dns": log lines, readiness lines and status keys
    name: str

    async def start(self) -> None:
        """Open what it serves on (listeners, addresses) before its first snapshot."""
        ...

    def snapshot_queued(self, snapshot: Snapshot) -> None:
        """A newer snapshot exists and will be applied next (kube-proxy's "sync queued")."""
        ...

    async def apply_snapshot(self, snapshot: Snapshot) -> None:
        """Make the data plane serve ``snapshot`` (synced); raises to have it retried."""
        ...

    @property
    def problems(self) -> list[str]:
        """What the consumer cannot serve as asked, one line each."""
        ...


#: one object as the last applied state keeps it: (kind, (namespace, name), value)
Entry = tuple[str, tuple[str, str], Any]


class Journal(Protocol):
    """Keeps every change of the ClusterState, so that a restarted daemon serves its last view
    (:class:`~kubeport.survival.laststate.LastState`)."""

    def attach(self, entries: Callable[[], Iterator[Entry]]) -> None:
        """``entries`` lists everything held now (for a whole base)."""
        ...

    def record(self, kind: str, key: tuple[str, str], value: Any) -> None:
        """One change; ``value`` None: the object is gone."""
        ...


class Saved(Protocol):
    """A kept state read back: what :meth:`ClusterState.restore` serves until the first sync."""

    entries: dict[tuple[str, tuple[str, str]], Any]
    #: Unix time of the last change it holds
    saved_at: float

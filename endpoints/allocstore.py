"""Persistence of Service allocations (stdlib sqlite3), so they survive restarts.

One row per Service (namespace, name): its uid, creationTimestamp, clusterIPs, the
nodePort of each (port name, protocol, port) and its healthCheckNodePort. Every
``put``/``delete`` is one statement, hence one atomic transaction. The database runs
in WAL mode with ``synchronous=NORMAL``: a commit survives a crash of the daemon
without an fsync per Service, which keeps a first load of thousands of Services fast.

``AllocationStore(None)`` keeps everything in memory (``kubeport check``, tests).
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FILE_NAME = "allocations.db"
DEFAULT_STATE_DIR = "/var/lib/kubeport"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS service_allocations (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    uid TEXT NOT NULL,
    creation_timestamp TEXT NOT NULL,
    cluster_ips TEXT NOT NULL,
    node_ports TEXT NOT NULL,
    health_check_node_port INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, name)
) WITHOUT ROWID
"""


class StoreError(Exception):
    """The allocation database cannot be opened, read or written; the message names its path."""


@dataclass(frozen=True, slots=True)
class NodePortAllocation:
    """The nodePort given to one entry of spec.ports, keyed like the entry itself."""

    name: str  # "" when unnamed
    protocol: str
    port: int
    node_port: int


@dataclass(frozen=True, slots=True)
class ServiceAllocation:
    namespace: str
    name: str
    uid: str
    #: RFC 3339 in UTC, e.g. "2024-05-01T12:00:00Z".
    creation_timestamp: str
    cluster_ips: tuple[str, ...] = ()
    node_ports: tuple[NodePortAllocation, ...] = ()
    health_check_node_port: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def held_ports(self) -> set[int]:
        """Every node port this Service holds (nodePorts and the health check port)."""
        held = {p.node_port for p in self.node_ports if p.node_port}
        if self.health_check_node_port:
            held.add(self.health_check_node_port)
        return held


class AllocationStore:
    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        """Open (creating if needed) the database at ``path``; ``None`` means in memory."""
        self.path = Path(path) if path is not None else None
        self._where = str(self.path) if self.path is not None else "(in memory)"
        self._conn = self._guard("open", self._open)

    @classmethod
    def in_state_dir(cls, state_dir: str | os.PathLike[str] = DEFAULT_STATE_DIR) -> "AllocationStore":
        """The store at ``<state_dir>/allocations.db`` (``--state-dir``), creating the directory."""
        directory = Path(state_dir)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            reason = f"cannot create {directory}: {exc.strerror}"
            raise StoreError(f"allocation store {directory / FILE_NAME}: {reason}") from exc
        return cls(directory / FILE_NAME)

    def _guard(self, action: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except sqlite3.Error as exc:
            raise StoreError(f"allocation store {self._where}: cannot {action}: {exc}") from exc

    def _open(self) -> sqlite3.Connection:
        target = ":memory:" if self.path is None else str(self.path)
        conn = sqlite3.connect(target, isolation_level=None, check_same_thread=False)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise sqlite3.DatabaseError(f"schema version {version} is newer than this kubeport ({SCHEMA_VERSION})")
            if self.path is not None:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(_SCHEMA)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except BaseException:
            conn.close()
            raise
        return conn

    def load(self) -> list[ServiceAllocation]:
        """Every stored allocation, sorted by namespace and name."""
        rows = self._guard("read", self._select)
        return [self._decode(row) for row in rows]

    def _select(self) -> list[tuple[Any, ...]]:
        return self._conn.execute(
            "SELECT namespace, name, uid, creation_timestamp, cluster_ips, node_ports, health_check_node_port "
            "FROM service_allocations ORDER BY namespace, name"
        ).fetchall()

    def _decode(self, row: tuple[Any, ...]) -> ServiceAllocation:
        namespace, name, uid, created, cluster_ips, node_ports, health = row
        try:
            return ServiceAllocation(
                namespace=namespace,
                name=name,
                uid=uid,
                creation_timestamp=created,
                cluster_ips=tuple(str(ip) for ip in json.loads(cluster_ips)),
                node_ports=tuple(
                    NodePortAllocation(str(n), str(proto), int(port), int(node_port))
                    for n, proto, port, node_port in json.loads(node_ports)
                ),
                health_check_node_port=int(health),
            )
        except (ValueError, TypeError) as exc:
            raise StoreError(f"allocation store {self._where}: cannot read Service {namespace}/{name}: {exc}") from exc

    def put(self, allocation: ServiceAllocation) -> None:
        """Insert or replace one Service's allocations (one transaction)."""
        node_ports = [[p.name, p.protocol, p.port, p.node_port] for p in allocation.node_ports]
        self._guard(
            "write",
            self._conn.execute,
            "INSERT OR REPLACE INTO service_allocations VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                allocation.namespace,
                allocation.name,
                allocation.uid,
                allocation.creation_timestamp,
                json.dumps(list(allocation.cluster_ips)),
                json.dumps(node_ports),
                allocation.health_check_node_port,
            ),
        )

    def delete(self, namespace: str, name: str) -> None:
        """Forget one Service's allocations (one transaction); absent is fine."""
        self._guard(
            "write",
            self._conn.execute,
            "DELETE FROM service_allocations WHERE namespace = ? AND name = ?",
            (namespace, name),
        )

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "AllocationStore":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

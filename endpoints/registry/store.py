"""Persistence of Service allocations (stdlib sqlite3), so they survive restarts.

One row per Service (namespace, name): its uid, creationTimestamp, clusterIPs, the
nodePort of each (port name, protocol, port) and its healthCheckNodePort. Every
``put``/``delete`` is one statement, hence one atomic transaction, unless it runs inside
``grouped()``, where the writes share one transaction (a first load writes thousands). The
database runs in WAL mode with ``synchronous=NORMAL``: a commit survives a crash of the
daemon without an fsync per commit.

``AllocationStore(None)`` keeps everything in memory (``kubeport check``, tests).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

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


#: the ServiceCIDR objects of the manifests (KEP-1880), so that a restart knows the ranges of
#: the stored ClusterIPs before the files are read again; ``terminating``: its manifest is gone
#: and Services still hold addresses in it (the finalizer of pkg/controller/servicecidrs)
_SCHEMA_SERVICE_CIDRS = """
CREATE TABLE IF NOT EXISTS service_cidrs (
    name TEXT NOT NULL PRIMARY KEY,
    cidrs TEXT NOT NULL,
    terminating INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID
"""


@dataclass(frozen=True, slots=True)
class ServiceCIDRRecord:
    name: str
    cidrs: tuple[str, ...]
    terminating: bool = False


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
        #: the writes of the open group transaction, if any (replayed if it is lost)
        self._journal: list[tuple[str, tuple[Any, ...]]] | None = None
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
            conn.execute(_SCHEMA_SERVICE_CIDRS)
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
                creation_timestamp=sys.intern(created),  # shared by the services of one start-up
                cluster_ips=tuple(str(ip) for ip in json.loads(cluster_ips)),
                node_ports=tuple(
                    NodePortAllocation(str(n), str(proto), int(port), int(node_port))
                    for n, proto, port, node_port in json.loads(node_ports)
                ),
                health_check_node_port=int(health),
            )
        except (ValueError, TypeError) as exc:
            raise StoreError(f"allocation store {self._where}: cannot read Service {namespace}/{name}: {exc}") from exc

    def load_service_cidrs(self) -> list[ServiceCIDRRecord]:
        """Every stored ServiceCIDR, by name."""
        rows = self._guard("read", lambda: self._conn.execute(
            "SELECT name, cidrs, terminating FROM service_cidrs ORDER BY name").fetchall())
        try:
            return [ServiceCIDRRecord(name, tuple(str(c) for c in json.loads(cidrs)), bool(terminating))
                    for name, cidrs, terminating in rows]
        except (ValueError, TypeError) as exc:
            raise StoreError(f"allocation store {self._where}: cannot read the ServiceCIDRs: {exc}") from exc

    def put_service_cidr(self, record: ServiceCIDRRecord) -> None:
        self._write("INSERT OR REPLACE INTO service_cidrs VALUES (?, ?, ?)",
                    (record.name, json.dumps(list(record.cidrs)), int(record.terminating)))

    def delete_service_cidr(self, name: str) -> None:
        self._write("DELETE FROM service_cidrs WHERE name = ?", (name,))

    def put(self, allocation: ServiceAllocation) -> None:
        """Insert or replace one Service's allocations (one transaction, or part of the group)."""
        node_ports = [[p.name, p.protocol, p.port, p.node_port] for p in allocation.node_ports]
        self._write(
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
        """Forget one Service's allocations (one transaction, or part of the group); absent is fine."""
        self._write("DELETE FROM service_allocations WHERE namespace = ? AND name = ?", (namespace, name))

    @contextlib.contextmanager
    def grouped(self) -> Iterator[None]:
        """The writes inside share one transaction, committed on leaving (nested: the outer one).

        A write that fails inside still raises :class:`StoreError` at once, so its Service is
        refused as before; should SQLite have rolled the whole transaction back with it (a full
        disk, an I/O error), the writes before it are replayed. Should the final commit fail,
        each write is tried again on its own, and those that still fail are logged: their
        Services stay admitted, with allocations held in memory only.
        """
        if self._journal is not None:
            yield
            return
        self._guard("write", self._conn.execute, "BEGIN")
        self._journal = []
        try:
            yield
        finally:
            journal, self._journal = self._journal, None
            self._commit(journal)

    def _write(self, sql: str, args: tuple[Any, ...]) -> None:
        try:
            self._guard("write", self._conn.execute, sql, args)
        except StoreError:
            if self._journal is not None and not self._conn.in_transaction:
                self._replay(self._journal, restart=True)
            raise
        if self._journal is not None:
            self._journal.append((sql, args))

    def _commit(self, journal: list[tuple[str, tuple[Any, ...]]]) -> None:
        try:
            self._conn.execute("COMMIT")
            return
        except sqlite3.Error as exc:
            log.error("allocation store %s: cannot commit %d writes (%s): writing them one by one",
                      self._where, len(journal), exc)
        with contextlib.suppress(sqlite3.Error):
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        self._replay(journal, restart=False)

    def _replay(self, journal: list[tuple[str, tuple[Any, ...]]], *, restart: bool) -> None:
        """Write ``journal`` again: in a new group transaction (``restart``) or one by one."""
        try:
            if restart:
                self._conn.execute("BEGIN")
        except sqlite3.Error as exc:
            log.error("allocation store %s: cannot restart the transaction: %s", self._where, exc)
            restart = False
        for sql, args in journal:
            try:
                self._conn.execute(sql, args)
            except sqlite3.Error as exc:
                log.error("allocation store %s: allocations of Service %s/%s not persisted: %s",
                          self._where, args[0], args[1], exc)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "AllocationStore":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

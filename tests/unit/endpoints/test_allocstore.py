"""SQLite persistence of Service allocations."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from kubeport.endpoints.registry.store import (
    FILE_NAME,
    AllocationStore,
    NodePortAllocation,
    ServiceAllocation,
    StoreError,
)

WEB = ServiceAllocation(
    namespace="default",
    name="web",
    uid="7f1c7f8e-0000-4000-8000-000000000001",
    creation_timestamp="2024-05-01T12:00:00Z",
    cluster_ips=("10.96.0.20", "fd00:10:96::20"),
    node_ports=(NodePortAllocation("dns", "UDP", 53, 30053), NodePortAllocation("dns-tcp", "TCP", 53, 30053)),
    health_check_node_port=30999,
)
API = ServiceAllocation("team-a", "api", "uid-2", "2024-05-02T08:00:00Z", ("10.96.0.21",))


@pytest.mark.parametrize("on_disk", [False, True], ids=["in_memory", "sqlite_file"])
def test_put_load_delete_roundtrip(on_disk: bool, tmp_path: Path) -> None:
    store = AllocationStore(tmp_path / FILE_NAME if on_disk else None)
    store.put(API)
    store.put(WEB)
    assert store.load() == [WEB, API]  # sorted by namespace, name
    store.put(ServiceAllocation("default", "web", WEB.uid, WEB.creation_timestamp))
    assert store.load()[0].cluster_ips == ()
    store.delete("default", "web")
    store.delete("default", "web")  # absent is fine
    assert store.load() == [API]


def test_survives_reopening(tmp_path: Path) -> None:
    with AllocationStore.in_state_dir(tmp_path / "state") as store:
        store.put(WEB)
    assert (tmp_path / "state" / FILE_NAME).is_file()
    with AllocationStore.in_state_dir(tmp_path / "state") as store:
        assert store.load() == [WEB]


def test_held_ports_include_the_health_check_port() -> None:
    assert WEB.held_ports() == {30053, 30999} and WEB.key == "default/web"


def test_corrupt_database_is_a_clear_error_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    path.write_bytes(b"this is not a database, just garbage " * 100)
    with pytest.raises(StoreError, match=f"allocation store {path}: cannot open: file is not a database"):
        AllocationStore(path)


def test_unreadable_row_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    AllocationStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO service_allocations VALUES ('default', 'web', 'u', 't', 'not json', '[]', 0)")
    with pytest.raises(StoreError, match=f"allocation store {path}: cannot read Service default/web"):
        AllocationStore(path).load()


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="schema version 99 is newer"):
        AllocationStore(path)


def test_state_dir_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StoreError, match=f"allocation store {blocker / 'state' / FILE_NAME}: cannot create"):
        AllocationStore.in_state_dir(blocker / "state")

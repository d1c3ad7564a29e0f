"""Grouped writes of the allocation store: one transaction per batch of admissions, and a
failing write still refuses only its own Service."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from kubeport.endpoints.registry.store import FILE_NAME, AllocationStore, ServiceAllocation, StoreError


def allocation(name: str) -> ServiceAllocation:
    return ServiceAllocation("default", name, f"uid-{name}", "2024-05-01T12:00:00Z", ("10.96.0.20",))


def stored_names(path: Path) -> list[str]:
    """What another reader of the database sees (committed rows only)."""
    conn = sqlite3.connect(path)
    try:
        return [name for (name,) in conn.execute("SELECT name FROM service_allocations ORDER BY name")]
    finally:
        conn.close()


def refuse(path: Path, name: str, how: str) -> None:
    """A trigger that makes writing ``name`` fail: ABORT undoes the statement, ROLLBACK the transaction."""
    conn = sqlite3.connect(path)
    conn.execute(f"CREATE TRIGGER refuse BEFORE INSERT ON service_allocations WHEN NEW.name = '{name}' "
                 f"BEGIN SELECT RAISE({how}, 'refused'); END")
    conn.commit()
    conn.close()


def test_grouped_writes_are_committed_together_on_leaving(tmp_path):
    path = tmp_path / FILE_NAME
    store = AllocationStore(path)
    with store.grouped():
        store.put(allocation("a"))
        with store.grouped():  # nested: part of the outer group
            store.put(allocation("b"))
        store.delete("default", "a")
        assert stored_names(path) == []  # nothing visible before the commit
    assert stored_names(path) == ["b"]


@pytest.mark.parametrize("how", ["ABORT", "ROLLBACK"],
                         ids=["statement_undone", "whole_transaction_rolled_back__replayed"])
def test_a_failing_write_refuses_only_itself(tmp_path, how):
    path = tmp_path / FILE_NAME
    store = AllocationStore(path)
    refuse(path, "bad", how)
    with store.grouped():
        store.put(allocation("a"))
        with pytest.raises(StoreError, match="cannot write: refused"):
            store.put(allocation("bad"))
        store.put(allocation("c"))
    assert stored_names(path) == ["a", "c"]

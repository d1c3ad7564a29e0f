"""Fixtures for integration tests: the netns topology, pod workloads, process ownership, and the
kubeport log tail in the report of a failed test."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.netns import (
    DAEMONS,
    Topology,
    process_scope,
    reap_all,
    require_netns,
    start_pods,
    unique_prefix,
)

_TEST_STARTED = pytest.StashKey[float]()


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    """The two-node topology with 2 pods per node, fresh per module, always torn down."""
    require_netns()
    topo = Topology.up(unique_prefix(), pods_per_node=2)
    try:
        yield topo
    finally:
        topo.down()


@pytest.fixture(scope="module")
def pods(topology: Topology) -> dict:
    """podserver running in every pod namespace (a1, a2, b1, b2); stopped with the topology."""
    return start_pods(topology)


@pytest.fixture
def pod_of(topology: Topology):
    """A pod by its short name ("a1": node-a's first pod)."""
    return lambda name: topology.pod_info(name[0], int(name[1:]))


@pytest.fixture(autouse=True)
def _processes_die_with_the_test() -> Iterator[None]:
    with process_scope():
        yield


def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_TEST_STARTED] = time.time()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.failed and report.when in ("setup", "call"):
        started = item.stash.get(_TEST_STARTED, 0.0)
        for daemon in DAEMONS:
            if daemon.running or _modified_since(daemon.log_path, started):
                report.sections.append((f"kubeport log tail ({daemon.ns}, {daemon.log_path})", daemon.log_tail()))
    return report


def _modified_since(path: Path, since: float) -> bool:
    try:
        return path.stat().st_mtime >= since
    except FileNotFoundError:
        return False


def pytest_sessionfinish(session: pytest.Session) -> None:
    reap_all()

"""Suite-wide rules.

Under ``CI=true`` an integration test that cannot run (no root, no network
namespaces) is a failure, never a silent skip: a green CI must mean the real
network tests ran.
"""

from __future__ import annotations

import os

import pytest

from support.netns import host_privileges_missing

IN_CI = os.environ.get("CI", "").lower() == "true"


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before the fixtures: a module's topology is not made for a test that cannot run. Under
    # CI=true an integration test's skip is a failure (below): an unprivileged CI run
    # deselects these with -m "not host_privileges" instead.
    if (marker := item.get_closest_marker("host_privileges")) and (missing := host_privileges_missing()):
        pytest.skip(f"needs host privileges: {marker.args[0] if marker.args else 'root of the host'} ({missing})")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if IN_CI and report.skipped and item.get_closest_marker("integration") is not None:
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.longrepr = f"integration test skipped under CI=true (counts as a failure): {reason}"
    return report

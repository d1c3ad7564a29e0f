"""Suite-wide rules.

Under ``CI=true`` an integration test that cannot run (no root, no network
namespaces) is a failure, never a silent skip: a green CI must mean the real
network tests ran.
"""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if IN_CI and report.skipped and item.get_closest_marker("integration") is not None:
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.longrepr = f"integration test skipped under CI=true (counts as a failure): {reason}"
    return report

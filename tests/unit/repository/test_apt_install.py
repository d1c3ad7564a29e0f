"""netns-scripts/apt-install.sh, which setup.sh and .ci/run use: it waits for another apt
process's locks instead of failing. apt-get is a stand-in on PATH here (the real one needs
the network and root); the script itself runs in bash as the set-up does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "netns-scripts" / "apt-install.sh"

#: An apt-get that fails with apt's lock message while $LOCKED_TIMES is above the calls made.
STAND_IN = """#!/bin/sh
echo "$*" >> "$CALLS"
count=$(wc -l < "$CALLS")
if [ "$count" -le "$LOCKED_TIMES" ]; then
    echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4220 (apt-get)" >&2
    exit 100
fi
if [ -n "$BROKEN" ]; then echo "E: Unable to locate package $BROKEN" >&2; exit 100; fi
exit 0
"""


def run(tmp_path: Path, locked_times: int, broken: str = "",
        timeout: int = 60) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "apt-get").write_text(STAND_IN)
    (bin_dir / "apt-get").chmod(0o755)
    calls = tmp_path / "calls"
    calls.write_text("")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls),
           "LOCKED_TIMES": str(locked_times), "BROKEN": broken, "KUBEPORT_APT_RETRY_SECONDS": "0",
           "KUBEPORT_APT_LOCK_TIMEOUT": str(timeout)}
    done = subprocess.run(["bash", str(SCRIPT), "curl", "nftables"], env=env, capture_output=True, text=True,
                          timeout=30, check=False)
    return done, calls.read_text().splitlines()


def test_dpkgs_lock_is_waited_for_by_apt_itself(tmp_path):
    done, calls = run(tmp_path, locked_times=0)
    assert done.returncode == 0, done.stderr
    assert calls == ["-o DPkg::Lock::Timeout=60 update -qq",
                     "-o DPkg::Lock::Timeout=60 install -y -qq --no-install-recommends curl nftables"]


def test_the_lists_lock_held_by_another_apt_is_waited_for(tmp_path):
    done, calls = run(tmp_path, locked_times=2)
    assert done.returncode == 0, done.stderr
    assert [call.split()[2] for call in calls] == ["update", "update", "update", "install"]
    assert done.stderr.count("another apt process holds its lock; waiting") == 2


@pytest.mark.parametrize("locked_times, broken, message", [
    pytest.param(0, "nftables", "Unable to locate package nftables", id="another_error_fails_at_once"),
    pytest.param(99, "", "Could not get lock", id="a_lock_held_past_the_timeout_fails"),
])
def test_failures_are_shown(tmp_path, locked_times, broken, message):
    done, calls = run(tmp_path, locked_times, broken, timeout=0)
    assert done.returncode != 0 and message in done.stderr
    assert len(calls) <= 2

"""Cgroups of the tests' own for connect-time balancing.

A daemon attaches its connect() programs to one cgroup v2; two daemons on one test machine
must never share one, and the machine's other processes must never be in one. Every daemon the
harness starts gets a cgroup of its own under ``kubeport-tests/`` (empty unless a test puts
its pods' processes there), or ``--no-connect-balancing`` where this machine cannot load and
attach BPF programs at all (a user namespace, no CAP_BPF): then the daemon would only report
that it cannot, in every test.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import subprocess
from pathlib import Path
from typing import Any, Sequence

from kubeport.proxy.connectlb import pins

PARENT = "kubeport-tests"


def host_cgroup2_root() -> Path | None:
    """Where this process (the test runner, in the host's mount namespace) sees cgroup v2."""
    found = pins.mounts_of(Path("/proc/self/mountinfo").read_text(), "cgroup2")
    return found[0] if found else None


@functools.cache
def connect_balancing_possible() -> str | None:
    """None when this machine can balance at connect() (cgroup v2 writable, BPF maps allowed),
    else why not."""
    root = host_cgroup2_root()
    if root is None:
        return "no cgroup v2 hierarchy mounted"
    try:
        probe = TestCgroup("probe")
        probe.remove()
        from kubeport.proxy.connectlb.maps import HashMap

        HashMap(4, 4, 1).close()
    except OSError as exc:
        return f"{exc.strerror or exc}"
    return None


class TestCgroup:
    __test__ = False  # not a test class for pytest

    """``<cgroup2>/kubeport-tests/<name>``, made now; ``hierarchy_path`` is what the daemon's
    ``--connect-balancing-cgroup`` takes."""

    def __init__(self, name: str) -> None:
        root = host_cgroup2_root()
        if root is None:
            raise OSError(2, "no cgroup v2 hierarchy mounted")
        self.hierarchy_path = f"/{PARENT}/{name}"
        self.path = root / PARENT / name
        self.path.mkdir(parents=True, exist_ok=True)

    def command(self, argv: Sequence[Any]) -> list[str]:
        """``argv`` run as a member: the shell joins the cgroup, then execs (a socket belongs to
        the cgroup of the process that creates it)."""
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.path), *map(str, argv)]

    def members(self) -> list[int]:
        return [int(pid) for pid in (self.path / "cgroup.procs").read_text().split()]

    def remove(self) -> None:
        """rmdir (a cgroup with live members stays; they are the test's, killed when it ends)."""
        with contextlib.suppress(OSError):
            self.path.rmdir()


def daemon_args(name: str) -> tuple[str, ...]:
    """The connect-balancing arguments of a test daemon: its own cgroup, or none where impossible."""
    if connect_balancing_possible() is not None:
        return ("--no-connect-balancing",)
    return (f"--connect-balancing-cgroup={TestCgroup(name).hierarchy_path}",)


def mount_bpffs(target: Path) -> Path:
    """A bpffs of the test's own, in the host's mount namespace, so pins outlive a killed
    daemon (``ip netns exec`` gives each daemon a mount namespace of its own)."""
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "bpf", "bpf", str(target)], check=True, capture_output=True)
    return target


def unmount(target: Path) -> None:
    subprocess.run(["umount", "-l", str(target)], check=False, capture_output=True)
    shutil.rmtree(target, ignore_errors=True)


def remove_all() -> None:
    """Every test cgroup left empty (at the end of the session)."""
    root = host_cgroup2_root()
    if root is None or not (root / PARENT).is_dir():
        return
    for child in (root / PARENT).iterdir():
        if child.is_dir():
            with contextlib.suppress(OSError):
                child.rmdir()
    with contextlib.suppress(OSError):
        (root / PARENT).rmdir()

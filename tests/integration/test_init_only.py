"""`kubeport run --init-only` and the daemon's check of the node's settings, in a network
namespace the test makes (net.ipv4.tcp_migrate_req and the port ranges are per namespace: a new
one starts at the kernel's defaults, and the host's values are not touched).

/proc/sys as an unprivileged container sees it is played by a mount namespace of the command's
own (unshare) in which /proc/sys is bound read-only, as a container runtime mounts it."""

from __future__ import annotations

import subprocess

import pytest

from support.netns import (
    CommandFailed,
    KubeportDaemon,
    run_in,
    scratch_namespace,
)
from support.netns.daemon import kubeport_bin

pytestmark = pytest.mark.integration

MIGRATE = "net.ipv4.tcp_migrate_req"
EPHEMERAL = "net.ipv4.ip_local_port_range"
RESERVED = "net.ipv4.ip_local_reserved_ports"
#: runs the rest of its command line with /proc/sys read-only, as in an unprivileged container
READ_ONLY_PROC_SYS = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                      'mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec "$0" "$@"']


@pytest.fixture
def namespace():
    with scratch_namespace("init") as ns:
        yield ns


def sysctl(ns: str | None, name: str) -> str:
    return run_in(ns, "sysctl", "-n", name).stdout.strip()


def init_only(ns: str, *args: str, read_only: bool = False) -> subprocess.CompletedProcess:
    wrapper = READ_ONLY_PROC_SYS if read_only else []
    return run_in(ns, *wrapper, kubeport_bin(), "run", "--init-only", "--hostname-override", "node-a", *args,
                  timeout=30, check=False)


def test_init_only_sets_the_settings_of_its_network_namespace_and_exits_0(namespace):
    ns = namespace
    host = {name: sysctl(None, name) for name in (MIGRATE, RESERVED)}
    run_in(ns, "sysctl", "-q", "-w", f"{EPHEMERAL}=10240 65535")  # overlaps the NodePort range
    assert (sysctl(ns, MIGRATE), sysctl(ns, RESERVED)) == ("0", "")

    done = init_only(ns, "--service-node-port-range", "30000-32767")
    assert done.returncode == 0, done.stderr
    assert (sysctl(ns, MIGRATE), sysctl(ns, RESERVED)) == ("1", "30000-32767")
    assert f"set {MIGRATE} = 1 (was 0)" in done.stderr
    assert {name: sysctl(None, name) for name in host} == host

    again = init_only(ns, "--service-node-port-range", "30000-32767", read_only=True)
    assert again.returncode == 0, again.stderr  # what holds is not written: a read-only /proc/sys passes
    assert f"{MIGRATE} = 1 already" in again.stderr


def test_init_only_without_privilege_names_each_setting_and_the_error_and_fails(namespace):
    ns = namespace
    done = init_only(ns, read_only=True)
    assert done.returncode == 1
    assert f"cannot set {MIGRATE} to 1 (it is 0): Read-only file system" in done.stderr
    assert sysctl(ns, MIGRATE) == "0"


def problems(ns: str) -> list[str]:
    """The daemon's problem lines, as `kubeport get` prints them (on stderr, after the listing)."""
    done = run_in(ns, kubeport_bin(), "get", "services", "-A", timeout=30)
    return [line.strip() for line in done.stderr.splitlines() if line.startswith("  ")]


def start_daemon(ns: str, tmp_path, *, read_only: bool) -> KubeportDaemon:
    (tmp_path / "manifests").mkdir(exist_ok=True)
    program = [*READ_ONLY_PROC_SYS, kubeport_bin()] if read_only else None
    daemon = KubeportDaemon(ns, tmp_path / "manifests", tmp_path / "state", "--upstream", "127.0.0.1:53535",
                            node_name="node-a", program=program)
    daemon.wait_ready(timeout=30)
    return daemon


def test_the_daemon_that_cannot_set_it_reports_one_problem_line_naming_it_and_the_fix(namespace, tmp_path):
    ns = namespace
    daemon = start_daemon(ns, tmp_path, read_only=True)
    [problem] = [line for line in problems(ns) if MIGRATE in line]
    assert problem.startswith(f"node setting {MIGRATE} is 0, not 1: ")
    assert "kubeport run --init-only" in problem and "/etc/sysctl.d/" in problem
    assert problem in daemon.log_text()  # and a warning in its log
    assert sysctl(ns, MIGRATE) == "0"
    daemon.stop()


def test_the_daemon_after_init_only_reads_the_settings_and_reports_nothing(namespace, tmp_path):
    ns = namespace
    assert init_only(ns).returncode == 0
    daemon = start_daemon(ns, tmp_path, read_only=True)
    assert not [line for line in problems(ns) if "node setting" in line]
    assert MIGRATE not in daemon.log_text()
    daemon.stop()


def test_the_daemon_that_can_write_sets_it_itself(namespace, tmp_path):
    """Root with a writable /proc/sys (kubeport run on a node by hand): nothing left to report."""
    ns = namespace
    daemon = start_daemon(ns, tmp_path, read_only=False)
    assert sysctl(ns, MIGRATE) == "1"
    assert f"set {MIGRATE} = 1 (was 0)" in daemon.log_text()
    assert not [line for line in problems(ns) if "node setting" in line]
    daemon.stop()


def test_the_read_only_wrapper_is_what_a_container_sees(namespace):
    """The stand-in for an unprivileged container: /proc/sys cannot be written, even by root."""
    with pytest.raises(CommandFailed, match="Read-only file system"):
        run_in(namespace, *READ_ONLY_PROC_SYS, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/tcp_migrate_req")

"""A real systemd (Debian's, the one the shipped unit is written for) as PID 1 of a PID and
mount namespace of its own, to run deploy/kubeport.service as a node would.

systemd runs in a container when ``$container`` is set (systemd's src/basic/virt.c
detect_container), so its early units that assume a whole machine (udev, getty, the
hardware ones) are skipped by their ConditionVirtualization=!container. What it still does
at boot must not reach the host: systemd-tmpfiles-setup empties /tmp (tmpfiles.d/tmp.conf's
``D /tmp``), journald and the random seed write under /var. So the namespace sees the host
read-only, with tmpfs over /run, /tmp, /var/tmp, /var/log, /var/lib/systemd and the unit's
own directories (/var/lib/kubeport, /etc/kubeport). Bound in before that, as they were:
the host's /run/netns (the unit joins a test node's network namespace with
NetworkNamespacePath=), the repo (its venv runs the daemon) and the test's manifests
(as /etc/kubeport/manifests, the shipped configuration's directory).

Everything ends with PID 1: killed, the kernel ends every process of its PID namespace
(pid_namespaces(7)), and its mounts go with the last of them.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import textwrap
from pathlib import Path

from ..wait import until_sync
from . import REPO, cgroups
from .daemon import kubeport_bin
from .proc import CommandFailed, run_in, spawn_in, stop_process

SYSTEMD = Path("/lib/systemd/systemd")
UNIT = REPO / "deploy" / "kubeport.service"
CONFIG = REPO / "deploy" / "kubeport.yaml"
#: what systemd writes at boot, or the unit writes later: each a tmpfs of the namespace
PRIVATE = ("/run", "/tmp", "/var/tmp", "/var/log", "/var/lib/systemd", "/var/lib/kubeport", "/etc/kubeport")


def available() -> str | None:
    """Why systemd cannot run here, or None."""
    if not SYSTEMD.exists():
        return f"{SYSTEMD} not installed (Debian's systemd package)"
    return None


def _boot_script(binds: dict[Path, str]) -> str:
    """The shell run as the namespace's first process: the mounts, then exec systemd.

    ``binds``: host path -> where the namespace sees it (bound before the tmpfs go over)."""
    lines = ["set -e", "mount --make-rprivate /", "stage=$(mktemp -d /dev/shm/kubeport-systemd.XXXXXX)"]
    for index, source in enumerate(binds):
        lines += [f"mkdir -p $stage/{index}", f"mount --rbind {shlex.quote(str(source))} $stage/{index}"]
    for directory in PRIVATE:
        lines.append(f"mkdir -p {directory} && mount -t tmpfs -o mode=0755 tmpfs {directory}")
    # No timers (apt-daily, tmpfiles-clean): nothing but the unit under test runs.
    lines.append("mkdir -p /run/systemd/system && ln -s /dev/null /run/systemd/system/timers.target")
    for index, target in enumerate(binds.values()):
        lines += [f"mkdir -p {shlex.quote(target)}", f"mount --move $stage/{index} {shlex.quote(target)}"]
    lines += ["rmdir $stage/* $stage", "mount -o remount,bind,ro /",
              f"exec env container=kubeport-test {SYSTEMD} --system --unit=basic.target"]
    return "\n".join(lines)


class Systemd:
    """``boot()`` it, ``install()`` the unit, then ``systemctl()`` and ``show()`` as on a node."""

    def __init__(self, manifests: Path) -> None:
        self.manifests = manifests
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        """systemd's pid as the host sees it (the namespace's init)."""
        assert self.proc is not None
        found = run_in(None, "pgrep", "-P", str(self.proc.pid), "-x", "systemd", check=False).stdout.split()
        if not found:
            raise RuntimeError(f"systemd is not running: {self.proc.poll()=}")
        return int(found[0])

    def boot(self, timeout: float = 30.0) -> None:
        venv = kubeport_bin().resolve().parent.parent  # the kubeport under test, maybe outside the repo
        binds = {Path("/run/netns"): "/run/netns", REPO: str(REPO), venv: str(venv),
                 self.manifests: "/etc/kubeport/manifests"}
        self.proc = spawn_in(None, "unshare", "--pid", "--fork", "--mount", "--mount-proc",
                             "bash", "-c", _boot_script(binds),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

        def running() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"systemd ended at boot ({self.proc.returncode}): "
                                   f"{self.proc.stderr.read().decode(errors='replace')}")
            try:
                state = self.run("systemctl", "is-system-running", check=False).stdout.strip()
            except RuntimeError:  # not forked yet
                return False
            return state in ("running", "degraded")

        until_sync(running, "systemd in its namespace running", timeout, interval=0.1)

    def run(self, *cmd: str, check: bool = True, timeout: float = 30.0, input: str | None = None
            ) -> subprocess.CompletedProcess:
        """A command in systemd's PID and mount namespaces (the host's network namespace)."""
        return run_in(None, "nsenter", "-t", str(self.pid), "-m", "-p", *cmd, check=check, timeout=timeout,
                      input=input)

    def kubeport(self, netns: str, *args: str, timeout: float = 30.0) -> str:
        """`kubeport ARGS` as the node's operator runs it: in systemd's mount namespace (the
        unit's state directory, and its status socket, are there) and the node's network one."""
        return self.run("nsenter", f"--net=/run/netns/{netns}", str(kubeport_bin()), *args, timeout=timeout).stdout

    def systemctl(self, *args: str, check: bool = True, timeout: float = 60.0) -> str:
        return self.run("systemctl", "--no-pager", *args, check=check, timeout=timeout).stdout

    def show(self, unit: str, prop: str) -> str:
        return self.systemctl("show", "-p", prop, "--value", unit).strip()

    def write(self, path: str, text: str) -> None:
        self.run("sh", "-c", f"mkdir -p {shlex.quote(str(Path(path).parent))} && cat > {shlex.quote(path)}",
                 input=text)

    def install(self, netns: str, *extra_args: str) -> None:
        """deploy/kubeport.service and deploy/kubeport.yaml as a node has them, and a drop-in
        with only what this machine needs: the repo's kubeport for /usr/local/bin's, the
        test node's network namespace, and ``extra_args`` after the shipped command line."""
        self.write("/run/systemd/system/kubeport.service", UNIT.read_text())
        self.write("/etc/kubeport/config.yaml", CONFIG.read_text())
        shipped = shlex.split(_unit_value(UNIT.read_text(), "ExecStart"))
        # connect() programs on a cgroup of the test's own, never on the machine's root
        if not any(arg.startswith(("--connect-balancing", "--no-connect-balancing")) for arg in extra_args):
            extra_args = (*extra_args, *cgroups.daemon_args(netns))
        command = [str(kubeport_bin()), *shipped[1:], *extra_args]
        prefix, _, pre = _unit_value(UNIT.read_text(), "ExecStartPre").partition("/")
        shipped_pre = shlex.split("/" + pre)
        pre_command = [str(kubeport_bin()), *shipped_pre[1:]]
        # The repo and the venv of the kubeport under test, under /tmp or /root: ProtectHome=
        # and PrivateTmp= hide them.
        binds = " ".join(sorted({str(REPO), str(kubeport_bin().resolve().parent.parent)}))
        self.write("/run/systemd/system/kubeport.service.d/test.conf", textwrap.dedent(f"""\
            [Service]
            ExecStartPre=
            ExecStartPre={prefix}{shlex.join(pre_command)}
            ExecStart=
            ExecStart={shlex.join(command)}
            NetworkNamespacePath=/run/netns/{netns}
            BindReadOnlyPaths={binds}
            """))
        self.systemctl("daemon-reload")

    def journal(self) -> str:
        """The whole journal: systemd's lines about the unit and the unit's own output."""
        done = self.run("journalctl", "--no-pager", "-o", "short-precise", check=False)
        return done.stdout + done.stderr

    def shutdown(self) -> None:
        if self.proc is None:
            return
        try:
            run_in(None, "kill", "-KILL", str(self.pid), check=False)
        except (RuntimeError, CommandFailed):
            pass
        stop_process(self.proc, 10)
        self.proc = None

    def kill(self, pid: int, signum: signal.Signals = signal.SIGKILL) -> None:
        """Kill a process of the namespace by its pid there (as `systemctl show` gives it)."""
        self.run("kill", f"-{signum.name.removeprefix('SIG')}", str(pid))


def _unit_value(text: str, key: str) -> str:
    for line in text.splitlines():
        if line.startswith(f"{key}="):
            return line.split("=", 1)[1]
    raise KeyError(key)

"""The kubeport daemon and CLI, run inside a network namespace."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeport.get_client import status_sockets

from ..wait import WaitTimeout, until_sync
from . import cgroups
from .proc import CommandFailed, current_scope, run_in, spawn_in, stop_process

# The kubeport command under test: $KUBEPORT_BIN (an installed wheel's console script, a
# wrapper that runs it in an image), else the console script of the venv running the tests.
KUBEPORT_BIN = Path(os.environ.get("KUBEPORT_BIN") or Path(sys.executable).parent / "kubeport")
DEFAULT_HEALTHZ = "127.0.0.1:10256"

# Every daemon made in this process, for the failure report (conftest prints their log tails).
DAEMONS: list[KubeportDaemon] = []


class DaemonExited(RuntimeError):
    pass


@dataclass(frozen=True)
class Readyz:
    status: int  # 0: nothing answered
    body: str

    def __bool__(self) -> bool:
        return self.status == 200


def kubeport_bin() -> Path:
    if not KUBEPORT_BIN.exists():
        where = "$KUBEPORT_BIN" if os.environ.get("KUBEPORT_BIN") else "the tests' venv"
        raise FileNotFoundError(f"kubeport command not found at {KUBEPORT_BIN} ({where}); install the project "
                                f"into this venv (pip install -e .) or set KUBEPORT_BIN to an installed kubeport")
    return KUBEPORT_BIN


def kubeport(ns: str | None, *args: Any, timeout: float = 30.0) -> str:
    """Run the kubeport CLI in `ns` (None: root namespace); its stdout, or CommandFailed."""
    return run_in(ns, kubeport_bin(), *args, timeout=timeout).stdout


def status_api(ns: str, path: str, timeout: float = 5.0) -> Any:
    """The status API's JSON at `path` (``/api/v1/problems``), from the daemon of network
    namespace `ns` over its Unix socket, found as `kubeport get` finds it (/proc/net/unix)."""
    sockets = status_sockets(run_in(ns, "cat", "/proc/net/unix").stdout)
    if not sockets:
        raise CommandFailed(ns, ["cat", "/proc/net/unix"], 7, "", "no kubeport status socket listens here")
    done = run_in(ns, "curl", "-sS", "--fail", "--max-time", f"{timeout:g}", "--unix-socket", sockets[0],
                  f"http://kubeport{path}", timeout=timeout + 5)
    return json.loads(done.stdout)


def problems_of(ns: str) -> list[str]:
    """The daemon's problem lines (what `kubeport get` prints under a listing)."""
    return status_api(ns, "/api/v1/problems")["problems"]


def node_name_from_ns(ns: str) -> str:
    for name in ("node-a", "node-b"):
        if ns.endswith(f"-{name}"):
            return name
    raise ValueError(f"can't tell the node name of namespace {ns!r}; pass node_name=")


def probe_address(extra_args: tuple[str, ...]) -> str:
    """Where /readyz answers inside the namespace, from --healthz-bind-address if given."""
    bind = DEFAULT_HEALTHZ
    for i, arg in enumerate(extra_args):
        if arg == "--healthz-bind-address" and i + 1 < len(extra_args):
            bind = extra_args[i + 1]
        elif arg.startswith("--healthz-bind-address="):
            bind = arg.split("=", 1)[1]
    host, _, port = bind.rpartition(":")
    host = host.strip("[]")
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class KubeportDaemon:
    """`kubeport run --manifests DIR --hostname-override NODE --state-dir DIR ...` in `ns`.

    With ``kubeconfig=FILE`` (and ``manifests_dir`` None) the source is a kube-apiserver:
    ``--kubeconfig FILE`` replaces ``--manifests DIR``.

    Starts at construction. stdout and stderr are appended to `log_path` (default: next to the
    state dir, `<ns>.kubeport.log`). Owned like any spawned process: a daemon made in a test is
    stopped when the test ends; `restart()` keeps the original owner. `program` replaces the
    kubeport executable (the harness's own tests run a stand-in)."""

    def __init__(self, ns: str, manifests_dir: Path | str | None, state_dir: Path | str, *extra_args: str,
                 node_name: str | None = None, log_path: Path | str | None = None,
                 program: Sequence[str] | None = None, kubeconfig: Path | str | None = None):
        if (manifests_dir is None) == (kubeconfig is None):
            raise ValueError("give exactly one source: manifests_dir or kubeconfig=")
        self.ns = ns
        self.manifests_dir = None if manifests_dir is None else Path(manifests_dir)
        self.kubeconfig = None if kubeconfig is None else Path(kubeconfig)
        self.state_dir = Path(state_dir)
        self.extra_args = tuple(str(arg) for arg in extra_args)
        self.node_name = node_name or node_name_from_ns(ns)
        self.log_path = Path(log_path) if log_path else self.state_dir.parent / f"{ns}.kubeport.log"
        self.readyz_url = f"http://{probe_address(self.extra_args)}/readyz"
        self.program = [str(part) for part in program] if program else [str(kubeport_bin())]
        self.proc: subprocess.Popen | None = None
        self._scope = current_scope()
        DAEMONS.append(self)
        self.start()

    @property
    def command(self) -> list[str]:
        # No DNS lame duck and no connection drain unless a test asks for them: every stop
        # would otherwise wait for them (5 s, and up to 30 s while a UDP flow is live).
        fast_stop = [f"{flag}=0s" for flag in ("--dns-lame-duck", "--shutdown-grace-period")
                     if not any(a.startswith(flag) for a in self.extra_args)]
        source = (["--kubeconfig", str(self.kubeconfig)] if self.kubeconfig is not None
                  else ["--manifests", str(self.manifests_dir)])
        # Each daemon's connect() programs on a cgroup of its own, unless the test chose
        balancing = () if any(a.startswith(("--connect-balancing", "--no-connect-balancing"))
                              for a in self.extra_args) else cgroups.daemon_args(self.ns)
        return [*self.program, "run", *source,
                "--hostname-override", self.node_name, "--state-dir", str(self.state_dir), *fast_stop,
                *balancing, *self.extra_args]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        if self.running:
            raise RuntimeError(f"kubeport in {self.ns} is already running (pid {self.proc.pid})")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"=== {time.strftime('%H:%M:%S')} start: {shlex.join(self.command)}\n".encode())
            log.flush()
            self.proc = spawn_in(self.ns, *self.command, scope=self._scope, stdout=log, stderr=subprocess.STDOUT)

    def readyz(self) -> Readyz:
        """/readyz now: status 0 when nothing answers; a 503 body names what is pending."""
        done = run_in(self.ns, "curl", "-s", "-w", "\n%{http_code}", "--noproxy", "*", "-g", "--max-time", "1",
                      self.readyz_url, timeout=10, check=False)
        body, _, code = done.stdout.rpartition("\n")
        return Readyz(int(code or 0), body.strip())

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Wait until /readyz answers 200; raise at once if the daemon exits."""
        def ready() -> Readyz:
            if not self.running:
                code = None if self.proc is None else self.proc.returncode
                raise DaemonExited(f"kubeport in {self.ns} exited ({code}) before ready; log tail:\n"
                                   f"{self.log_tail()}")
            return self.readyz()

        try:
            until_sync(ready, f"GET {self.readyz_url} == 200 in {self.ns}", timeout, interval=0.1)
        except WaitTimeout as err:
            raise WaitTimeout(f"{err}\nkubeport log tail ({self.log_path}):\n{self.log_tail()}") from None

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM, wait up to `grace`, then SIGKILL. Returns the exit code (None if never started)."""
        return None if self.proc is None else stop_process(self.proc, grace)

    def restart(self, grace: float = 10.0) -> None:
        self.stop(grace)
        self.start()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def __enter__(self) -> KubeportDaemon:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.proc.pid}" if self.running else "stopped"
        return f"KubeportDaemon({self.ns!r}, node={self.node_name!r}, {state})"


__all__ = ["DAEMONS", "CommandFailed", "DaemonExited", "KubeportDaemon", "Readyz", "kubeport", "kubeport_bin",
           "problems_of", "status_api"]

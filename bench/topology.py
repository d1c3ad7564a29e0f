"""Network-namespace topologies for one benchmark: a star around the node under test.

    client ─┐                      every spoke is a namespace with eth0 = 10.77.<i>.2/24,
    be1  ───┼── node (ip_forward)   the node side of its veth is 10.77.<i>.1/24 and is the
    up   ───┘                      spoke's default route, so a VIP is reached via the node.

Namespaces are named ``<prefix>-<role>``; the prefix holds the benchmark name and the
process id, so concurrent runs never collide and leftovers of a killed run (whose pid is
gone) are removed by the next run. Every address lives inside these namespaces.
Teardown kills every process in them and deletes them, also on Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import ctypes
import os
import re
import resource
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
PREFIX_ROOT = "kpb"
_libc = ctypes.CDLL(None, use_errno=True)


class TopologyError(RuntimeError):
    """A topology could not be built or a command inside it failed; the message says which."""


def enter_netns(name: str) -> None:
    """Move the calling thread into namespace ``name`` (sockets it creates stay there)."""
    fd = os.open(NETNS_DIR / name, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({name}): {os.strerror(err)}")
    finally:
        os.close(fd)


def raise_nofile(limit: int = 1 << 20) -> None:
    """Allow many descriptors (10,000 idle connections need 2-3 per connection)."""
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    except (ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces_pids(names: Sequence[str]) -> list[int]:
    pids: list[int] = []
    for name in names:
        out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
        pids.extend(int(p) for p in out.split())
    return pids


def _delete_namespaces(names: Sequence[str]) -> None:
    if not names:
        return
    for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
        pids = _namespaces_pids(names)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if pid_alive(p)]
            time.sleep(0.02)
    for name in names:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def remove_stale(bench: str) -> None:
    """Delete namespaces of earlier runs of ``bench`` whose process is gone."""
    pattern = re.compile(rf"^{PREFIX_ROOT}-{re.escape(bench)}-(\d+)-")
    stale = []
    for entry in NETNS_DIR.glob(f"{PREFIX_ROOT}-{bench}-*") if NETNS_DIR.is_dir() else []:
        match = pattern.match(entry.name)
        if match and not pid_alive(int(match.group(1))):
            stale.append(entry.name)
    _delete_namespaces(stale)


class Topology:
    """A star of namespaces; use as a context manager so it is always torn down."""

    def __init__(self, bench: str, spokes: Sequence[str], workdir: Path) -> None:
        self.bench = bench
        self.prefix = f"{PREFIX_ROOT}-{bench}-{os.getpid()}"
        self.spokes = list(spokes)
        self.workdir = workdir
        self._procs: list[subprocess.Popen] = []
        self._executors: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
        self._up = False

    # --- names and addresses --------------------------------------------------------------

    def ns(self, role: str) -> str:
        return f"{self.prefix}-{role}"

    def _index(self, role: str) -> int:
        return self.spokes.index(role) + 1

    def addr(self, role: str) -> str:
        """The spoke's own address (eth0)."""
        return f"10.77.{self._index(role)}.2"

    def node_addr(self, role: str) -> str:
        """The node's address on the link to ``role``."""
        return f"10.77.{self._index(role)}.1"

    # --- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> "Topology":
        self.up()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.down()

    def up(self) -> None:
        remove_stale(self.bench)
        self.workdir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.down)
        self._up = True
        roles = ["node", *self.spokes]
        root = [f"netns add {self.ns(r)}" for r in roles]
        for role in self.spokes:
            root.append(f"link add eth0 netns {self.ns(role)} type veth peer name v-{role} netns {self.ns('node')}")
        self._batch(None, root)
        node = ["link set lo up"]
        for role in self.spokes:
            node += [f"link set v-{role} up", f"addr add {self.node_addr(role)}/24 dev v-{role}"]
        self._batch("node", node)
        for role in self.spokes:
            self._batch(role, ["link set lo up", "link set eth0 up",
                               f"addr add {self.addr(role)}/24 dev eth0",
                               f"route add default via {self.node_addr(role)}"])
        self.sysctl("node", "net.ipv4.ip_forward", "1")
        for role in roles:
            # Many short connections: let the kernel reuse TIME_WAIT ports and give it room.
            self.sysctl(role, "net.ipv4.ip_local_port_range", "1024 65000")
            self.sysctl(role, "net.ipv4.tcp_tw_reuse", "1")
            self.sysctl(role, "net.core.somaxconn", "65535")

    def down(self) -> None:
        if not self._up:
            return
        self._up = False
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for executor in self._executors.values():
            executor.shutdown(wait=False, cancel_futures=True)
        self._executors.clear()
        _delete_namespaces([self.ns(r) for r in ["node", *self.spokes]])
        for proc in self._procs:
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._procs.clear()

    # --- commands ---------------------------------------------------------------------------

    def _batch(self, role: str | None, lines: list[str]) -> None:
        argv = ["ip", "-batch", "-"] if role is None else ["ip", "-n", self.ns(role), "-batch", "-"]
        proc = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True, text=True)
        if proc.returncode != 0:
            raise TopologyError(f"ip -batch in {role or 'root'} failed: {proc.stderr.strip()}")

    def ip(self, role: str, *args: str, check: bool = True) -> None:
        proc = subprocess.run(["ip", "-n", self.ns(role), *args], capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise TopologyError(f"ip {' '.join(args)} in {role}: {proc.stderr.strip()}")

    def sysctl(self, role: str, key: str, value: str) -> None:
        self.run(role, ["sysctl", "-q", "-w", f"{key}={value}"], timeout=5)

    def argv(self, role: str, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(role), *argv]

    def run(self, role: str, argv: Sequence[str], timeout: float, check: bool = True,
            input: str | None = None) -> subprocess.CompletedProcess:
        """Run a command to completion inside ``role``; bounded by ``timeout`` seconds."""
        try:
            proc = subprocess.run(self.argv(role, argv), capture_output=True, text=True,
                                  timeout=timeout, input=input)
        except subprocess.TimeoutExpired as exc:
            raise TopologyError(f"{argv[0]} in {role}: no result within {timeout:.0f} s") from exc
        if check and proc.returncode != 0:
            raise TopologyError(f"{' '.join(argv)} in {role} exited {proc.returncode}: "
                                f"{(proc.stderr or proc.stdout).strip()[-600:]}")
        return proc

    def spawn(self, role: str, argv: Sequence[str], log_name: str, cwd: Path | None = None,
              env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start a long-running process inside ``role``; its output goes to workdir/<log_name>.log.

        ``ip netns exec`` execs the command, so the pid is the command's own (for /proc CPU and RSS).
        """
        log = open(self.workdir / f"{log_name}.log", "ab")
        proc = subprocess.Popen(self.argv(role, argv), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=cwd, env=env,
                                preexec_fn=raise_nofile, start_new_session=True)
        log.close()
        self._procs.append(proc)
        return proc

    def log_tail(self, log_name: str, lines: int = 15) -> str:
        path = self.workdir / f"{log_name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def call_in(self, role: str, fn: Callable[..., T], *args: Any, timeout: float = 60.0) -> T:
        """Run ``fn(*args)`` on a thread that lives in namespace ``role`` (sockets it makes stay there)."""
        executor = self._executors.get(role)
        if executor is None:
            executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix=f"ns-{role}", initializer=enter_netns, initargs=(self.ns(role),))
            self._executors[role] = executor
        return executor.submit(fn, *args).result(timeout=timeout)


def stop_process(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """SIGTERM, wait up to ``timeout``, then SIGKILL the whole process group."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=5)


def wait_for(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.01) -> float:
    """Poll ``condition`` until true; returns seconds waited. TopologyError naming ``what`` on timeout."""
    start = time.monotonic()
    deadline = start + timeout
    while True:
        if condition():
            return time.monotonic() - start
        if time.monotonic() > deadline:
            raise TopologyError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)

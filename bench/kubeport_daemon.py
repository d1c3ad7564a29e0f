"""Start `kubeport run` in the node namespace with a manifests directory; wait for /readyz.

The command line is the CLI contract (notes/CLI.md). The upstream resolver is always
given explicitly and lives in a namespace of the benchmark, so no query leaves it.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import probes
from .procinfo import rss_bytes
from .topology import Topology, TopologyError, stop_process, wait_for

HEALTHZ = "127.0.0.1:10256"
METRICS = "127.0.0.1:10249"


def missing_run_flag(flag: str) -> str:
    """Why `kubeport run` of this interpreter cannot take ``flag`` ("" when its --help names it)."""
    try:
        proc = subprocess.run([sys.executable, "-m", "kubeport", "run", "--help"], capture_output=True, text=True,
                              timeout=30, cwd=tempfile.gettempdir())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`kubeport run --help` did not run: {exc}"
    if proc.returncode != 0:
        return f"`kubeport run --help` exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-200:]}"
    if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", proc.stdout):
        return f"`kubeport run` has no {flag} (its --help does not name it)"
    return ""


_BALANCING_FLAGS = ("--connect-balancing", "--no-connect-balancing")


@functools.cache
def relay_only() -> tuple[str, ...]:
    """The flags that keep connect() balancing off, where this kubeport has it. On, it attaches BPF
    programs to the root cgroup (its default --connect-balancing-cgroup): every process of the host,
    the load generators and probes included, would reach a ClusterIP straight at an endpoint, past
    the relay the benchmarks measure. The pod-path benchmark turns it on, for a cgroup of its own."""
    return () if missing_run_flag("--no-connect-balancing") else ("--no-connect-balancing",)


class KubeportDaemon:
    def __init__(self, topo: Topology, role: str, workdir: Path, manifests: Path | None, dns_address: str,
                 upstream: str, extra_args: list[str] | None = None, kubeconfig: Path | None = None) -> None:
        """The source is ``manifests`` (a directory) or, when given, the API server of ``kubeconfig``."""
        self.topo = topo
        self.role = role
        self.workdir = workdir
        self.manifests = manifests
        self.kubeconfig = kubeconfig
        self.dns_address = dns_address
        self.upstream = upstream
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def argv(self) -> list[str]:
        source = (["--kubeconfig", str(self.kubeconfig)] if self.kubeconfig is not None
                  else ["--manifests", str(self.manifests)])
        return [sys.executable, "-m", "kubeport", "run", *source,
                "--hostname-override", "node",
                "--state-dir", str(self.workdir / "state"),
                "--healthz-bind-address", HEALTHZ,
                "--metrics-bind-address", METRICS,
                "--dns-address", self.dns_address,
                "--upstream", self.upstream,
                *(() if any(arg.startswith(_BALANCING_FLAGS) for arg in self.extra_args) else relay_only()),
                *self.extra_args]

    def start(self, fresh_state: bool = True) -> None:
        if fresh_state:
            shutil.rmtree(self.workdir / "state", ignore_errors=True)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.started_at = time.perf_counter()
        # cwd is the work dir, never the repo root: there `import dns` would find the repo's folder.
        self.proc = self.topo.spawn(self.role, self.argv(), "kubeport", cwd=self.workdir)

    def ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise TopologyError(f"kubeport exited with {self.proc.returncode}: "
                                f"{self.topo.log_tail('kubeport', 8)}")
        return self.topo.call_in(self.role, probes.http_status, f"http://{HEALTHZ}/readyz", 0.5) == 200

    def wait_ready(self, timeout: float, interval: float = 0.1) -> float:
        """Seconds from start() until /readyz answered 200.

        Polled every ``interval`` seconds, not faster: each /readyz costs the daemon work, and a
        tight poll would slow the very start-up it measures."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise TopologyError(f"kubeport not ready within {timeout:.0f} s: {self.topo.log_tail('kubeport', 8)}")
            time.sleep(interval)
        return time.perf_counter() - self.started_at

    def rss(self) -> int | None:
        return rss_bytes(self.pid)

    @property
    def status_socket(self) -> str:
        return str(self.workdir / "state" / "kubeport.sock")

    def status_api(self, resource: str, timeout: float = 2.0):
        """The daemon's status API at ``resource`` (what `kubeport get` reads), or None."""
        return probes.unix_http_json(self.status_socket, resource, timeout)

    def status(self) -> dict | None:
        """`kubeport get status -o json`: the daemon's /api/v1/status."""
        return self.status_api("/api/v1/status")

    def wait_at_rest(self, timeout: float, reads: int = 5, interval: float = 0.2) -> float:
        """Until the daemon's RSS (what a user sees: /proc/<pid>/statm) stays unchanged over
        ``reads`` consecutive reads ``interval`` seconds apart: the daemon has given the heap
        freed by the last change back to the kernel (it does once no change came for a moment:
        kubeport/lib/heap.py) and nothing else moves it. Returns the seconds waited."""
        seen: list[int | None] = []

        def steady() -> bool:
            seen.append(self.rss())
            del seen[:-reads]
            return len(seen) == reads and seen[0] is not None and len(set(seen)) == 1
        return wait_for(steady, timeout, f"kubeport's RSS unchanged over {reads} reads {interval} s apart",
                        interval=interval)

    def stop(self) -> None:
        stop_process(self.proc, timeout=15)
        self.proc = None
        # Whatever a crashed daemon left behind: service addresses and its nftables table.
        self.topo.ip(self.role, "addr", "flush", "dev", "lo", "scope", "global", check=False)
        self.topo.run(self.role, ["nft", "flush", "ruleset"], timeout=10, check=False)

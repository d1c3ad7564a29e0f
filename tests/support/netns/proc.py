"""Processes for integration tests: run or spawn commands inside network namespaces, own and
kill what was spawned, and wait for what they print."""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import signal
import subprocess
import time
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..wait import WaitTimeout


class CommandFailed(RuntimeError):
    """A command exited non-zero (returncode) or timed out (returncode None)."""

    def __init__(self, ns: str | None, cmd: Sequence[str], returncode: int | None, stdout: Any, stderr: Any):
        self.ns, self.cmd, self.returncode, self.stdout, self.stderr = ns, list(cmd), returncode, stdout, stderr
        outcome = "timed out" if returncode is None else f"exited {returncode}"
        super().__init__(
            f"{shlex.join(self.cmd)} {outcome} in namespace {ns or '(root)'}\n"
            f"stdout: {_clip(stdout)}\nstderr: {_clip(stderr)}")


def _clip(output: Any, limit: int = 2000) -> str:
    text = output.decode(errors="replace") if isinstance(output, bytes) else str(output or "")
    return text if len(text) <= limit else "..." + text[-limit:]


def in_ns(ns: str | None, cmd: Sequence[str]) -> list[str]:
    return [str(part) for part in cmd] if ns is None else ["ip", "netns", "exec", ns, *map(str, cmd)]


def run_in(ns: str | None, *cmd: Any, timeout: float = 10.0, check: bool = True, input: Any = None,
           text: bool = True) -> subprocess.CompletedProcess:
    """Run cmd inside namespace `ns` (None: the root namespace); raise CommandFailed if check."""
    argv = in_ns(ns, cmd)
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout, input=input, text=text)
    except subprocess.TimeoutExpired as err:
        raise CommandFailed(ns, argv, None, err.stdout, err.stderr) from None
    if check and done.returncode != 0:
        raise CommandFailed(ns, argv, done.returncode, done.stdout, done.stderr)
    return done


@dataclass
class _Spawned:
    ns: str | None
    proc: subprocess.Popen


# A stack of owners; the bottom one lives for the session (module fixtures, topologies).
_SCOPES: list[list[_Spawned]] = [[]]


@contextlib.contextmanager
def process_scope() -> Iterator[list[_Spawned]]:
    """Processes spawned inside are killed when the block ends (the per-test fixture uses this)."""
    scope: list[_Spawned] = []
    _SCOPES.append(scope)
    try:
        yield scope
    finally:
        # By identity: list.remove() compares by value and two empty scopes are equal.
        del _SCOPES[next(i for i, each in enumerate(_SCOPES) if each is scope)]
        _stop_all(scope)


def spawn_in(ns: str | None, *cmd: Any, scope: list[_Spawned] | None = None, **popen_kwargs: Any) -> subprocess.Popen:
    """Start cmd in `ns` in its own process group; it is killed when the current owner ends."""
    popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
    proc = subprocess.Popen(in_ns(ns, cmd), start_new_session=True, **popen_kwargs)
    (_SCOPES[-1] if scope is None else scope).append(_Spawned(ns, proc))
    return proc


def current_scope() -> list[_Spawned]:
    return _SCOPES[-1]


def stop_process(proc: subprocess.Popen, grace: float = 5.0) -> int:
    """SIGTERM the process group, SIGKILL it after `grace` seconds; returns the exit code."""
    signalled = False
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            break
        signalled = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
    if signalled:  # sweep children that outlived their leader, while the group id is fresh
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    _close_pipes(proc)
    return proc.wait()


def _close_pipes(proc: subprocess.Popen) -> None:
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def _stop_all(entries: list[_Spawned]) -> None:
    for entry in entries:  # SIGTERM everyone first so they shut down in parallel
        if entry.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(entry.proc.pid, signal.SIGTERM)
    for entry in entries:
        stop_process(entry.proc)
    entries.clear()


def _reap(owned: Callable[[_Spawned], bool]) -> None:
    for scope in _SCOPES:
        doomed = [entry for entry in scope if owned(entry)]
        scope[:] = [entry for entry in scope if not owned(entry)]
        _stop_all(doomed)


def reap_namespaces(namespaces: Collection[str]) -> None:
    """Stop every spawned process that runs in one of `namespaces`, whoever owns it."""
    _reap(lambda entry: entry.ns in namespaces)


def reap_all() -> None:
    _reap(lambda entry: True)


#: what a process printed past the line the last wait_for_output was waiting for: a
#: pipe read returns what is there, and the next line may have come in the same read.
_unread: weakref.WeakKeyDictionary[subprocess.Popen, bytes] = weakref.WeakKeyDictionary()


def wait_for_output(proc: subprocess.Popen, expected: bytes, timeout: float, what: str) -> None:
    """Read proc.stdout (a binary pipe) until `expected` shows up, the process exits, or the deadline.

    What follows `expected` in the same read is kept for the next call on the same process."""
    fd, seen = proc.stdout.fileno(), _unread.pop(proc, b"")
    deadline = time.monotonic() + timeout
    while expected not in seen:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WaitTimeout(f"{what}: no {expected!r} on stdout within {timeout:g}s; got {seen!r}")
        if select.select([fd], [], [], remaining)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(f"{what}: exited ({proc.wait()}) before printing {expected!r}; got {seen!r}")
            seen += chunk
    rest = seen[seen.index(expected) + len(expected):]
    if rest:
        _unread[proc] = rest



"""``kubeport run --hold-sockets``: a small parent process that runs the daemon as its child,
holds every listening socket the daemon binds, and starts the daemon again at once when it
is killed or crashes, handing it the sockets back.

While no daemon runs, the held sockets stay open: TCP handshakes complete into their accept
queues and datagrams (DNS queries included) wait in their receive buffers, so a client
sees a delay of the restart's length, not a refused connection or an ICMP port unreachable.
The next daemon serves its last applied state at once (endpoints/laststate.py) on these
sockets.

A parent rather than a helper child: a container's processes die with its PID 1, and a
systemd unit's with its main process (``KillMode=control-group``), so only the process at
the top outlives the daemon. Kept small (no part of the daemon is imported) so that it is not
what crashes; if it is killed itself, the unit or the pod restarts as without it.

The daemon is started again only when it was ended by a signal the supervisor did not
forward (SIGKILL by the OOM killer or a user, SIGSEGV, SIGABRT): an exit code is the
daemon's decision (0: stopped or handed over; 1: a fatal error; 2: a bad configuration) and
becomes the supervisor's. SIGTERM, SIGINT and SIGHUP are forwarded. Crashes within
``QUICK_CRASH`` seconds of a start are retried after a doubling pause (0.1 s to 10 s);
after ``CRASH_LOOP`` of them in a row the supervisor exits 1 and leaves it to its own
supervisor (systemd, the kubelet).
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time

from kubeport.lib.sockethold import BATCH, ENV, receive, send

log = logging.getLogger("kubeport.supervisor")

QUICK_CRASH = 10.0
CRASH_LOOP = 5
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PR_SET_CHILD_SUBREAPER = 36


class Supervisor:
    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.held: dict[str, socket.socket] = {}
        self.child: subprocess.Popen | None = None
        self.chan: socket.socket | None = None
        self.stopping = False
        self.restarts = 0

    def run(self) -> int:
        _become_subreaper()
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        for signum in (*FORWARDED, signal.SIGCHLD):
            signal.signal(signum, lambda *_: None)  # handled below, after the wake-up byte
        quick_crashes = 0
        pause = 0.1
        while True:
            started = time.monotonic()
            self._start()
            code, killed_by = self._serve(wake_r)
            if self.stopping or killed_by is None or killed_by in FORWARDED:
                self._close_held()
                return code
            quick_crashes = quick_crashes + 1 if time.monotonic() - started < QUICK_CRASH else 1
            self.restarts += 1
            if quick_crashes >= CRASH_LOOP:
                log.error("the daemon was killed by %s %d times within %gs of its start: giving up",
                          signal.Signals(killed_by).name, quick_crashes, QUICK_CRASH)
                self._close_held()
                return 1
            delay = 0.0 if quick_crashes <= 1 else pause
            pause = min(pause * 2, 10.0) if quick_crashes > 1 else 0.1
            log.error("the daemon (pid %d) was killed by %s; starting it again%s with %d held sockets",
                      self.child.pid, signal.Signals(killed_by).name, f" in {delay:g}s" if delay else "",
                      len(self.held))
            if delay:
                time.sleep(delay)  # a crash loop: not spun on

    def _start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ, **{ENV: str(child.fileno())})
        # systemd's watchdog names the main process (this one); the daemon pings in its stead
        # (the unit says NotifyAccess=all).
        env.pop("WATCHDOG_PID", None)
        self.child = subprocess.Popen(self.argv, env=env, pass_fds=(child.fileno(),))
        child.close()
        self.chan = parent

    def _serve(self, wake_r: int) -> tuple[int, int | None]:
        """Until the child ends: its exit code, and the signal that ended it (or None)."""
        assert self.child is not None and self.chan is not None
        while True:
            status = self._reap()
            if status is not None:
                self.chan.close()
                return status
            readable, _, _ = select.select([self.chan, wake_r], [], [])
            if wake_r in readable:
                for signum in os.read(wake_r, 64):
                    if signum in FORWARDED:
                        if signum != signal.SIGHUP:
                            self.stopping = True
                        self._signal_child(signum)
            if self.chan in readable and not self._message():
                # The child closed its end: it is exiting (or gone), and says no more.
                status = self._reap(block=True)
                self.chan.close()
                return status

    def _reap(self, *, block: bool = False) -> tuple[int, int | None] | None:
        """The daemon's end, if it ended. Orphans of a killed daemon (its relay workers, which
        relay on until the next daemon adopts them) are reaped too: they are this process's."""
        while True:
            try:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except InterruptedError:
                continue
            except ChildProcessError:  # nothing left at all: the daemon was reaped before
                return self.child.returncode, None
            if pid == 0:
                return None
            if pid != self.child.pid:
                continue
            break
        self.child.returncode = os.waitstatus_to_exitcode(status)
        if os.WIFSIGNALED(status):
            signum = os.WTERMSIG(status)
            return 128 + signum, signum
        return os.WEXITSTATUS(status), None

    def _signal_child(self, signum: int) -> None:
        try:
            os.kill(self.child.pid, signum)
        except ProcessLookupError:
            pass

    def _message(self) -> bool:
        """Handle one message of the child; False once its end is closed."""
        try:
            message, fds = receive(self.chan)
        except OSError:
            message, fds = None, []
        if message is None:
            return False
        op = message.get("op")
        if op == "hello":
            labels = list(self.held)
            for start in range(0, len(labels), BATCH):
                batch = labels[start:start + BATCH]
                send(self.chan, {"op": "held", "labels": batch}, [self.held[label].fileno() for label in batch])
            send(self.chan, {"op": "end"})
        elif op == "hold" and fds:
            previous = self.held.pop(message["label"], None)
            if previous is not None:
                previous.close()
            self.held[message["label"]] = socket.socket(fileno=fds[0])
            for extra in fds[1:]:
                os.close(extra)
        elif op == "release":
            held = self.held.pop(message.get("label", ""), None)
            if held is not None:
                held.close()
        for fd in fds if op != "hold" else ():
            os.close(fd)
        return True

    def _close_held(self) -> None:
        for sock in self.held.values():
            sock.close()
        self.held.clear()


def _become_subreaper() -> None:
    """Orphans of the daemon become this process's children, not init's: reaped here, and
    ended with the pod or the unit as before (PR_SET_CHILD_SUBREAPER, prctl(2))."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        log.warning("cannot become the daemon's orphans' subreaper (%s): init reaps them", exc)


def supervise(argv: list[str]) -> int:
    """Run ``argv`` (this very command line) as the supervised daemon."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return Supervisor(argv).run()

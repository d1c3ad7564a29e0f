"""``kubeport run --hold-sockets``: a small parent process that runs the daemon as its child,
holds every listening socket the daemon binds, and starts the daemon again at once when it
is killed or crashes, handing it the sockets back.

While no daemon runs, the held sockets stay open: TCP handshakes complete into their accept
queues and datagrams (DNS queries included) wait in their receive buffers, so a client
sees a delay of the restart's length, not a refused connection or an ICMP port unreachable.
The next daemon serves its last applied state at once (kubeport/survival/laststate.py) on these
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

Under systemd the supervisor also puts every socket it holds in the unit's file descriptor
store (kubeport/lib/sdnotify.py), so that the sockets outlive the supervisor too: killed
itself, it is started again by ``Restart=`` with the sockets passed back as
``$LISTEN_FDS``, and hands them to its daemon as it does after a crash of the daemon.
Connections and queries wait in their queues meanwhile, as they do while the daemon alone
restarts. A container has nothing of the kind (it ends with its first process, and the
kubelet starts it again): there ``--fd-store DIR`` names the directory of a ``kubeport
fd-store`` sidecar (kubeport/survival/fdstore.py), which keeps them in systemd's stead and hands them
to the next supervisor when asked.
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
from pathlib import Path

from kubeport.lib import sdnotify
from kubeport.survival.sockethold import BATCH, ENV, receive, send, worker_prefix, worker_slot

#: the fd-store sidecar's sockets in its directory (kubeport/survival/fdstore.py; not imported: the
#: supervisor stays small)
FD_STORE_NOTIFY, FD_STORE_FETCH = "notify", "fetch"
#: how often the sidecar's socket is checked for a restart of the sidecar (it then starts empty)
STORE_CHECK_S = 2.0

log = logging.getLogger("kubeport.survival.supervisor")

QUICK_CRASH = 10.0
CRASH_LOOP = 5
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PR_SET_CHILD_SUBREAPER = 36


class Supervisor:
    def __init__(self, argv: list[str], fd_store: Path | None = None) -> None:
        self.argv = argv
        #: a ``kubeport fd-store`` sidecar's directory, in place of systemd's store
        self.fd_store = fd_store
        self.held: dict[str, socket.socket] = {}
        self.child: subprocess.Popen | None = None
        self.chan: socket.socket | None = None
        #: relay workers' own channels (sockethold.channel_for_worker) -> their slot: they
        #: outlive the daemon that made them, as the workers do
        self.worker_chans: dict[socket.socket, int] = {}
        self.stopping = False
        self.restarts = 0
        #: where the held sockets are also kept: systemd's descriptor store, or the fd-store
        #: sidecar's (None: neither, the sockets live as long as this process)
        self.store: sdnotify.Notifier | None = None
        self.store_failures = 0
        self._store_identity: tuple[int, int] | None = None
        self._store_checked_at = float("-inf")

    def run(self) -> int:
        _become_subreaper()
        self._take_stored_sockets()
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

    def _store_again_if_restarted(self) -> None:
        """A restarted fd-store sidecar (its own crash) starts empty: everything held goes to
        it again. Told by its socket: a new process binds a new one (a new inode, or the
        same number reused with a new ctime)."""
        if self.fd_store is None or self.store is None:
            return
        now = time.monotonic()
        if now - self._store_checked_at < STORE_CHECK_S:
            return  # not per message: a cold start holds 10,000 sockets in a burst
        self._store_checked_at = now
        try:
            found = os.stat(self.fd_store / FD_STORE_NOTIFY)
            identity = (found.st_ino, found.st_ctime_ns)
        except OSError:
            return  # gone for now: stored again once it is back
        if self._store_identity is not None and identity != self._store_identity and self.held:
            log.info("the fd store at %s was restarted: storing the %d held sockets again", self.fd_store,
                     len(self.held))
            for label, sock in self.held.items():
                self.store.store_fds(sdnotify.fd_name(label), [sock.fileno()])
        self._store_identity = identity

    def _take_stored_sockets(self) -> None:
        """The sockets a killed supervisor put in the store (systemd's, or the fd-store
        sidecar's), given back at this start."""
        passed = sdnotify.listen_fds(os.environ, os.getpid())
        if self.fd_store is not None:
            for _, fd in passed:  # the sidecar is the store: nothing of systemd's is ours
                os.close(fd)
            self.store = sdnotify.Notifier(str(self.fd_store / FD_STORE_NOTIFY))
            passed, where = self._fetch_from_sidecar(), f"the fd store in {self.fd_store}"
        else:
            address = sdnotify.socket_address(os.environ.get("NOTIFY_SOCKET", ""))
            if address is not None and sdnotify.fd_store_size(os.environ) > 0:
                self.store = sdnotify.Notifier(address)
            where = "systemd's descriptor store"
        for name, fd in passed:
            try:
                self.held[sdnotify.label_of(name)] = socket.socket(fileno=fd)
            except OSError as exc:  # not a socket: nothing of ours
                log.warning("descriptor %d (%s) from %s is not a socket (%s): closed", fd, name, where, exc)
                os.close(fd)
        if self.held:
            log.info("%d sockets held across a restart of the supervisor, from %s", len(self.held), where)

    def _fetch_from_sidecar(self) -> list[tuple[str, int]]:
        assert self.fd_store is not None
        path = self.fd_store / FD_STORE_FETCH
        passed: list[tuple[str, int]] = []
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as chan:
                chan.settimeout(5.0)
                chan.connect(str(path))
                while True:
                    message, fds = receive(chan)
                    if message is None or message.get("op") == "end":
                        break
                    passed += zip(message["labels"], fds)
        except OSError as exc:
            # A sidecar not started yet, or none: held from now on by this process alone.
            log.warning("the fd store at %s cannot be read (%s): no socket comes back from it", path, exc)
        return passed

    def _hold(self, label: str, sock: socket.socket) -> None:
        previous = self.held.pop(label, None)
        if previous is not None:
            previous.close()
            if self.store is not None:
                self.store.remove_fds(sdnotify.fd_name(label))
        self.held[label] = sock
        if self.store is not None and not self.store.store_fds(sdnotify.fd_name(label), [sock.fileno()]):
            self.store_failures += 1
            if self.store_failures == 1:  # once: a store that is gone refuses every socket
                log.warning("cannot put %s in the descriptor store at %s: held only while this process lives "
                            "(and so every socket after it that cannot be stored either)", label, self.store.address)

    def _release(self, label: str) -> None:
        held = self.held.pop(label, None)
        if held is not None:
            held.close()
            if self.store is not None:
                self.store.remove_fds(sdnotify.fd_name(label))

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
            readable, _, _ = select.select([self.chan, wake_r, *self.worker_chans], [], [],
                                           STORE_CHECK_S if self.fd_store is not None else None)
            self._store_again_if_restarted()
            if wake_r in readable:
                for signum in os.read(wake_r, 64):
                    if signum in FORWARDED:
                        if signum != signal.SIGHUP:
                            self.stopping = True
                        self._signal_child(signum)
            # The workers' first: a worker's end comes before the daemon asks for its successor.
            for chan in [c for c in readable if c in self.worker_chans]:
                if not self._message(chan, worker_prefix(self.worker_chans[chan])):
                    self._drop_worker_chan(chan)  # the worker exited; what it held stays held
            if self.chan in readable and not self._message(self.chan, ""):
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

    def _message(self, chan: socket.socket, prefix: str) -> bool:
        """Handle one message of the daemon (``prefix`` "") or of a relay worker (its slot's
        prefix); False once its end is closed."""
        try:
            message, fds = receive(chan)
        except OSError:
            message, fds = None, []
        if message is None:
            return False
        op = message.get("op")
        kept = False
        if op == "hello":
            labels = self._offer(chan, prefix)
            for start in range(0, len(labels), BATCH):
                batch = labels[start:start + BATCH]
                send(chan, {"op": "held", "labels": [label[len(prefix):] for label in batch]},
                     [self.held[label].fileno() for label in batch])
            send(chan, {"op": "end", "store": self._store_name()})
        elif op == "hold" and fds:
            self._hold(prefix + message["label"], socket.socket(fileno=fds[0]))
            kept = True
        elif op == "release":
            self._release(prefix + message.get("label", ""))
        elif op == "worker" and fds and not prefix:
            self.worker_chans[socket.socket(fileno=fds[0])] = int(message["slot"])
            kept = True
        elif op == "settled" and not prefix:
            self._settle(set(message.get("slots", ())))
        for fd in fds[1:] if kept else fds:
            os.close(fd)
        return True

    def _store_name(self) -> str | None:
        """Where the held sockets are kept beyond this process (`kubeport get status`)."""
        if self.store is None:
            return None
        return f"the fd store in {self.fd_store}" if self.fd_store is not None else "systemd's descriptor store"

    def _offer(self, chan: socket.socket, prefix: str) -> list[str]:
        """What a process asking for its held sockets gets: the daemon its own; a worker its
        slot's, unless a live worker of the same slot serves them (an orphan of a killed
        daemon, adopted by the next one in another slot)."""
        if not prefix:
            return [label for label in self.held if worker_slot(label) is None]
        slot = self.worker_chans[chan]
        for other, other_slot in list(self.worker_chans.items()):
            if other is not chan and other_slot == slot and not self._gone(other):
                return []
        return [label for label in self.held if label.startswith(prefix)]

    def _settle(self, slots: set[int]) -> None:
        """The daemon served its first view with workers in ``slots``: the sockets of any
        other slot (fewer workers than before, or none) that no live worker holds are closed."""
        live = {slot for chan, slot in list(self.worker_chans.items()) if not self._gone(chan)}
        unserved = [label for label in self.held
                    if (slot := worker_slot(label)) is not None and slot not in slots and slot not in live]
        for label in unserved:
            self._release(label)
        if unserved:
            log.info("%d held sockets of relay workers no longer started, closed", len(unserved))

    def _gone(self, chan: socket.socket) -> bool:
        """A worker's channel whose other end is closed (dropped here if so)."""
        try:
            readable, _, _ = select.select([chan], [], [], 0)
            if readable and not chan.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                self._drop_worker_chan(chan)
                return True
        except BlockingIOError:
            return False
        except OSError:
            self._drop_worker_chan(chan)
            return True
        return False

    def _drop_worker_chan(self, chan: socket.socket) -> None:
        self.worker_chans.pop(chan, None)
        chan.close()

    def _close_held(self) -> None:
        for sock in self.held.values():
            sock.close()
        self.held.clear()
        for chan in list(self.worker_chans):
            self._drop_worker_chan(chan)


def _become_subreaper() -> None:
    """Orphans of the daemon become this process's children, not init's: reaped here, and
    ended with the pod or the unit as before (PR_SET_CHILD_SUBREAPER, prctl(2))."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        log.warning("cannot become the daemon's orphans' subreaper (%s): init reaps them", exc)


def supervise(argv: list[str], fd_store: Path | None = None) -> int:
    """Run ``argv`` (this very command line) as the supervised daemon."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return Supervisor(argv, fd_store).run()

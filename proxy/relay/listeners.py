"""The live listeners, one per frontend that needs one, reconciled change by change.

A listener is opened only below the reserve's listener ceiling (reserve.py): past it a
frontend gets none, and those frontends are one problem line and one log line, not one per frontend
(thousands of Services under a low ``LimitNOFILE`` would bury everything else). They are tried
again at every apply and by the proxier's timer, the first names first, until one is refused.
"""

from __future__ import annotations

import errno
import heapq
import logging
import socket
from typing import Callable

from kubeport.proxy.balancer import Route
from kubeport.proxy.relay import steering
from kubeport.proxy.relay.context import RelayContext
from kubeport.proxy.relay.reserve import NAMED_FRONTENDS, DescriptorReserve, no_listener_problem
from kubeport.proxy.relay.tcp_listener import TcpListener
from kubeport.proxy.relay.udp import UdpListener
from kubeport.proxy.table import Frontend, FrontendKind, FrontendRule, RuleChange

log = logging.getLogger(__name__)

RouteFor = Callable[[FrontendRule], Route]

#: a listener refused for want of descriptors: the process's limit, or the system's
_NO_DESCRIPTORS = {errno.EMFILE, errno.ENFILE}


def _first_named(item: tuple[Frontend, FrontendRule]) -> tuple[str, Frontend]:
    return str(item[1].port_name), item[0]


class Listeners:
    def __init__(self, ctx: RelayContext, *, sctp: bool, steer_affinity: bool = False,
                 reserve: DescriptorReserve | None = None) -> None:
        self._ctx = ctx
        self._reserve = reserve or ctx.reserve
        self._sctp = sctp
        #: several workers share the sockets: steer affinity frontends by client address (steering.py).
        self._steer_affinity = steer_affinity
        self._open: dict[Frontend, tuple[TcpListener | UdpListener, FrontendRule]] = {}
        #: frontends whose listener could not be opened: (rule, error), retried on every apply.
        self._failed: dict[Frontend, tuple[FrontendRule, str]] = {}
        #: frontends refused a listener for want of descriptors (a frontend is here or in
        #: _failed, never both)
        self._short: dict[Frontend, FrontendRule] = {}
        #: how many were short when it was last logged
        self._short_logged = 0
        self._unsupported: set[Frontend] = set()

    def open_frontends(self) -> frozenset[Frontend]:
        return frozenset(self._open)

    def listener(self, frontend: Frontend) -> TcpListener | UdpListener | None:
        held = self._open.get(frontend)
        return held[0] if held else None

    def problems(self) -> list[str]:
        found = [f"{f} ({rule.port_name}): cannot listen: {err}" for f, (rule, err) in sorted(self._failed.items())]
        found += [f"{f}: SCTP is not supported by this kernel; not served" for f in sorted(self._unsupported)]
        short = self.shortage()
        if short is not None:
            found.append(short)
        return found

    @property
    def short_of_descriptors(self) -> int:
        """How many frontends were refused a listener for want of descriptors."""
        return len(self._short)

    def shortage(self) -> str | None:
        """The problem line of the frontends refused a listener for want of descriptors,
        naming the first few in the order they are tried again (service port, then frontend)."""
        first = heapq.nsmallest(NAMED_FRONTENDS, self._short.items(), key=_first_named)
        return no_listener_problem([f"{rule.port_name} on {frontend}" for frontend, rule in first], len(self._short),
                                   self._reserve.limit)

    def log_shortage(self) -> None:
        """One log line when the number of frontends without a listener for want of
        descriptors has changed (after an apply or a retry)."""
        count = len(self._short)
        if count == self._short_logged:
            return
        if count:
            log.warning("%s; raise the open-file limit (LimitNOFILE)", self.shortage())
        else:
            log.info("every frontend has a listener again (%d were short of descriptors)", self._short_logged)
        self._short_logged = count

    def apply(self, change: RuleChange, route_for: RouteFor) -> None:
        frontend, new = change.frontend, change.new
        self._failed.pop(frontend, None)
        self._short.pop(frontend, None)
        self._unsupported.discard(frontend)
        held = self._open.get(frontend)
        wanted = new is not None and new.needs_listener
        if wanted and frontend.protocol == "SCTP" and not self._sctp:
            self._unsupported.add(frontend)
            wanted = False
        if held is not None and wanted and held[1].port_name == new.port_name:
            listener, old = held
            listener.route = route_for(new)  # endpoints swapped; socket and connections untouched
            self._open[frontend] = (listener, new)
            if bool(old.affinity_timeout) != bool(new.affinity_timeout):
                self._steer(listener, new)
            return
        if held is not None:
            held[0].close()
            del self._open[frontend]
            log.debug("closed %s", frontend)
        if wanted:
            self._start(frontend, new, route_for)

    def retry_failed(self, route_for: RouteFor) -> None:
        """Every frontend refused a listener tried again; those short of descriptors in the
        order they are named, until one is refused again (the ones after it would be too)."""
        for frontend, (rule, _) in list(self._failed.items()):
            del self._failed[frontend]
            self._start(frontend, rule, route_for)
        self.retry_short(route_for)

    def retry_short(self, route_for: RouteFor) -> None:
        """The frontends short of descriptors tried again, in the order they are named."""
        for frontend, rule in sorted(self._short.items(), key=_first_named):
            del self._short[frontend]
            if not self._start(frontend, rule, route_for):
                break

    def _start(self, frontend: Frontend, rule: FrontendRule, route_for: RouteFor) -> bool:
        """Open ``frontend``'s listener; False when it was refused for want of descriptors."""
        if not self._reserve.listener_fits():
            self._short[frontend] = rule
            return False
        route = route_for(rule)
        transparent = rule.kind in (FrontendKind.EXTERNAL_IP, FrontendKind.LOAD_BALANCER)
        if frontend.protocol == "UDP":
            listener: TcpListener | UdpListener = UdpListener(self._ctx, frontend, route, transparent)
        elif frontend.protocol == "SCTP":
            listener = TcpListener(self._ctx, frontend, route, proto=socket.IPPROTO_SCTP, transparent=transparent)
        else:
            listener = TcpListener(self._ctx, frontend, route, transparent=transparent)
        self._keep_reserve(listener)
        try:
            listener.open()
        except OSError as exc:
            if exc.errno in _NO_DESCRIPTORS:  # the limit itself (a thread took the rest): as above
                log.debug("%s (%s): cannot listen: %s", frontend, rule.port_name, exc)
                self._short[frontend] = rule
                return False
            log.error("%s (%s): cannot listen: %s", frontend, rule.port_name, exc)
            self._failed[frontend] = (rule, str(exc))
            return True
        self._open[frontend] = (listener, rule)
        if rule.affinity_timeout:
            self._steer(listener, rule)
        log.debug("listening on %s for %s", frontend, rule.port_name)
        return True

    def _keep_reserve(self, listener: TcpListener | UdpListener) -> None:
        """The callbacks that open descriptors (an accept and its backend socket, a new UDP
        flow's socket) run below the reserve's ceiling (reserve.py). Set on the instance
        before ``open`` registers them, so every registration (a resumed accept too) takes it."""
        within = self._reserve.within
        if isinstance(listener, UdpListener):
            listener._on_datagrams = within(listener._on_datagrams)  # type: ignore[method-assign]
        else:
            listener._on_acceptable = within(listener._on_acceptable)  # type: ignore[method-assign]

    def _steer(self, listener: TcpListener | UdpListener, rule: FrontendRule) -> None:
        if not self._steer_affinity or listener.sock is None:
            return
        if not rule.affinity_timeout:
            steering.detach(listener.sock)
            return
        try:
            steering.attach(listener.sock, listener.frontend.family, self._ctx.config.workers)
        except OSError as exc:  # affinity then holds per worker only
            log.warning("%s: cannot steer clients to workers by address: %s", listener.frontend, exc)

    def stop_accepting(self, *, hand_over: bool = False, accept_queued: bool = True) -> None:
        """Shutdown: TCP and SCTP listeners close now (``accept_queued``: after taking what the
        kernel queued); UDP ones drain (``hand_over``: new datagrams go to the successor's
        sockets, see UdpListener.drain)."""
        for frontend, (listener, _) in list(self._open.items()):
            if isinstance(listener, UdpListener):
                listener.drain(hand_over=hand_over)
            else:
                listener.close(accept_queued=accept_queued)
            del self._open[frontend]
        self._failed.clear()
        self._short.clear()

    def close_all(self) -> None:
        for listener, _ in self._open.values():
            listener.close()
        self._open.clear()
        self._failed.clear()
        self._short.clear()
        for listener in list(self._ctx.draining):
            listener.close()


class _Served:
    """A frontend another process listens on: its route is kept, there is no socket."""

    sock = None

    def __init__(self, frontend: Frontend, route: Route) -> None:
        self.frontend = frontend
        self.route = route

    def close(self, **_) -> None:
        pass


class ServedElsewhere(Listeners):
    """The frontends as Listeners reconciles them, without a socket of this process: the relay
    workers listen on them (workers/parent.py), and this process's established connections would not
    outlive it. ``open_frontends`` then says what the workers serve."""

    def _start(self, frontend: Frontend, rule: FrontendRule, route_for: RouteFor) -> bool:
        self._open[frontend] = (_Served(frontend, route_for(rule)), rule)  # type: ignore[assignment]
        return True

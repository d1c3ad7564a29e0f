"""The live listeners, one per frontend that needs one, reconciled change by change."""

from __future__ import annotations

import logging
import socket
from typing import Callable

from .balancer import Route
from .context import RelayContext
from .table import Frontend, FrontendRule, RuleChange
from .tcp import TcpListener
from .udp import UdpListener

log = logging.getLogger(__name__)

RouteFor = Callable[[FrontendRule], Route]


class Listeners:
    def __init__(self, ctx: RelayContext, *, sctp: bool) -> None:
        self._ctx = ctx
        self._sctp = sctp
        self._open: dict[Frontend, tuple[TcpListener | UdpListener, FrontendRule]] = {}
        #: frontends whose listener could not be opened: (rule, error), retried on every apply.
        self._failed: dict[Frontend, tuple[FrontendRule, str]] = {}
        self._unsupported: set[Frontend] = set()

    def open_frontends(self) -> frozenset[Frontend]:
        return frozenset(self._open)

    def listener(self, frontend: Frontend) -> TcpListener | UdpListener | None:
        held = self._open.get(frontend)
        return held[0] if held else None

    def problems(self) -> list[str]:
        found = [f"{f} ({rule.port_name}): cannot listen: {err}" for f, (rule, err) in sorted(self._failed.items())]
        found += [f"{f}: SCTP is not supported by this kernel; not served" for f in sorted(self._unsupported)]
        return found

    def apply(self, change: RuleChange, route_for: RouteFor) -> None:
        frontend, new = change.frontend, change.new
        self._failed.pop(frontend, None)
        self._unsupported.discard(frontend)
        held = self._open.get(frontend)
        wanted = new is not None and new.needs_listener
        if wanted and frontend.protocol == "SCTP" and not self._sctp:
            self._unsupported.add(frontend)
            wanted = False
        if held is not None and wanted and held[1].port_name == new.port_name:
            held[0].route = route_for(new)  # endpoints swapped; socket and connections untouched
            self._open[frontend] = (held[0], new)
            return
        if held is not None:
            held[0].close()
            del self._open[frontend]
            log.debug("closed %s", frontend)
        if wanted:
            self._start(frontend, new, route_for)

    def retry_failed(self, route_for: RouteFor) -> None:
        for frontend, (rule, _) in list(self._failed.items()):
            del self._failed[frontend]
            self._start(frontend, rule, route_for)

    def _start(self, frontend: Frontend, rule: FrontendRule, route_for: RouteFor) -> None:
        route = route_for(rule)
        if frontend.protocol == "UDP":
            listener: TcpListener | UdpListener = UdpListener(self._ctx, frontend, route)
        elif frontend.protocol == "SCTP":
            listener = TcpListener(self._ctx, frontend, route, proto=socket.IPPROTO_SCTP)
        else:
            listener = TcpListener(self._ctx, frontend, route)
        try:
            listener.open()
        except OSError as exc:
            log.error("%s (%s): cannot listen: %s", frontend, rule.port_name, exc)
            self._failed[frontend] = (rule, str(exc))
            return
        self._open[frontend] = (listener, rule)
        log.debug("listening on %s for %s", frontend, rule.port_name)

    def close_all(self) -> None:
        for listener, _ in self._open.values():
            listener.close()
        self._open.clear()
        self._failed.clear()

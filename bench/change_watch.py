"""Watching for one endpoint change from the client namespace: when do new connections and DNS
answers first show it?

The probes run open loop, one thread, one selector: a new connection every millisecond and a DNS
query every half millisecond, whether or not earlier ones have answered. A probe sequence that waits
for each answer (connection, then query, then a pause) measures itself: a connection accepted
just before the change is applied is relayed while the daemon is busy with the change and can
take milliseconds, and every probe behind it waits too (measured at 10,000 services: the
daemon had applied a change at 2 ms, that loop saw it at 6.7 ms).

A figure is the time from ``start`` until the first reply naming the new endpoint had been
read completely (not when its probe was sent): the observer's error is at most a pacing
interval plus one round trip through the proxy (about 0.5 ms here). Before returning, the
probes in flight are let finish, so that the next change starts on a quiet daemon.
"""

from __future__ import annotations

import errno
import selectors
import socket
import time
from dataclasses import dataclass, field

from dnslib import QTYPE, RCODE, DNSRecord

HTTP_REQUEST = b"GET / HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n"
#: the longest wait for an answer when no probe is due (the deadline is checked in between)
WAIT_CAP = 0.05


@dataclass
class _Connection:
    sock: socket.socket
    sent: bool = False
    reply: bytearray = field(default_factory=bytearray)


@dataclass
class ChangeWatch:
    """``conn`` is (VIP, port) whose HTTP body must become ``endpoint``; ``dns`` is (server, name)
    whose A answer must become exactly [``endpoint``]."""

    conn: tuple[str, int]
    dns: tuple[str, str]
    #: Seconds between two connections, and between two queries. A relayed connection costs the
    #: daemon far more than a query, and the probes share its event loop with the change.
    conn_pacing: float = 0.001
    dns_pacing: float = 0.0005
    #: connections in flight at most: a stalled daemon gets no pile of probes on top of its work
    max_connections: int = 4

    def first_seen(self, endpoint: str, start: float, deadline_s: float = 30.0) -> tuple[float, float]:
        """ms from ``start`` (a perf_counter) until a new connection, and a DNS answer, showed ``endpoint``."""
        want_body = endpoint.encode()
        want_dns = ("NOERROR", [endpoint])
        selector = selectors.DefaultSelector()
        resolver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        resolver.setblocking(False)
        resolver.connect((self.dns[0], 53))
        query = DNSRecord.question(self.dns[1], "A")
        selector.register(resolver, selectors.EVENT_READ, None)
        connections: dict[socket.socket, _Connection] = {}
        known: dict[bytes, bool] = {}
        conn_ms = dns_ms = None
        next_conn = next_query = time.perf_counter()
        try:
            while conn_ms is None or dns_ms is None:
                now = time.perf_counter()
                if now - start > deadline_s:
                    raise TimeoutError(f"no change to {endpoint} within {deadline_s:.0f} s "
                                       f"(conn {conn_ms}, dns {dns_ms})")
                if conn_ms is None and now >= next_conn and len(connections) < self.max_connections:
                    self._open(selector, connections)
                    next_conn = now + self.conn_pacing
                if dns_ms is None and now >= next_query:
                    query.header.id = (query.header.id + 1) & 0xFFFF
                    try:
                        resolver.send(query.pack())
                    except OSError:
                        pass  # a full buffer or an ICMP error of an earlier query: the next one goes out
                    next_query = now + self.dns_pacing
                # Never a timeout in the past: a spinning observer takes a core from the daemon.
                wake = now + WAIT_CAP
                if conn_ms is None and len(connections) < self.max_connections:
                    wake = min(wake, next_conn)
                if dns_ms is None:
                    wake = min(wake, next_query)
                for key, _events in selector.select(max(0.0, wake - time.perf_counter())):
                    if key.fileobj is resolver:
                        # read also once answered: an unread reply keeps the socket ready
                        if _answers(resolver, want_dns, known) and dns_ms is None:
                            dns_ms = (time.perf_counter() - start) * 1e3
                    else:
                        body = self._progress(selector, connections, connections[key.fileobj])
                        if body == want_body and conn_ms is None:
                            conn_ms = (time.perf_counter() - start) * 1e3
            selector.unregister(resolver)  # late replies are of no interest
            self._drain(selector, connections, start + deadline_s)
            return conn_ms, dns_ms
        finally:
            for probe in connections.values():
                probe.sock.close()
            resolver.close()
            selector.close()

    def _drain(self, selector: selectors.BaseSelector, connections: dict[socket.socket, _Connection],
               deadline: float) -> None:
        """Let the probes in flight finish: the next change then starts on a daemon with nothing
        of this one's probes left to relay."""
        while connections and time.perf_counter() < deadline:
            for key, _events in selector.select(max(0.0, deadline - time.perf_counter())):
                self._progress(selector, connections, connections[key.fileobj])

    def _open(self, selector: selectors.BaseSelector, connections: dict[socket.socket, _Connection]) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        code = sock.connect_ex(self.conn)
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            return
        connections[sock] = _Connection(sock)
        selector.register(sock, selectors.EVENT_WRITE, None)

    @staticmethod
    def _progress(selector: selectors.BaseSelector, connections: dict[socket.socket, _Connection],
                  probe: _Connection) -> bytes | None:
        """Advance one connection; its body once the reply is complete, else None."""
        sock = probe.sock
        complete = False
        try:
            if not probe.sent:
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error:
                    raise OSError(error, "connect")
                sock.send(HTTP_REQUEST)  # 55 bytes into an empty send buffer: never partial
                probe.sent = True
                selector.modify(sock, selectors.EVENT_READ, None)
                return None
            chunk = sock.recv(4096)
            if chunk:
                probe.reply += chunk
                return None
            complete = True  # the server closed after its reply (Connection: close)
        except BlockingIOError:
            return None
        except OSError:
            pass  # refused or reset (a VIP without endpoints for a moment): no answer
        selector.unregister(sock)
        del connections[sock]
        sock.close()
        return bytes(probe.reply).rsplit(b"\r\n\r\n", 1)[-1].strip() if complete else None


def _answers(resolver: socket.socket, want: tuple[str, list[str]], known: dict[bytes, bool]) -> bool:
    """Reads every reply waiting; whether one of them was ``want``. ``known`` maps a reply without
    its ID to that verdict: replies repeat, and parsing each one (~0.1 ms of Python) would make
    the observer a load on the two cores it shares with what it observes."""
    seen = False
    while True:
        try:
            data = resolver.recv(4096)
        except BlockingIOError:
            return seen
        except OSError:
            continue  # an ICMP error queued on the socket: the next read has the replies
        verdict = known.get(data[2:])
        if verdict is None:
            reply = DNSRecord.parse(data)
            answer = (RCODE.get(reply.header.rcode),
                      sorted(str(rr.rdata) for rr in reply.rr if rr.rtype == QTYPE.A))
            verdict = known[data[2:]] = answer == want
        seen = seen or verdict

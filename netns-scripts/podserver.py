#!/usr/bin/env python3
"""A tiny pod workload for the netns test topology (stdlib only).

    podserver.py --name POD [--http PORT ...] [--udp PORT ...] [--echo PORT ...]

Every socket binds ``::`` with IPV6_V6ONLY=0, so it serves IPv4 and IPv6.

HTTP/1.1 with keep-alive (defaults to port 8080):
  GET /             -> "pod=<name> client=<ip>:<port>\\n"
  GET /bytes/<N>    -> N bytes of the pattern byte[i] = (i + seed) % 251 (?seed=S, default 0);
                       251 is prime, so a lost or repeated power-of-two sized chunk breaks the checksum
  GET /sleep/<sec>  -> waits, then "pod=<name> client=<ip>:<port> slept=<sec>\\n" (drain tests)
UDP (defaults to port 9090): each datagram is answered with "<name> <payload>", and the
datagram "peer?" with "<name> client=<ip>:<port>" (the address the pod saw).
TCP echo (--echo, off by default): echoes everything, and after the client's EOF shuts down
its write side (half-close).

Prints "ready" on stdout once every socket listens.
"""

from __future__ import annotations

import argparse
import http.server
import socket
import socketserver
import sys
import threading
import time
from urllib.parse import parse_qs, urlsplit

PATTERN_PERIOD = 251
# A whole number of periods, so consecutive blocks continue the pattern seamlessly; one spare
# period lets a seeded block start anywhere in it.
BLOCK_LEN = PATTERN_PERIOD * 4096
_BLOCK = bytes(range(PATTERN_PERIOD)) * (BLOCK_LEN // PATTERN_PERIOD + 1)
MAX_SLEEP_SECONDS = 3600.0
QUIET_ERRORS = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)


def client_text(address: tuple) -> str:
    """`ip:port` of a peer, with IPv4-mapped IPv6 addresses shown as plain IPv4."""
    host, port = address[0], address[1]
    if host.startswith("::ffff:") and "." in host:
        host = host[len("::ffff:"):]
    return f"{host}:{port}"


def dual_stack_socket(kind: int, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6, kind)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::", port))
    return sock


class DualStackHTTPServer(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6
    request_queue_size = 1024
    daemon_threads = True

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], QUIET_ERRORS):
            super().handle_error(request, client_address)


class PodHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "podserver"
    # Headers and body go out in two writes; Nagle would hold the second back on keep-alive.
    disable_nagle_algorithm = True
    pod_name = "pod"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        try:
            if url.path == "/":
                self._reply_text(self._identity())
            elif len(parts) == 2 and parts[0] == "bytes":
                self._send_pattern(int(parts[1]), int(parse_qs(url.query).get("seed", ["0"])[0]))
            elif len(parts) == 2 and parts[0] == "sleep":
                self._sleep_then_reply(float(parts[1]))
            else:
                self._reply_text(f"not found: {url.path}\n", status=404)
        except ValueError as err:
            self._reply_text(f"bad request: {err}\n", status=400)

    def _identity(self) -> str:
        return f"pod={self.pod_name} client={client_text(self.client_address)}"

    def _reply_text(self, text: str, status: int = 200) -> None:
        if not text.endswith("\n"):
            text += "\n"
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _sleep_then_reply(self, seconds: float) -> None:
        if not 0 <= seconds <= MAX_SLEEP_SECONDS:
            raise ValueError(f"sleep seconds must be in [0, {MAX_SLEEP_SECONDS}]")
        time.sleep(seconds)
        self._reply_text(f"{self._identity()} slept={seconds:g}")

    def _send_pattern(self, length: int, seed: int) -> None:
        if length < 0:
            raise ValueError("byte count must be >= 0")
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.end_headers()
        start = seed % PATTERN_PERIOD
        block = memoryview(_BLOCK)[start:start + BLOCK_LEN]
        full, rest = divmod(length, BLOCK_LEN)
        for _ in range(full):
            self.wfile.write(block)
        if rest:
            self.wfile.write(block[:rest])


class EchoHandler(socketserver.BaseRequestHandler):
    """Echo until the client's EOF, then half-close our side."""

    def handle(self) -> None:
        sock: socket.socket = self.request
        buf = bytearray(256 * 1024)
        view = memoryview(buf)
        try:
            while n := sock.recv_into(buf):
                sock.sendall(view[:n])
            sock.shutdown(socket.SHUT_WR)
        except QUIET_ERRORS:
            pass


class DualStackTCPServer(socketserver.ThreadingTCPServer):
    address_family = socket.AF_INET6
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 1024

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def serve_udp(sock: socket.socket, name: str) -> None:
    prefix = name.encode() + b" "
    while True:
        payload, peer = sock.recvfrom(65535)
        if payload == b"peer?":
            payload = f"client={client_text(peer)}".encode()
        try:
            sock.sendto(prefix + payload, peer)
        except OSError:
            pass  # the peer's ICMP error must not stop the echo for everyone else


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True, help="pod name put into every answer")
    parser.add_argument("--http", type=int, action="append", metavar="PORT", help="HTTP port (default 8080)")
    parser.add_argument("--udp", type=int, action="append", metavar="PORT", help="UDP echo port (default 9090)")
    parser.add_argument("--echo", type=int, action="append", metavar="PORT", default=[], help="raw TCP echo port")
    args = parser.parse_args(argv)
    args.http = args.http or [8080]
    args.udp = args.udp or [9090]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    handler = type("NamedPodHandler", (PodHandler,), {"pod_name": args.name})
    servers: list[socketserver.BaseServer] = [DualStackHTTPServer(("::", port), handler) for port in args.http]
    servers += [DualStackTCPServer(("::", port), EchoHandler) for port in args.echo]
    udp_sockets = [dual_stack_socket(socket.SOCK_DGRAM, port) for port in args.udp]
    threads = [threading.Thread(target=server.serve_forever, daemon=True) for server in servers]
    threads += [threading.Thread(target=serve_udp, args=(sock, args.name), daemon=True) for sock in udp_sockets]
    for thread in threads:
        thread.start()
    print("ready", flush=True)
    try:
        for thread in threads:
            thread.join()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A client that keeps using a service: TCP request/response connections and UDP datagrams in a loop.

Run inside a pod namespace. Counts successes and failures into --status (a JSON file,
rewritten atomically) so a test can wait for progress, and prints the same JSON when it
gets SIGTERM. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time

counts = {"tcp_ok": 0, "tcp_fail": 0, "udp_ok": 0, "udp_lost": 0, "dns_ok": 0, "dns_lost": 0,
          "dns_longest_ms": 0.0, "errors": []}
#: how long one DNS query may wait for its answer before it counts as lost
DNS_TIMEOUT = 3.0


def host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def tcp_once(address: tuple[str, int], timeout: float = 2.0) -> None:
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(address)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    if b"pod=" not in reply:
        raise RuntimeError(f"unexpected reply {reply[:80]!r}")


def udp_once(sock: socket.socket, address: tuple[str, int], sequence: int) -> None:
    payload = f"seq-{sequence}".encode()
    sock.sendto(payload, address)
    deadline = time.monotonic() + 1.0
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        data, _ = sock.recvfrom(2048)
        if data.endswith(payload):
            return


def dns_query(name: str, ident: int) -> bytes:
    """An A query for ``name``, recursion desired (RFC 1035 4.1), as a stub resolver sends it."""
    labels = b"".join(bytes([len(part)]) + part.encode() for part in name.rstrip(".").split("."))
    return ident.to_bytes(2, "big") + b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + labels + b"\x00\x00\x01\x00\x01"


def dns_once(sock: socket.socket, server: tuple[str, int], name: str, ident: int) -> float:
    """Seconds until an answer with records came back; raises on timeout or an error rcode."""
    started = time.monotonic()
    sock.sendto(dns_query(name, ident), server)
    deadline = started + DNS_TIMEOUT
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        data, _ = sock.recvfrom(4096)
        if len(data) >= 12 and int.from_bytes(data[:2], "big") == ident:
            rcode, answers = data[3] & 0x0F, int.from_bytes(data[6:8], "big")
            if rcode != 0 or answers == 0:
                raise RuntimeError(f"rcode {rcode}, {answers} answers")
            return time.monotonic() - started


def record(kind: str, ok: bool, error: Exception | None = None) -> None:
    counts[f"{kind}_ok" if ok else f"{kind}_{'fail' if kind == 'tcp' else 'lost'}"] += 1
    if error is not None and len(counts["errors"]) < 20:
        counts["errors"].append(f"{kind}: {type(error).__name__}: {error}")


def write_status(path: str) -> None:
    scratch = f"{path}.tmp"
    with open(scratch, "w") as handle:
        json.dump(counts, handle)
    os.replace(scratch, path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tcp")
    parser.add_argument("--udp")
    parser.add_argument("--dns", metavar="NAME@IP", help="also an A query for NAME to IP:53 each round")
    parser.add_argument("--status", required=True)
    parser.add_argument("--tcp-timeout", type=float, default=2.0,
                        help="seconds a connection may take, connect to the whole reply")
    args = parser.parse_args()
    running = True

    def stop(*_):
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    tcp = host_port(args.tcp) if args.tcp else None
    udp = host_port(args.udp) if args.udp else None
    # One UDP socket for the whole run: one flow through the proxy, which must survive.
    udp_sock = socket.socket(socket.AF_INET6 if udp and ":" in udp[0] else socket.AF_INET, socket.SOCK_DGRAM)
    dns = None
    if args.dns:
        dns_name, _, dns_ip = args.dns.partition("@")
        dns = (dns_name, (dns_ip, 53), socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    sequence = 0
    while running:
        if tcp:
            try:
                tcp_once(tcp, timeout=args.tcp_timeout)
                record("tcp", True)
            except Exception as error:  # noqa: BLE001 - every failure is counted
                record("tcp", False, error)
        if udp:
            sequence += 1
            try:
                udp_once(udp_sock, udp, sequence)
                record("udp", True)
            except Exception as error:  # noqa: BLE001
                record("udp", False, error)
        if dns:
            try:
                waited = dns_once(dns[2], dns[1], dns[0], sequence % 65536)
                counts["dns_longest_ms"] = max(counts["dns_longest_ms"], round(waited * 1000, 1))
                record("dns", True)
            except Exception as error:  # noqa: BLE001
                record("dns", False, error)
        if sequence % 10 == 0:
            write_status(args.status)
        time.sleep(0.005)  # pacing of the load itself, not synchronisation
    write_status(args.status)
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    sys.exit(main())

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

counts = {"tcp_ok": 0, "tcp_fail": 0, "udp_ok": 0, "udp_lost": 0, "errors": []}


def host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def tcp_once(address: tuple[str, int]) -> None:
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(2.0)
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
    parser.add_argument("--status", required=True)
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
    sequence = 0
    while running:
        if tcp:
            try:
                tcp_once(tcp)
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
        if sequence % 10 == 0:
            write_status(args.status)
        time.sleep(0.005)  # pacing of the load itself, not synchronisation
    write_status(args.status)
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    sys.exit(main())

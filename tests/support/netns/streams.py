"""Open streams through a service that must survive: N TCP connections to an echo service,
each sending a numbered line and reading it back every round.

Run inside a pod namespace: ``streams.py HOST:PORT N --status FILE``. Rewrites --status (JSON,
atomically) after every round: rounds completed, streams alive, and the first errors. A stream
whose echo fails or differs is dead for the rest of the run. Prints the same JSON on SIGTERM.
Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time

counts = {"rounds": 0, "alive": 0, "dead": 0, "errors": []}


def write_status(path: str) -> None:
    scratch = f"{path}.tmp"
    with open(scratch, "w") as handle:
        json.dump(counts, handle)
    os.replace(scratch, path)


def echo(sock: socket.socket, line: bytes) -> None:
    sock.sendall(line)
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed by the peer")
        reply += chunk
    if reply != line:
        raise RuntimeError(f"echoed {reply[:60]!r}, sent {line[:60]!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("streams", type=int)
    parser.add_argument("--status", required=True)
    parser.add_argument("--period", type=float, default=0.05)
    args = parser.parse_args()
    host, _, port = args.address.rpartition(":")
    running = True

    def stop(*_):
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    streams: dict[int, socket.socket] = {}
    for index in range(args.streams):
        sock = socket.create_connection((host, int(port)), timeout=5.0)
        streams[index] = sock
    counts["alive"] = len(streams)
    while running:
        for index, sock in list(streams.items()):
            try:
                echo(sock, f"stream {index} round {counts['rounds']}\n".encode())
            except (OSError, RuntimeError) as exc:
                del streams[index]
                sock.close()
                counts["dead"] += 1
                if len(counts["errors"]) < 10:
                    counts["errors"].append(f"stream {index}: {type(exc).__name__}: {exc}")
        counts["rounds"] += 1
        counts["alive"] = len(streams)
        write_status(args.status)
        time.sleep(args.period)
    print(json.dumps(counts))
    sys.stdout.flush()


if __name__ == "__main__":
    main()

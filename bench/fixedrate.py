#!/usr/bin/env python3
"""A fixed-rate (open-loop) HTTP/1.1 keep-alive load generator: wrk2's idea in asyncio.

    fixedrate.py --host IP --port N --rate R --seconds S [--connections C] [--warmup W]

Requests are due at t0 + k/R whatever the server does. A due request goes out on an idle
keep-alive connection at once; when none is idle it waits, and that wait counts in its
latency (no coordinated omission). The timer ticks every millisecond, so the base of a
request's latency is the first tick at which it was due, not its ideal instant: that keeps
the timer's granularity out of the numbers. Prints one JSON object with latency
percentiles in ms, the achieved rate and errors. Used because wrk2 is not in Debian.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import time
from array import array

REQUEST = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"
TICK = 0.001


class Client(asyncio.Protocol):
    def __init__(self, load: "Load") -> None:
        self.load = load
        self.buffer = b""
        self.base = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, base: float) -> None:
        self.base = base
        self.transport.write(REQUEST)

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            self.buffer = buffer
            return
        start = buffer.find(b"Content-Length:", 0, end)
        length = int(buffer[start + 15:buffer.find(b"\r\n", start)]) if start >= 0 else 0
        if len(buffer) < end + 4 + length:
            self.buffer = buffer
            return
        self.buffer = buffer[end + 4 + length:]
        self.load.done(self, time.perf_counter() - self.base)

    def connection_lost(self, exc: Exception | None) -> None:
        self.load.lost(self)


class Load:
    def __init__(self, rate: float, seconds: float, warmup: float) -> None:
        self.rate = rate
        self.seconds = seconds
        self.warmup = warmup
        self.idle: list[Client] = []
        self.waiting: collections.deque[float] = collections.deque()
        self.issued = 0
        self.latencies = array("d")
        self.errors = 0
        self.in_flight = 0
        # Only requests due inside [record_from, record_until) are recorded, whenever they finish.
        self.record_from = float("inf")
        self.record_until = float("inf")

    def done(self, client: Client, latency: float) -> None:
        self.in_flight -= 1
        if self.record_from <= client.base < self.record_until:
            self.latencies.append(latency)
        if self.waiting:
            self.in_flight += 1
            client.send(self.waiting.popleft())
        else:
            self.idle.append(client)

    def lost(self, client: Client) -> None:
        if client in self.idle:
            self.idle.remove(client)
        else:
            self.errors += 1
            self.in_flight -= 1

    def pump(self, t0: float, until: float) -> None:
        now = time.perf_counter()
        due = int((min(now, until) - t0) * self.rate) - self.issued
        for _ in range(max(0, due)):
            self.issued += 1
            if self.idle:
                self.in_flight += 1
                self.idle.pop().send(now)
            else:
                self.waiting.append(now)


async def main(args: argparse.Namespace) -> dict:
    loop = asyncio.get_running_loop()
    load = Load(args.rate, args.seconds, args.warmup)
    clients = await asyncio.gather(*(
        loop.create_connection(lambda: Client(load), args.host, args.port) for _ in range(args.connections)))
    load.idle = [protocol for _transport, protocol in clients]
    t0 = time.perf_counter()
    load.record_from = t0 + args.warmup
    load.record_until = until = load.record_from + args.seconds
    while time.perf_counter() < until:
        load.pump(t0, until)
        await asyncio.sleep(TICK)
    issued_in_window = load.issued - int(args.warmup * args.rate)
    drain_deadline = time.perf_counter() + 2.0
    while (load.in_flight or load.waiting) and time.perf_counter() < drain_deadline:
        await asyncio.sleep(TICK)
    unfinished = load.in_flight + len(load.waiting)
    # Requests still open count with the time they have waited so far (a lower bound): never dropped.
    now = time.perf_counter()
    idle = {id(client) for client in load.idle}
    pending = list(load.waiting) + [p.base for _t, p in clients if id(p) not in idle and p.transport
                                    and not p.transport.is_closing()]
    load.latencies.extend(now - base for base in pending if load.record_from <= base < load.record_until)
    for transport, _protocol in clients:
        transport.close()
    samples = sorted(load.latencies)
    result: dict = {
        "tool": "bench/fixedrate.py (asyncio open-loop, keep-alive)",
        "target_rate": args.rate, "connections": args.connections, "seconds": args.seconds,
        "issued": issued_in_window, "completed": len(samples),
        "achieved_rate": len(samples) / args.seconds, "errors": load.errors, "unfinished": unfinished,
    }
    if samples:
        for p in (50, 90, 99, 99.9):
            result[f"p{p:g}_ms"] = samples[min(len(samples) - 1, int(len(samples) * p / 100))] * 1e3
        result["max_ms"] = samples[-1] * 1e3
    return result


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True, help="requests per second")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of load before recording")
    parser.add_argument("--connections", type=int, default=64)
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse_args()
    try:
        import uvloop
        result = uvloop.run(main(arguments))
    except ImportError:
        result = asyncio.run(main(arguments))
    print(json.dumps(result))

"""Load tools run inside the client namespace, each bounded in time, and their output parsed."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .topology import Topology, TopologyError

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class WrkResult:
    requests_per_second: float
    errors: int
    latency_ms: dict[str, float]


@dataclass(frozen=True)
class DnsperfResult:
    qps: float
    sent: int
    completed: int
    lost: int
    rcodes: dict[str, int]
    latency_ms: dict[str, float]


def iperf3(topo: Topology, client: str, host: str, port: int, streams: int, seconds: float) -> float:
    """Bulk TCP throughput in Gbit/s as received by the server."""
    proc = topo.run(client, ["iperf3", "-c", host, "-p", str(port), "-P", str(streams),
                             "-t", f"{seconds:g}", "-J", "--connect-timeout", "3000"], timeout=seconds + 20,
                    check=False)
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise TopologyError(f"iperf3: no JSON result: {proc.stderr.strip()[-300:]}") from None
    if "error" in data:
        raise TopologyError(f"iperf3: {data['error']}")
    return data["end"]["sum_received"]["bits_per_second"] / 1e9


LOST_QUERY_SECONDS = 2.0
_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _to_ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if not match:
        raise ValueError(f"unparsed wrk latency {text!r}")
    return float(match.group(1)) * _UNITS_MS[match.group(2)]


def parse_wrk(text: str) -> WrkResult:
    match = re.search(r"Requests/sec:\s+([\d.]+)", text)
    if not match:
        raise TopologyError(f"wrk: no result: {text.strip()[-300:]}")
    errors = 0
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if socket_errors:
        connect, _read, write, timeout = (int(g) for g in socket_errors.groups())
        # With `Connection: close` wrk counts the server's orderly close as a read error: not a failure.
        errors += connect + write + timeout
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    if non2xx:
        errors += int(non2xx.group(1))
    latency = {f"p{p}": _to_ms(v) for p, v in re.findall(r"^\s+(\d+)%\s+(\S+)\s*$", text, re.M)}
    return WrkResult(float(match.group(1)), errors, latency)


def wrk(topo: Topology, client: str, url: str, seconds: float, connections: int = 64,
        threads: int = 2, close: bool = False) -> WrkResult:
    argv = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "5s", "--latency"]
    if close:
        argv += ["-H", "Connection: close"]
    proc = topo.run(client, [*argv, url], timeout=seconds + 20, check=False)
    return parse_wrk(proc.stdout + proc.stderr)


def parse_dnsperf(text: str, verbose: bool) -> DnsperfResult:
    def number(label: str) -> float:
        match = re.search(rf"{label}:\s+([\d.]+)", text)
        if not match:
            raise TopologyError(f"dnsperf: no '{label}' in output: {text.strip()[-400:]}")
        return float(match.group(1))

    codes_line = re.search(r"Response codes:(.*)$", text, re.M)
    rcodes = {code: int(n) for code, n in re.findall(r"([A-Z]+) (\d+) \(", codes_line.group(1))} if codes_line else {}
    latency: dict[str, float] = {}
    if verbose:
        # "> NOERROR name. A 0.000123" per answered query (dnsperf -v).
        samples = [float(x) for x in re.findall(r"^> \S+ \S+ \S+ ([\d.]+)$", text, re.M)]
        # A lost query counts as the timeout: dropping it would flatter the tail.
        lost = re.search(r"Queries lost:\s+(\d+)", text)
        samples = sorted(samples + [LOST_QUERY_SECONDS] * (int(lost.group(1)) if lost else 0))
        if samples:
            for p in (50, 90, 99, 99.9):
                latency[f"p{p:g}"] = samples[min(len(samples) - 1, int(len(samples) * p / 100))] * 1e3
    return DnsperfResult(number("Queries per second"), int(number("Queries sent")),
                         int(number("Queries completed")), int(number("Queries lost")), rcodes, latency)


def dnsperf(topo: Topology, client: str, server: str, queries: Path, seconds: float,
            max_qps: int | None = None, clients: int = 8, outstanding: int = 200,
            verbose: bool = False, port: int = 53, passes: int | None = None) -> DnsperfResult:
    argv = ["dnsperf", "-s", server, "-p", str(port), "-d", str(queries), "-l", f"{seconds:g}",
            "-c", str(clients), "-T", "1", "-q", str(outstanding), "-t", f"{LOST_QUERY_SECONDS:g}",
            "-O", "suppress=timeout,unexpected"]
    if max_qps:
        argv += ["-Q", str(max_qps)]
    if verbose:
        argv.append("-v")
    if passes:
        argv += ["-n", str(passes)]
    proc = topo.run(client, argv, timeout=seconds + 20, check=False)
    return parse_dnsperf(proc.stdout + "\n" + proc.stderr, verbose)


def fixed_rate(topo: Topology, client: str, host: str, port: int, rate: float, seconds: float,
               connections: int = 64) -> dict:
    """The asyncio fixed-rate HTTP client (bench/fixedrate.py): latency percentiles in ms."""
    argv = [sys.executable, str(HERE / "fixedrate.py"), "--host", host, "--port", str(port),
            "--rate", f"{rate:.0f}", "--seconds", f"{seconds:g}", "--connections", str(connections)]
    proc = topo.run(client, argv, timeout=seconds + 30)
    return json.loads(proc.stdout)

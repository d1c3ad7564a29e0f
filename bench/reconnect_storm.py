#!/usr/bin/env python3
"""What an API server sees when it comes back: N nodes' informers reconnecting at once.

    .venv/bin/python bench/reconnect_storm.py [--nodes 50] [--outage 5 --outage 60] [--json FILE]

Each simulated node is kubeport's real API source (``ApiServerSource``: four informers,
Services, EndpointSlices, its Node, Namespaces) feeding its own ClusterState, all in this
process; the API server is the test suite's fake (bench/apiserver.py) in a child process on
127.0.0.1, with 100 Services of 2 endpoints. For each backoff policy and outage length: the
server stops (connections refused) for the outage, starts again as a restarted server does
(a new watch cache: every watch from an older resourceVersion gets 410), and a new Service
is applied at once. Measured from the moment it is back:

- requests per second the server receives in each of the first 10 seconds, and their peak;
- when the last node has the new Service (every node followed the restart).

The peer is client-go's reflector backoff (``wait.Backoff{Duration: 800ms, Factor: 2, Jitter:
1, Cap: 30s}`` in tools/cache/reflector.go, whose 410 relist also waits on it), played by the
same informers with that policy, so the two differ in the policy alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

# apiserver.py is found beside this script (sys.path[0]); importing it loads tests/support.
from apiserver import cluster_objects  # noqa: F401  (loads the test support package)
from generate import NAMESPACE
from support.apiserver import objects as k8s
from support.apiserver.tls import write_kubeconfig

from kubeport.endpoints.apiserver.source import ApiServerSource, BackoffPolicy
from kubeport.endpoints.state import ClusterState
from kubeport.endpoints.types import ServiceName

HERE = Path(__file__).resolve().parent
TOKEN = "storm-token"
NODE = "node"
WINDOW = 10  # seconds after the server is back whose request rate is reported
#: client-go's reflector backoff, as far as BackoffPolicy can say it: no young-outage cap,
#: and its 410 relist waits on the same backoff (0.8..1.6 s; here uniform in 0..1.6 s).
CLIENT_GO = BackoffPolicy(initial=0.8, cap=30.0, factor=2.0, jitter=1.0, reset_after=120.0, young=0.0,
                          young_cap=30.0, growth=0.0, relist_jitter=1.6)
POLICIES = {"kubeport": BackoffPolicy(), "client-go": CLIENT_GO}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    def __init__(self, port: int, control: int) -> None:
        self.port, self.control = port, control
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "apiserver.py"), "--listen", "127.0.0.1", "--port", str(port),
             "--control-port", str(control), "--services", "100", "--endpoints", "2", "--token", TOKEN,
             "--node", NODE], stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if not line.startswith("serving"):
            raise RuntimeError(f"the fake API server did not start: {line!r}")

    def call(self, method: str, path: str, body: object = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.control}{path}", data=data, method=method)
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


async def blocking(func, *args):
    return await asyncio.get_running_loop().run_in_executor(None, func, *args)


async def until_all(states: list[ClusterState], name: ServiceName, deadline: float) -> float | None:
    """Unix time when every state has ``name`` (polled: a benchmark's observer), or None."""
    while time.time() < deadline:
        if all(name in state.snapshot.services for state in states):
            return time.time()
        await asyncio.sleep(0.01)
    return None


async def storm(server: Server, policy: BackoffPolicy, nodes: int, outage: float, kubeconfig: Path,
                round_no: int) -> dict:
    states = [ClusterState(NODE) for _ in range(nodes)]
    sources = [ApiServerSource(state, node_name=NODE, kubeconfig=kubeconfig, backoff=policy) for state in states]
    tasks = [asyncio.create_task(source.run()) for source in sources]
    try:
        deadline = time.time() + 60
        while not all(state.synced for state in states):
            if time.time() > deadline:
                raise RuntimeError("the nodes did not sync")
            await asyncio.sleep(0.05)
        await blocking(server.call, "POST", "/bench/down")
        await asyncio.sleep(outage)  # the outage itself: nothing to wait for
        up = (await blocking(server.call, "POST", "/bench/up"))["up"]
        name = ServiceName(NAMESPACE, f"storm-{round_no}")
        await blocking(server.call, "POST", "/bench/apply",
                       [k8s.service(name.name, NAMESPACE, cluster_ip=f"10.111.0.{round_no + 1}")])
        followed = await until_all(states, name, up + 120)
        await asyncio.sleep(max(0.0, up + WINDOW - time.time()))
        log = await blocking(server.call, "GET", f"/bench/requests?since={up}")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    per_second = Counter(int(at - up) for at, _, _ in log if at - up < WINDOW)
    rates = [per_second.get(second, 0) for second in range(WINDOW)]
    return {"nodes": nodes, "informers": nodes * 4, "outage_s": outage, "requests_per_s": rates,
            "peak_per_s": max(rates), "requests_10s": sum(rates),
            "all_followed_s": None if followed is None else round(followed - up, 3)}


async def main(args: argparse.Namespace) -> list[dict]:
    server = Server(free_port(), free_port())
    results = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", f"http://127.0.0.1:{server.port}", token=TOKEN)
            round_no = 0
            for outage in args.outage:
                for policy_name, policy in POLICIES.items():
                    result = await storm(server, policy, args.nodes, outage, kubeconfig, round_no)
                    result["policy"] = policy_name
                    round_no += 1
                    results.append(result)
                    print(json.dumps(result), flush=True)
    finally:
        server.stop()
    return results


def table(results: list[dict]) -> str:
    lines = ["| outage | policy | requests/s in each of the first 10 s | peak/s | in 10 s | all nodes followed |",
             "|---|---|---|---|---|---|"]
    for r in results:
        followed = "not within 120 s" if r["all_followed_s"] is None else f"{r['all_followed_s']:.2f} s"
        lines.append(f"| {r['outage_s']:g} s | {r['policy']} | {' '.join(map(str, r['requests_per_s']))} | "
                     f"{r['peak_per_s']} | {r['requests_10s']} | {followed} |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=50, help="simulated nodes, four informers each")
    parser.add_argument("--outage", type=float, action="append", help="seconds the server is down (repeatable)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    arguments = parser.parse_args()
    arguments.outage = arguments.outage or [5.0, 60.0]
    logging.getLogger("kubeport").setLevel(logging.ERROR)  # every refused reconnect is a warning
    found = asyncio.run(main(arguments))
    if arguments.json:
        arguments.json.write_text(json.dumps(found, indent=1) + "\n")
    print(table(found))

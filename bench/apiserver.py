#!/usr/bin/env python3
"""The test suite's fake kube-apiserver (tests/support/apiserver/server.py), loaded with N services
x M endpoints shaped like a real server's JSON, for the control-plane benchmark's API source.

    apiserver.py --listen IP --port N --services N --endpoints M --token T [--node NAME]

It speaks the real list/watch protocol (paged lists, watch events, bookmarks) over plain
HTTP with a bearer token, in the namespace it is started in. One route is the benchmark's
own: ``POST /bench/apply`` with a JSON list of objects applies them (ADDED or MODIFIED
events to the open watches, as `kubectl apply` would cause); it answers with the new
resourceVersion. For the reconnect-storm benchmark: ``POST /bench/down`` stops the API
(connections refused), ``POST /bench/up`` starts it again as a restarted server (a new watch
cache: watches from older versions get 410), ``GET /bench/requests?since=T`` lists the API
requests received since Unix time T as ``[time, verb, plural]``. Prints ``serving <url>``
once listening. Runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import signal
import socket
import sys
import time
from pathlib import Path

from aiohttp import web
# generate.py is found beside this script (sys.path[0]).
from generate import NAMESPACE, SERVICE_PORT, TARGET_PORT, cluster_ip, pod_ip, service_name

TEST_SUPPORT = Path(__file__).resolve().parents[1] / "tests" / "support"


def load_test_support() -> None:
    """The fake lives in the test suite's support package: load tests/support as the package
    ``support``, the name the tests import it by, without putting tests/ on sys.path."""
    spec = importlib.util.spec_from_file_location("support", TEST_SUPPORT / "__init__.py",
                                                  submodule_search_locations=[str(TEST_SUPPORT)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["support"] = package
    spec.loader.exec_module(package)


load_test_support()
from support.apiserver import objects as k8s  # noqa: E402
from support.apiserver.server import FakeApiServer  # noqa: E402


def cluster_objects(services: int, endpoints: int) -> list[dict]:
    """The services of bench/generate.py (same names, ClusterIPs and pod IPs) as the API server
    and the EndpointSlice controller write them: uids, managedFields, ownerReferences."""
    ports = [{"name": "http", "protocol": "TCP", "port": SERVICE_PORT, "targetPort": TARGET_PORT}]
    objects = []
    for i in range(services):
        name = service_name(i)
        objects.append(k8s.service(name, NAMESPACE, cluster_ip=cluster_ip(i), ports=ports))
        if endpoints:
            objects.append(k8s.endpoint_slice(f"{name}-s1", name, NAMESPACE, port=TARGET_PORT,
                                              addresses=[pod_ip(i, j, endpoints) for j in range(endpoints)]))
    return objects


def pod_objects(count: int, on_node: int, node: str) -> list[dict]:
    """``count`` Pods as a Deployment's, with the kubelet's status (about 4 KiB of JSON each),
    the first ``on_node`` on ``node``, the others on other nodes; over 100 namespaces."""
    return [k8s.pod(f"app-{i // 10}-5d9f7c8b6d-{i:05d}", f"team-{i % 100}",
                    ip=f"10.{128 + i // 65536}.{i // 256 % 256}.{i % 256}",
                    node_name=node if i < on_node else f"node-{i % 50}") for i in range(count)]


class TimedRequests(list):
    """The fake's request log, each entry also stamped with its Unix time."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def append(self, request) -> None:
        super().append(request)
        self.times.append(time.time())


def bound_socket(listen: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((listen, port))
    return sock


async def serve(args: argparse.Namespace) -> None:
    fake = FakeApiServer(token=args.token)
    fake.requests = TimedRequests()
    for name in (NAMESPACE, "default"):
        fake.apply(k8s.namespace(name))
    fake.apply(k8s.node(args.node, internal_ip=args.listen))
    for obj in cluster_objects(args.services, args.endpoints):
        fake.apply(obj)
    for obj in pod_objects(args.pods, args.pods_on_node, args.node):
        fake.apply(obj)
    fake.compact()  # the load is not history: a watch starts from the list, as with a real server
    # Millions of long-lived objects: without this, a collection now and then holds a watch
    # event for milliseconds, a pause of this Python stand-in (a real server is Go) that
    # would count as the daemon's.
    gc.collect()
    gc.freeze()

    async def apply(request: web.Request) -> web.Response:
        version = 0
        for obj in await request.json():
            version = fake.apply(obj)
        return web.json_response({"resourceVersion": str(version)})

    async def down(request: web.Request) -> web.Response:
        await fake.go_down()
        return web.json_response({})

    async def up(request: web.Request) -> web.Response:
        await fake.come_up(sock=bound_socket(args.listen, args.port))
        return web.json_response({"up": time.time()})

    async def requests(request: web.Request) -> web.Response:
        since = float(request.query.get("since", "0"))
        log = fake.requests
        return web.json_response([[at, r.verb, r.plural] for at, r in zip(log.times, log) if at >= since])

    await fake.start(sock=bound_socket(args.listen, args.port))
    control = web.Application()
    control.router.add_post("/bench/apply", apply)
    control.router.add_post("/bench/down", down)
    control.router.add_post("/bench/up", up)
    control.router.add_get("/bench/requests", requests)
    runner = web.AppRunner(control, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, args.listen, args.control_port).start()
    print(f"serving {fake.url}", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()
    await fake.stop()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="address to serve on")
    parser.add_argument("--port", type=int, default=6443, help="the API (plain HTTP)")
    parser.add_argument("--control-port", type=int, default=6444, help="POST /bench/apply")
    parser.add_argument("--services", type=int, required=True)
    parser.add_argument("--endpoints", type=int, required=True, help="endpoints per service (one slice)")
    parser.add_argument("--token", required=True, help="the bearer token clients must send")
    parser.add_argument("--node", default="node", help="the Node object of the daemon's host")
    parser.add_argument("--pods", type=int, default=0, help="Pods over 100 namespaces")
    parser.add_argument("--pods-on-node", type=int, default=0, help="how many of them run on --node")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(serve(parse_args()))

"""The daemon's HTTP ports (status, metrics, health-check node ports) never import aiohttp: its
server, multidict, yarl and the client's SSL contexts cost ~9 MiB of RSS and ~0.15 s of every
start. aiohttp stays the API client's, imported with the API source only. Runs in a fresh
interpreter: an import is process-wide state."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import asyncio, json, socket, sys
import uvloop
import kubeport.daemon
from prometheus_client import CollectorRegistry
from kubeport.endpoints.types import ServiceName, Snapshot
from kubeport.proxy.healthcheck.proxier_health import ProxyHealth
from kubeport.proxy.healthcheck.service_health import HealthCheckServers
from kubeport.status import StatusServer


class View:
    def snapshot(self):
        return Snapshot(generation=1)

    def pending(self):
        return []

    def problems(self):
        return []

    def status(self):
        return {}

    def proxy_health(self, path):
        return ProxyHealth(require_node=False).livez(0.0)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def get(port, path):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.0\\r\\n\\r\\n".encode())
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return int(answer.split()[1])


async def main():
    healthz, metrics, dns_metrics, node_port, api = free_port(), free_port(), free_port(), free_port(), free_port()
    status = StatusServer(View(), healthz_bind=f"127.0.0.1:{healthz}", metrics_bind=f"127.0.0.1:{metrics}",
                          registry=CollectorRegistry(), dns_metrics_bind=f"127.0.0.1:{dns_metrics}",
                          dns_registry=CollectorRegistry(), status_bind=f"127.0.0.1:{api}")
    await status.start()
    checks = HealthCheckServers(lambda: True)
    await checks.sync({node_port: (ServiceName("default", "web"), 1)}, ["127.0.0.1"])
    codes = [await get(healthz, "/healthz"), await get(metrics, "/metrics"),
             await get(api, "/api/v1/services"), await get(dns_metrics, "/metrics"),
             await get(node_port, "/")]
    await checks.close()
    await status.stop()
    return codes


codes = uvloop.run(main())
print(json.dumps({"codes": codes, "loaded": sorted(name for name in sys.modules
                  if name.split(".")[0] in ("aiohttp", "multidict", "yarl", "propcache", "attrs"))}))
"""


def test_serving_every_http_port_imports_no_aiohttp() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found == {"codes": [200, 200, 200, 200, 200], "loaded": []}, result.stderr

"""Manifest text and a harness for the manifest-source tests: real files, a real registry, a
real ClusterState and real inotify.

The builders here write YAML text, not objects (support.api): the reader is under test, so
the text a file holds is the input."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import random
import textwrap
from pathlib import Path
from typing import Callable

import pytest

from kubeport.endpoints import model
from kubeport.endpoints.registry.store import AllocationStore
from kubeport.endpoints.controllers.endpointslice import slices_for
from kubeport.endpoints.manifests.lastgood import LastGoodFiles
from kubeport.endpoints.manifests.source import ManifestSource
from kubeport.endpoints.registry.registry import Registry
from kubeport.endpoints.state import ClusterState
from kubeport.endpoints.types import ServiceName, Snapshot

from .wait import DEADLINE, until

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
BROKEN = REPO / "tests" / "fixtures" / "broken"

WEB = ServiceName("default", "web")


def service(
    name: str = "web", port: int = 80, cluster_ip: str | None = None, namespace: str = "default", port_name: str = "http"
) -> str:
    ip = f"  clusterIP: {cluster_ip}\n" if cluster_ip else ""
    return (
        f"apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {namespace}\n"
        f"spec:\n{ip}  ports:\n  - name: {port_name}\n    port: {port}\n"
    )


def endpoint_slice(name: str = "web-a", service_name: str = "web", address: str = "10.244.1.11") -> str:
    return textwrap.dedent(f"""\
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSlice
        metadata:
          name: {name}
          labels: {{kubernetes.io/service-name: {service_name}}}
        addressType: IPv4
        endpoints:
        - addresses: ["{address}"]
        ports:
        - {{name: http, port: 8080}}
        """)


class CountingRegistry:
    """The real registry, counting admissions (to see that unchanged objects are skipped)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.admitted: list[tuple[str, str, str]] = []

    def admit(self, obj: model.KubeObject) -> model.KubeObject:
        self.admitted.append(model.object_key(obj))
        return self.registry.admit(obj)

    def release(self, kind: str, namespace: str, name: str) -> None:
        self.registry.release(kind, namespace, name)

    def allocated_services(self) -> set[tuple[str, str]]:
        return self.registry.allocated_services()

    def grouped_writes(self):
        return self.registry.grouped_writes()

    def take_finished_service_cidrs(self) -> list[str]:
        return self.registry.take_finished_service_cidrs()

    def service_cidrs(self):
        return self.registry.service_cidrs()


def new_registry(store: AllocationStore | None = None, seed: int = 7) -> CountingRegistry:
    networks = [ipaddress.ip_network("10.96.0.0/12")]
    return CountingRegistry(Registry(store or AllocationStore(None), networks, (30000, 32767), random.Random(seed)))


class Harness:
    def __init__(self, directory: Path, store: AllocationStore | None = None, seed: int = 7,
                 last_good: LastGoodFiles | None = None, gone_grace_ms: float = 100) -> None:
        self.dir = directory
        self.registry = new_registry(store, seed)
        self.state = ClusterState("node-a", pod_slices=slices_for)  # manifest mode's controller, as the daemon runs it
        self.source = ManifestSource(directory, self.registry, self.state, debounce_ms=20, last_good=last_good,
                                     gone_grace_ms=gone_grace_ms)

    def write(self, name: str, text: str) -> None:
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def ports(self, name: ServiceName = WEB) -> list[int]:
        return [p.port for p in self.state.snapshot.services[name].service.ports]

    async def next_snapshot(self, after: Snapshot) -> Snapshot:
        async with asyncio.timeout(DEADLINE):
            return await self.state.wait_newer(after.generation)

    def batches(self) -> int:
        """The batches the source applied (its status, as `kubeport get status` shows it)."""
        return self.source.status()["batches"]

    async def until(self, condition: Callable[[], bool], what: str = "the manifests' state awaited") -> None:
        """Wait until ``condition`` holds (or fail at the deadline)."""
        await until(condition, what)


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    directory = tmp_path / "manifests"
    directory.mkdir()
    return directory


@contextlib.asynccontextmanager
async def running(harness: Harness):
    synced = asyncio.Event()
    task = asyncio.create_task(harness.source.run(synced))
    try:
        async with asyncio.timeout(DEADLINE):
            waiter = asyncio.create_task(synced.wait())
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if task.done():
                task.result()  # the source failed to start: raise its error
        yield harness
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

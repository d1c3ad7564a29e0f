"""The manifest-directory source, with real files, a real registry, a real ClusterState and
real inotify. Waits are on conditions with deadlines, never sleeps."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import random
import shutil
import textwrap
from pathlib import Path
from typing import Callable

import pytest

from kubeport.endpoints import model
from kubeport.endpoints.allocstore import AllocationStore, ServiceAllocation
from kubeport.endpoints.manifest_reader import STREAM_ABOVE_BYTES
from kubeport.endpoints.manifests import ManifestSource
from kubeport.endpoints.registry import Registry
from kubeport.endpoints.state import ClusterState
from kubeport.endpoints.types import ServiceName, Snapshot

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
BROKEN = REPO / "tests" / "fixtures" / "broken"
DEADLINE = 10  # seconds: generous for a loaded CI machine; a passing test takes milliseconds

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


def new_registry(store: AllocationStore | None = None, seed: int = 7) -> CountingRegistry:
    networks = [ipaddress.ip_network("10.96.0.0/12")]
    return CountingRegistry(Registry(store or AllocationStore(None), networks, (30000, 32767), random.Random(seed)))


class Harness:
    def __init__(self, directory: Path, store: AllocationStore | None = None, seed: int = 7) -> None:
        self.dir = directory
        self.registry = new_registry(store, seed)
        self.state = ClusterState("node-a")
        self.source = ManifestSource(directory, self.registry, self.state, debounce_ms=20)

    def write(self, name: str, text: str) -> None:
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def ports(self, name: ServiceName = WEB) -> list[int]:
        return [p.port for p in self.state.snapshot.services[name].service.ports]

    async def next_snapshot(self, after: Snapshot) -> Snapshot:
        async with asyncio.timeout(DEADLINE):
            return await self.state.wait_newer(after.generation)

    async def until(self, condition: Callable[[], bool]) -> None:
        """Wait, batch by batch, until ``condition`` holds (or fail at the deadline)."""
        async with asyncio.timeout(DEADLINE):
            while not condition():
                await self.source.wait_batch(self.source.batches)


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


# --- the first load ------------------------------------------------------------------------


def test_examples_load_cleanly():
    harness = Harness(EXAMPLES)
    harness.source.load()
    snap = harness.state.snapshot
    assert harness.source.problems == []
    assert snap.synced and snap.generation == 1
    names = {str(name) for name in snap.services}
    assert names == {"demo/web", "demo/web-np", "demo/db", "demo/search", "demo/echo", "kube-system/kube-dns"}
    web = snap.services[ServiceName("demo", "web")]
    assert len(web.service.cluster_ips) == 1 and len(web.slices) == 2
    assert snap.services[ServiceName("kube-system", "kube-dns")].service.cluster_ips == ("10.96.0.10",)
    assert snap.services[ServiceName("demo", "web-np")].service.ports[0].node_port == 30080
    assert set(snap.nodes) == {"node-a", "node-b"} and snap.node is not None and snap.node.zone == "zone-a"
    assert harness.source.files_loaded == 8
    assert harness.source.objects_loaded == 6 + 6 + 2 + 2  # services, slices, nodes, namespaces


def test_broken_directory_loads_what_is_valid():
    harness = Harness(BROKEN)
    harness.source.load()
    assert set(harness.state.snapshot.services) == {ServiceName("default", "duplicate")}
    assert harness.ports(ServiceName("default", "duplicate")) == [80]  # duplicate-a.yaml won


def test_first_file_in_path_order_wins(manifests):
    harness = Harness(manifests)
    harness.write("b.yaml", service(port=81))
    harness.write("a/web.yaml", service(port=80))
    harness.source.load()
    assert harness.ports() == [80]
    assert harness.source.problems == ['b.yaml: Service "web": declared also in a/web.yaml, ignored']


def test_same_object_twice_in_one_file(manifests):
    harness = Harness(manifests)
    harness.write("a.yaml", service(port=80) + "---\n" + service(port=81))
    harness.source.load()
    assert harness.ports() == [80]
    assert harness.source.problems == [
        'a.yaml: Service "web": declared more than once in this file, document 2 ignored'
    ]


def test_services_admitted_before_slices_of_the_same_file(manifests):
    # The slice comes first in the file, but the Service is admitted first: the slice using
    # its ClusterIP as an endpoint address is refused (a ClusterIP is not a pod address).
    harness = Harness(manifests)
    harness.write("web.yaml", endpoint_slice(address="10.96.0.50") + "---\n" + service(cluster_ip="10.96.0.50"))
    harness.source.load()
    [problem] = harness.source.problems
    assert problem.startswith('web.yaml: EndpointSlice.discovery.k8s.io "web-a" is invalid')


def test_stale_allocations_released_after_a_clean_first_load(manifests, tmp_path):
    store = AllocationStore(tmp_path / "allocations.db")
    store.put(ServiceAllocation("default", "gone", "uid-1", "2024-01-01T00:00:00Z", ("10.96.0.77",)))
    harness = Harness(manifests, store)
    harness.write("web.yaml", service(cluster_ip="10.96.0.77"))
    harness.source.load()
    assert harness.source.problems == []
    assert harness.state.snapshot.services[WEB].service.cluster_ips == ("10.96.0.77",)


def test_stale_allocations_kept_while_a_file_is_broken(manifests, tmp_path):
    # The broken file may be the one declaring the Service: its ClusterIP must survive.
    store = AllocationStore(tmp_path / "allocations.db")
    store.put(ServiceAllocation("default", "web", "uid-1", "2024-01-01T00:00:00Z", ("10.96.0.77",)))
    harness = Harness(manifests, store)
    harness.write("web.yaml", service() + "  oops: [\n")
    harness.source.load()
    assert harness.registry.allocated_services() == {("default", "web")}


def test_allocations_stable_across_restart_on_the_same_store(tmp_path):
    directory = tmp_path / "manifests"
    shutil.copytree(EXAMPLES, directory)

    def allocations(seed: int) -> dict[str, tuple]:
        store = AllocationStore(tmp_path / "allocations.db")
        harness = Harness(directory, store, seed)  # another seed: values come from the store
        harness.source.load()
        result = {
            str(name): (state.service.uid, state.service.cluster_ips, tuple(p.node_port for p in state.service.ports))
            for name, state in harness.state.snapshot.services.items()
        }
        store.close()
        return result

    first = allocations(seed=1)
    second = allocations(seed=2)
    assert first == second
    assert all(uid for uid, _, _ in first.values())
    assert first["demo/web"][1]  # a ClusterIP was allocated, and the same one came back


# --- live reload -------------------------------------------------------------------------------


async def test_edit_publishes_a_new_snapshot(manifests):
    harness = Harness(manifests)
    harness.write("web.yaml", service(port=80))
    async with running(harness):
        first = harness.state.snapshot
        assert harness.ports() == [80]
        harness.write("web.yaml", service(port=8080))
        snap = await harness.next_snapshot(first)
        assert snap.changed == {WEB}
        assert harness.ports() == [8080]
        assert snap.services[WEB].service.cluster_ips == first.services[WEB].service.cluster_ips


async def test_broken_file_keeps_its_objects_until_fixed(manifests):
    harness = Harness(manifests)
    harness.write("web.yaml", service(port=80) + "---\n" + endpoint_slice())
    async with running(harness):
        first = harness.state.snapshot
        harness.write("web.yaml", service(port=81) + "  oops: [\n")
        await harness.until(lambda: bool(harness.source.problems))
        assert harness.source.problems[0].startswith("web.yaml: YAML syntax error at line")
        assert harness.state.snapshot is first  # nothing deleted, nothing half-applied
        harness.write("web.yaml", service(port=81) + "---\n" + endpoint_slice())
        snap = await harness.next_snapshot(first)
        assert harness.source.problems == []
        assert harness.ports() == [81] and len(snap.services[WEB].slices) == 1


async def test_invalid_object_keeps_its_previous_version(manifests):
    harness = Harness(manifests)
    harness.write("a.yaml", service("web", 80) + "---\n" + service("api", 90))
    async with running(harness):
        first = harness.state.snapshot
        harness.write("a.yaml", service("web", 81, port_name="HTTP") + "---\n" + service("api", 91))
        snap = await harness.next_snapshot(first)
        assert snap.changed == {ServiceName("default", "api")}
        assert harness.ports() == [80]
        [problem] = harness.source.problems
        assert problem.startswith('a.yaml: Service "web" is invalid: spec.ports[0].name: Invalid value: "HTTP": ')


async def test_deleted_file_and_removed_object_are_deleted(manifests):
    harness = Harness(manifests)
    harness.write("web.yaml", service("web", cluster_ip="10.96.0.50"))
    harness.write("more.yaml", service("api") + "---\n" + service("db"))
    async with running(harness):
        first = harness.state.snapshot
        (manifests / "web.yaml").unlink()
        harness.write("more.yaml", service("api"))
        await harness.until(lambda: set(harness.state.snapshot.services) == {ServiceName("default", "api")})
        assert "10.96.0.50" not in harness.registry.registry.service_cluster_ips()  # released
        assert harness.state.snapshot.generation > first.generation
        assert harness.source.files_loaded == 1


async def test_duplicate_takes_over_when_the_holder_drops_it(manifests):
    harness = Harness(manifests)
    harness.write("a.yaml", service(port=80))
    harness.write("b.yaml", service(port=81))
    async with running(harness):
        first = harness.state.snapshot
        assert harness.source.problems == ['b.yaml: Service "web": declared also in a.yaml, ignored']
        harness.write("a.yaml", service("other", port=80))
        snap = await harness.next_snapshot(first)
        assert snap.services[WEB].service.ports[0].port == 81  # in the same batch as a.yaml's change
        assert snap.services[WEB].service.cluster_ips == first.services[WEB].service.cluster_ips
        assert harness.source.problems == []


async def test_refused_object_gets_in_once_the_conflict_is_gone(manifests):
    harness = Harness(manifests)
    harness.write("a.yaml", service("first", cluster_ip="10.96.0.50"))
    harness.write("b.yaml", service("second", cluster_ip="10.96.0.50"))
    async with running(harness):
        assert "provided IP is already allocated" in harness.source.problems[0]
        (manifests / "a.yaml").unlink()
        second = ServiceName("default", "second")
        await harness.until(lambda: second in harness.state.snapshot.services)
        assert harness.state.snapshot.services[second].service.cluster_ips == ("10.96.0.50",)
        assert harness.source.problems == []


async def test_object_moved_between_files_keeps_its_allocations(manifests):
    harness = Harness(manifests)
    harness.write("a.yaml", service("web") + "---\n" + service("api"))
    async with running(harness):
        first = harness.state.snapshot
        ip = first.services[WEB].service.cluster_ips
        # one rename: a.yaml disappears and z.yaml appears in the same batch
        (manifests / "z.yaml").write_text(service("web"))
        harness.write("a.yaml", service("api"))
        await harness.until(lambda: harness.source.files_loaded == 2 and harness.source.problems == [])
        assert harness.state.snapshot.services[WEB].service.cluster_ips == ip


async def test_noop_rewrite_publishes_nothing_and_admits_nothing(manifests):
    harness = Harness(manifests)
    harness.write("web.yaml", service())
    harness.write("api.yaml", service("api"))
    async with running(harness):
        first = harness.state.snapshot
        admitted = len(harness.registry.admitted)
        batches = harness.source.batches
        os.utime(manifests / "web.yaml")  # touch
        harness.write("api.yaml", "# same objects, new bytes\n" + service("api"))
        await harness.until(lambda: harness.source.batches > batches)
        # a real change after both: its snapshot must be the very next one
        harness.write("sentinel.yaml", service("sentinel"))
        snap = await harness.next_snapshot(first)
        assert snap.generation == first.generation + 1
        assert snap.changed == {ServiceName("default", "sentinel")}
        assert harness.registry.admitted[admitted:] == [("Service", "default", "sentinel")]


async def test_editor_atomic_save_and_new_subdirectory(manifests):
    harness = Harness(manifests)
    harness.write("web.yaml", service(port=80))
    async with running(harness):
        first = harness.state.snapshot
        temporary = manifests / ".web.yaml.tmp"  # hidden: never read itself
        temporary.write_text(service(port=82))
        os.replace(temporary, manifests / "web.yaml")
        await harness.next_snapshot(first)
        assert harness.ports() == [82]
        harness.write("team/a/api.json", '{"kind": "Service", "metadata": {"name": "api"}, "spec": {"ports": [{"port": 1}]}}')
        await harness.until(lambda: ServiceName("default", "api") in harness.state.snapshot.services)


async def test_burst_of_writes_is_coalesced(manifests):
    harness = Harness(manifests)
    async with running(harness):
        first = harness.state.snapshot
        for i in range(30):
            harness.write(f"svc-{i:02}.yaml", service(f"svc-{i:02}"))
        await harness.until(lambda: len(harness.state.snapshot.services) == 30)
        assert harness.state.snapshot.generation - first.generation < 10  # not one snapshot per file


async def test_missing_directory_fails_clearly(tmp_path):
    harness = Harness(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="manifest directory .*nope does not exist"):
        async with running(harness):
            pass


async def test_configmap_volume_atomic_swap__kubelet_atomic_writer(manifests):
    # A mounted ConfigMap: visible files are symlinks through `..data`, which kubelet
    # swaps to a new hidden directory in one rename. The hidden twins are never read.
    harness = Harness(manifests)
    (manifests / "..2024_01").mkdir()
    (manifests / "..2024_01" / "web.yaml").write_text(service(port=80))
    (manifests / "..data").symlink_to("..2024_01")
    (manifests / "web.yaml").symlink_to("..data/web.yaml")
    async with running(harness):
        first = harness.state.snapshot
        assert harness.ports() == [80] and harness.source.problems == []
        (manifests / "..2024_02").mkdir()
        (manifests / "..2024_02" / "web.yaml").write_text(service(port=81))
        (manifests / "..data_tmp").symlink_to("..2024_02")
        os.replace(manifests / "..data_tmp", manifests / "..data")
        await harness.next_snapshot(first)
        assert harness.ports() == [81] and harness.source.files_loaded == 1


async def test_each_problem_is_logged_once(manifests, caplog):
    harness = Harness(manifests)
    harness.write("web.yaml", service() + "  oops: [\n")
    async with running(harness):
        harness.write("api.yaml", service("api"))
        await harness.until(lambda: ServiceName("default", "api") in harness.state.snapshot.services)
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1 and warnings[0].startswith("web.yaml: YAML syntax error")


def test_other_kinds_are_logged_at_debug(manifests, caplog):
    caplog.set_level("DEBUG", logger="kubeport.endpoints.manifests")
    harness = Harness(manifests)
    harness.write("app.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n---\n" + service())
    harness.source.load()
    assert harness.source.problems == []
    assert "app.yaml: skipped (kind not read): apps/v1 Deployment web" in caplog.messages


async def test_large_file_broken_mid_way_keeps_all_its_objects(manifests):
    # Large files stream in chunks; their syntax is checked first, so a broken one
    # changes nothing rather than half of it.
    harness = Harness(manifests)
    padding = ("# " + "x" * 98 + "\n") * (STREAM_ABOVE_BYTES // 100)  # large, yet few objects to admit
    services = padding + "".join("---\n" + service(f"s{i:04}") for i in range(600))
    assert len(services) > STREAM_ABOVE_BYTES
    harness.write("big.yaml", services)
    async with running(harness):
        first = harness.state.snapshot
        assert len(first.services) == 600
        harness.write("big.yaml", services.replace("port: 80", "port: 81") + "---\nkind: [\n")
        await harness.until(lambda: bool(harness.source.problems))
        assert harness.state.snapshot is first
        harness.write("big.yaml", services.replace("port: 80", "port: 81"))
        await harness.next_snapshot(first)
        assert harness.ports(ServiceName("default", "s0599")) == [81] and harness.source.problems == []


async def test_directory_moved_away_keeps_the_objects(manifests, tmp_path):
    harness = Harness(manifests)
    harness.write("web.yaml", service())
    async with running(harness):
        first = harness.state.snapshot
        batches = harness.source.batches
        manifests.rename(tmp_path / "elsewhere")
        await harness.until(lambda: harness.source.batches > batches)
        assert harness.state.snapshot is first

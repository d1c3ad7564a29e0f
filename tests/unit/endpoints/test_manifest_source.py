"""The manifest-directory source, its first load. Waits are on conditions with deadlines, never sleeps."""

from __future__ import annotations

import shutil

from kubeport.endpoints.registry.store import AllocationStore, ServiceAllocation
from kubeport.endpoints.types import ServiceName

from support.manifests import (  # noqa: F401  (a fixture)
    BROKEN,
    EXAMPLES,
    WEB,
    Harness,
    endpoint_slice,
    manifests,
    service,
)


def test_examples_load_cleanly():
    harness = Harness(EXAMPLES)
    harness.source.load()
    snap = harness.state.snapshot
    assert harness.source.problems == []
    assert snap.synced and snap.generation == 1
    names = {str(name) for name in snap.services}
    assert names == {"demo/web", "demo/web-np", "demo/web-local", "demo/db", "demo/search", "demo/echo",
                     "kube-system/kube-dns"}
    web = snap.services[ServiceName("demo", "web")]
    assert len(web.service.cluster_ips) == 1
    # Made from pods.yaml: one family (one service range here), the four pods, the named port resolved.
    (made,) = web.slices
    assert [e.pod_name for e in made.endpoints] == ["a1", "a2", "b1", "b2"] and made.ports[0].port == 8080
    db = snap.services[ServiceName("demo", "db")]
    assert sorted((e.pod_name, e.hostname) for s in db.slices for e in s.endpoints if s.address_type == "IPv4") == [
        ("a2", "db-0"), ("b2", "db-1")]
    assert snap.services[ServiceName("kube-system", "kube-dns")].service.cluster_ips == ("10.96.0.10",)
    assert snap.services[ServiceName("demo", "web-np")].service.ports[0].node_port == 30080
    assert snap.services[ServiceName("demo", "web-local")].service.external_policy_local
    assert set(snap.nodes) == {"node-a", "node-b"} and snap.node is not None and snap.node.zone == "zone-a"
    assert harness.source.files_loaded == 10
    assert harness.source.objects_loaded == 7 + 1 + 4 + 2 + 2  # services, slices, pods, nodes, namespaces


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

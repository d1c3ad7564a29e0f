"""The manifest-directory source, reloading live as files change. Waits are on conditions with deadlines, never sleeps."""

from __future__ import annotations

import os

import pytest

from kubeport.endpoints.manifests.read import STREAM_ABOVE_BYTES
from kubeport.endpoints.types import ServiceName

from support.manifests import WEB, Harness, endpoint_slice, manifests, running, service  # noqa: F401  (a fixture)


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
        batches = harness.batches()
        os.utime(manifests / "web.yaml")  # touch
        harness.write("api.yaml", "# same objects, new bytes\n" + service("api"))
        await harness.until(lambda: harness.batches() > batches)
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
    caplog.set_level("DEBUG", logger="kubeport.endpoints.manifests.source")
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
        batches = harness.batches()
        manifests.rename(tmp_path / "elsewhere")
        await harness.until(lambda: harness.batches() > batches)
        assert harness.state.snapshot is first

"""ServiceCIDR manifests: a range added to the directory serves the next Services and the
snapshot's service ranges; a range whose file is removed stays while a Service holds one of
its addresses (pkg/controller/servicecidrs' finalizer), then leaves."""

from __future__ import annotations

import ipaddress
import random
import textwrap

from kubeport.endpoints.manifests.source import ManifestSource
from kubeport.endpoints.registry.registry import Registry
from kubeport.endpoints.registry.store import AllocationStore
from kubeport.endpoints.state import ClusterState
from kubeport.endpoints.types import ServiceName

from support.manifests import CountingRegistry, Harness, manifests, running, service  # noqa: F401  (a fixture)

SMALL = "10.96.0.0/29"
EXTRA = "10.97.0.0/29"

SERVICE_CIDR = textwrap.dedent(f"""\
    apiVersion: networking.k8s.io/v1
    kind: ServiceCIDR
    metadata:
      name: extra
    spec:
      cidrs:
      - {EXTRA}
    """)


def small_harness(directory) -> Harness:
    harness = Harness(directory)
    harness.registry = CountingRegistry(Registry(AllocationStore(None), [ipaddress.ip_network(SMALL)], (30000, 32767),
                                                 random.Random(7)))
    harness.state = ClusterState("node-a", service_cidrs=[SMALL])
    harness.source = ManifestSource(directory, harness.registry, harness.state, debounce_ms=20)
    return harness


def cluster_ip(harness: Harness, name: str) -> str | None:
    state = harness.state.snapshot.services.get(ServiceName("default", name))
    return state.service.cluster_ips[0] if state is not None and state.service.cluster_ips else None


async def test_a_service_cidr_file_adds_a_range__removed_it_stays_until_its_service_goes(manifests):
    harness = small_harness(manifests)
    for i in range(6):
        harness.write(f"s{i}.yaml", service(f"s{i}"))
    harness.write("z-late.yaml", service("z-late"))  # read last: the one refused
    async with running(harness):
        assert cluster_ip(harness, "z-late") is None  # the range is full
        assert any("range is full" in p for p in harness.source.problems)
        harness.write("cidr.yaml", SERVICE_CIDR)
        # The refused Service is tried again once a range is added.
        await harness.until(lambda: cluster_ip(harness, "z-late") is not None, "late allocated from the new range")
        assert ipaddress.ip_address(cluster_ip(harness, "z-late")) in ipaddress.ip_network(EXTRA)
        assert harness.state.snapshot.service_cidrs == (SMALL, EXTRA)

        (manifests / "cidr.yaml").unlink()
        await harness.until(lambda: harness.registry.service_cidrs().get("extra") is not None
                            and harness.registry.service_cidrs()["extra"].terminating, "the deletion started")
        assert harness.state.snapshot.service_cidrs == (SMALL, EXTRA)  # "late" still holds 10.97.0.x
        assert ipaddress.ip_address(cluster_ip(harness, "z-late")) in ipaddress.ip_network(EXTRA)

        (manifests / "z-late.yaml").unlink()
        await harness.until(lambda: harness.state.snapshot.service_cidrs == (SMALL,), "the range gone with late")
        assert harness.registry.service_cidrs() == {}


async def test_an_invalid_service_cidr_is_one_problem_line_naming_file_object_and_field(manifests):
    harness = small_harness(manifests)
    harness.write("cidr.yaml", SERVICE_CIDR.replace(EXTRA, "10.97.0.1/29"))
    async with running(harness):
        assert ('cidr.yaml: ServiceCIDR "extra" is invalid: spec.cidrs[0]: Invalid value: "10.97.0.1/29": '
                'must be in canonical form ("10.97.0.0/29")') in harness.source.problems
        assert harness.state.snapshot.service_cidrs == (SMALL,)

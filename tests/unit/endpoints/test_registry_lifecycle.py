"""The embedded API server over time: conflicts, changes, release, persistence.

Behaviour follows pkg/registry/core/service/storage/alloc.go (initIPFamilyFields,
allocClusterIPs, initNodePorts, allocHealthCheckNodePort) and the band allocators
(portallocator/allocator.go and ipallocator/bitmap.go calculateRangeOffset; KEP-3668, KEP-3070).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from kubeport.endpoints import model
from kubeport.endpoints.registry.store import AllocationStore, ServiceAllocation, StoreError

from support.registry import T0, V4, V6, make_registry, node_port_service, refused, service, snapshot  # noqa: F401


# --- conflicts: the earlier holder keeps the value, nothing changes ------------------------------------


def test_conflicting_explicit_cluster_ip_refused_earlier_keeps_it() -> None:
    registry = make_registry()
    registry.admit(service("web", clusterIP="10.96.0.20"))
    before = snapshot(registry)
    assert refused(registry, service("api", clusterIP="10.96.0.20")) == [
        'Service "api" is invalid: spec.clusterIPs: Invalid value: []string{"10.96.0.20"}: '
        "failed to allocate IP 10.96.0.20: provided IP is already allocated"
    ]
    assert snapshot(registry) == before
    assert registry.allocation("default", "web").cluster_ips == ("10.96.0.20",)


def test_conflicting_explicit_node_port_refused_and_refused_service_keeps_its_own() -> None:
    registry = make_registry()
    registry.admit(node_port_service("web", 30080))
    api = registry.admit(node_port_service("api"))
    before = snapshot(registry)
    assert refused(registry, node_port_service("api", 30080)) == [
        'Service "api" is invalid: spec.ports[0].nodePort: Invalid value: 30080: provided port is already allocated'
    ]
    assert snapshot(registry) == before
    assert registry.admit(node_port_service("api")).to_api() == api.to_api()


def test_refusal_rolls_back_everything_taken_for_that_service() -> None:
    registry = make_registry()
    registry.admit(node_port_service("web", 30081))
    before = snapshot(registry)
    refused(registry, node_port_service("api", 30080, 30081))  # 30080 free, 30081 taken
    assert snapshot(registry) == before
    registry.admit(node_port_service("other", 30080))  # 30080 was given back


def test_node_port_range_full_rolls_back_the_cluster_ip() -> None:
    registry = make_registry(node_ports=(30000, 30001))
    registry.admit(node_port_service("a", 0, 0))
    before = snapshot(registry)
    assert refused(registry, node_port_service("b")) == [
        'Service "b" is invalid: spec.ports[0].nodePort: Internal error: failed to allocate a nodePort: range is full'
    ]
    assert snapshot(registry) == before


@pytest.mark.parametrize(
    "svc, expected",
    [
        (node_port_service("web", 40000),
         "spec.ports[0].nodePort: Invalid value: 40000: provided port is not in the valid range. "
         "The range of valid ports is 30000-32767"),
        (service(clusterIP="10.0.0.1"),
         'spec.clusterIPs: Invalid value: []string{"10.0.0.1"}: failed to allocate IP 10.0.0.1: '
         "the provided IP (10.0.0.1) is not in the valid range. The range of valid IPs is 10.96.0.0/12"),
    ],
    ids=["node_port_outside_range", "cluster_ip_outside_range"],
)
def test_explicit_values_outside_the_ranges(svc: model.Service, expected: str) -> None:
    assert refused(make_registry(), svc) == [f'Service "web" is invalid: {expected}']


def test_validation_errors_are_raised_api_style() -> None:
    svc = service(ports=[{"name": "http", "port": 80}, {"port": 443}])
    assert refused(make_registry(), svc) == ['Service "web" is invalid: spec.ports[1].name: Required value']


# --- changes release what is no longer needed --------------------------------------------------------


def test_type_change_to_cluster_ip_releases_node_ports() -> None:
    registry = make_registry()
    node_port = registry.admit(node_port_service("web")).spec.ports[0].node_port
    registry.admit(service("web"))
    assert registry.usage()["nodePorts"] == 0
    registry.admit(node_port_service("api", node_port))


def test_removed_port_releases_its_node_port_and_others_keep_theirs() -> None:
    registry = make_registry()
    first = registry.admit(node_port_service("web", 0, 0))
    kept, dropped = (p.node_port for p in first.spec.ports)
    after = registry.admit(service("web", type="NodePort", ports=[{"name": "p0", "port": 80}]))
    assert after.spec.ports[0].node_port == kept
    api = registry.admit(node_port_service("api", dropped))  # the dropped port was released
    assert api.spec.ports[0].node_port == dropped


def test_explicit_node_port_change_releases_the_old_value() -> None:
    registry = make_registry()
    registry.admit(node_port_service("web", 30080))
    registry.admit(node_port_service("web", 30090))
    api = registry.admit(node_port_service("api", 30080))  # free again: no "provided port is already allocated"
    assert api.spec.ports[0].node_port == 30080


def test_explicit_cluster_ip_change_releases_the_old_ip() -> None:
    registry = make_registry()
    registry.admit(service("web", clusterIP="10.96.0.20"))
    registry.admit(service("web", clusterIP="10.96.0.21"))
    assert registry.service_cluster_ips() == {"10.96.0.21"}
    registry.admit(service("api", clusterIP="10.96.0.20"))


def test_external_traffic_policy_change_releases_the_health_check_node_port() -> None:
    registry = make_registry()
    hc = registry.admit(service(type="LoadBalancer", externalTrafficPolicy="Local")).spec.health_check_node_port
    registry.admit(service(type="LoadBalancer", externalTrafficPolicy="Cluster"))
    assert registry.usage()["nodePorts"] == 1
    registry.admit(node_port_service("api", hc))


def test_renamed_port_keeps_its_node_port() -> None:
    registry = make_registry()
    before = registry.admit(service(type="NodePort", ports=[{"name": "http", "port": 80}])).spec.ports[0].node_port
    after = registry.admit(service(type="NodePort", ports=[{"name": "web", "port": 80}])).spec.ports[0].node_port
    assert before == after


# --- release -----------------------------------------------------------------------------------


def test_release_frees_everything_and_is_idempotent() -> None:
    registry = make_registry()
    out = registry.admit(service(type="LoadBalancer", externalTrafficPolicy="Local", clusterIP="10.96.0.20"))
    registry.release("Service", "default", "web")
    registry.release("Service", "default", "web")
    assert snapshot(registry) == snapshot(make_registry())
    taken = [out.spec.ports[0].node_port, out.spec.health_check_node_port]
    registry.admit(node_port_service("api", *taken, clusterIP="10.96.0.20"))


def test_release_of_other_kinds_is_a_noop() -> None:
    registry = make_registry()
    registry.admit(service())
    before = snapshot(registry)
    registry.release("EndpointSlice", "default", "web")
    registry.release("Service", "default", "absent")
    assert snapshot(registry) == before


# --- persistence -------------------------------------------------------------------------------------


def lb_local() -> model.Service:
    return service(type="LoadBalancer", externalTrafficPolicy="Local", ports=[
        {"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53}, {"name": "http", "port": 80}])


def test_allocations_stable_across_a_restart_on_the_same_store(tmp_path: Path) -> None:
    with AllocationStore.in_state_dir(tmp_path) as store:
        first = make_registry(store, seed=1).admit(lb_local())
    with AllocationStore.in_state_dir(tmp_path) as store:
        registry = make_registry(store, seed=2)
        again = registry.admit(lb_local())
        assert again.to_api() == first.to_api()
        # The restarted registry holds the values: nobody else can take them.
        assert refused(registry, node_port_service("api", first.spec.health_check_node_port))
        assert refused(registry, service("api", clusterIP=first.spec.cluster_ip))


def test_release_is_persisted(tmp_path: Path) -> None:
    with AllocationStore.in_state_dir(tmp_path) as store:
        registry = make_registry(store)
        registry.admit(service("web"))
        registry.admit(service("api"))
        registry.release("Service", "default", "web")
    with AllocationStore.in_state_dir(tmp_path) as store:
        assert make_registry(store).allocated_services() == {("default", "api")}


def test_stored_values_outside_new_ranges_are_dropped_at_start() -> None:
    store = AllocationStore(None)
    store.put(ServiceAllocation("default", "web", "uid-1", "2024-05-01T12:00:00Z", ("10.0.0.5",), (), 40000))
    registry = make_registry(store)
    assert registry.allocation("default", "web") == ServiceAllocation("default", "web", "uid-1", "2024-05-01T12:00:00Z")
    out = registry.admit(service("web"))
    assert out.metadata.uid == "uid-1" and ipaddress.ip_address(out.spec.cluster_ip) in ipaddress.ip_network(V4)


class FailingStore(AllocationStore):
    """A store whose writes fail (a full disk), to check that nothing changes."""

    def put(self, allocation: ServiceAllocation) -> None:
        raise StoreError("allocation store (test): cannot write: disk I/O error")


def test_store_write_failure_leaves_the_registry_unchanged() -> None:
    registry = make_registry(FailingStore(None))
    with pytest.raises(StoreError):
        registry.admit(node_port_service("web", 30080))
    assert snapshot(registry) == snapshot(make_registry())

"""Manifest mode's MultiCIDR allocator: ServiceCIDR objects add ranges to the flag's
(pkg/registry/core/service/ipallocator/cidrallocator.go MetaAllocator, KEP-1880), a deleted
one keeps its addresses until its Services are gone (pkg/controller/servicecidrs' finalizer),
and ServiceCIDRs are validated as pkg/apis/networking/validation ValidateServiceCIDR does.
"""

from __future__ import annotations

import ipaddress

import pytest

from kubeport.endpoints.registry.allocators import RangeFull, ServiceCIDRAllocator
from kubeport.endpoints.registry.store import AllocationStore

from support import api
from support.registry import make_registry, refused, service

SMALL = "10.96.0.0/29"  # 6 usable, .10 is outside: all six are dynamic
EXTRA = "10.97.0.0/29"


def service_cidr(name: str, *cidrs: str):
    return api.to_model(api.service_cidr(name, *cidrs))


def ip_of(registry, name: str) -> ipaddress.IPv4Address:
    return ipaddress.ip_address(registry.allocation("default", name).cluster_ips[0])


def fill(registry, count: int, prefix: str = "s") -> None:
    for i in range(count):
        registry.admit(service(f"{prefix}{i}"))


# --- allocation across ranges ------------------------------------------------------------


def test_first_range_full__the_next_service_comes_from_the_service_cidr() -> None:
    registry = make_registry(cidrs=(SMALL,))
    fill(registry, 6)
    assert refused(registry, service("late")) == [
        'Service "late" is invalid: spec.clusterIPs: Internal error: failed to allocate a serviceIP: range is full']
    registry.admit(service_cidr("extra", EXTRA))
    registry.admit(service("late"))
    assert ip_of(registry, "late") in ipaddress.ip_network(EXTRA)
    assert registry.usage()["IPv4"] == 7


def test_the_default_range_is_tried_first__then_service_cidrs_by_name() -> None:
    registry = make_registry(cidrs=(SMALL,))
    registry.admit(service_cidr("b-second", "10.98.0.0/29"))
    registry.admit(service_cidr("a-first", EXTRA))
    fill(registry, 6)
    assert all(ip_of(registry, f"s{i}") in ipaddress.ip_network(SMALL) for i in range(6))
    fill(registry, 6, "t")
    assert all(ip_of(registry, f"t{i}") in ipaddress.ip_network(EXTRA) for i in range(6))
    registry.admit(service("u"))
    assert ip_of(registry, "u") in ipaddress.ip_network("10.98.0.0/29")


def test_an_explicit_cluster_ip_in_a_service_cidr_is_accepted() -> None:
    registry = make_registry(cidrs=(SMALL,))
    assert refused(registry, service("pinned", clusterIP="10.97.0.3"))[0].endswith(
        "The range of valid IPs is 10.96.0.0/29")
    registry.admit(service_cidr("extra", EXTRA))
    assert registry.admit(service("pinned", clusterIP="10.97.0.3")).spec.cluster_ip == "10.97.0.3"


@pytest.mark.parametrize(("ranges", "allocations"), [
    pytest.param(("10.96.0.0/29", "10.96.0.0/28"), 14, id="contained__every_address_once"),
    pytest.param(("10.96.0.0/28", "10.96.0.0/29"), 14, id="containing_first__every_address_once"),
    pytest.param(("10.96.0.0/29", "10.96.0.8/29"), 12, id="apart__broadcast_and_network_of_each_excluded"),
])
def test_overlapping_ranges_never_hand_out_an_address_twice(ranges, allocations) -> None:
    """Overlapping ServiceCIDRs are valid (KEP-1880); an address belongs to no Service twice."""
    allocator = ServiceCIDRAllocator("IPv4")
    for i, cidr in enumerate(ranges):
        allocator.add(cidr, f"c{i}")
    taken = [allocator.allocate_next() for _ in range(allocations)]
    assert len(set(taken)) == allocations == allocator.used
    with pytest.raises(RangeFull):
        allocator.allocate_next()


# --- deletion: the finalizer -------------------------------------------------------------


def test_deleted_service_cidr__services_keep_their_ips__no_new_one__gone_with_the_last() -> None:
    registry = make_registry(cidrs=(SMALL,))
    fill(registry, 6)
    registry.admit(service_cidr("extra", EXTRA))
    registry.admit(service("kept"))
    kept_ip = str(ip_of(registry, "kept"))
    registry.release("ServiceCIDR", "", "extra")
    assert registry.take_finished_service_cidrs() == []  # "kept" still holds an address of it
    assert registry.service_cidrs()["extra"].terminating
    assert refused(registry, service("new")) == [
        'Service "new" is invalid: spec.clusterIPs: Internal error: failed to allocate a serviceIP: range is full']
    assert refused(registry, service("pinned", clusterIP="10.97.0.5"))[0].endswith(
        "The range of valid IPs is 10.96.0.0/29")
    assert registry.admit(service("kept")).spec.cluster_ip == kept_ip  # re-admitted: keeps it
    registry.release("Service", "default", "kept")
    assert registry.take_finished_service_cidrs() == ["extra"]
    assert "extra" not in registry.service_cidrs()


def test_a_deleted_service_cidr_without_services_goes_at_once() -> None:
    registry = make_registry(cidrs=(SMALL,))
    registry.admit(service_cidr("extra", EXTRA))
    registry.release("ServiceCIDR", "", "extra")
    assert registry.take_finished_service_cidrs() == ["extra"]


def test_an_address_another_ready_range_covers_does_not_hold_a_deletion() -> None:
    """canDeleteCIDR: an address also in another ServiceCIDR is not orphaned by the deletion."""
    registry = make_registry(cidrs=(SMALL,))
    registry.admit(service_cidr("wide", "10.97.0.0/24"))
    registry.admit(service_cidr("narrow", EXTRA))
    registry.admit(service("pinned", clusterIP="10.97.0.3"))
    registry.release("ServiceCIDR", "", "narrow")
    assert registry.take_finished_service_cidrs() == ["narrow"]
    assert registry.allocation("default", "pinned").cluster_ips == ("10.97.0.3",)


def test_a_restart_knows_the_ranges_and_the_deletions_in_progress(tmp_path) -> None:
    path = tmp_path / "allocations.db"
    with AllocationStore(path) as store:
        registry = make_registry(store, cidrs=(SMALL,))
        fill(registry, 6)
        registry.admit(service_cidr("extra", EXTRA))
        registry.admit(service_cidr("more", "10.98.0.0/29"))
        registry.admit(service("a"))
        registry.admit(service("b", clusterIP="10.98.0.2"))
        registry.release("ServiceCIDR", "", "more")
        a_ip = registry.allocation("default", "a").cluster_ips
    with AllocationStore(path) as store:
        again = make_registry(store, cidrs=(SMALL,))
        assert again.allocation("default", "a").cluster_ips == a_ip  # not dropped as out of range
        assert again.allocation("default", "b").cluster_ips == ("10.98.0.2",)
        assert {name: r.terminating for name, r in again.service_cidrs().items()} == {"extra": False, "more": True}
        again.release("Service", "default", "b")
        assert again.take_finished_service_cidrs() == ["more"]


# --- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(("cidrs", "expected"), [
    pytest.param(("10.97.0.0/33",), 'spec.cidrs[0]: Invalid value: "10.97.0.0/33": must be a valid CIDR value, '
                                    "(e.g. 10.9.8.0/24 or 2001:db8::/64)", id="bad_cidr"),
    pytest.param(("10.97.0.1/24",), 'spec.cidrs[0]: Invalid value: "10.97.0.1/24": must be in canonical form '
                                    '("10.97.0.0/24")', id="host_bits__not_canonical"),
    pytest.param(("10.97.0.0/24", "10.98.0.0/24"),
                 'spec.cidrs: Invalid value: []string{"10.97.0.0/24", "10.98.0.0/24"}: may specify no more than one '
                 "IP for each IP family, i.e 192.168.0.0/24 and 2001:db8::/64", id="two_of_one_family"),
    pytest.param(("10.97.0.0/24", "fd00::/64", "10.98.0.0/24"),
                 'spec.cidrs: Invalid value: []string{"10.97.0.0/24", "fd00::/64", "10.98.0.0/24"}: may only hold '
                 "up to 2 values", id="three"),
    pytest.param((), "spec.cidrs: Required value: at least one CIDR required", id="none"),
])
def test_invalid_service_cidr_is_refused_and_changes_nothing(cidrs, expected) -> None:
    registry = make_registry(cidrs=(SMALL,))
    assert refused(registry, service_cidr("extra", *cidrs)) == [f'ServiceCIDR "extra" is invalid: {expected}']
    assert registry.service_cidrs() == {}


@pytest.mark.parametrize("cidrs", [
    pytest.param((SMALL,), id="the_default_itself"),
    pytest.param(("10.96.0.0/28",), id="containing_the_default"),
    pytest.param(("10.96.0.0/30",), id="inside_the_default"),
])
def test_overlapping_ranges_are_valid__as_the_api_server_accepts_them(cidrs) -> None:
    """ValidateServiceCIDR checks no overlap: KEP-1880 grows a range by adding a wider one."""
    registry = make_registry(cidrs=(SMALL,))
    registry.admit(service_cidr("extra", *cidrs))
    assert set(registry.service_cidrs()) == {"extra"}


def test_spec_cidrs_are_immutable__the_last_good_version_is_kept() -> None:
    registry = make_registry(cidrs=(SMALL,))
    registry.admit(service_cidr("extra", EXTRA))
    assert refused(registry, service_cidr("extra", "10.99.0.0/29")) == [
        'ServiceCIDR "extra" is invalid: spec.cidrs: Invalid value: []string{"10.99.0.0/29"}: field is immutable']
    assert registry.service_cidrs()["extra"].cidrs == (EXTRA,)
    assert refused(registry, service_cidr("kubernetes", EXTRA)) == [
        'ServiceCIDR "kubernetes" is invalid: spec.cidrs: Invalid value: []string{"10.97.0.0/29"}: field is immutable']
    registry.admit(service_cidr("kubernetes", SMALL))  # the default one as the API server made it: fine

"""The record index at scale: what it shares with the snapshot, what it keeps per address,
and which changes count as DNS changes.

Memory is the constraint (the target: daemon RSS <= 150 MiB at 10,000 services / 100,000
endpoints, proxy and DNS together), so records share the snapshot's objects and the
reverse maps hold a ServiceName, not a container, per address.
"""

from __future__ import annotations

import dataclasses
import tracemalloc

import pytest

from kubeport.dns.config import DnsConfig
from kubeport.dns.answer import Answerer
from kubeport.dns.names import reverse_name_labels
from kubeport.dns.records import RecordIndex, same_dns, service_records
from kubeport.endpoints.types import (
    EndpointInfo,
    EndpointPortInfo,
    PortSpec,
    ServiceInfo,
    ServiceName,
    ServiceState,
    SliceInfo,
)

from support import slim
from support.api import endpoint_slice, service, snapshot_of
from support.zonetext import question, read_reply

WEB = ServiceName("default", "web")
HTTP = (PortSpec("http", "TCP", 80, 8080),)
SLICE_HTTP = (EndpointPortInfo("http", "TCP", 8080),)


def state(*endpoints: EndpointInfo, headless: bool = False, publish: bool = False,
          address_type: str = "IPv4", ports: tuple[PortSpec, ...] = HTTP,
          slice_ports: tuple[EndpointPortInfo, ...] | None = SLICE_HTTP) -> ServiceState:
    info = slim.service("web", () if headless else ("10.96.0.20",), ports, headless=headless,
                        publish_not_ready_addresses=publish)
    return ServiceState(info, (SliceInfo("web-1", address_type, slice_ports, endpoints),))


def test_all_published_records_share_the_snapshots_objects() -> None:
    held = state(EndpointInfo("10.244.0.1"), EndpointInfo("10.244.0.2"))
    records = service_records(held)
    assert records.slices is held.slices
    assert records.ports is held.service.ports
    index = RecordIndex.build(slim.snapshot([held]))
    assert index.endpoint_owners["10.244.0.1"] is records.name  # no container per address
    assert index.cluster_ip_owners["10.96.0.20"] is records.name


def test_not_ready_endpoints_are_cut_and_kept_as_pod_addresses() -> None:
    """Out of the records (CoreDNS object/endpoint.go), still pods to `pods verified` (findPods)."""
    ready, not_ready = EndpointInfo("10.244.0.1"), EndpointInfo("10.244.0.2", ready=False)
    records = service_records(state(ready, not_ready))
    assert records.slices[0].endpoints == (ready,)
    assert records.unready_addresses == ("10.244.0.2",)
    index = RecordIndex.build(slim.snapshot([state(ready, not_ready)]))
    assert index.knows_pod("default", "10.244.0.2") and index.knows_pod("default", "10.244.0.1")
    assert not index.knows_pod("other", "10.244.0.2")
    assert index.ptr_targets("10.244.0.2") == []


def test_publish_not_ready_addresses_is_read_from_ready_only() -> None:
    """Only `ready` counts (CoreDNS object/endpoint.go); the controller folds publishNotReadyAddresses in
    (staging/src/k8s.io/endpointslice/utils.go podToEndpoint)."""
    held = state(EndpointInfo("10.244.0.1"), EndpointInfo("10.244.0.2", ready=False), publish=True)
    assert [e.address for e in service_records(held).slices[0].endpoints] == ["10.244.0.1"]


@pytest.mark.parametrize("address_type, addresses, published", [
    pytest.param("IPv4", ["10.244.0.1", "not-an-ip"], ["10.244.0.1"], id="unvalidated_non_ip_is_skipped"),
    pytest.param("IPv4", ["10.244.0.1", "fd00::1"], ["10.244.0.1", "fd00::1"], id="other_family_is_still_an_ip"),
    pytest.param("IPv6", ["fd00::1", "fe80::1%eth0"], ["fd00::1"], id="zoned_ipv6_is_not_an_ip"),
    pytest.param("FQDN", ["example.com"], [], id="fqdn_slices_are_ignored"),
])
def test_only_ip_addresses_are_published(address_type: str, addresses: list[str], published: list[str]) -> None:
    """Addresses are validated at ingest; a ClusterState fed directly must still not put a
    non-IP into an address record."""
    records = service_records(state(*(EndpointInfo(a) for a in addresses), address_type=address_type))
    assert [e.address for s in records.slices for e in s.endpoints] == published


def _changed(before: ServiceState, after: ServiceState, pod_names: bool = False) -> bool:
    return not same_dns(service_records(before), service_records(after), pod_names)


BASE = EndpointInfo("10.244.0.1", hostname=None, pod_name="web-abc", zone="a")


@pytest.mark.parametrize("after, pod_names, changed", [
    pytest.param(dataclasses.replace(BASE, zone="b"), False, False, id="zone_is_no_dns_change"),
    pytest.param(dataclasses.replace(BASE, serving=False), False, False, id="serving_is_no_dns_change"),
    pytest.param(dataclasses.replace(BASE, node_hints=frozenset({"n"})), False, False, id="hints_are_no_dns_change"),
    pytest.param(dataclasses.replace(BASE, pod_name="web-xyz"), False, False, id="pod_name_unused_without_option"),
    pytest.param(dataclasses.replace(BASE, pod_name="web-xyz"), True, True, id="pod_name_names_it_with_option"),
    pytest.param(dataclasses.replace(BASE, hostname="web-0"), False, True, id="hostname_names_it"),
    pytest.param(dataclasses.replace(BASE, address="10.244.0.9"), False, True, id="address"),
    pytest.param(dataclasses.replace(BASE, ready=False), False, True, id="ready"),
])
def test_which_endpoint_changes_are_dns_changes(after: EndpointInfo, pod_names: bool, changed: bool) -> None:
    """CoreDNS endpointsEquivalent: only what answers read makes the SOA serial move."""
    assert _changed(state(BASE), state(after), pod_names) is changed


@pytest.mark.parametrize("after, changed", [
    pytest.param(state(BASE, ports=(PortSpec("http", "TCP", 80, 8080, node_port=30080),)), False,
                 id="node_port_is_no_dns_change"),
    pytest.param(state(BASE, ports=(PortSpec("http", "TCP", 80, "web"),)), False, id="target_port_is_no_dns_change"),
    pytest.param(state(BASE, ports=(PortSpec("web", "TCP", 80, 8080),)), True, id="port_name"),
    pytest.param(state(BASE, slice_ports=(EndpointPortInfo("http", "TCP", 9090),)), True, id="slice_port_number"),
    pytest.param(state(BASE, slice_ports=None), True, id="slice_ports_dropped"),
    pytest.param(state(BASE, headless=True), True, id="became_headless"),
])
def test_which_port_changes_are_dns_changes(after: ServiceState, changed: bool) -> None:
    assert _changed(state(BASE), after) is changed


def test_shared_addresses_keep_every_owner_and_collapse_back() -> None:
    """An IP in two services (two selectors picking one pod): both answer for it (CoreDNS
    plugin/kubernetes/reverse.go serviceRecordForIP), and removing one leaves the plain
    single-owner form."""
    objects = [service("a", clusterIP="None"), endpoint_slice("a", endpoints=["10.244.0.7"]),
               service("b", clusterIP="None"), endpoint_slice("b", endpoints=["10.244.0.7"])]
    index = RecordIndex.build(snapshot_of(objects))
    a, b = ServiceName("default", "a"), ServiceName("default", "b")
    assert index.endpoint_services("10.244.0.7") == (a, b)
    assert index.ptr_targets("10.244.0.7") == [("10-244-0-7", "a", "default", "svc"),
                                                ("10-244-0-7", "b", "default", "svc")]
    after = snapshot_of(objects[:2])
    index.apply(after, None, now=1)
    assert index.endpoint_owners["10.244.0.7"] == a
    index.apply(snapshot_of([]), None, now=2)
    assert index.endpoint_owners == {} and index.cluster_ip_owners == {} and index.unready_owners == {}


def test_an_address_twice_in_one_service_is_indexed_once() -> None:
    objects = [service("a", clusterIP="None"),
               endpoint_slice("a", name="a-1", endpoints=[{"addresses": ["10.244.0.7"], "hostname": "x"}]),
               endpoint_slice("a", name="a-2", endpoints=[{"addresses": ["10.244.0.7"], "hostname": "y"}])]
    index = RecordIndex.build(snapshot_of(objects))
    assert index.endpoint_owners["10.244.0.7"] == ServiceName("default", "a")
    answerer = Answerer(DnsConfig(upstreams=()), index)
    reverse = ".".join(reverse_name_labels("10.244.0.7")) + "."
    assert read_reply(answerer.answer(question(reverse, "PTR"))).answer == (
        f"{reverse} 5 IN PTR x.a.default.svc.cluster.local.", f"{reverse} 5 IN PTR y.a.default.svc.cluster.local.")
    index.apply(snapshot_of([]), None, now=1)
    assert index.endpoint_owners == {}


def test_index_memory_per_endpoint_stays_small() -> None:
    """1,000 services x 10 endpoints. Records sharing the snapshot leave the reverse map's
    dict entries as the cost per endpoint (about 40 bytes); copies per endpoint (records,
    names, sets: ~790 bytes before) would show at once."""
    states = []
    for i in range(1000):
        name = ServiceName("bench", f"svc-{i}")
        info = ServiceInfo(name, "", "ClusterIP", (f"10.100.{i // 250}.{i % 250 + 1}",), False, None, HTTP)
        endpoints = tuple(EndpointInfo(f"10.{200 + i // 6000}.{i // 25 % 240}.{i % 25 * 10 + j}")
                          for j in range(10))
        states.append(ServiceState(info, (SliceInfo(f"svc-{i}-1", "IPv4", SLICE_HTTP, endpoints),)))
    held = slim.snapshot(states)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index = RecordIndex.build(held)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(index.endpoint_owners) == 10_000
    print(f"\nindex: {used / 10_000:.0f} bytes per endpoint")
    assert used / 10_000 < 120, f"{used / 10_000:.0f} bytes per endpoint"

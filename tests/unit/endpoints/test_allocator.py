"""Band allocators: offsets and scan order exactly as the API server's.

Sources: pkg/registry/core/service/portallocator (calculateRangeOffset, Test_calculateRangeOffset),
pkg/registry/core/service/ipallocator (calculateRangeOffset), allocator/bitmap.go
(randomScanStrategyWithOffset), KEP-3668 and KEP-3070.
"""

from __future__ import annotations

import ipaddress
import random

import pytest

from kubeport.endpoints.registry.allocators import (
    AlreadyAllocated,
    IPAllocator,
    NotInRange,
    PortAllocator,
    RangeFull,
    ip_band_offset,
    port_band_offset,
)


def rng(seed: int = 7) -> random.Random:
    return random.Random(seed)


# --- NodePorts (KEP-3668) ---------------------------------------------------------------

PORT_BANDS = [
    # (lo, hi, offset, static band, dynamic band): portallocator calculateRangeOffset, KEP-3668
    (30000, 32767, 86, (30000, 30085), (30086, 32767)),
    (20000, 32767, 128, (20000, 20127), (20128, 32767)),
    (32567, 32767, 16, (32567, 32582), (32583, 32767)),
    (30000, 30015, 0, None, (30000, 30015)),
    (30000, 30016, 16, (30000, 30015), (30016, 30016)),
    (30000, 30127, 16, (30000, 30015), (30016, 30127)),
    (30000, 32047, 64, (30000, 30063), (30064, 32047)),
    (30000, 34095, 128, (30000, 30127), (30128, 34095)),
]


@pytest.mark.parametrize(
    "lo, hi, offset, static, dynamic",
    PORT_BANDS,
    ids=[f"node_port_band__{lo}-{hi}__kep3668" for lo, hi, *_ in PORT_BANDS],
)
def test_node_port_band_offsets(lo: int, hi: int, offset: int, static, dynamic) -> None:
    assert port_band_offset(hi - lo + 1) == offset
    ports = PortAllocator(lo, hi, rng())
    assert ports.band_offset == offset
    assert ports.static_band == static
    assert ports.dynamic_band == dynamic


def test_1000_dynamic_node_ports_land_in_the_dynamic_band__kep3668() -> None:
    ports = PortAllocator(30000, 32767, rng())
    allocated = [ports.allocate_next() for _ in range(1000)]
    assert len(set(allocated)) == 1000
    assert min(allocated) >= 30086 and max(allocated) <= 32767


def test_lower_band_used_only_after_the_upper_band_is_full__kep3668() -> None:
    ports = PortAllocator(30000, 30127, rng())  # static 30000-30015, dynamic 30016-30127
    upper = {ports.allocate_next() for _ in range(112)}
    assert upper == set(range(30016, 30128))
    lower = {ports.allocate_next() for _ in range(16)}
    assert lower == set(range(30000, 30016))
    with pytest.raises(RangeFull, match="^range is full$"):
        ports.allocate_next()


def test_released_upper_port_is_preferred_over_the_lower_band__kep3668() -> None:
    ports = PortAllocator(30000, 30016, rng())  # dynamic band: 30016 only
    assert ports.allocate_next() == 30016
    assert 30000 <= ports.allocate_next() <= 30015
    ports.release(30016)
    assert ports.allocate_next() == 30016


def test_range_of_16_has_no_static_band_and_fills_completely() -> None:
    ports = PortAllocator(30000, 30015, rng())
    assert {ports.allocate_next() for _ in range(16)} == set(range(30000, 30016))
    with pytest.raises(RangeFull):
        ports.allocate_next()


@pytest.mark.parametrize("port", [30000, 30085, 30086, 32767], ids=["static_first", "static_last", "dynamic_first", "dynamic_last"])
def test_explicit_node_port_anywhere_in_range_is_honoured__kep3668(port: int) -> None:
    ports = PortAllocator(30000, 32767, rng())
    ports.allocate(port)
    assert ports.has(port)


def test_explicit_node_port_conflict_refused_and_holder_keeps_it() -> None:
    ports = PortAllocator(30000, 32767, rng())
    ports.allocate(30080)
    with pytest.raises(AlreadyAllocated, match="^provided port is already allocated$"):
        ports.allocate(30080)
    assert ports.has(30080) and ports.used == 1


@pytest.mark.parametrize("port", [29999, 32768, 80, -1], ids=["below", "above", "well_known", "negative"])
def test_explicit_node_port_out_of_range(port: int) -> None:
    ports = PortAllocator(30000, 32767, rng())
    with pytest.raises(NotInRange) as exc:
        ports.allocate(port)
    assert str(exc.value) == "provided port is not in the valid range. The range of valid ports is 30000-32767"


def test_release_frees_a_port_and_is_a_noop_otherwise() -> None:
    ports = PortAllocator(30000, 32767, rng())
    ports.allocate(30500)
    ports.release(30500)
    ports.release(30500)
    ports.release(40000)
    assert not ports.has(30500) and ports.used == 0
    ports.allocate(30500)


def test_dynamic_node_port_never_takes_an_explicitly_held_one() -> None:
    ports = PortAllocator(30000, 30016, rng())
    ports.allocate(30016)
    assert 30000 <= ports.allocate_next() <= 30015


def test_same_seed_same_choices() -> None:
    first = PortAllocator(30000, 32767, rng(3))
    second = PortAllocator(30000, 32767, rng(3))
    assert [first.allocate_next() for _ in range(20)] == [second.allocate_next() for _ in range(20)]


# --- ClusterIPs (KEP-3070) ------------------------------------------------------------------

IP_BANDS = [
    # (cidr, offset, static band, first dynamic): ipallocator calculateRangeOffset, KEP-3070
    ("10.96.0.0/12", 256, ("10.96.0.1", "10.96.1.0"), "10.96.1.1"),
    ("192.168.0.0/16", 256, ("192.168.0.1", "192.168.1.0"), "192.168.1.1"),
    ("192.168.0.0/22", 64, ("192.168.0.1", "192.168.0.64"), "192.168.0.65"),
    ("192.168.0.0/26", 16, ("192.168.0.1", "192.168.0.16"), "192.168.0.17"),
    ("10.0.0.0/24", 16, ("10.0.0.1", "10.0.0.16"), "10.0.0.17"),
    ("192.168.0.0/28", 0, None, "192.168.0.1"),
    ("fd00:10:96::/112", 256, ("fd00:10:96::1", "fd00:10:96::100"), "fd00:10:96::101"),
]


@pytest.mark.parametrize(
    "cidr, offset, static, first_dynamic",
    IP_BANDS,
    ids=[f"cluster_ip_band__{c.replace('/', '_')}__kep3070" for c, *_ in IP_BANDS],
)
def test_cluster_ip_band_offsets(cidr: str, offset: int, static, first_dynamic: str) -> None:
    assert ip_band_offset(ipaddress.ip_network(cidr).num_addresses) == offset
    ips = IPAllocator(cidr, rng())
    assert ips.band_offset == offset
    assert ips.static_band == static
    assert ips.first_dynamic == first_dynamic


def test_dynamic_ips_fill_the_upper_band_then_the_lower__kep3070() -> None:
    ips = IPAllocator("10.0.0.0/24", rng())  # static .1-.16, dynamic .17-.254
    upper = {ips.allocate_next() for _ in range(238)}
    assert upper == {f"10.0.0.{i}" for i in range(17, 255)}
    lower = {ips.allocate_next() for _ in range(16)}
    assert lower == {f"10.0.0.{i}" for i in range(1, 17)}
    with pytest.raises(RangeFull, match="^range is full$"):
        ips.allocate_next()


def test_dynamic_ips_in_a_12_land_in_the_dynamic_band__kep3070() -> None:
    ips = IPAllocator("10.96.0.0/12", rng())
    first_dynamic = ipaddress.ip_address("10.96.1.1")
    assert all(ipaddress.ip_address(ips.allocate_next()) >= first_dynamic for _ in range(1000))


def test_ipv4_never_hands_out_network_or_broadcast() -> None:
    ips = IPAllocator("192.168.0.0/28", rng())
    assert {ips.allocate_next() for _ in range(14)} == {f"192.168.0.{i}" for i in range(1, 15)}
    with pytest.raises(RangeFull):
        ips.allocate_next()
    for address in ("192.168.0.0", "192.168.0.15"):
        with pytest.raises(NotInRange):
            ips.allocate(address)


def test_ipv6_112_dynamic_band() -> None:
    ips = IPAllocator("fd00:10:96::/112", rng())
    first_dynamic = ipaddress.ip_address("fd00:10:96::101")
    assert all(ipaddress.ip_address(ips.allocate_next()) >= first_dynamic for _ in range(100))


def test_ipv6_range_is_capped_at_65536_entries() -> None:
    ips = IPAllocator("fd00:10:96::/64", rng())
    ips.allocate("fd00:10:96::ffff")
    with pytest.raises(NotInRange):
        ips.allocate("fd00:10:96::1:0")


def test_reserved_ip_never_dynamic_but_explicitly_allocatable() -> None:
    ips = IPAllocator("10.96.0.0/28", rng(), reserved=["10.96.0.10"])
    handed_out = {ips.allocate_next() for _ in range(13)}
    assert "10.96.0.10" not in handed_out
    with pytest.raises(RangeFull):
        ips.allocate_next()
    ips.allocate("10.96.0.10")
    assert ips.has("10.96.0.10")


def test_released_reserved_ip_stays_out_of_dynamic_allocation() -> None:
    ips = IPAllocator("10.96.0.0/28", rng(), reserved=["10.96.0.10"])
    ips.allocate("10.96.0.10")
    ips.release("10.96.0.10")
    assert "10.96.0.10" not in {ips.allocate_next() for _ in range(13)}


def test_explicit_ip_conflict_refused() -> None:
    ips = IPAllocator("10.96.0.0/12", rng())
    ips.allocate("10.96.0.20")
    with pytest.raises(AlreadyAllocated, match="^provided IP is already allocated$"):
        ips.allocate("10.96.0.20")


@pytest.mark.parametrize("address", ["10.112.0.1", "fd00::1", "not-an-ip"], ids=["outside", "other_family", "garbage"])
def test_explicit_ip_out_of_range(address: str) -> None:
    ips = IPAllocator("10.96.0.0/12", rng())
    with pytest.raises(NotInRange) as exc:
        ips.allocate(address)
    assert str(exc.value) == f"the provided IP ({address}) is not in the valid range. The range of valid IPs is 10.96.0.0/12"


def test_ip_release_is_idempotent() -> None:
    ips = IPAllocator("10.96.0.0/12", rng())
    ips.allocate("10.96.0.20")
    ips.release("10.96.0.20")
    ips.release("10.96.0.20")
    ips.release("192.0.2.1")
    assert not ips.has("10.96.0.20") and ips.used == 0

"""Connect-time balancing's pure decision (which frontends, which endpoints) and the shell's
bookkeeping against a stand-in for the maps (the maps themselves: test_connectlb.py)."""

from __future__ import annotations

import dataclasses

import pytest

from kubeport.endpoints.types import ServiceName, ServicePortName
from kubeport.proxy.balancer import EndpointState
from kubeport.proxy.connectlb import balancing as balancing_module
from kubeport.proxy.connectlb import pins
from kubeport.proxy.connectlb.balancing import ConnectBalancing, Entry, connect_entry
from kubeport.proxy.table import Action, Frontend, FrontendKind, FrontendRule, RuleChange

PORT = ServicePortName(ServiceName("demo", "web"), "http", "TCP")
A, B, C = EndpointState("10.244.1.11", 8080), EndpointState("10.244.2.11", 8080), EndpointState("10.244.1.12", 8080)


def rule(kind=FrontendKind.CLUSTER_IP, action=Action.FORWARD, endpoints=(A, B), local=None, **extra) -> FrontendRule:
    return FrontendRule(PORT, kind, action, endpoints if action is Action.FORWARD else (), local, **extra)


TCP = Frontend("10.96.0.10", 80, "TCP")


@pytest.mark.parametrize(("frontend", "given", "expected"), [
    pytest.param(TCP, rule(), Entry((A, B)), id="ClusterIP: every endpoint the relay would use"),
    pytest.param(Frontend("10.96.0.10", 53, "UDP"), rule(), Entry((A, B)), id="UDP too"),
    pytest.param(Frontend("fd00:96::10", 80, "TCP"), rule(), Entry((A, B)), id="IPv6 too"),
    pytest.param(TCP, rule(affinity_timeout=10800), Entry((A, B), 10800), id="ClientIP affinity carried"),
    pytest.param(TCP, rule(action=Action.REFUSE), Entry(()), id="no endpoint at all: refused at connect"),
    pytest.param(TCP, rule(action=Action.DROP), None,
                 id="internalTrafficPolicy Local without a local endpoint: kube-proxy's DROP, left to the node"),
    pytest.param(Frontend("192.0.2.10", 80, "TCP"), rule(FrontendKind.EXTERNAL_IP, endpoints=(C,), local=(A, B, C)),
                 Entry((A, B, C)), id="eTP Local externalIP: pods use the short-circuit (cluster) set"),
    pytest.param(Frontend("192.0.2.20", 80, "TCP"),
                 rule(FrontendKind.LOAD_BALANCER, action=Action.DROP, local=(A, B)),
                 Entry((A, B)), id="eTP Local LB IP without a local endpoint: pods still short-circuit"),
    pytest.param(Frontend("192.168.50.1", 30080, "TCP"), rule(FrontendKind.NODE_PORT), None,
                 id="NodePort: stays on the relay"),
    pytest.param(Frontend("192.0.2.20", 80, "TCP"), rule(FrontendKind.LOAD_BALANCER, source_ranges=("203.0.113.0/24",)),
                 None, id="loadBalancerSourceRanges: the relay filters by client address"),
    pytest.param(TCP, rule(proxy_protocol=True), None, id="PROXY protocol: the relay writes the header"),
    pytest.param(Frontend("10.96.0.10", 80, "SCTP"), rule(), None, id="SCTP: not translated"),
    pytest.param(TCP, None, None, id="gone"),
])
def test_connect_entry(frontend, given, expected):
    assert connect_entry(frontend, given) == expected


class FakeMaps:
    """What ConnectMaps keeps, as dicts: (address, port, protocol) -> (backends, affinity)."""

    def __init__(self, held=None) -> None:
        self.entries = dict(held or {})
        self.writes = 0
        self.counts: dict = {}

    def set_service(self, address, port, protocol, backends, affinity_timeout=0):
        self.writes += 1
        self.entries[(address, port, protocol)] = (list(backends), affinity_timeout)

    def remove_service(self, address, port, protocol):
        self.writes += 1
        del self.entries[(address, port, protocol)]

    def service_ports(self):
        return set(self.entries)

    def connects(self):
        return self.counts

    def close(self):
        pass


def started(maps: FakeMaps) -> ConnectBalancing:
    balancing = ConnectBalancing("node-a", "/kubepods.slice")
    balancing._maps = maps  # what start() makes; here without a kernel
    return balancing


async def test_the_first_apply_writes_the_whole_table():
    maps = FakeMaps()
    balancing = started(maps)
    await balancing.apply([], {TCP: rule(), Frontend("192.168.50.1", 30080, "TCP"): rule(FrontendKind.NODE_PORT)})
    assert maps.entries == {("10.96.0.10", 80, 6): ([("10.244.1.11", 8080), ("10.244.2.11", 8080)], 0)}
    assert balancing.frontends == {TCP}


async def test_later_applies_write_only_what_changed_and_nothing_for_an_equal_entry():
    maps = FakeMaps()
    balancing = started(maps)
    await balancing.apply([], {TCP: rule()})
    writes = maps.writes
    same = rule()
    await balancing.apply([RuleChange(TCP, rule(), same)], {TCP: same})
    assert maps.writes == writes  # e.g. a DROP rule's change that leaves the pods' endpoints alone
    await balancing.apply([RuleChange(TCP, same, rule(endpoints=(A,)))], {})
    assert maps.entries[("10.96.0.10", 80, 6)][0] == [("10.244.1.11", 8080)]
    await balancing.apply([RuleChange(TCP, rule(endpoints=(A,)), rule(action=Action.DROP))], {})
    assert maps.entries == {} and balancing.frontends == frozenset()


async def test_connects_are_summed_per_service_port():
    maps = FakeMaps()
    balancing = started(maps)
    other = Frontend("fd00:96::10", 80, "TCP")
    await balancing.apply([], {TCP: rule(), other: rule()})
    maps.counts = {("10.96.0.10", 80, 6): 3, ("fd00:96::10", 80, 6): 4, ("10.96.0.77", 80, 6): 9}
    assert balancing.connects() == {PORT: 7}


async def test_a_renamed_service_port_is_counted_under_its_new_name():
    maps = FakeMaps()
    balancing = started(maps)
    await balancing.apply([], {TCP: rule()})
    renamed = dataclasses.replace(rule(), port_name=ServicePortName(ServiceName("demo", "web"), "web", "TCP"))
    await balancing.apply([RuleChange(TCP, rule(), renamed)], {TCP: renamed})
    maps.counts = {("10.96.0.10", 80, 6): 3}
    assert balancing.connects() == {renamed.port_name: 3}


def test_not_started_is_inactive_and_applies_nothing():
    balancing = ConnectBalancing("node-a")
    assert not balancing.active and balancing.problem is None and balancing.connects() == {}


def test_a_failed_start_is_a_problem_not_an_exception(monkeypatch, tmp_path):
    def refused():
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(pins, "cgroup2_root", refused)
    balancing = ConnectBalancing("node-a", bpf_root=tmp_path)
    balancing.start()
    assert balancing.problem == "[Errno 1] Operation not permitted" and not balancing.active


def test_a_missing_cgroup_is_named(monkeypatch, tmp_path):
    monkeypatch.setattr(pins, "cgroup2_root", lambda: tmp_path)
    balancing = ConnectBalancing("node-a", "kubepods.slice", bpf_root=tmp_path)
    balancing.start()
    assert balancing.problem == f"cgroup /kubepods.slice does not exist (looked in {tmp_path}/kubepods.slice)"


def _left_by_a_predecessor(root):
    left = pins.Pins(root, "node-a")
    left.directory.mkdir(parents=True)
    for name in ("link_connect4", "map_services4"):
        (left.directory / name).touch()
    return left


def test_a_failed_start_unpins_what_a_predecessor_left(monkeypatch, tmp_path):
    """Its links keep their programs attached, translating with maps no one updates: the
    pods would go on reaching the endpoints of the day it died, not the relay the problem names."""
    bpffs = tmp_path / "bpf"
    left = _left_by_a_predecessor(bpffs)
    monkeypatch.setattr(pins, "cgroup2_root", lambda: tmp_path)
    monkeypatch.setattr(balancing_module, "_bpffs_mounts", lambda: [bpffs])
    balancing = ConnectBalancing("node-a", "kubepods.slice", bpf_root=bpffs)
    balancing.start()
    assert balancing.problem.startswith("cgroup /kubepods.slice does not exist") and not balancing.active
    assert not left.directory.exists()


def test_a_failed_start_leaves_a_directory_that_is_no_bpffs_alone(monkeypatch, tmp_path):
    left = _left_by_a_predecessor(tmp_path / "bpf")
    monkeypatch.setattr(pins, "cgroup2_root", lambda: tmp_path)
    monkeypatch.setattr(balancing_module, "_bpffs_mounts", lambda: [])
    balancing = ConnectBalancing("node-a", "kubepods.slice", bpf_root=tmp_path / "bpf")
    balancing.start()
    assert balancing.problem and left.present()


HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 23 0:45 / /sys/fs/bpf rw,relatime shared:9 - bpf bpf rw,mode=700
51 23 0:46 / /run/my\\040bpf rw,relatime - bpf none rw
"""


@pytest.mark.parametrize(("fstype", "found"), [
    ("cgroup2", ["/sys/fs/cgroup/unified"]),
    ("bpf", ["/sys/fs/bpf", "/run/my bpf"]),
    ("xfs", []),
])
def test_mounts_of(fstype, found):
    assert [str(p) for p in pins.mounts_of(HYBRID, fstype)] == found


@pytest.mark.parametrize(("path", "expected"), [("/", ""), ("/kubepods.slice", "kubepods.slice"),
                                                 ("/a/b/", "a/b")])
def test_cgroup_path(tmp_path, path, expected):
    assert pins.cgroup_path(tmp_path, path) == (tmp_path / expected if expected else tmp_path)


@pytest.mark.parametrize("node", ["", "a/b", "..", "."])
def test_pins_refuse_a_node_name_that_is_not_a_directory_name(tmp_path, node):
    with pytest.raises(ValueError):
        pins.Pins(tmp_path, node)


def test_pin_paths(tmp_path):
    where = pins.Pins(tmp_path, "node-a")
    assert where.map_path("services4") == tmp_path / "kubeport/node-a/map_services4"
    assert where.link_path("connect4") == tmp_path / "kubeport/node-a/link_connect4"
    assert where.names("map") == [] and not where.present()
    (tmp_path / "kubeport/node-a").mkdir(parents=True)
    (tmp_path / "kubeport/node-a/map_b").touch()
    (tmp_path / "kubeport/node-a/map_a").touch()
    (tmp_path / "kubeport/node-a/link_connect6").touch()
    assert where.names("map") == ["a", "b"] and where.names("link") == ["connect6"]
    assert where.remove() and not (tmp_path / "kubeport/node-a").exists() and not where.remove()


def test_entries_compare_by_their_endpoints_states():
    assert Entry((A, B)) == Entry((A, B)) and Entry((A, B)) != Entry((A, EndpointState("10.244.2.11", 8080)))
    assert dataclasses.replace(Entry((A,)), affinity_timeout=5) != Entry((A,))


def test_remove_left_over__only_in_a_mounted_bpffs(monkeypatch, tmp_path):
    from kubeport.proxy.connectlb import balancing as module

    left = tmp_path / "kubeport" / "node-a"
    left.mkdir(parents=True)
    (left / "link_connect4").touch()
    monkeypatch.setattr(module, "_bpffs_mounts", lambda: [])
    assert not module.remove_left_over(tmp_path, "node-a") and left.exists()  # not a bpffs: not ours
    monkeypatch.setattr(module, "_bpffs_mounts", lambda: [tmp_path])
    assert module.remove_left_over(tmp_path, "node-a") and not left.exists()
    assert not module.remove_left_over(tmp_path, "node-a")

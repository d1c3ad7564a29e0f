"""Balancing: P2C on active connections, passive outlier ejection, affinity, seeded determinism."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from kubeport.endpoints.types import PortEndpoint, ServiceName, ServicePortName
from kubeport.proxy.affinity import AffinityTable
from kubeport.proxy.balancer import Balancer, EndpointState, Route, ServicePortPool

from support.slim import endpoint


def states(*loads: int) -> list[EndpointState]:
    out = []
    for i, load in enumerate(loads):
        state = EndpointState(f"10.244.0.{i + 1}", 80, f"10.244.0.{i + 1}:80")
        state.active = load
        out.append(state)
    return out


def keys(candidates) -> frozenset[str]:
    return frozenset(c.key for c in candidates)


def picks(balancer: Balancer, candidates, n: int, now: float = 0.0, client: str = "10.0.0.1") -> Counter:
    return Counter(balancer.pick(candidates, keys(candidates), client, now).key for _ in range(n))


@pytest.mark.parametrize(
    ("loads", "never"),
    [
        pytest.param((5, 0), {"10.244.0.1:80"}, id="two_endpoints__always_the_less_loaded"),
        pytest.param((0, 0, 9), {"10.244.0.3:80"}, id="p2c__the_most_loaded_never_wins"),
        pytest.param((3, 1, 2, 7), {"10.244.0.4:80"}, id="p2c__four_endpoints"),
    ],
)
def test_p2c_avoids_the_most_loaded(loads, never):
    chosen = picks(Balancer(random.Random(1)), states(*loads), 2000)
    assert not set(chosen) & never
    assert set(chosen) == {s.key for s in states(*loads)} - never


def test_equal_load__every_endpoint_is_used_evenly():
    chosen = picks(Balancer(random.Random(7)), states(0, 0, 0, 0), 4000)
    assert set(chosen) == {f"10.244.0.{i}:80" for i in range(1, 5)}
    assert min(chosen.values()) > 800


def test_seeded__same_sequence():
    candidates = states(0, 0, 0, 0, 0)
    a, b = Balancer(random.Random(42)), Balancer(random.Random(42))
    seq_a = [a.pick(candidates, keys(candidates), "c", 0).key for _ in range(50)]
    seq_b = [b.pick(candidates, keys(candidates), "c", 0).key for _ in range(50)]
    assert seq_a == seq_b
    assert len(set(seq_a)) > 1


def test_ejection_after_consecutive_failures__and_return_after_the_ejection_time():
    balancer = Balancer(random.Random(1), eject_after=2, eject_base=5.0, eject_max=30.0)
    bad, good = states(0, 0)
    assert balancer.connect_failed(bad, now=100.0) is False
    assert balancer.connect_failed(bad, now=100.0) is True
    assert bad.ejected_until == 105.0
    assert set(picks(balancer, [bad, good], 200, now=101.0)) == {good.key}
    assert bad.key in picks(balancer, [bad, good], 200, now=105.0)
    assert (balancer.stats.connect_failures, balancer.stats.ejections) == (2, 1)


def test_ejection_time_doubles_up_to_the_cap__success_resets():
    balancer = Balancer(random.Random(1), eject_after=1, eject_base=5.0, eject_max=12.0)
    (bad,) = states(0)
    durations = []
    for now in (0.0, 100.0, 200.0):
        balancer.connect_failed(bad, now)
        durations.append(bad.ejected_until - now)
    assert durations == [5.0, 10.0, 12.0]
    Balancer.connect_succeeded(bad)
    balancer.connect_failed(bad, 300.0)
    assert bad.ejected_until - 300.0 == 5.0


def test_all_candidates_ejected__still_pick_one__never_eject_everything():
    balancer = Balancer(random.Random(1), eject_after=1)
    candidates = states(0, 0, 0)
    for state in candidates:
        balancer.connect_failed(state, 0.0)
    assert balancer.pick(candidates, keys(candidates), "c", 1.0) in candidates


def test_retry_excludes_tried_endpoints__none_when_all_tried():
    balancer = Balancer(random.Random(3))
    candidates = states(0, 0, 0)
    tried = [candidates[0], candidates[2]]
    assert {balancer.pick(candidates, keys(candidates), "c", 0, tried).key for _ in range(50)} == {"10.244.0.2:80"}
    assert balancer.pick(candidates, keys(candidates), "c", 0, candidates) is None
    assert balancer.pick([], frozenset(), "c", 0) is None


def test_client_ip_affinity__sticks_until_the_endpoint_leaves():
    """pkg/proxy/iptables/proxier.go writeServiceToEndpointRules: load does not break affinity."""
    balancer = Balancer(random.Random(5), affinity=AffinityTable(10800))
    candidates = states(0, 0, 0, 0)
    first = balancer.pick(candidates, keys(candidates), "10.0.0.1", 0.0)
    first.active = 100  # load does not break affinity
    assert {balancer.pick(candidates, keys(candidates), "10.0.0.1", t).key for t in range(1, 50)} == {first.key}
    rest = [c for c in candidates if c is not first]
    balancer.affinity.forget([first.key])  # what ServicePortPool.sync does for a removed endpoint
    moved = balancer.pick(rest, keys(rest), "10.0.0.1", 60.0)
    assert moved is not first
    assert balancer.pick(candidates, keys(candidates), "10.0.0.1", 61.0) is moved


# One port's endpoints: "remote" on another node, "a" and "b" on this one. The cluster chain
# offers every endpoint; the Local chain of an eTP=Local NodePort (or iTP=Local) this node's only.
FRONTENDS = {"cluster": ("remote", "a", "b"), "local": ("a", "b")}


class _Port:
    def __init__(self) -> None:
        remote, a, b = states(0, 0, 0)
        self.endpoints = {"remote": remote, "a": a, "b": b}
        self.balancer = Balancer(random.Random(7), affinity=AffinityTable(10800))

    def pick(self, frontend: str, now: float, busy: tuple[str, ...] = ()) -> str:
        """The pick for a new connection; ``busy`` endpoints lose any fresh pick (P2C on load)."""
        for name, state in self.endpoints.items():
            state.active = 100 if name in busy else 0
        candidates = [self.endpoints[name] for name in FRONTENDS[frontend]]
        chosen = self.balancer.pick(candidates, keys(candidates), "10.0.0.1", now)
        return next(name for name, state in self.endpoints.items() if state is chosen)

    def pins(self) -> list[str]:
        by_key = {state.key: name for name, state in self.endpoints.items()}
        return [by_key[key] for key in self.balancer.affinity.pins("10.0.0.1")]


@pytest.mark.parametrize(
    ("steps", "pins"),
    [
        # (now, frontend, endpoints busy for a fresh pick, expected endpoint)
        pytest.param(
            [(0.0, "cluster", ("a", "b"), "remote"), (1.0, "local", ("b",), "a"),
             (2.0, "cluster", ("remote",), "remote")],
            ["remote", "a"],
            id="cluster_pin_skipped_by_local_frontend__kept_for_the_clusterip",
        ),
        pytest.param(
            [(0.0, "cluster", ("a", "b"), "remote"), (1.0, "local", ("b",), "a"), (2.0, "local", ("a",), "a")],
            ["remote", "a"],
            id="local_frontend_sticks_to_its_own_pick",
        ),
        pytest.param(
            [(0.0, "local", ("b",), "a"), (1.0, "cluster", ("a",), "a")],
            ["a"],
            id="local_pin_honoured_by_the_cluster_chain",
        ),
    ],
)
def test_affinity_per_endpoint_across_frontends_of_one_port(steps, pins):
    """One `recent` list per endpoint chain, shared by the port's frontends, checked only for the
    endpoints of the chain in use (pkg/proxy/iptables/proxier.go writeServiceToEndpointRules)."""
    port = _Port()
    for now, frontend, busy, expected in steps:
        assert port.pick(frontend, now, busy) == expected
    assert port.pins() == pins


def test_affinity_pin_on_an_ejected_endpoint_moves_in_place():
    port = _Port()
    assert port.pick("cluster", 0.0, busy=("a", "b")) == "remote"
    assert port.pick("local", 1.0, busy=("b",)) == "a"
    port.endpoints["remote"].ejected_until = 100.0
    assert port.pick("cluster", 2.0, busy=("a",)) == "b"
    assert port.pins() == ["b", "a"]


def test_affinity_expires_after_the_timeout():
    """`recent --rcheck --seconds N`: pkg/proxy/iptables/proxier.go writeServiceToEndpointRules."""
    balancer = Balancer(random.Random(5), affinity=AffinityTable(10))
    candidates = states(0, 0, 0, 0, 0, 0)
    first = balancer.pick(candidates, keys(candidates), "10.0.0.1", 0.0)
    first.active = 1000
    later = {balancer.pick(candidates, keys(candidates), "10.0.0.1", 100.0 + i * 20).key for i in range(20)}
    assert later - {first.key}


def _pe(address: str, port: int = 80) -> PortEndpoint:
    return PortEndpoint(endpoint(address), port)


def test_pool_sync__keeps_state_of_surviving_endpoints_and_returns_the_removed():
    name = ServicePortName(ServiceName("default", "web"), "", "TCP")
    pool = ServicePortPool(name, Balancer(random.Random(1), affinity=AffinityTable(100)))
    assert pool.sync([_pe("10.244.0.1"), _pe("10.244.0.2")]) == []
    kept = pool.endpoint("10.244.0.1:80")
    kept.active = 3
    pool.balancer.affinity.record("10.0.0.9", "10.244.0.2:80", 0.0)
    removed = pool.sync([_pe("10.244.0.1"), _pe("10.244.0.3")])
    assert [s.key for s in removed] == ["10.244.0.2:80"] and removed[0].removed
    assert pool.endpoint("10.244.0.1:80") is kept and kept.active == 3
    assert pool.balancer.affinity.lookup("10.0.0.9", {"10.244.0.2:80"}, 1.0) is None
    route = Route(pool, pool.states([_pe("10.244.0.3")]), pool.states([_pe("10.244.0.1"), _pe("10.244.0.3")]))
    assert route.keys == {"10.244.0.3:80"}
    assert route.all_keys() == {"10.244.0.1:80", "10.244.0.3:80"}

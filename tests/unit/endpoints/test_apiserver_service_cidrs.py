"""ServiceCIDRs read from an API server (KEP-1880): listed and watched like every kind, the
snapshot's service ranges following them live.

What the fake server imitates, and where the real behaviour comes from:
- the default ServiceCIDR ``kubernetes`` made of ``--service-cluster-ip-range``
  (pkg/controlplane/controller/defaultservicecidr), applied here by hand;
- a deleted ServiceCIDR whose range still has addresses in use stays, with a
  deletionTimestamp and Ready=False reason Terminating, until pkg/controller/servicecidrs
  removes its finalizer; only then does the watch say DELETED.
"""

from __future__ import annotations

from support.apiserver import objects as k8s
from support.apiserver.harness import running, snapshot_where, synced, tls  # noqa: F401  (fixtures)
from support.wait import until

from kubeport.endpoints.state import ClusterState

FLAG = "10.96.0.0/12"


def _state() -> ClusterState:
    return ClusterState("node-a", service_cidrs=[FLAG])


async def test_service_cidrs_are_listed_then_followed_live(running):
    server, source, state = await running(state=_state())
    server.apply(k8s.service_cidr("kubernetes", FLAG))  # the API server's default one
    server.apply(k8s.service_cidr("extra", "10.100.0.0/24", "fd00:100::/112"))
    await snapshot_where(state, lambda s: s.service_cidrs == (FLAG, "10.100.0.0/24", "fd00:100::/112"),
                         "the ServiceCIDRs listed")

    server.apply(k8s.service_cidr("more", "10.101.0.0/24"))
    await snapshot_where(state, lambda s: "10.101.0.0/24" in s.service_cidrs, "a ServiceCIDR added at run time")

    # Deletion with Services still in the range: the object stays, terminating, and so does its range.
    server.apply(k8s.service_cidr("more", "10.101.0.0/24", deleting=True))
    await until(lambda: source.stats["ServiceCIDR"].events["MODIFIED"] >= 1, "the terminating ServiceCIDR seen")
    assert "10.101.0.0/24" in state.snapshot.service_cidrs
    # The finalizer removed, the object goes: its range leaves the snapshot.
    server.delete("ServiceCIDR", "", "more")
    await snapshot_where(state, lambda s: "10.101.0.0/24" not in s.service_cidrs, "the ServiceCIDR gone")
    assert state.snapshot.service_cidrs == (FLAG, "10.100.0.0/24", "fd00:100::/112")
    assert source.problems == []
    assert server.count("servicecidrs", "watch") >= 1


async def test_forbidden_servicecidrs__the_rbac_rule_to_add_is_named(running):
    server, source, state = await running(state=_state())
    server.forbid("servicecidrs", "list")  # before the source's first request (it has not run yet)
    server.forbid("servicecidrs", "watch")
    await synced(state)  # Services and EndpointSlices alone make the state synced
    assert state.snapshot.service_cidrs == (FLAG,)
    problem = await _problem(source, "ServiceCIDR")
    assert '{apiGroups: ["networking.k8s.io"], resources: ["servicecidrs"], verbs: ["get", "list", "watch"]}' in problem


async def _problem(source, kind: str) -> str:
    return await until(lambda: next((p for p in source.problems if p.startswith(kind)), None), f"a {kind} problem")


async def test_an_api_server_without_servicecidrs_is_no_problem__the_flag_s_range_stands(running):
    """Before 1.33 the API server answers 404 for networking.k8s.io/v1 servicecidrs."""
    server, source, state = await running(state=_state())
    server.fail("servicecidrs", "watch", 404, times=1000)
    server.fail("servicecidrs", "list", 404, times=1000)
    await synced(state)
    await until(lambda: source.stats["ServiceCIDR"].failures["404"] >= 2, "asked again")
    assert source.problems == []
    assert state.snapshot.service_cidrs == (FLAG,)

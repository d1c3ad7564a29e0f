"""`pods verified` from manifest mode's Pods: CoreDNS answers a-b-c-d.<ns>.pod.<zone> only when
a Pod of that namespace has that IP (plugin/kubernetes/kubernetes.go findPods, PodIndex; the
Pods are object/pod.go ToPod's: status.podIP, terminating ones left out)."""

from __future__ import annotations

import pytest

from kubeport.dns.answer import Answerer
from kubeport.dns.config import DnsConfig
from kubeport.dns.records import RecordIndex
from kubeport.endpoints.state import ClusterState

from support import api
from support.dns_answers import SERIAL, case, check, make_answerer
from support.zonetext import question, read_reply

PODS = [
    api.namespace("other"),
    api.pod("lonely", ips=["10.244.3.7", "fd00:244:3::7"]),
    api.pod("going", ips=["10.244.3.8"], deleting=True),
    api.pod("elsewhere", "other", ips=["10.244.3.9"]),
]


@pytest.mark.parametrize("c", [
    case("a_pod_no_service_selects", "10-244-3-7.default.pod.cluster.local.", "A",
         answer=["10-244-3-7.default.pod.cluster.local. 5 IN A 10.244.3.7"]),
    case("the_same_ip_in_another_namespace", "10-244-3-7.other.pod.cluster.local.", "A", "NXDOMAIN"),
    case("a_terminating_pod", "10-244-3-8.default.pod.cluster.local.", "A", "NXDOMAIN"),
    case("a_pod_of_another_namespace", "10-244-3-9.other.pod.cluster.local.", "A",
         answer=["10-244-3-9.other.pod.cluster.local. 5 IN A 10.244.3.9"]),
    case("no_pod_has_it", "10-244-3-10.default.pod.cluster.local.", "A", "NXDOMAIN"),
])
def test_pods_verified_from_pods(c) -> None:
    check(make_answerer(PODS, pods="verified"), c)


def test_a_pod_deleted_stops_answering() -> None:
    state = ClusterState("node-a", implicit_namespaces=True)
    for obj in PODS:
        state.upsert(api.to_model(obj))
    state.mark_synced("Service")
    state.mark_synced("EndpointSlice")
    state.commit()
    index = RecordIndex.build(state.snapshot, now=SERIAL)
    answerer = Answerer(DnsConfig(upstreams=(), addresses=("10.96.0.10",), pods="verified"), index)
    query = question("10-244-3-7.default.pod.cluster.local.", "A", edns=1232)
    assert read_reply(answerer.answer(query)).rcode == "NOERROR"
    state.delete("Pod", "default", "lonely")
    snapshot = state.commit()
    assert snapshot is not None
    change = index.apply(snapshot, snapshot.changed, now=SERIAL + 1)
    assert change.pods
    answerer.invalidate(change)
    assert read_reply(answerer.answer(query)).rcode == "NXDOMAIN"

"""The record index and the encoded-answer cache across snapshots.

Properties: an index updated per changed service equals one built from scratch, and an
answerer that keeps its cache across updates answers exactly like a fresh one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time

import pytest

from kubeport.dns.answer import Answerer
from kubeport.dns.config import DnsConfig
from kubeport.dns.names import reverse_name_labels
from kubeport.dns.records import IndexChange, RecordIndex
from kubeport.dns.server import DnsServer
from kubeport.endpoints.types import ServiceName

from support.api import cluster_state, endpoint_slice, namespace, service, snapshot_of, to_model
from support.zonetext import question, read_reply

NAMESPACES = ["default", "ns1", "ns2"]
NAMES = ["a", "b", "c", "d"]
ADDRESSES = [f"10.244.0.{i}" for i in range(1, 7)] + ["fd00::1", "fd00::2"]
HOSTNAMES = [None, None, "web-0", "web-1"]


def random_service(rng: random.Random, ns: str, name: str) -> dict:
    kind = rng.choice(["ClusterIP", "ClusterIP", "Headless", "ExternalName"])
    ports = rng.choice([[], [{"port": 80}], [{"name": "http", "port": 80}, {"name": "dns", "port": 53,
                                                                              "protocol": "UDP"}]])
    if kind == "ExternalName":
        target = rng.choice(["example.com", "1.2.3.4", f"{rng.choice(NAMES)}.{ns}.svc.cluster.local"])
        return service(name, ns, type="ExternalName", externalName=target)
    if kind == "Headless":
        return service(name, ns, clusterIP="None", ports=ports,
                       publishNotReadyAddresses=rng.random() < 0.3)
    ips = rng.choice([["10.96.0.1"], [f"10.96.0.{rng.randrange(2, 6)}"], ["10.96.0.7", "fd00:96::7"], ["fd00:96::8"]])
    return service(name, ns, clusterIPs=ips, ports=ports or [{"port": 80}])


def random_slice(rng: random.Random, ns: str, name: str) -> dict:
    family = rng.choice(["IPv4", "IPv4", "IPv6"])
    pool = [a for a in ADDRESSES if (":" in a) == (family == "IPv6")]
    endpoints = []
    for address in rng.sample(pool, rng.randrange(0, len(pool) + 1)):
        endpoint = {"addresses": [address], "conditions": {"ready": rng.random() < 0.7}}
        hostname = rng.choice(HOSTNAMES)
        if hostname:
            endpoint["hostname"] = hostname
        if rng.random() < 0.5:
            endpoint["targetRef"] = {"kind": "Pod", "name": f"pod-{address.replace(':', '-').replace('.', '-')}"}
        endpoints.append(endpoint)
    ports = rng.choice([None, [{"name": "http", "port": 8080}], [{"name": "", "port": 8080}]])
    return endpoint_slice(name, ns, name=f"{name}-{rng.randrange(2)}", address_type=family,
                          endpoints=endpoints, ports=ports)


def questions() -> list[bytes]:
    found = []
    for ns in NAMESPACES:
        found.append(question(f"{ns}.svc.cluster.local.", "A", edns=4096))
        for name in NAMES:
            base = f"{name}.{ns}.svc.cluster.local."
            for qtype in ("A", "AAAA", "SRV", "TXT", "CNAME"):
                found.append(question(base, qtype, edns=4096))
            found.append(question(f"_http._tcp.{base}", "SRV", edns=4096))
            found.append(question(f"web-0.{base}", "A", edns=4096))
            found.append(question(f"10-244-0-1.{base}", "A", edns=4096))
        found.append(question(f"10-244-0-2.{ns}.pod.cluster.local.", "A", edns=4096))
    for address in ("10.96.0.1", "10.96.0.7", "10.244.0.1", "10.244.0.2", "fd00::1"):
        found.append(question(".".join(reverse_name_labels(address)) + ".", "PTR", edns=4096))
    found.append(question("cluster.local.", "NS", edns=4096))
    return found


def unturned(reply: object) -> object:
    """A reply with its answer records in one order: loadbalance turns the cached ones."""
    if not isinstance(reply, bytes):
        return reply
    parsed = read_reply(reply)
    return dataclasses.replace(parsed, answer=tuple(sorted(parsed.answer)))


@pytest.mark.parametrize("seed", [1, 2])
def test_incremental_updates_equal_a_rebuild_and_cached_answers_equal_fresh_ones(seed: int) -> None:
    rng = random.Random(seed)
    state = cluster_state([], synced=False)
    config = DnsConfig(upstreams=(), pods="verified", endpoint_pod_names=bool(seed % 2), addresses=("10.96.0.1",))
    index = RecordIndex(endpoint_pod_names=config.endpoint_pod_names)
    answerer = Answerer(config, index)
    asked = questions()
    previous = None
    for step in range(1, 80):
        for _ in range(rng.randrange(1, 4)):
            ns, name = rng.choice(NAMESPACES), rng.choice(NAMES)
            action = rng.random()
            if action < 0.35:
                state.upsert(to_model(random_service(rng, ns, name)))
            elif action < 0.75:
                state.upsert(to_model(random_slice(rng, ns, name)))
            elif action < 0.85:
                state.delete("Service", ns, name)
            elif action < 0.95:
                state.delete("EndpointSlice", ns, f"{name}-{rng.randrange(2)}")
            else:
                state.upsert(to_model(namespace(f"extra{rng.randrange(2)}")))
        if step == 5:
            state.mark_synced("Service")
            state.mark_synced("EndpointSlice")
        snapshot = state.commit()
        if snapshot is None:
            continue
        answerer.invalidate(index.apply(snapshot, snapshot.changed_since(previous), now=step))
        previous = snapshot
        rebuilt = RecordIndex.build(snapshot, endpoint_pod_names=config.endpoint_pod_names, now=index.serial)
        assert index.dump() == rebuilt.dump()
        fresh = Answerer(config, rebuilt)
        for packet in rng.sample(asked, 30):  # a sample: answers cached steps ago get asked too
            assert unturned(answerer.answer(packet)) == unturned(fresh.answer(packet)), read_reply(fresh.answer(packet))


def test_unchanged_service_answers_stay_encoded_changed_ones_are_fresh() -> None:
    objects = [service("web", clusterIP="10.96.0.20", ports=[{"port": 80}]),
               service("db", clusterIP="10.96.0.30", ports=[{"port": 5432}])]
    state = cluster_state(objects)
    server = DnsServer(DnsConfig(upstreams=()), clock=lambda: 1_700_000_000)
    server.apply(state.commit())
    web, db, new = (question(f"{n}.default.svc.cluster.local.") for n in ("web", "db", "new"))
    for packet in (web, db, new):
        server.answerer.answer(packet)
    assert read_reply(server.answerer.answer(new)).rcode == "NXDOMAIN"
    hits = server.stats.answer_cache_hits

    state.upsert(to_model(service("web", clusterIP="10.96.0.21", ports=[{"port": 80}])))
    state.upsert(to_model(service("new", clusterIP="10.96.0.40", ports=[{"port": 80}])))
    server.apply(state.commit())
    assert read_reply(server.answerer.answer(db)).answer == ("db.default.svc.cluster.local. 5 IN A 10.96.0.30",)
    assert server.stats.answer_cache_hits == hits + 1  # db came from the cache
    assert read_reply(server.answerer.answer(web)).answer == ("web.default.svc.cluster.local. 5 IN A 10.96.0.21",)
    assert read_reply(server.answerer.answer(new)).answer == ("new.default.svc.cluster.local. 5 IN A 10.96.0.40",)
    assert server.stats.answer_cache_hits == hits + 1


def test_freshness_new_answer_right_after_apply() -> None:
    """No stale window. Prints the time from apply() to the new answer."""
    objects = [service(f"svc{i}", clusterIP=f"10.96.{i // 250}.{i % 250 + 1}", ports=[{"port": 80}])
               for i in range(1000)]
    state = cluster_state(objects)
    server = DnsServer(DnsConfig(upstreams=()))
    server.apply(state.commit())
    packet = question("svc7.default.svc.cluster.local.")
    assert read_reply(server.answerer.answer(packet)).answer[0].endswith("10.96.0.8")
    state.upsert(to_model(service("svc7", clusterIP="10.96.9.9", ports=[{"port": 80}])))
    snapshot = state.commit()
    started = time.perf_counter()
    server.apply(snapshot)
    answer = server.answerer.answer(packet)
    elapsed = time.perf_counter() - started
    assert read_reply(answer).answer == ("svc7.default.svc.cluster.local. 5 IN A 10.96.9.9",)
    print(f"\nfreshness: apply() + first new answer took {elapsed * 1e6:.0f} us (1000 services)")


def test_sync_flip_and_namespace_changes_clear_the_cache() -> None:
    state = cluster_state([service("web", clusterIP="10.96.0.20", ports=[{"port": 80}])], synced=False)
    server = DnsServer(DnsConfig(upstreams=()))
    server.apply(state.commit())
    packet = question("web.default.svc.cluster.local.")
    missing = question("nope.default.svc.cluster.local.")
    assert read_reply(server.answerer.answer(packet)).rcode == "NOERROR"  # known before the sync (handler.go)
    assert read_reply(server.answerer.answer(missing)).rcode == "SERVFAIL"
    state.mark_synced("Service")
    state.mark_synced("EndpointSlice")
    server.apply(state.commit())
    assert server.synced
    assert read_reply(server.answerer.answer(missing)).rcode == "NXDOMAIN"
    empty = question("later.svc.cluster.local.")
    assert read_reply(server.answerer.answer(empty)).rcode == "NXDOMAIN"
    state.upsert(to_model(namespace("later")))
    server.apply(state.commit())
    assert read_reply(server.answerer.answer(empty)).rcode == "NOERROR"


def test_only_dns_relevant_changes_count() -> None:
    base = [service("web", type="NodePort", clusterIP="10.96.0.20", ports=[{"port": 80, "nodePort": 30080}])]
    state = cluster_state(base)
    index = RecordIndex()
    snapshot = state.commit()
    assert index.apply(snapshot, None, now=10) == IndexChange(
        services=frozenset({ServiceName("default", "web")}), namespaces=True, synced=True)
    state.upsert(to_model(service("web", type="NodePort", clusterIP="10.96.0.20",
                                  ports=[{"port": 80, "nodePort": 30081}])))
    changed = state.commit()
    assert not index.apply(changed, changed.changed_since(snapshot), now=20)
    assert index.serial == 10  # the SOA serial moves only with DNS-visible changes


def test_serving_and_terminating_are_ignored() -> None:
    """CoreDNS plugin/kubernetes/object/endpoint.go EndpointSliceToEndpoints reads `ready` only."""
    objects = [service("h", clusterIP="None", ports=[{"port": 80}]),
               endpoint_slice("h", ports=[{"port": 80}], endpoints=[
                   {"addresses": ["10.0.0.1"], "conditions": {"ready": True, "serving": False, "terminating": True}},
                   {"addresses": ["10.0.0.2"], "conditions": {"ready": False, "serving": True}}])]
    index = RecordIndex.build(snapshot_of(objects))
    addresses = [e.address for s in index.services[ServiceName("default", "h")].slices for e in s.endpoints]
    assert addresses == ["10.0.0.1"]


async def test_set_ttl_and_reconfigure_rebuild_answers() -> None:
    state = cluster_state([service("web", clusterIP="10.96.0.20", ports=[{"port": 80}]),
                           endpoint_slice("web", ports=[{"port": 80}], endpoints=[
                               {"addresses": ["10.244.0.5"], "targetRef": {"kind": "Pod", "name": "web-abc"}}])])
    server = DnsServer(DnsConfig(upstreams=()))
    server.apply(state.commit())
    packet = question("web.default.svc.cluster.local.")
    server.answerer.answer(packet)
    server.set_ttl(30)
    assert read_reply(server.answerer.answer(packet)).answer == ("web.default.svc.cluster.local. 30 IN A 10.96.0.20",)
    await server.reconfigure(server.config.with_changes(zone="example.org", endpoint_pod_names=True))
    pod_name = question("web-abc.web.default.svc.example.org.")
    assert read_reply(server.answerer.answer(pod_name)).answer == (
        "web-abc.web.default.svc.example.org. 30 IN A 10.244.0.5",)


def test_stats_count_requests_by_type_and_rcode() -> None:
    server = DnsServer(DnsConfig(upstreams=()))
    server.apply(snapshot_of([service("web", clusterIP="10.96.0.20", ports=[{"port": 80}])]))
    for _ in range(3):
        server.answerer.answer(question("web.default.svc.cluster.local."))
    server.answerer.answer(question("nope.default.svc.cluster.local."), tcp=True)
    server.answerer.answer(question("web.default.svc.cluster.local.", "SRV"))
    assert server.stats.requests == {("udp", "A"): 3, ("tcp", "A"): 1, ("udp", "SRV"): 1}
    assert server.stats.responses == {"NOERROR": 4, "NXDOMAIN": 1}
    assert (server.stats.answer_cache_hits, server.stats.answer_cache_misses) == (2, 3)


async def test_start_twice_at_once_binds_once() -> None:
    """The first sync and a handover's takeover may both start a new instance's DNS."""
    server = DnsServer(DnsConfig(addresses=("127.0.0.1",), port=0, upstreams=()))
    await asyncio.gather(server.start(), server.start())
    try:
        assert server.listening and len(server._udp) == 1 and len(server._tcp) == 1
    finally:
        await server.stop()
    assert not server.listening

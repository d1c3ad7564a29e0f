"""The cluster and the answer-checking helpers shared by the cluster-zone answer tests
(test_dns_answers.py: service records; test_dns_answers_zone.py: reverse zones, apex,
pods, sync state, forwarding).

Expected answers are zone text; every negative answer must carry the zone's SOA.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kubeport.dns.answer import Answerer
from kubeport.dns.config import DnsConfig
from kubeport.dns.records import RecordIndex

from support.api import endpoint_slice, namespace, service, snapshot_of
from support.zonetext import question, read_reply

SERIAL = 1_700_000_000
SOA = f"cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. {SERIAL} 7200 1800 86400 5"

HTTP = [{"name": "http", "port": 80, "protocol": "TCP"}]

CLUSTER = [
    namespace("emptyns"),
    service("kube-dns", "kube-system", clusterIP="10.96.0.10",
            ports=[{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53}]),
    service("web", "default", clusterIP="10.96.0.20", ports=HTTP),
    endpoint_slice("web", "default", ports=HTTP, endpoints=[
        "10.244.0.5", {"addresses": ["10.244.0.6"], "conditions": {"ready": False}}]),
    service("svc1", "testns", clusterIP="10.96.0.11", ports=HTTP),
    endpoint_slice("svc1", "testns", ports=HTTP, endpoints=["10.244.1.1"]),
    service("svcempty", "testns", clusterIP="10.96.0.12", ports=[{"port": 80}]),
    service("dual", "testns", clusterIPs=["10.96.0.13", "fd00:10:96::13"], ports=HTTP),
    service("v6only", "testns", clusterIP="fd00:10:96::14", ports=HTTP),
    service("multiport", "testns", clusterIP="10.96.0.15", ports=[
        {"name": "http", "port": 80}, {"name": "https", "port": 443}, {"name": "dns", "port": 53, "protocol": "UDP"}]),
    service("hdls1", "testns", clusterIP="None", ports=HTTP),
    endpoint_slice("hdls1", "testns", ports=HTTP, endpoints=[
        {"addresses": ["172.0.0.2"], "hostname": "pet-0"},
        "172.0.0.3",
        {"addresses": ["172.0.0.4"], "conditions": {"ready": False}},
        {"addresses": ["172.0.0.5"], "hostname": "dup-name"},
        {"addresses": ["172.0.0.6"], "hostname": "dup-name"},
    ]),
    endpoint_slice("hdls1", "testns", address_type="IPv6", ports=HTTP,
                   endpoints=["5678:abcd::1", "5678:abcd::2"]),
    service("hdls2", "testns", clusterIP="None", ports=HTTP),
    endpoint_slice("hdls2", "testns", ports=HTTP, endpoints=["172.0.0.2"]),
    service("hdlsempty", "testns", clusterIP="None", ports=HTTP),
    endpoint_slice("hdlsempty", "testns", ports=HTTP, endpoints=[
        {"addresses": ["172.0.3.2"], "conditions": {"ready": False}}]),
    service("hdlsnoport", "testns", clusterIP="None"),
    endpoint_slice("hdlsnoport", "testns", endpoints=["172.0.1.2"]),
    service("hdlspna", "testns", clusterIP="None", ports=HTTP, publishNotReadyAddresses=True),
    endpoint_slice("hdlspna", "testns", ports=HTTP, endpoints=[
        {"addresses": ["172.0.2.2"], "conditions": {"ready": False, "terminating": True}}]),
    service("podnames", "testns", clusterIP="None", ports=HTTP),
    endpoint_slice("podnames", "testns", ports=HTTP, endpoints=[
        {"addresses": ["172.0.4.2"], "targetRef": {"kind": "Pod", "name": "pod-abc"}},
        {"addresses": ["172.0.4.3"], "targetRef": {"kind": "Pod", "name": "p" * 64}},
        {"addresses": ["172.0.4.4"], "targetRef": {"kind": "VirtualMachineInstance", "name": "vm-1"}}]),
    service("multi", "testns", clusterIP="None", ports=HTTP),
    endpoint_slice("multi", "testns", ports=HTTP, endpoints=[
        {"addresses": ["172.0.5.2", "172.0.5.3"], "hostname": "both"}]),
    service("ext", "testns", type="ExternalName", externalName="ext.interwebs.test."),
    service("extip", "testns", type="ExternalName", externalName="1.2.3.4"),
    service("extin", "testns", type="ExternalName", externalName="svc1.testns.svc.cluster.local"),
    service("extmissing", "testns", type="ExternalName", externalName="missing.testns.svc.cluster.local"),
    service("extloop", "testns", type="ExternalName", externalName="extloop.testns.svc.cluster.local"),
]


def make_answerer(objects=CLUSTER, *, synced: bool = True, **config) -> Answerer:
    config.setdefault("upstreams", ())
    config.setdefault("addresses", ("10.96.0.10",))
    cfg = DnsConfig(**config)
    index = RecordIndex.build(snapshot_of(objects, synced=synced), zone=cfg.zone,
                              endpoint_pod_names=cfg.endpoint_pod_names,
                              exposed=frozenset(cfg.namespaces) if cfg.namespaces else None,
                              endpoints=not cfg.noendpoints, now=SERIAL, selector=cfg.label_selector,
                              namespace_selector=cfg.namespace_selector)
    return Answerer(cfg, index)


@pytest.fixture(scope="module")
def answerer() -> Answerer:
    return make_answerer()


@dataclass(frozen=True)
class Case:
    id: str
    name: str
    qtype: str
    rcode: str = "NOERROR"
    answer: tuple[str, ...] = ()
    additional: tuple[str, ...] = ()
    config: dict = field(default_factory=dict)


def case(id: str, name: str, qtype: str, rcode: str = "NOERROR", answer=(), additional=(), **config):
    return pytest.param(Case(id, name, qtype, rcode, tuple(answer), tuple(additional), config), id=id)


def check(answerer: Answerer, c: Case) -> None:
    if c.config:
        answerer = make_answerer(**c.config)
    raw = answerer.answer(question(c.name, c.qtype, edns=1232))  # as dig asks
    assert isinstance(raw, bytes), raw
    reply = read_reply(raw)
    assert reply.rcode == c.rcode
    assert sorted(reply.answer) == sorted(c.answer)
    assert sorted(reply.additional) == sorted(c.additional)
    negative = c.rcode != "NOERROR" or not c.answer
    assert reply.authority == ((SOA.replace("cluster.local.", _zone_as_asked(c.name)),) if negative else ())
    assert {"qr", "aa", "rd", "ra"} <= reply.flags and "tc" not in reply.flags


def _zone_as_asked(name: str) -> str:
    return name.rstrip(".")[-len("cluster.local"):] + "."


W = "web.default.svc.cluster.local."
S = "testns.svc.cluster.local."

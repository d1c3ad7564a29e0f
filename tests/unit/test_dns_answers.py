"""Cluster-zone answers, one table per record family, expected answers as zone text.

The reference is CoreDNS's kubernetes plugin (shared/reference/coredns-kubernetes.md,
section numbers in the ids: b4 = B.4 answer matrix, ...) and the Kubernetes DNS
specification (spec2xx). Every negative answer must carry the zone's SOA.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kubeport.dns.answer import Answerer, Forward
from kubeport.dns.config import DnsConfig
from kubeport.dns.records import RecordIndex
from kubeport.dns.testing import endpoint_slice, namespace, question, read_reply, record_lines, service, snapshot_of

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
                              endpoint_pod_names=cfg.endpoint_pod_names, now=SERIAL)
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


ADDRESS_CASES = [
    case("clusterip_a__spec231", W, "A", answer=[f"{W} 5 IN A 10.96.0.20"]),
    case("clusterip_without_endpoints_answers__b4", f"svcempty.{S}", "A",
         answer=[f"svcempty.{S} 5 IN A 10.96.0.12"]),
    case("dual_stack_a__b10", f"dual.{S}", "A", answer=[f"dual.{S} 5 IN A 10.96.0.13"]),
    case("dual_stack_aaaa__b10", f"dual.{S}", "AAAA", answer=[f"dual.{S} 5 IN AAAA fd00:10:96::13"]),
    case("aaaa_on_ipv4_service_is_nodata__f1", f"svc1.{S}", "AAAA"),
    case("a_on_ipv6_service_is_nodata__b5", f"v6only.{S}", "A"),
    case("headless_ready_endpoints_only__spec241", f"hdls1.{S}", "A", answer=[
        f"hdls1.{S} 5 IN A 172.0.0.2", f"hdls1.{S} 5 IN A 172.0.0.3",
        f"hdls1.{S} 5 IN A 172.0.0.5", f"hdls1.{S} 5 IN A 172.0.0.6"]),
    case("headless_aaaa_from_ipv6_slice__b10", f"hdls1.{S}", "AAAA", answer=[
        f"hdls1.{S} 5 IN AAAA 5678:abcd::1", f"hdls1.{S} 5 IN AAAA 5678:abcd::2"]),
    case("headless_without_ready_endpoints_is_nxdomain__spec241", f"hdlsempty.{S}", "A", "NXDOMAIN"),
    case("headless_portless_slice_still_has_a__b7", f"hdlsnoport.{S}", "A",
         answer=[f"hdlsnoport.{S} 5 IN A 172.0.1.2"]),
    # Only `ready` is read (B.12): the controller folds publishNotReadyAddresses into it, and a
    # slice it did not write keeps its own (manifest mode: endpoints/hints.py).
    case("publish_not_ready_addresses_reads_only_ready__b12", f"hdlspna.{S}", "A", "NXDOMAIN"),
    case("endpoint_hostname__spec241", f"pet-0.hdls1.{S}", "A", answer=[f"pet-0.hdls1.{S} 5 IN A 172.0.0.2"]),
    case("endpoint_dashed_ip__b6", f"172-0-0-3.hdls1.{S}", "A",
         answer=[f"172-0-0-3.hdls1.{S} 5 IN A 172.0.0.3"]),
    case("shared_hostname_gives_every_address__b6", f"dup-name.hdls1.{S}", "A", answer=[
        f"dup-name.hdls1.{S} 5 IN A 172.0.0.5", f"dup-name.hdls1.{S} 5 IN A 172.0.0.6"]),
    case("endpoint_dashed_ipv6__b6", f"5678-abcd--1.hdls1.{S}", "AAAA",
         answer=[f"5678-abcd--1.hdls1.{S} 5 IN AAAA 5678:abcd::1"]),
    case("not_ready_endpoint_name_is_nxdomain__b12", f"172-0-0-4.hdls1.{S}", "A", "NXDOMAIN"),
    case("unknown_endpoint_is_nxdomain__b5", f"nobody.hdls1.{S}", "A", "NXDOMAIN"),
    case("endpoint_names_under_clusterip_service__f3", f"10-244-0-5.{W}", "A",
         answer=[f"10-244-0-5.{W} 5 IN A 10.244.0.5"]),
    case("a_on_port_proto_name_returns_cluster_ip__b15", f"_http._tcp.svc1.{S}", "A",
         answer=[f"_http._tcp.svc1.{S} 5 IN A 10.96.0.11"]),
    case("letter_case_echoed__b11", "WEB.Default.SVC.Cluster.LOCAL.", "A",
         answer=["WEB.Default.SVC.Cluster.LOCAL. 5 IN A 10.96.0.20"]),
    case("unknown_service_is_nxdomain__b5", f"nope.{S}", "A", "NXDOMAIN"),
    case("unknown_namespace_is_nxdomain__b5", "web.nons.svc.cluster.local.", "A", "NXDOMAIN"),
    case("too_many_labels_is_nxdomain__b3", f"a.b.c.d.{W}", "A", "NXDOMAIN"),
    case("second_label_not_svc_or_pod_is_nxdomain__b3", "foo.cluster.local.", "A", "NXDOMAIN"),
    case("wildcards_removed__coredns190", "*.default.svc.cluster.local.", "A", "NXDOMAIN"),
    case("ttl_option__b2", W, "A", answer=[f"{W} 30 IN A 10.96.0.20"], ttl=30),
    case("endpoint_pod_names__b6", f"pod-abc.podnames.{S}", "A",
         answer=[f"pod-abc.podnames.{S} 5 IN A 172.0.4.2"], endpoint_pod_names=True),
    case("endpoint_pod_names_off__b6", f"pod-abc.podnames.{S}", "A", "NXDOMAIN"),
    case("endpoint_pod_name_of_64_chars_uses_dashed_ip__b6", f"172-0-4-3.podnames.{S}", "A",
         answer=[f"172-0-4-3.podnames.{S} 5 IN A 172.0.4.3"], endpoint_pod_names=True),
    case("endpoint_pod_names_take_target_ref_name_whatever_its_kind__b6", f"vm-1.podnames.{S}", "A",
         answer=[f"vm-1.podnames.{S} 5 IN A 172.0.4.4"], endpoint_pod_names=True),
    # CoreDNS makes an endpoint of every address of an endpoint (EndpointSliceToEndpoints).
    case("every_address_of_an_endpoint__headless_a", f"multi.{S}", "A",
         answer=[f"multi.{S} 5 IN A 172.0.5.2", f"multi.{S} 5 IN A 172.0.5.3"]),
    case("every_address_of_an_endpoint__its_hostname", f"both.multi.{S}", "A",
         answer=[f"both.multi.{S} 5 IN A 172.0.5.2", f"both.multi.{S} 5 IN A 172.0.5.3"]),
]


@pytest.mark.parametrize("c", ADDRESS_CASES)
def test_address_records(answerer: Answerer, c: Case) -> None:
    check(answerer, c)


SRV_CASES = [
    case("named_port_srv__spec232", f"_http._tcp.svc1.{S}", "SRV",
         answer=[f"_http._tcp.svc1.{S} 5 IN SRV 0 100 80 svc1.{S}"],
         additional=[f"svc1.{S} 5 IN A 10.96.0.11"]),
    case("bare_name_srv_includes_unnamed_ports__b4", f"svcempty.{S}", "SRV",
         answer=[f"svcempty.{S} 5 IN SRV 0 100 80 svcempty.{S}"],
         additional=[f"svcempty.{S} 5 IN A 10.96.0.12"]),
    case("underscore_label_is_wildcard__b3", f"_._tcp.svcempty.{S}", "SRV",
         answer=[f"_._tcp.svcempty.{S} 5 IN SRV 0 100 80 svcempty.{S}"],
         additional=[f"svcempty.{S} 5 IN A 10.96.0.12"]),
    case("unnamed_port_has_no_named_srv__spec232", f"_http._tcp.svcempty.{S}", "SRV", "NXDOMAIN"),
    case("unknown_port_is_nxdomain__b4", f"_https._tcp.svc1.{S}", "SRV", "NXDOMAIN"),
    case("protocol_must_match__b3", f"_http._udp.svc1.{S}", "SRV", "NXDOMAIN"),
    case("weight_is_100_over_candidates__b7", f"multiport.{S}", "SRV", answer=[
        f"multiport.{S} 5 IN SRV 0 33 80 multiport.{S}", f"multiport.{S} 5 IN SRV 0 33 443 multiport.{S}",
        f"multiport.{S} 5 IN SRV 0 33 53 multiport.{S}"], additional=[f"multiport.{S} 5 IN A 10.96.0.15"]),
    case("udp_port_srv__spec232", f"_dns._udp.multiport.{S}", "SRV",
         answer=[f"_dns._udp.multiport.{S} 5 IN SRV 0 100 53 multiport.{S}"],
         additional=[f"multiport.{S} 5 IN A 10.96.0.15"]),
    case("dual_stack_one_srv_weight_50__b7", f"_http._tcp.dual.{S}", "SRV",
         answer=[f"_http._tcp.dual.{S} 5 IN SRV 0 50 80 dual.{S}"],
         additional=[f"dual.{S} 5 IN A 10.96.0.13", f"dual.{S} 5 IN AAAA fd00:10:96::13"]),
    case("headless_weight_counted_before_dedup__b7", f"_http._tcp.hdls1.{S}", "SRV", answer=[
        f"_http._tcp.hdls1.{S} 5 IN SRV 0 16 80 pet-0.hdls1.{S}",
        f"_http._tcp.hdls1.{S} 5 IN SRV 0 16 80 172-0-0-3.hdls1.{S}",
        f"_http._tcp.hdls1.{S} 5 IN SRV 0 16 80 dup-name.hdls1.{S}",
        f"_http._tcp.hdls1.{S} 5 IN SRV 0 16 80 5678-abcd--1.hdls1.{S}",
        f"_http._tcp.hdls1.{S} 5 IN SRV 0 16 80 5678-abcd--2.hdls1.{S}",
    ], additional=[
        f"pet-0.hdls1.{S} 5 IN A 172.0.0.2", f"172-0-0-3.hdls1.{S} 5 IN A 172.0.0.3",
        f"dup-name.hdls1.{S} 5 IN A 172.0.0.5", f"dup-name.hdls1.{S} 5 IN A 172.0.0.6",
        f"5678-abcd--1.hdls1.{S} 5 IN AAAA 5678:abcd::1", f"5678-abcd--2.hdls1.{S} 5 IN AAAA 5678:abcd::2",
    ]),
    case("endpoint_srv__spec242", f"pet-0.hdls1.{S}", "SRV",
         answer=[f"pet-0.hdls1.{S} 5 IN SRV 0 100 80 pet-0.hdls1.{S}"],
         additional=[f"pet-0.hdls1.{S} 5 IN A 172.0.0.2"]),
    case("portless_slice_has_no_srv__b7", f"hdlsnoport.{S}", "SRV"),
    case("externalname_bare_srv_is_nodata__b4", f"ext.{S}", "SRV"),
    case("externalname_port_srv_is_nxdomain__coredns6162", f"_http._tcp.ext.{S}", "SRV", "NXDOMAIN"),
    case("srv_target_keeps_query_zone_case__b7", "_HtTp._TcP.sVc1.TeStNs.SvC.cLuStEr.LoCaL.", "SRV",
         answer=["_HtTp._TcP.sVc1.TeStNs.SvC.cLuStEr.LoCaL. 5 IN SRV 0 100 80 svc1.testns.svc.cLuStEr.LoCaL."],
         additional=["svc1.testns.svc.cLuStEr.LoCaL. 5 IN A 10.96.0.11"]),
]


@pytest.mark.parametrize("c", SRV_CASES)
def test_srv_records(answerer: Answerer, c: Case) -> None:
    check(answerer, c)


PTR_CASES = [
    case("cluster_ip_ptr__spec233", "11.0.96.10.in-addr.arpa.", "PTR",
         answer=[f"11.0.96.10.in-addr.arpa. 5 IN PTR svc1.{S}"]),
    case("cluster_ipv6_ptr__spec233", "3.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa.", "PTR",
         answer=[f"3.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa. 5 IN PTR dual.{S}"]),
    case("endpoint_ptr_per_selecting_service__b8", "2.0.0.172.in-addr.arpa.", "PTR", answer=[
        f"2.0.0.172.in-addr.arpa. 5 IN PTR pet-0.hdls1.{S}", f"2.0.0.172.in-addr.arpa. 5 IN PTR 172-0-0-2.hdls2.{S}"]),
    case("endpoint_without_hostname_gets_dashed_ptr__b8", "3.0.0.172.in-addr.arpa.", "PTR",
         answer=[f"3.0.0.172.in-addr.arpa. 5 IN PTR 172-0-0-3.hdls1.{S}"]),
    case("endpoint_ipv6_ptr__spec243", "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.c.b.a.8.7.6.5.ip6.arpa.",
         "PTR", answer=["1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.c.b.a.8.7.6.5.ip6.arpa. 5 IN PTR "
                        f"5678-abcd--1.hdls1.{S}"]),
    case("clusterip_endpoint_ptr__b8", "5.0.244.10.in-addr.arpa.", "PTR",
         answer=[f"5.0.244.10.in-addr.arpa. 5 IN PTR 10-244-0-5.{W}"]),
    case("ptr_of_an_endpoints_second_address__b8", "3.5.0.172.in-addr.arpa.", "PTR",
         answer=[f"3.5.0.172.in-addr.arpa. 5 IN PTR both.multi.{S}"]),
    case("ptr_on_a_forward_name_is_nodata__b4", f"svc1.{S}", "PTR"),
    case("ptr_on_a_missing_forward_name_is_nxdomain__b5", f"nope.{S}", "PTR", "NXDOMAIN"),
]


@pytest.mark.parametrize("c", PTR_CASES)
def test_ptr_records(answerer: Answerer, c: Case) -> None:
    check(answerer, c)


@pytest.mark.parametrize("name", [
    pytest.param("4.0.0.172.in-addr.arpa.", id="not_ready_endpoint__b12"),
    pytest.param("9.9.9.10.in-addr.arpa.", id="unknown_ip__b8"),
    pytest.param("0.96.10.in-addr.arpa.", id="partial_reverse_name__b8"),
    pytest.param("in-addr.arpa.", id="reverse_zone_apex"),
])
def test_unknown_reverse_names_fall_through_upstream__b2(answerer: Answerer, name: str) -> None:
    result = answerer.answer(question(name, "PTR"))
    assert isinstance(result, Forward) and result.chain is None


@pytest.mark.parametrize("name, qtype, answer, authority", [
    pytest.param("in-addr.arpa.", "SOA", "in-addr.arpa.", None, id="reverse_apex_soa__b5"),
    pytest.param("IP6.arpa.", "SOA", "IP6.arpa.", None, id="reverse_apex_soa_spelled_as_asked__b5"),
    pytest.param("20.0.96.10.in-addr.arpa.", "SOA", None, "in-addr.arpa.", id="soa_below_reverse_apex_is_nodata__b5"),
    pytest.param("9.9.9.10.in-addr.arpa.", "SOA", None, "in-addr.arpa.", id="soa_on_unknown_reverse_name_is_nodata__b5"),
    pytest.param("in-addr.arpa.", "A", None, "in-addr.arpa.", id="reverse_apex_a_is_nodata__b5"),
    pytest.param("ip6.arpa.", "TXT", None, "ip6.arpa.", id="reverse_apex_txt_is_nodata__b5"),
])
def test_reverse_zone_nodata_and_soa_are_answered_not_forwarded(answerer: Answerer, name: str, qtype: str, answer: str | None,
                                                     authority: str | None) -> None:
    """SOA queries, and any type but PTR and NS at the apex, never fall through: NODATA is
    not the NXDOMAIN class (B.5)."""
    reply = read_reply(answerer.answer(question(name, qtype, edns=1232)))
    zone_soa = SOA.replace("cluster.local.", answer or authority)
    assert reply.rcode == "NOERROR" and "aa" in reply.flags
    assert reply.answer == ((zone_soa,) if answer else ())
    assert reply.authority == ((zone_soa,) if authority else ())


CNAME_CASES = [
    case("externalname_cname__spec25", f"ext.{S}", "CNAME", answer=[f"ext.{S} 5 IN CNAME ext.interwebs.test."]),
    case("externalname_ip_is_nxdomain__coredns2324", f"extip.{S}", "A", "NXDOMAIN"),
    case("externalname_ip_cname_is_nxdomain__coredns2324", f"extip.{S}", "CNAME", "NXDOMAIN"),
    case("in_zone_externalname_is_chased__b4", f"extin.{S}", "A",
         answer=[f"extin.{S} 5 IN CNAME svc1.{S}", f"svc1.{S} 5 IN A 10.96.0.11"]),
    case("in_zone_target_wrong_family_is_nodata_without_cname__b4", f"extin.{S}", "AAAA"),
    case("in_zone_missing_target_nodata_without_cname__coredns6088", f"extmissing.{S}", "A"),
    case("cname_loop_is_skipped__b14", f"extloop.{S}", "A"),
    case("name_below_externalname_is_nxdomain__coredns5734", f"x.ext.{S}", "A", "NXDOMAIN"),
    case("port_name_below_externalname_is_nxdomain__coredns6162", f"_http._tcp.ext.{S}", "A", "NXDOMAIN"),
    case("cname_on_clusterip_is_nodata__b4", f"svc1.{S}", "CNAME"),
    case("cname_on_headless_is_nodata__b4", f"hdls1.{S}", "CNAME"),
    case("cname_on_empty_headless_is_nxdomain__b4", f"hdlsempty.{S}", "CNAME", "NXDOMAIN"),
    case("txt_on_externalname_is_nodata__b4", f"ext.{S}", "TXT"),
]


@pytest.mark.parametrize("c", CNAME_CASES)
def test_cname_records(answerer: Answerer, c: Case) -> None:
    check(answerer, c)


TXT_CASES = [
    case("dns_version__spec22", "dns-version.cluster.local.", "TXT",
         answer=['dns-version.cluster.local. 28800 IN TXT "1.1.0"']),
    case("dns_version_case_echoed__b11", "DNS-Version.Cluster.Local.", "TXT",
         answer=['DNS-Version.Cluster.Local. 28800 IN TXT "1.1.0"']),
    case("dns_version_ttl_fixed__b2", "dns-version.cluster.local.", "TXT",
         answer=['dns-version.cluster.local. 28800 IN TXT "1.1.0"'], ttl=30),
    case("txt_on_service_is_nodata__b5", f"svc1.{S}", "TXT"),
    case("txt_on_empty_headless_is_nxdomain__b4", f"hdlsempty.{S}", "TXT", "NXDOMAIN"),
    case("txt_on_namespace_is_nxdomain__b5_quirk", S, "TXT", "NXDOMAIN"),
    case("txt_on_apex_is_nxdomain__b15", "cluster.local.", "TXT", "NXDOMAIN"),
    case("a_on_dns_version_is_nxdomain__b3", "dns-version.cluster.local.", "A", "NXDOMAIN"),
]


@pytest.mark.parametrize("c", TXT_CASES)
def test_txt_records(answerer: Answerer, c: Case) -> None:
    check(answerer, c)


APEX_CASES = [
    case("apex_soa__b5", "cluster.local.", "SOA", answer=[SOA]),
    case("apex_soa_in_query_case__b5", "Cluster.LOCAL.", "SOA", answer=[SOA.replace("cluster.local.", "Cluster.LOCAL.")]),
    case("soa_ttl_capped_at_300__b2", "cluster.local.", "SOA",
         answer=[SOA.replace(" 5 IN", " 300 IN").replace("86400 5", "86400 3600")], ttl=3600),
    case("soa_on_service_is_nodata__b5", f"svc1.{S}", "SOA"),
    case("soa_on_missing_name_is_nodata__b5", f"nope.{S}", "SOA"),
    case("a_on_apex_is_nodata__b3", "cluster.local.", "A"),
    case("svc_node_is_nodata__b3", "svc.cluster.local.", "A"),
    case("pod_node_is_nodata__b3", "pod.cluster.local.", "A"),
    case("namespace_node_is_nodata__b3", S, "A"),
    case("namespace_without_services_is_nodata__b3", "emptyns.svc.cluster.local.", "A"),
    case("missing_namespace_is_nxdomain__b5", "nons.svc.cluster.local.", "A", "NXDOMAIN"),
    case("apex_ns_names_the_dns_service__b13", "cluster.local.", "NS",
         answer=["cluster.local. 5 IN NS kube-dns.kube-system.svc.cluster.local."],
         additional=["kube-dns.kube-system.svc.cluster.local. 5 IN A 10.96.0.10"]),
    case("apex_ns_in_any_case", "CLUSTER.local.", "NS",
         answer=["CLUSTER.local. 5 IN NS kube-dns.kube-system.svc.CLUSTER.local."],
         additional=["kube-dns.kube-system.svc.CLUSTER.local. 5 IN A 10.96.0.10"]),
    case("apex_ns_without_dns_service__b13", "cluster.local.", "NS",
         answer=["cluster.local. 5 IN NS ns.dns.cluster.local."],
         additional=["ns.dns.cluster.local. 5 IN A 10.96.0.53"], addresses=("10.96.0.53",)),
    case("ns_dns_address__b13", "ns.dns.cluster.local.", "A", answer=["ns.dns.cluster.local. 5 IN A 10.96.0.10"]),
    case("ns_below_apex_is_nodata__b13", f"svc1.{S}", "NS"),
    case("any_on_service_is_nodata__b4", f"svc1.{S}", "ANY"),
    case("any_on_missing_name_is_nxdomain__b4", f"nope.{S}", "ANY", "NXDOMAIN"),
    case("mx_on_service_is_nodata__b4", f"svc1.{S}", "MX"),
]


@pytest.mark.parametrize("c", APEX_CASES)
def test_apex_and_namespace_records(answerer: Answerer, c: Case) -> None:
    check(answerer, c)


POD_CASES = [
    case("pods_disabled_is_nxdomain__b9", "10-244-0-5.default.pod.cluster.local.", "A", "NXDOMAIN"),
    case("pods_disabled_namespace_is_nxdomain__b9", "default.pod.cluster.local.", "A", "NXDOMAIN"),
    case("pods_insecure__b9", "10-244-9-9.default.pod.cluster.local.", "A",
         answer=["10-244-9-9.default.pod.cluster.local. 5 IN A 10.244.9.9"], pods="insecure"),
    case("pods_insecure_ipv6__b9", "fd00--1.default.pod.cluster.local.", "AAAA",
         answer=["fd00--1.default.pod.cluster.local. 5 IN AAAA fd00::1"], pods="insecure"),
    case("pods_insecure_other_family_is_nodata__b9", "10-244-9-9.default.pod.cluster.local.", "AAAA",
         pods="insecure"),
    case("pods_insecure_not_an_ip_is_nxdomain__b9", "not-an-ip.default.pod.cluster.local.", "A", "NXDOMAIN",
         pods="insecure"),
    case("pods_insecure_needs_namespace__f1", "10-244-9-9.nons.pod.cluster.local.", "A", "NXDOMAIN",
         pods="insecure"),
    case("pods_namespace_node_is_nodata__b9", "default.pod.cluster.local.", "A", pods="insecure"),
    case("pods_verified_known_address__b9", "10-244-0-5.default.pod.cluster.local.", "A",
         answer=["10-244-0-5.default.pod.cluster.local. 5 IN A 10.244.0.5"], pods="verified"),
    case("pods_verified_not_ready_pod_exists__b9", "10-244-0-6.default.pod.cluster.local.", "A",
         answer=["10-244-0-6.default.pod.cluster.local. 5 IN A 10.244.0.6"], pods="verified"),
    case("pods_verified_unknown_address_is_nxdomain__b9", "10-244-9-9.default.pod.cluster.local.", "A",
         "NXDOMAIN", pods="verified"),
    case("pods_verified_other_namespace_is_nxdomain__b9", "10-244-0-5.testns.pod.cluster.local.", "A",
         "NXDOMAIN", pods="verified"),
]


@pytest.mark.parametrize("c", POD_CASES)
def test_pod_records(answerer: Answerer, c: Case) -> None:
    check(answerer, c)


def test_axfr_is_refused__b4(answerer: Answerer) -> None:
    reply = read_reply(answerer.answer(question("cluster.local.", "AXFR")))
    assert reply.rcode == "REFUSED"


@pytest.mark.parametrize("name, qtype, rcode, answer", [
    pytest.param(f"svc1.{S}", "A", "NOERROR", (f"svc1.{S} 5 IN A 10.96.0.11",), id="known_service_answers__b5"),
    pytest.param(f"pet-0.hdls1.{S}", "A", "NOERROR", (f"pet-0.hdls1.{S} 5 IN A 172.0.0.2",),
                 id="known_endpoint_answers__b5"),
    pytest.param("dns-version.cluster.local.", "TXT", "NOERROR", ('dns-version.cluster.local. 28800 IN TXT "1.1.0"',),
                 id="dns_version_answers__b5"),
    pytest.param(f"nope.{S}", "A", "SERVFAIL", (), id="would_be_nxdomain_is_servfail__b5"),
    pytest.param("web.nons.svc.cluster.local.", "A", "SERVFAIL", (), id="unknown_namespace_is_servfail__b5"),
    pytest.param(f"hdlsempty.{S}", "A", "SERVFAIL", (), id="headless_without_endpoints_is_servfail__b5"),
    pytest.param("dns-version.cluster.local.", "A", "SERVFAIL", (), id="bad_name_is_servfail__b5"),
    pytest.param("cluster.local.", "A", "NOERROR", (), id="nodata_stays_nodata__b5"),
    pytest.param(f"svc1.{S}", "AAAA", "NOERROR", (), id="other_family_stays_nodata__b5"),
])
def test_before_first_sync_only_would_be_nxdomain_is_servfail__b5(name: str, qtype: str, rcode: str,
                                                                   answer: tuple[str, ...]) -> None:
    """CoreDNS handler.go answers what its informers hold before they sync and turns only
    a name error into SERVFAIL (with the SOA)."""
    reply = read_reply(make_answerer(synced=False).answer(question(name, qtype)))
    assert (reply.rcode, reply.answer, reply.authority) == (rcode, answer, () if answer else (SOA,))


def test_first_sync_drops_the_answers_given_before_it__b5() -> None:
    answerer = make_answerer(synced=False)
    assert read_reply(answerer.answer(question(f"nope.{S}"))).rcode == "SERVFAIL"
    answerer.invalidate(answerer.index.apply(snapshot_of(CLUSTER), None, now=SERIAL + 1))
    assert read_reply(answerer.answer(question(f"nope.{S}"))).rcode == "NXDOMAIN"


def test_names_outside_the_zone_are_forwarded(answerer: Answerer) -> None:
    result = answerer.answer(question("www.Example.com.", "A"))
    assert isinstance(result, Forward)
    assert result.labels == (b"www", b"Example", b"com") and result.chain is None


@pytest.mark.parametrize("qtype", ["A", "AAAA"])
def test_externalname_outside_the_zone_asks_upstream_for_the_target__b4(answerer: Answerer, qtype: str) -> None:
    result = answerer.answer(question(f"Ext.{S}", qtype))
    assert isinstance(result, Forward)
    assert result.labels == (b"ext", b"interwebs", b"test") and result.qtype == {"A": 1, "AAAA": 28}[qtype]
    assert record_lines(result.chain) == [f"Ext.{S} 5 IN CNAME ext.interwebs.test."]


def test_cluster_domain_option__b2() -> None:
    answerer = make_answerer(zone="Example.Org.")
    reply = read_reply(answerer.answer(question("web.default.svc.example.org.", "A")))
    assert reply.answer == ("web.default.svc.example.org. 5 IN A 10.96.0.20",)
    assert isinstance(answerer.answer(question(W, "A")), Forward)  # cluster.local is not ours now
    missing = read_reply(answerer.answer(question("nope.default.svc.example.org.", "A")))
    assert missing.authority == (SOA.replace("cluster.local.", "example.org."),)

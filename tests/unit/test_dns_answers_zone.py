"""Cluster-zone answers beyond service names: reverse zones (PTR, SOA), the apex and
namespace nodes, pod records, zone transfers, answers before the first sync, names
outside the zone and the cluster-domain option.

The reference is CoreDNS's kubernetes plugin (shared/reference/coredns-kubernetes.md,
section numbers in the ids: b4 = B.4 answer matrix, ...) and the Kubernetes DNS
specification (spec2xx). Every negative answer must carry the zone's SOA; the cluster
and the helpers are in support/dns_answers.py.
"""

from __future__ import annotations

import pytest

from kubeport.dns.answer import Answerer, Forward

from support.api import snapshot_of
from support.dns_answers import (  # noqa: F401  (a fixture)
    CLUSTER,
    S,
    SERIAL,
    SOA,
    W,
    Case,
    answerer,
    case,
    check,
    make_answerer,
)
from support.zonetext import question, read_reply


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


def test_cluster_domain_option__b2() -> None:
    answerer = make_answerer(zone="Example.Org.")
    reply = read_reply(answerer.answer(question("web.default.svc.example.org.", "A")))
    assert reply.answer == ("web.default.svc.example.org. 5 IN A 10.96.0.20",)
    assert isinstance(answerer.answer(question(W, "A")), Forward)  # cluster.local is not ours now
    missing = read_reply(answerer.answer(question("nope.default.svc.example.org.", "A")))
    assert missing.authority == (SOA.replace("cluster.local.", "example.org."),)

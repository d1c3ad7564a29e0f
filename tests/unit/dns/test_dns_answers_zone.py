"""Cluster-zone answers beyond service names: reverse zones (PTR, SOA), the apex and
namespace nodes, pod records, zone transfers, answers before the first sync, names
outside the zone and the cluster-domain option.

What the cases restate, named in a comment by each: the Kubernetes DNS-Based Service Discovery
specification (kubernetes/dns docs/specification.md; "spec 2.3.3" is its section 2.3.3) and
CoreDNS's kubernetes plugin (coredns/coredns; a bare file name is in plugin/kubernetes/).
Every negative answer must carry the zone's SOA; the cluster and the helpers are in
support/dns_answers.py.
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
    # spec 2.3.3
    case("cluster_ip_ptr", "11.0.96.10.in-addr.arpa.", "PTR",
         answer=[f"11.0.96.10.in-addr.arpa. 5 IN PTR svc1.{S}"]),
    # spec 2.3.3
    case("cluster_ipv6_ptr", "3.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa.", "PTR",
         answer=[f"3.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa. 5 IN PTR dual.{S}"]),
    # reverse.go serviceRecordForIP: every endpoint
    case("endpoint_ptr_per_selecting_service", "2.0.0.172.in-addr.arpa.", "PTR", answer=[
        f"2.0.0.172.in-addr.arpa. 5 IN PTR pet-0.hdls1.{S}", f"2.0.0.172.in-addr.arpa. 5 IN PTR 172-0-0-2.hdls2.{S}"]),
    # reverse.go serviceRecordForIP, endpointHostname
    case("endpoint_without_hostname_gets_dashed_ptr", "3.0.0.172.in-addr.arpa.", "PTR",
         answer=[f"3.0.0.172.in-addr.arpa. 5 IN PTR 172-0-0-3.hdls1.{S}"]),
    # spec 2.4.3
    case("endpoint_ipv6_ptr", "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.c.b.a.8.7.6.5.ip6.arpa.",
         "PTR", answer=["1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.c.b.a.8.7.6.5.ip6.arpa. 5 IN PTR "
                        f"5678-abcd--1.hdls1.{S}"]),
    # reverse.go serviceRecordForIP: endpoints of any Service
    case("clusterip_endpoint_ptr", "5.0.244.10.in-addr.arpa.", "PTR",
         answer=[f"5.0.244.10.in-addr.arpa. 5 IN PTR 10-244-0-5.{W}"]),
    # reverse.go serviceRecordForIP; object/endpoint.go EndpointSliceToEndpoints
    case("ptr_of_an_endpoints_second_address", "3.5.0.172.in-addr.arpa.", "PTR",
         answer=[f"3.5.0.172.in-addr.arpa. 5 IN PTR both.multi.{S}"]),
    # reverse.go Reverse: no address, Records
    case("ptr_on_a_forward_name_is_nodata", f"svc1.{S}", "PTR"),
    # reverse.go Reverse: Records' error
    case("ptr_on_a_missing_forward_name_is_nxdomain", f"nope.{S}", "PTR", "NXDOMAIN"),
]


@pytest.mark.parametrize("c", PTR_CASES)
def test_ptr_records(answerer: Answerer, c: Case) -> None:
    """PTR: spec 2.3.3 and 2.4.3, as reverse.go serviceRecordForIP and plugin/backend_lookup.go PTR."""
    check(answerer, c)


@pytest.mark.parametrize("name", [
    # object/endpoint.go EndpointSliceToEndpoints: ready only
    pytest.param("4.0.0.172.in-addr.arpa.", id="not_ready_endpoint"),
    # reverse.go Reverse: errNoItems
    pytest.param("9.9.9.10.in-addr.arpa.", id="unknown_ip"),
    # plugin/pkg/dnsutil ExtractAddressFromReverse: no address
    pytest.param("0.96.10.in-addr.arpa.", id="partial_reverse_name"),
])
def test_unknown_reverse_names_fall_through_upstream(answerer: Answerer, name: str) -> None:
    """`fallthrough in-addr.arpa ip6.arpa`: handler.go ServeDNS hands a name error to the next plugin."""
    result = answerer.answer(question(name, "PTR"))
    assert isinstance(result, Forward) and result.chain is None


@pytest.mark.parametrize("name, qtype, answer, authority", [
    pytest.param("in-addr.arpa.", "SOA", "in-addr.arpa.", None, id="reverse_apex_soa"),
    pytest.param("IP6.arpa.", "SOA", "IP6.arpa.", None, id="reverse_apex_soa_spelled_as_asked"),
    pytest.param("20.0.96.10.in-addr.arpa.", "SOA", None, "in-addr.arpa.", id="soa_below_reverse_apex_is_nodata"),
    pytest.param("9.9.9.10.in-addr.arpa.", "SOA", None, "in-addr.arpa.", id="soa_on_unknown_reverse_name_is_nodata"),
    pytest.param("in-addr.arpa.", "A", None, "in-addr.arpa.", id="reverse_apex_a_is_nodata"),
    # reverse.go Reverse: no address, Records: parse.go parseRequest gives the apex (NODATA)
    pytest.param("in-addr.arpa.", "PTR", None, "in-addr.arpa.", id="reverse_apex_ptr_is_nodata"),
    pytest.param("ip6.arpa.", "TXT", None, "ip6.arpa.", id="reverse_apex_txt_is_nodata"),
])
def test_reverse_zone_nodata_and_soa_are_answered_not_forwarded(answerer: Answerer, name: str, qtype: str, answer: str | None,
                                                     authority: str | None) -> None:
    """SOA queries, and any type but NS at the apex, never fall through: NODATA is
    not the NXDOMAIN class (handler.go ServeDNS: only a name error falls through)."""
    reply = read_reply(answerer.answer(question(name, qtype, edns=1232)))
    zone_soa = SOA.replace("cluster.local.", answer or authority)
    assert reply.rcode == "NOERROR" and "aa" in reply.flags
    assert reply.answer == ((zone_soa,) if answer else ())
    assert reply.authority == ((zone_soa,) if authority else ())


APEX_CASES = [
    # plugin/backend_lookup.go SOA
    case("apex_soa", "cluster.local.", "SOA", answer=[SOA]),
    # handler.go ServeDNS: the zone as asked
    case("apex_soa_in_query_case", "Cluster.LOCAL.", "SOA", answer=[SOA.replace("cluster.local.", "Cluster.LOCAL.")]),
    # plugin/backend_lookup.go SOA: TTL min(ttl, 300)
    case("soa_ttl_capped_at_300", "cluster.local.", "SOA",
         answer=[SOA.replace(" 5 IN", " 300 IN").replace("86400 5", "86400 3600")], ttl=3600),
    # handler.go ServeDNS, plugin/backend_lookup.go SOA
    case("soa_on_service_is_nodata", f"svc1.{S}", "SOA"),
    # handler.go ServeDNS, plugin/backend_lookup.go SOA
    case("soa_on_missing_name_is_nodata", f"nope.{S}", "SOA"),
    # parse.go parseRequest: apex
    case("a_on_apex_is_nodata", "cluster.local.", "A"),
    # parse.go parseRequest: apex
    case("svc_node_is_nodata", "svc.cluster.local.", "A"),
    # parse.go parseRequest: apex
    case("pod_node_is_nodata", "pod.cluster.local.", "A"),
    # kubernetes.go findServices: no service name
    case("namespace_node_is_nodata", S, "A"),
    # kubernetes.go findServices: no service name
    case("namespace_without_services_is_nodata", "emptyns.svc.cluster.local.", "A"),
    # kubernetes.go Records: errNsNotExposed
    case("missing_namespace_is_nxdomain", "nons.svc.cluster.local.", "A", "NXDOMAIN"),
    # ns.go nsAddrs
    case("apex_ns_names_the_dns_service", "cluster.local.", "NS",
         answer=["cluster.local. 5 IN NS kube-dns.kube-system.svc.cluster.local."],
         additional=["kube-dns.kube-system.svc.cluster.local. 5 IN A 10.96.0.10"]),
    case("apex_ns_in_any_case", "CLUSTER.local.", "NS",
         answer=["CLUSTER.local. 5 IN NS kube-dns.kube-system.svc.CLUSTER.local."],
         additional=["kube-dns.kube-system.svc.CLUSTER.local. 5 IN A 10.96.0.10"]),
    # ns.go nsAddrs: EpIndexReverse holds every namespace's endpoints, whatever `namespaces` serves
    case("apex_ns_names_the_dns_service_of_a_namespace_not_served", "cluster.local.", "NS",
         answer=["cluster.local. 5 IN NS kube-dns.kube-system.svc.cluster.local."],
         additional=["kube-dns.kube-system.svc.cluster.local. 5 IN A 10.96.0.10"], namespaces=("testns",)),
    # ns.go nsAddrs: the server's address an endpoint of a Service outside `namespaces`: its ClusterIP
    case("apex_ns_names_a_service_whose_endpoint_we_are__namespace_not_served", "cluster.local.", "NS",
         answer=["cluster.local. 5 IN NS web.default.svc.cluster.local."],
         additional=["web.default.svc.cluster.local. 5 IN A 10.96.0.20"], namespaces=("testns",),
         addresses=("10.244.0.5",)),
    # ns.go nsAddrs: the local addresses
    case("apex_ns_without_dns_service", "cluster.local.", "NS",
         answer=["cluster.local. 5 IN NS ns.dns.cluster.local."],
         additional=["ns.dns.cluster.local. 5 IN A 10.96.0.53"], addresses=("10.96.0.53",)),
    # kubernetes.go Services: isDefaultNS
    case("ns_dns_address", "ns.dns.cluster.local.", "A", answer=["ns.dns.cluster.local. 5 IN A 10.96.0.10"]),
    # handler.go ServeDNS: NS only at the apex
    case("ns_below_apex_is_nodata", f"svc1.{S}", "NS"),
    # handler.go ServeDNS: the fake A lookup
    case("any_on_service_is_nodata", f"svc1.{S}", "ANY"),
    # handler.go ServeDNS: the fake A lookup
    case("any_on_missing_name_is_nxdomain", f"nope.{S}", "ANY", "NXDOMAIN"),
    # plugin/backend_lookup.go MX
    case("mx_on_service_is_nodata", f"svc1.{S}", "MX"),
]


@pytest.mark.parametrize("c", APEX_CASES)
def test_apex_and_namespace_records(answerer: Answerer, c: Case) -> None:
    """The apex, SOA, NS and namespace nodes: handler.go ServeDNS, parse.go parseRequest, ns.go nsAddrs."""
    check(answerer, c)


POD_CASES = [
    # kubernetes.go findPods
    case("pods_disabled_is_nxdomain", "10-244-0-5.default.pod.cluster.local.", "A", "NXDOMAIN"),
    # kubernetes.go findPods
    case("pods_disabled_namespace_is_nxdomain", "default.pod.cluster.local.", "A", "NXDOMAIN"),
    # kubernetes.go findPods
    case("pods_insecure", "10-244-9-9.default.pod.cluster.local.", "A",
         answer=["10-244-9-9.default.pod.cluster.local. 5 IN A 10.244.9.9"], pods="insecure"),
    # kubernetes.go findPods: dashes to colons
    case("pods_insecure_ipv6", "fd00--1.default.pod.cluster.local.", "AAAA",
         answer=["fd00--1.default.pod.cluster.local. 5 IN AAAA fd00::1"], pods="insecure"),
    # kubernetes.go findPods
    case("pods_insecure_other_family_is_nodata", "10-244-9-9.default.pod.cluster.local.", "AAAA",
         pods="insecure"),
    # kubernetes.go findPods
    case("pods_insecure_not_an_ip_is_nxdomain", "not-an-ip.default.pod.cluster.local.", "A", "NXDOMAIN",
         pods="insecure"),
    # kubernetes.go findPods: namespaceExposed
    case("pods_insecure_needs_namespace", "10-244-9-9.nons.pod.cluster.local.", "A", "NXDOMAIN",
         pods="insecure"),
    # kubernetes.go findPods: no pod name
    case("pods_namespace_node_is_nodata", "default.pod.cluster.local.", "A", pods="insecure"),
    # kubernetes.go findPods: PodIndex
    case("pods_verified_known_address", "10-244-0-5.default.pod.cluster.local.", "A",
         answer=["10-244-0-5.default.pod.cluster.local. 5 IN A 10.244.0.5"], pods="verified"),
    # kubernetes.go findPods: PodIndex
    case("pods_verified_not_ready_pod_exists", "10-244-0-6.default.pod.cluster.local.", "A",
         answer=["10-244-0-6.default.pod.cluster.local. 5 IN A 10.244.0.6"], pods="verified"),
    # kubernetes.go findPods: PodIndex
    case("pods_verified_unknown_address_is_nxdomain", "10-244-9-9.default.pod.cluster.local.", "A",
         "NXDOMAIN", pods="verified"),
    # kubernetes.go findPods: PodIndex
    case("pods_verified_other_namespace_is_nxdomain", "10-244-0-5.testns.pod.cluster.local.", "A",
         "NXDOMAIN", pods="verified"),
]


@pytest.mark.parametrize("c", POD_CASES)
def test_pod_records(answerer: Answerer, c: Case) -> None:
    """<a-b-c-d>.<ns>.pod records: kubernetes.go findPods, per the `pods` option."""
    check(answerer, c)


def test_axfr_is_refused(answerer: Answerer) -> None:
    """Zone transfers are served through the transfer plugin (transfer.go); without it, REFUSED."""
    reply = read_reply(answerer.answer(question("cluster.local.", "AXFR")))
    assert reply.rcode == "REFUSED"


@pytest.mark.parametrize("name, qtype, rcode, answer", [
    pytest.param(f"svc1.{S}", "A", "NOERROR", (f"svc1.{S} 5 IN A 10.96.0.11",), id="known_service_answers"),
    pytest.param(f"pet-0.hdls1.{S}", "A", "NOERROR", (f"pet-0.hdls1.{S} 5 IN A 172.0.0.2",),
                 id="known_endpoint_answers"),
    pytest.param("dns-version.cluster.local.", "TXT", "NOERROR", ('dns-version.cluster.local. 28800 IN TXT "1.1.0"',),
                 id="dns_version_answers"),
    pytest.param(f"nope.{S}", "A", "SERVFAIL", (), id="would_be_nxdomain_is_servfail"),
    pytest.param("web.nons.svc.cluster.local.", "A", "SERVFAIL", (), id="unknown_namespace_is_servfail"),
    pytest.param(f"hdlsempty.{S}", "A", "SERVFAIL", (), id="headless_without_endpoints_is_servfail"),
    pytest.param("dns-version.cluster.local.", "A", "SERVFAIL", (), id="bad_name_is_servfail"),
    pytest.param("cluster.local.", "A", "NOERROR", (), id="nodata_stays_nodata"),
    pytest.param(f"svc1.{S}", "AAAA", "NOERROR", (), id="other_family_stays_nodata"),
])
def test_before_first_sync_only_would_be_nxdomain_is_servfail(name: str, qtype: str, rcode: str,
                                                                   answer: tuple[str, ...]) -> None:
    """CoreDNS handler.go ServeDNS answers what its informers hold before they sync and turns
    only a name error into SERVFAIL (with the SOA): IsNameError && !HasSynced."""
    reply = read_reply(make_answerer(synced=False).answer(question(name, qtype)))
    assert (reply.rcode, reply.answer, reply.authority) == (rcode, answer, () if answer else (SOA,))


def test_first_sync_drops_the_answers_given_before_it() -> None:
    """handler.go ServeDNS: once HasSynced, a name error is NXDOMAIN again."""
    answerer = make_answerer(synced=False)
    assert read_reply(answerer.answer(question(f"nope.{S}"))).rcode == "SERVFAIL"
    answerer.invalidate(answerer.index.apply(snapshot_of(CLUSTER), None, now=SERIAL + 1))
    assert read_reply(answerer.answer(question(f"nope.{S}"))).rcode == "NXDOMAIN"


def test_names_outside_the_zone_are_forwarded(answerer: Answerer) -> None:
    result = answerer.answer(question("www.Example.com.", "A"))
    assert isinstance(result, Forward)
    assert result.labels == (b"www", b"Example", b"com") and result.chain is None


def test_cluster_domain_option() -> None:
    """setup.go ParseStanza: the zones of `kubernetes [ZONES...]`, matched as handler.go ServeDNS does."""
    answerer = make_answerer(zone="Example.Org.")
    reply = read_reply(answerer.answer(question("web.default.svc.example.org.", "A")))
    assert reply.answer == ("web.default.svc.example.org. 5 IN A 10.96.0.20",)
    assert isinstance(answerer.answer(question(W, "A")), Forward)  # cluster.local is not ours now
    missing = read_reply(answerer.answer(question("nope.default.svc.example.org.", "A")))
    assert missing.authority == (SOA.replace("cluster.local.", "example.org."),)

"""Cluster-zone answers for service names, one table per record family (A/AAAA, SRV,
CNAME/ExternalName, TXT), expected answers as zone text.

What the cases restate, named in a comment by each: the Kubernetes DNS-Based Service Discovery
specification (kubernetes/dns docs/specification.md; "spec 2.4.1" is its section 2.4.1) and
CoreDNS's kubernetes plugin (coredns/coredns; a bare file name is in plugin/kubernetes/).
Every negative answer must carry the zone's SOA; the cluster and the helpers are in
support/dns_answers.py.
"""

from __future__ import annotations

import pytest

from kubeport.dns.answer import Answerer, Forward

from support.dns_answers import S, W, Case, answerer, case, check  # noqa: F401  (a fixture)
from support.zonetext import question, record_lines


ADDRESS_CASES = [
    # spec 2.3.1
    case("clusterip_a", W, "A", answer=[f"{W} 5 IN A 10.96.0.20"]),
    # kubernetes.go findServices: ClusterIPs, endpoints or not
    case("clusterip_without_endpoints_answers", f"svcempty.{S}", "A",
         answer=[f"svcempty.{S} 5 IN A 10.96.0.12"]),
    # kubernetes.go findServices: every one of spec.clusterIPs
    case("dual_stack_a", f"dual.{S}", "A", answer=[f"dual.{S} 5 IN A 10.96.0.13"]),
    # kubernetes.go findServices: every one of spec.clusterIPs
    case("dual_stack_aaaa", f"dual.{S}", "AAAA", answer=[f"dual.{S} 5 IN AAAA fd00:10:96::13"]),
    # handler.go ServeDNS: the name exists, no records: NODATA
    case("aaaa_on_ipv4_service_is_nodata", f"svc1.{S}", "AAAA"),
    # handler.go ServeDNS: the name exists, no records: NODATA
    case("a_on_ipv6_service_is_nodata", f"v6only.{S}", "A"),
    # spec 2.4.1
    case("headless_ready_endpoints_only", f"hdls1.{S}", "A", answer=[
        f"hdls1.{S} 5 IN A 172.0.0.2", f"hdls1.{S} 5 IN A 172.0.0.3",
        f"hdls1.{S} 5 IN A 172.0.0.5", f"hdls1.{S} 5 IN A 172.0.0.6"]),
    # object/endpoint.go EndpointSliceToEndpoints, every slice
    case("headless_aaaa_from_ipv6_slice", f"hdls1.{S}", "AAAA", answer=[
        f"hdls1.{S} 5 IN AAAA 5678:abcd::1", f"hdls1.{S} 5 IN AAAA 5678:abcd::2"]),
    # spec 2.4.1
    case("headless_without_ready_endpoints_is_nxdomain", f"hdlsempty.{S}", "A", "NXDOMAIN"),
    # object/endpoint.go EndpointSliceToEndpoints: port -1
    case("headless_portless_slice_still_has_a", f"hdlsnoport.{S}", "A",
         answer=[f"hdlsnoport.{S} 5 IN A 172.0.1.2"]),
    # Only `ready` is read (object/endpoint.go EndpointSliceToEndpoints): the controller folds
    # publishNotReadyAddresses into it, and a slice it did not write keeps its own (manifest mode:
    # endpoints/hints.py).
    case("publish_not_ready_addresses_reads_only_ready", f"hdlspna.{S}", "A", "NXDOMAIN"),
    # spec 2.4.1
    case("endpoint_hostname", f"pet-0.hdls1.{S}", "A", answer=[f"pet-0.hdls1.{S} 5 IN A 172.0.0.2"]),
    # kubernetes.go endpointHostname
    case("endpoint_dashed_ip", f"172-0-0-3.hdls1.{S}", "A",
         answer=[f"172-0-0-3.hdls1.{S} 5 IN A 172.0.0.3"]),
    # kubernetes.go findServices: every match
    case("shared_hostname_gives_every_address", f"dup-name.hdls1.{S}", "A", answer=[
        f"dup-name.hdls1.{S} 5 IN A 172.0.0.5", f"dup-name.hdls1.{S} 5 IN A 172.0.0.6"]),
    # kubernetes.go endpointHostname
    case("endpoint_dashed_ipv6", f"5678-abcd--1.hdls1.{S}", "AAAA",
         answer=[f"5678-abcd--1.hdls1.{S} 5 IN AAAA 5678:abcd::1"]),
    # object/endpoint.go EndpointSliceToEndpoints: ready only
    case("not_ready_endpoint_name_is_nxdomain", f"172-0-0-4.hdls1.{S}", "A", "NXDOMAIN"),
    # kubernetes.go findServices: errNoItems
    case("unknown_endpoint_is_nxdomain", f"nobody.hdls1.{S}", "A", "NXDOMAIN"),
    # kubernetes.go findServices: any Service's endpoints
    case("endpoint_names_under_clusterip_service", f"10-244-0-5.{W}", "A",
         answer=[f"10-244-0-5.{W} 5 IN A 10.244.0.5"]),
    # parse.go parseRequest, for any type
    case("a_on_port_proto_name_returns_cluster_ip", f"_http._tcp.svc1.{S}", "A",
         answer=[f"_http._tcp.svc1.{S} 5 IN A 10.96.0.11"]),
    # handler.go ServeDNS: the query's case
    case("letter_case_echoed", "WEB.Default.SVC.Cluster.LOCAL.", "A",
         answer=["WEB.Default.SVC.Cluster.LOCAL. 5 IN A 10.96.0.20"]),
    # kubernetes.go findServices: errNoItems
    case("unknown_service_is_nxdomain", f"nope.{S}", "A", "NXDOMAIN"),
    # kubernetes.go Records: errNsNotExposed
    case("unknown_namespace_is_nxdomain", "web.nons.svc.cluster.local.", "A", "NXDOMAIN"),
    # parse.go parseRequest: too long
    case("too_many_labels_is_nxdomain", f"a.b.c.d.{W}", "A", "NXDOMAIN"),
    # parse.go parseRequest: errInvalidRequest
    case("second_label_not_svc_or_pod_is_nxdomain", "foo.cluster.local.", "A", "NXDOMAIN"),
    case("wildcards_removed__coredns190", "*.default.svc.cluster.local.", "A", "NXDOMAIN"),
    # setup.go ParseStanza: ttl
    case("ttl_option", W, "A", answer=[f"{W} 30 IN A 10.96.0.20"], ttl=30),
    # kubernetes.go endpointHostname: endpoint_pod_names
    case("endpoint_pod_names", f"pod-abc.podnames.{S}", "A",
         answer=[f"pod-abc.podnames.{S} 5 IN A 172.0.4.2"], endpoint_pod_names=True),
    # kubernetes.go endpointHostname
    case("endpoint_pod_names_off", f"pod-abc.podnames.{S}", "A", "NXDOMAIN"),
    # kubernetes.go endpointHostname
    case("endpoint_pod_name_of_64_chars_uses_dashed_ip", f"172-0-4-3.podnames.{S}", "A",
         answer=[f"172-0-4-3.podnames.{S} 5 IN A 172.0.4.3"], endpoint_pod_names=True),
    # kubernetes.go endpointHostname: TargetRefName
    case("endpoint_pod_names_take_target_ref_name_whatever_its_kind", f"vm-1.podnames.{S}", "A",
         answer=[f"vm-1.podnames.{S} 5 IN A 172.0.4.4"], endpoint_pod_names=True),
    # CoreDNS makes an endpoint of every address of an endpoint (EndpointSliceToEndpoints).
    case("every_address_of_an_endpoint__headless_a", f"multi.{S}", "A",
         answer=[f"multi.{S} 5 IN A 172.0.5.2", f"multi.{S} 5 IN A 172.0.5.3"]),
    case("every_address_of_an_endpoint__its_hostname", f"both.multi.{S}", "A",
         answer=[f"both.multi.{S} 5 IN A 172.0.5.2", f"both.multi.{S} 5 IN A 172.0.5.3"]),
]


@pytest.mark.parametrize("c", ADDRESS_CASES)
def test_address_records(answerer: Answerer, c: Case) -> None:
    """A and AAAA: spec 2.3.1 and 2.4.1, as kubernetes.go findServices and plugin/backend_lookup.go A."""
    check(answerer, c)


SRV_CASES = [
    # spec 2.3.2
    case("named_port_srv", f"_http._tcp.svc1.{S}", "SRV",
         answer=[f"_http._tcp.svc1.{S} 5 IN SRV 0 100 80 svc1.{S}"],
         additional=[f"svc1.{S} 5 IN A 10.96.0.11"]),
    # kubernetes.go findServices: no port asked, all
    case("bare_name_srv_includes_unnamed_ports", f"svcempty.{S}", "SRV",
         answer=[f"svcempty.{S} 5 IN SRV 0 100 80 svcempty.{S}"],
         additional=[f"svcempty.{S} 5 IN A 10.96.0.12"]),
    # parse.go parseRequest, stripUnderscore
    case("underscore_label_is_wildcard", f"_._tcp.svcempty.{S}", "SRV",
         answer=[f"_._tcp.svcempty.{S} 5 IN SRV 0 100 80 svcempty.{S}"],
         additional=[f"svcempty.{S} 5 IN A 10.96.0.12"]),
    # spec 2.3.2
    case("unnamed_port_has_no_named_srv", f"_http._tcp.svcempty.{S}", "SRV", "NXDOMAIN"),
    # kubernetes.go findServices: errNoItems
    case("unknown_port_is_nxdomain", f"_https._tcp.svc1.{S}", "SRV", "NXDOMAIN"),
    # kubernetes.go matchPortAndProtocol
    case("protocol_must_match", f"_http._udp.svc1.{S}", "SRV", "NXDOMAIN"),
    # plugin/backend_lookup.go SRV
    case("weight_is_100_over_candidates", f"multiport.{S}", "SRV", answer=[
        f"multiport.{S} 5 IN SRV 0 33 80 multiport.{S}", f"multiport.{S} 5 IN SRV 0 33 443 multiport.{S}",
        f"multiport.{S} 5 IN SRV 0 33 53 multiport.{S}"], additional=[f"multiport.{S} 5 IN A 10.96.0.15"]),
    # spec 2.3.2
    case("udp_port_srv", f"_dns._udp.multiport.{S}", "SRV",
         answer=[f"_dns._udp.multiport.{S} 5 IN SRV 0 100 53 multiport.{S}"],
         additional=[f"multiport.{S} 5 IN A 10.96.0.15"]),
    # plugin/backend_lookup.go SRV: weight before dedup
    case("dual_stack_one_srv_weight_50", f"_http._tcp.dual.{S}", "SRV",
         answer=[f"_http._tcp.dual.{S} 5 IN SRV 0 50 80 dual.{S}"],
         additional=[f"dual.{S} 5 IN A 10.96.0.13", f"dual.{S} 5 IN AAAA fd00:10:96::13"]),
    # plugin/backend_lookup.go SRV
    case("headless_weight_counted_before_dedup", f"_http._tcp.hdls1.{S}", "SRV", answer=[
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
    # spec 2.4.2
    case("endpoint_srv", f"pet-0.hdls1.{S}", "SRV",
         answer=[f"pet-0.hdls1.{S} 5 IN SRV 0 100 80 pet-0.hdls1.{S}"],
         additional=[f"pet-0.hdls1.{S} 5 IN A 172.0.0.2"]),
    # plugin/backend_lookup.go SRV skips port -1
    case("portless_slice_has_no_srv", f"hdlsnoport.{S}", "SRV"),
    # kubernetes.go Services: no CNAME in SRV
    case("externalname_bare_srv_is_nodata", f"ext.{S}", "SRV"),
    case("externalname_port_srv_is_nxdomain__coredns6162", f"_http._tcp.ext.{S}", "SRV", "NXDOMAIN"),
    # handler.go ServeDNS: the zone as asked
    case("srv_target_keeps_query_zone_case", "_HtTp._TcP.sVc1.TeStNs.SvC.cLuStEr.LoCaL.", "SRV",
         answer=["_HtTp._TcP.sVc1.TeStNs.SvC.cLuStEr.LoCaL. 5 IN SRV 0 100 80 svc1.testns.svc.cLuStEr.LoCaL."],
         additional=["svc1.testns.svc.cLuStEr.LoCaL. 5 IN A 10.96.0.11"]),
]


@pytest.mark.parametrize("c", SRV_CASES)
def test_srv_records(answerer: Answerer, c: Case) -> None:
    """SRV: spec 2.3.2 and 2.4.2, as kubernetes.go findServices and plugin/backend_lookup.go SRV."""
    check(answerer, c)


CNAME_CASES = [
    # spec 2.5
    case("externalname_cname", f"ext.{S}", "CNAME", answer=[f"ext.{S} 5 IN CNAME ext.interwebs.test."]),
    case("externalname_ip_is_nxdomain__coredns2324", f"extip.{S}", "A", "NXDOMAIN"),
    case("externalname_ip_cname_is_nxdomain__coredns2324", f"extip.{S}", "CNAME", "NXDOMAIN"),
    # plugin/backend_lookup.go A
    case("in_zone_externalname_is_chased", f"extin.{S}", "A",
         answer=[f"extin.{S} 5 IN CNAME svc1.{S}", f"svc1.{S} 5 IN A 10.96.0.11"]),
    # plugin/backend_lookup.go A
    case("in_zone_target_wrong_family_is_nodata_without_cname", f"extin.{S}", "AAAA"),
    case("in_zone_missing_target_nodata_without_cname__coredns6088", f"extmissing.{S}", "A"),
    # plugin/backend_lookup.go A: a direct loop
    case("cname_loop_is_skipped", f"extloop.{S}", "A"),
    case("name_below_externalname_is_nxdomain__coredns5734", f"x.ext.{S}", "A", "NXDOMAIN"),
    case("port_name_below_externalname_is_nxdomain__coredns6162", f"_http._tcp.ext.{S}", "A", "NXDOMAIN"),
    # plugin/backend_lookup.go CNAME
    case("cname_on_clusterip_is_nodata", f"svc1.{S}", "CNAME"),
    # plugin/backend_lookup.go CNAME
    case("cname_on_headless_is_nodata", f"hdls1.{S}", "CNAME"),
    # kubernetes.go findServices: errNoItems
    case("cname_on_empty_headless_is_nxdomain", f"hdlsempty.{S}", "CNAME", "NXDOMAIN"),
    # kubernetes.go Services (TXT)
    case("txt_on_externalname_is_nodata", f"ext.{S}", "TXT"),
]


@pytest.mark.parametrize("c", CNAME_CASES)
def test_cname_records(answerer: Answerer, c: Case) -> None:
    """ExternalName: spec 2.5, as kubernetes.go findServices and plugin/backend_lookup.go A, CNAME."""
    check(answerer, c)


TXT_CASES = [
    # spec 2.2
    case("dns_version", "dns-version.cluster.local.", "TXT",
         answer=['dns-version.cluster.local. 28800 IN TXT "1.1.0"']),
    # handler.go ServeDNS: the query's case
    case("dns_version_case_echoed", "DNS-Version.Cluster.Local.", "TXT",
         answer=['DNS-Version.Cluster.Local. 28800 IN TXT "1.1.0"']),
    # kubernetes.go Services: TTL 28800
    case("dns_version_ttl_fixed", "dns-version.cluster.local.", "TXT",
         answer=['dns-version.cluster.local. 28800 IN TXT "1.1.0"'], ttl=30),
    # kubernetes.go Services (TXT)
    case("txt_on_service_is_nodata", f"svc1.{S}", "TXT"),
    # kubernetes.go Services (TXT)
    case("txt_on_empty_headless_is_nxdomain", f"hdlsempty.{S}", "TXT", "NXDOMAIN"),
    # kubernetes.go Services (TXT), a quirk
    case("txt_on_namespace_is_nxdomain", S, "TXT", "NXDOMAIN"),
    # kubernetes.go Services (TXT), a quirk
    case("txt_on_apex_is_nxdomain", "cluster.local.", "TXT", "NXDOMAIN"),
    # parse.go parseRequest: errInvalidRequest
    case("a_on_dns_version_is_nxdomain", "dns-version.cluster.local.", "A", "NXDOMAIN"),
]


@pytest.mark.parametrize("c", TXT_CASES)
def test_txt_records(answerer: Answerer, c: Case) -> None:
    """TXT: spec 2.2 (dns-version), as kubernetes.go Services answers TXT."""
    check(answerer, c)


@pytest.mark.parametrize("qtype", ["A", "AAAA"])
def test_externalname_outside_the_zone_asks_upstream_for_the_target(answerer: Answerer, qtype: str) -> None:
    """plugin/backend_lookup.go A: an out-of-zone CNAME target is looked up upstream (Lookup)."""
    result = answerer.answer(question(f"Ext.{S}", qtype))
    assert isinstance(result, Forward)
    assert result.labels == (b"ext", b"interwebs", b"test") and result.qtype == {"A": 1, "AAAA": 28}[qtype]
    assert record_lines(result.chain) == [f"Ext.{S} 5 IN CNAME ext.interwebs.test."]

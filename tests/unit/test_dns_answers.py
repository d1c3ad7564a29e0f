"""Cluster-zone answers for service names, one table per record family (A/AAAA, SRV,
CNAME/ExternalName, TXT), expected answers as zone text.

The reference is CoreDNS's kubernetes plugin (shared/reference/coredns-kubernetes.md,
section numbers in the ids: b4 = B.4 answer matrix, ...) and the Kubernetes DNS
specification (spec2xx). Every negative answer must carry the zone's SOA; the cluster
and the helpers are in support/dns_answers.py.
"""

from __future__ import annotations

import pytest

from kubeport.dns.answer import Answerer, Forward

from support.dns_answers import S, W, Case, answerer, case, check  # noqa: F401  (a fixture)
from support.zonetext import question, record_lines


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


@pytest.mark.parametrize("qtype", ["A", "AAAA"])
def test_externalname_outside_the_zone_asks_upstream_for_the_target__b4(answerer: Answerer, qtype: str) -> None:
    result = answerer.answer(question(f"Ext.{S}", qtype))
    assert isinstance(result, Forward)
    assert result.labels == (b"ext", b"interwebs", b"test") and result.qtype == {"A": 1, "AAAA": 28}[qtype]
    assert record_lines(result.chain) == [f"Ext.{S} 5 IN CNAME ext.interwebs.test."]

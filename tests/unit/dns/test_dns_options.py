"""The kubernetes plugin's options, one table per option, each case named after the CoreDNS
behaviour it reproduces (a bare file name is in coredns/coredns plugin/kubernetes/):
``namespaces``, ``ignore empty_service``, the reverse zones of ``kubernetes <zone> [ZONES...]``
and ``fallthrough [ZONES...]``. ``endpoint_pod_names`` is in test_dns_answers.py.

Expected answers are zone text; a negative answer carries the SOA of the zone it fell in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kubeport.dns.answer import Forward
from kubeport.dns.config import DnsConfig, DnsConfigError

from support.dns_answers import SOA, S, W, make_answerer
from support.zonetext import question, read_reply

FORWARDED = "forwarded"


@dataclass(frozen=True)
class OptionCase:
    name: str
    qtype: str
    #: an rcode, or FORWARDED: handed upstream as it was asked
    rcode: str = "NOERROR"
    answer: tuple[str, ...] = ()
    #: the zone whose SOA a negative answer carries
    soa: str = "cluster.local."
    config: dict = field(default_factory=dict)


def case(id: str, name: str, qtype: str, rcode: str = "NOERROR", answer=(), soa="cluster.local.", **config):
    return pytest.param(OptionCase(name, qtype, rcode, tuple(answer), soa, config), id=id)


def check(c: OptionCase, *, synced: bool = True) -> None:
    answerer = make_answerer(synced=synced, **c.config)
    result = answerer.answer(question(c.name, c.qtype, edns=1232))
    if c.rcode == FORWARDED:
        assert isinstance(result, Forward) and result.chain is None, result
        assert b".".join(result.labels).decode() + "." == c.name
        return
    assert isinstance(result, bytes), result
    reply = read_reply(result)
    assert (reply.rcode, sorted(reply.answer)) == (c.rcode, sorted(c.answer))
    negative = c.rcode != "NOERROR" or not c.answer
    assert reply.authority == ((SOA.replace("cluster.local.", c.soa),) if negative else ())
    assert "aa" in reply.flags


ONLY_TESTNS = {"namespaces": ("testns",), "fallthrough": ()}

NAMESPACES_CASES = [
    # setup.go ParseStanza `namespaces`; kubernetes.go Records: namespaceExposed
    case("listed_namespace_answers", f"svc1.{S}", "A", answer=[f"svc1.{S} 5 IN A 10.96.0.11"], **ONLY_TESTNS),
    # kubernetes.go Records: errNsNotExposed is a name error
    case("service_of_an_unlisted_namespace_is_nxdomain", W, "A", "NXDOMAIN", **ONLY_TESTNS),
    # kubernetes.go findServices: namespaceExposed before the empty service name
    case("unlisted_namespace_node_is_nxdomain", "default.svc.cluster.local.", "A", "NXDOMAIN", **ONLY_TESTNS),
    # kubernetes.go findServices: namespaceExposed
    case("srv_of_an_unlisted_namespace_is_nxdomain", f"_http._tcp.{W}", "SRV", "NXDOMAIN", **ONLY_TESTNS),
    # kubernetes.go findPods: namespaceExposed
    case("pod_of_an_unlisted_namespace_is_nxdomain", "10-244-9-9.default.pod.cluster.local.", "A", "NXDOMAIN",
         pods="insecure", **ONLY_TESTNS),
    # reverse.go serviceRecordForIP: a ClusterIP of an unlisted namespace is skipped
    case("ptr_of_a_cluster_ip_in_an_unlisted_namespace_is_nxdomain", "20.0.96.10.in-addr.arpa.", "PTR",
         "NXDOMAIN", soa="in-addr.arpa.", **ONLY_TESTNS),
    # reverse.go serviceRecordForIP: so is an endpoint of an unlisted namespace
    case("ptr_of_an_endpoint_in_an_unlisted_namespace_is_nxdomain", "5.0.244.10.in-addr.arpa.", "PTR",
         "NXDOMAIN", soa="in-addr.arpa.", **ONLY_TESTNS),
    # reverse.go serviceRecordForIP
    case("ptr_of_a_cluster_ip_in_a_listed_namespace_answers", "11.0.96.10.in-addr.arpa.", "PTR",
         answer=[f"11.0.96.10.in-addr.arpa. 5 IN PTR svc1.{S}"], **ONLY_TESTNS),
    # handler.go ServeDNS: with kubeadm's `fallthrough in-addr.arpa ip6.arpa` the name error goes upstream
    case("ptr_of_an_unlisted_namespace_falls_through_by_default", "20.0.96.10.in-addr.arpa.", "PTR", FORWARDED,
         namespaces=("testns",)),
    # setup.go ParseStanza: several namespaces
    case("every_listed_namespace_answers", W, "A", answer=[f"{W} 5 IN A 10.96.0.20"],
         namespaces=("testns", "default")),
]


@pytest.mark.parametrize("c", NAMESPACES_CASES)
def test_namespaces_option(c: OptionCase) -> None:
    """CoreDNS `namespaces NAMESPACE...`: only the listed namespaces are served."""
    check(c)


IGNORE = {"ignore_empty_service": True}

IGNORE_EMPTY_SERVICE_CASES = [
    # handler_ignore_emptyservice_test.go: a ClusterIP service without endpoints is NXDOMAIN
    case("clusterip_without_endpoints_is_nxdomain", f"svcempty.{S}", "A", "NXDOMAIN", **IGNORE),
    # kubernetes.go findServices: for every type
    case("srv_of_clusterip_without_endpoints_is_nxdomain", f"_http._tcp.dual.{S}", "SRV", "NXDOMAIN", **IGNORE),
    # kubernetes.go findServices: both families
    case("dual_stack_without_endpoints_is_nxdomain", f"dual.{S}", "AAAA", "NXDOMAIN", **IGNORE),
    # handler_ignore_emptyservice_test.go: a service with an endpoint answers
    case("clusterip_with_a_ready_endpoint_answers", f"svc1.{S}", "A", answer=[f"svc1.{S} 5 IN A 10.96.0.11"],
         **IGNORE),
    # kubernetes.go findServices: one ready address is enough (web also has a not-ready one)
    case("clusterip_with_ready_and_not_ready_endpoints_answers", W, "A", answer=[f"{W} 5 IN A 10.96.0.20"],
         **IGNORE),
    # kubernetes.go findServices: only ClusterIP services (headless ones never had records without endpoints)
    case("headless_with_endpoints_answers", f"hdls2.{S}", "A", answer=[f"hdls2.{S} 5 IN A 172.0.0.2"], **IGNORE),
    # kubernetes.go findServices: not ExternalName
    case("externalname_in_the_zone_answers", f"extin.{S}", "A",
         answer=[f"extin.{S} 5 IN CNAME svc1.{S}", f"svc1.{S} 5 IN A 10.96.0.11"], **IGNORE),
    # kubernetes.go findServices: off by default, the ClusterIP answers
    case("off_by_default", f"svcempty.{S}", "A", answer=[f"svcempty.{S} 5 IN A 10.96.0.12"]),
    # reverse.go serviceRecordForIP does not look at endpoints: the PTR stays
    case("ptr_of_an_empty_service_stays", "12.0.96.10.in-addr.arpa.", "PTR",
         answer=[f"12.0.96.10.in-addr.arpa. 5 IN PTR svcempty.{S}"], **IGNORE),
]


@pytest.mark.parametrize("c", IGNORE_EMPTY_SERVICE_CASES)
def test_ignore_empty_service_option(c: OptionCase) -> None:
    """CoreDNS `ignore empty_service`: NXDOMAIN for a ClusterIP service with no ready endpoint."""
    check(c)


NO_ENDPOINTS = {"noendpoints": True, "fallthrough": ()}

NOENDPOINTS_CASES = [
    # setup.go `noendpoints`: no endpoint watch, so a headless service has nothing to answer
    case("headless_service_is_nxdomain", f"hdls1.{S}", "A", "NXDOMAIN", **NO_ENDPOINTS),
    case("headless_srv_is_nxdomain", f"_http._tcp.hdls1.{S}", "SRV", "NXDOMAIN", **NO_ENDPOINTS),
    # kubernetes.go findServices: an endpoint name has no endpoints to match
    case("endpoint_name_is_nxdomain", f"pet-0.hdls1.{S}", "A", "NXDOMAIN", **NO_ENDPOINTS),
    case("endpoint_of_a_clusterip_service_is_nxdomain", f"10-244-0-5.{W}", "A", "NXDOMAIN", **NO_ENDPOINTS),
    # kubernetes.go findServices: ClusterIPs come from Services
    case("clusterip_still_answers", W, "A", answer=[f"{W} 5 IN A 10.96.0.20"], **NO_ENDPOINTS),
    # reverse.go serviceRecordForIP: EpIndexReverse finds nothing
    case("endpoint_ptr_is_nxdomain", "2.0.0.172.in-addr.arpa.", "PTR", "NXDOMAIN", soa="in-addr.arpa.",
         **NO_ENDPOINTS),
    case("clusterip_ptr_still_answers", "20.0.96.10.in-addr.arpa.", "PTR",
         answer=[f"20.0.96.10.in-addr.arpa. 5 IN PTR {W}"], **NO_ENDPOINTS),
]


@pytest.mark.parametrize("c", NOENDPOINTS_CASES)
def test_noendpoints_option(c: OptionCase) -> None:
    """CoreDNS `noendpoints`: endpoint records are not served."""
    check(c)


AUTHORITATIVE = {"fallthrough": ()}
#: reverse_test.go TestReverse serves narrower reverse zones beside the cluster zone
NARROW = {"reverse_zones": ("10.96.0.0/16", "fd00:10:96::/48"), "fallthrough": ()}
IP6_ZONE = "6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa."

REVERSE_ZONE_CASES = [
    # handler.go ServeDNS without fallthrough: a name error is NXDOMAIN with the reverse zone's SOA
    case("unknown_ip_in_a_served_reverse_zone_is_nxdomain_with_its_soa", "9.9.9.10.in-addr.arpa.", "PTR",
         "NXDOMAIN", soa="in-addr.arpa.", **AUTHORITATIVE),
    case("unknown_ipv6_in_ip6_arpa_is_nxdomain_with_its_soa",
         "9.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa.", "PTR",
         "NXDOMAIN", soa="ip6.arpa.", **AUTHORITATIVE),
    # plugin/pkg/dnsutil ExtractAddressFromReverse: no address, parse.go errInvalidRequest
    case("partial_reverse_name_is_nxdomain", "0.96.10.in-addr.arpa.", "PTR", "NXDOMAIN", soa="in-addr.arpa.",
         **AUTHORITATIVE),
    # reverse_test.go TestReverse: known addresses answer in a narrower zone
    case("known_ip_in_a_narrow_reverse_zone_answers", "11.0.96.10.in-addr.arpa.", "PTR",
         answer=[f"11.0.96.10.in-addr.arpa. 5 IN PTR svc1.{S}"], **NARROW),
    # reverse_test.go TestReverse: 101.0.0.10.in-addr.arpa. NXDOMAIN, SOA 0.10.in-addr.arpa.
    case("unknown_ip_in_a_narrow_reverse_zone_has_that_zones_soa", "101.0.96.10.in-addr.arpa.", "PTR",
         "NXDOMAIN", soa="96.10.in-addr.arpa.", **NARROW),
    case("unknown_ipv6_in_a_narrow_reverse_zone_has_that_zones_soa",
         "9.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0." + IP6_ZONE, "PTR", "NXDOMAIN", soa=IP6_ZONE, **NARROW),
    # reverse_test.go TestReverse: svc1.testns.svc.0.10.in-addr.arpa. A is NXDOMAIN with the reverse SOA
    case("forward_name_inside_a_reverse_zone_is_nxdomain", "svc1.testns.svc.96.10.in-addr.arpa.", "A",
         "NXDOMAIN", soa="96.10.in-addr.arpa.", **NARROW),
    # plugin/backend_lookup.go SOA at the apex of each served zone
    case("narrow_reverse_zone_apex_soa", "96.10.in-addr.arpa.", "SOA",
         answer=[SOA.replace("cluster.local.", "96.10.in-addr.arpa.")], **NARROW),
    # handler.go ServeDNS: plugin.Zones.Matches finds no zone, the next plugin (forward) answers
    case("address_outside_the_served_reverse_zones_is_forwarded", "2.0.0.172.in-addr.arpa.", "PTR", FORWARDED,
         **NARROW),
    # handler.go ServeDNS: no reverse zone served, no PTR answered, even for a ClusterIP
    case("no_reverse_zones_forwards_every_ptr", "11.0.96.10.in-addr.arpa.", "PTR", FORWARDED, reverse_zones=()),
    # kubeadm's Corefile: `fallthrough in-addr.arpa ip6.arpa`
    case("unknown_ip_falls_through_by_default", "9.9.9.10.in-addr.arpa.", "PTR", FORWARDED),
    # fall.go F.Through: only the zones listed
    case("fallthrough_for_one_reverse_zone_only", "9.9.9.10.in-addr.arpa.", "PTR", "NXDOMAIN",
         soa="in-addr.arpa.", fallthrough=("ip6.arpa",)),
]


@pytest.mark.parametrize("c", REVERSE_ZONE_CASES)
def test_reverse_zones_option(c: OptionCase) -> None:
    """`kubernetes cluster.local in-addr.arpa ip6.arpa` (or CIDRs): the plugin is authoritative
    for the reverse zones it is given."""
    check(c)


FALLTHROUGH_CASES = [
    # fall.go SetZonesFromArgs: no zones is every zone (`.`)
    case("fallthrough_every_zone_forwards_a_missing_service", f"nope.{S}", "A", FORWARDED, fallthrough=(".",)),
    # handler.go ServeDNS: IsNameError && Fall.Through
    case("fallthrough_cluster_zone_forwards_a_missing_namespace", "web.nons.svc.cluster.local.", "A", FORWARDED,
         fallthrough=("cluster.local",)),
    # handler.go ServeDNS: NODATA is no name error, it never falls through
    case("fallthrough_keeps_nodata", f"svc1.{S}", "AAAA", fallthrough=(".",)),
    # handler.go ServeDNS: what exists answers
    case("fallthrough_keeps_answers", f"svc1.{S}", "A", answer=[f"svc1.{S} 5 IN A 10.96.0.11"], fallthrough=(".",)),
    # fall.go F.Through: a zone that does not hold the name
    case("fallthrough_of_another_zone_keeps_nxdomain", f"nope.{S}", "A", "NXDOMAIN", fallthrough=("example.org",)),
    # kubernetes.go Records: errNsNotExposed falls through too
    case("fallthrough_forwards_an_unlisted_namespace", W, "A", FORWARDED, namespaces=("testns",),
         fallthrough=("cluster.local",)),
]


@pytest.mark.parametrize("c", FALLTHROUGH_CASES)
def test_fallthrough_option(c: OptionCase) -> None:
    """CoreDNS `fallthrough [ZONES...]`: a name error in those zones goes to the next plugin (forward)."""
    check(c)


def test_unknown_reverse_name_before_the_first_sync_is_servfail() -> None:
    """handler.go ServeDNS: a name error before HasSynced is SERVFAIL, with the zone's SOA."""
    check(OptionCase("9.9.9.10.in-addr.arpa.", "PTR", "SERVFAIL", soa="in-addr.arpa.", config=AUTHORITATIVE),
          synced=False)


@pytest.mark.parametrize("changes, message", [
    pytest.param({"namespaces": ("Default",)}, "DnsConfig.namespaces: 'Default' is not a namespace name",
                 id="namespace_not_a_label"),
    pytest.param({"reverse_zones": ("example.org",)}, "DnsConfig.reverse_zones: example.org: a reverse zone is",
                 id="reverse_zone_not_under_arpa"),
    pytest.param({"reverse_zones": ("10.0.0.0/40",)}, "DnsConfig.reverse_zones: '10.0.0.0/40' is not a CIDR",
                 id="reverse_zone_bad_cidr"),
    pytest.param({"fallthrough": ("a..b",)}, "DnsConfig.fallthrough: 'a..b' is not a domain name",
                 id="fallthrough_not_a_name"),
])
def test_option_errors_name_the_field(changes: dict, message: str) -> None:
    with pytest.raises(DnsConfigError, match="^" + message.replace(".", r"\.").replace("(", r"\(")):
        DnsConfig(upstreams=(), **changes)


@pytest.mark.parametrize("zones, labels", [
    # plugin/normalize.go Host.NormalizeExact: a CIDR on an octet boundary is one zone
    pytest.param(("10.96.0.0/16",), (("96", "10", "in-addr", "arpa"),), id="octet_boundary"),
    # plugin/normalize.go: cut at the next octet, one zone per /16 of a /15
    pytest.param(("10.96.0.0/15",), (("96", "10", "in-addr", "arpa"), ("97", "10", "in-addr", "arpa")),
                 id="between_octets"),
    # plugin/normalize.go: nibbles for IPv6
    pytest.param(("fd00::/8",), (("d", "f", "ip6", "arpa"),), id="ipv6_nibbles"),
    pytest.param(("In-Addr.Arpa.",), (("in-addr", "arpa"),), id="names_lowercased_without_the_dot"),
])
def test_reverse_zones_as_coredns_normalizes_them(zones: tuple[str, ...], labels: tuple) -> None:
    assert DnsConfig(upstreams=(), reverse_zones=zones).reverse_zone_labels == labels


async def test_a_reload_with_new_namespaces_or_noendpoints_rebuilds_the_index() -> None:
    """Options the index is built for apply on reconfigure (the `dns` section applies live)."""
    from kubeport.dns.server import DnsServer

    from support.api import cluster_state
    from support.dns_answers import CLUSTER

    server = DnsServer(DnsConfig(upstreams=(), addresses=("10.96.0.10",)))
    server.apply(cluster_state(CLUSTER).commit())
    assert read_reply(server.answerer.answer(question(W))).rcode == "NOERROR"
    await server.reconfigure(server.config.with_changes(namespaces=("testns",)))
    assert read_reply(server.answerer.answer(question(W))).rcode == "NXDOMAIN"
    assert read_reply(server.answerer.answer(question(f"hdls2.{S}"))).rcode == "NOERROR"
    await server.reconfigure(server.config.with_changes(noendpoints=True))
    assert read_reply(server.answerer.answer(question(f"hdls2.{S}"))).rcode == "NXDOMAIN"

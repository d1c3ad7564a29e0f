"""Cluster DNS through the real daemon, asked from pod namespaces.

One kubeport runs in node-a and one in node-b, both on the same manifest directory (with
explicit clusterIPs), forwarding to a fake upstream for example.test in the ext namespace.
Pods ask the node-local DNS at 10.96.0.10 with real `dig`, `getent` (glibc through a pod
resolv.conf with the kubelet's search path and ndots:5) and raw sockets.
"""

from __future__ import annotations

import ipaddress
import random
import struct
import subprocess
import sys
import time

import pytest

from support.netns import DNS_SERVICE_IP, EXT_IPS, SERVICE_CIDRS, KubeportDaemon, python_in, run_in, spawn_in
from support.netns.cluster_dns import (
    BIG_ENDPOINTS,
    FRESHNESS_PROBE,
    MALFORMED_PROBE,
    NS,
    SOA,
    LineReader,
    big_addresses,
    dig,
    fqdn,
    pod_resolv_conf,
    same_records,
    start_fake_upstream,
)
from support.netns.manifests import endpoint, endpoint_slice, node, service, write

pytestmark = pytest.mark.integration

WEB, DB, EXT, INNER, BIG, LIVE = (fqdn(n) for n in ("web", "db", "ext", "inner", "big", "live"))
HTTP = [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}]
POSTGRES = [{"name": "postgres", "protocol": "TCP", "port": 5432}]
DB_0, DB_1 = "10.244.2.11", "10.244.2.12"  # db-0 has a hostname, the other is named by its address
LIVE_BEFORE, LIVE_AFTER = ["10.244.9.1"], ["10.244.9.1", "10.244.9.2"]


def live(addresses: list[str]) -> tuple[dict, dict]:
    return (service("live", ports=POSTGRES, namespace=NS, clusterIP="None"),
            endpoint_slice("live-1", "live", POSTGRES, addresses, namespace=NS))


@pytest.fixture(scope="module")
def cluster(topology, tmp_path_factory):
    """The manifest directory, with both daemons ready and the fake upstream answering."""
    manifests = tmp_path_factory.mktemp("manifests")
    state = tmp_path_factory.mktemp("state")
    write(manifests, "nodes", node(topology, "a"), node(topology, "b"))
    write(manifests, "web", service("web", ["10.96.0.20", "fd00:10:96::20"], HTTP, namespace=NS),
          endpoint_slice("web-v4", "web", [{"name": "http", "port": 8080}], ["10.244.1.11", "10.244.1.12"],
                         namespace=NS))
    write(manifests, "db", service("db", ports=POSTGRES, namespace=NS, clusterIP="None"),
          endpoint_slice("db-1", "db", POSTGRES, [endpoint(DB_0, hostname="db-0"), DB_1], namespace=NS))
    write(manifests, "big", service("big", ports=HTTP, namespace=NS, clusterIP="None"),
          endpoint_slice("big-1", "big", [{"name": "http", "port": 8080}], big_addresses(), namespace=NS))
    write(manifests, "ext", service("ext", namespace=NS, type="ExternalName", externalName="www.example.test"),
          service("inner", namespace=NS, type="ExternalName", externalName=WEB))
    write(manifests, "live", *live(LIVE_BEFORE))
    # Manifest mode writes ready as the EndpointSlice controller would: publishNotReadyAddresses.
    unready = endpoint_slice("warming-1", "warming", [{"name": "http", "port": 8080}], ["10.244.1.13"], namespace=NS)
    unready["endpoints"][0]["conditions"] = {"ready": False}
    write(manifests, "warming", service("warming", ports=HTTP, namespace=NS, clusterIP="None",
                                        publishNotReadyAddresses=True),
          unready)
    start_fake_upstream(topology)
    args = ("--upstream", EXT_IPS[0], "--service-cluster-ip-range", ",".join(SERVICE_CIDRS))
    daemons = [KubeportDaemon(topology.node(which), manifests, state / which, *args) for which in ("a", "b")]
    for daemon in daemons:
        daemon.wait_ready(timeout=30)
    yield manifests
    for daemon in daemons:
        daemon.stop()


PODS = [pytest.param(("a", 1), id="from_node_a"), pytest.param(("b", 1), id="from_node_b")]
PROTOS = [pytest.param((), id="udp"), pytest.param(("+tcp",), id="tcp")]
NEGATIVE = None  # expected answer of a negative case: no records, the zone's SOA in authority

RECORD_CASES = [
    pytest.param([WEB, "A"], "NOERROR", [f"{WEB}. 5 IN A 10.96.0.20"], id="a_cluster_ip"),
    pytest.param([WEB, "AAAA"], "NOERROR", [f"{WEB}. 5 IN AAAA fd00:10:96::20"], id="aaaa_dual_stack"),
    # Dual stack: the weight counts both ClusterIPs, before de-duplication (plugin/backend_lookup.go SRV).
    pytest.param([f"_http._tcp.{WEB}", "SRV"], "NOERROR", [f"_http._tcp.{WEB}. 5 IN SRV 0 50 80 {WEB}."],
                 id="srv_cluster_ip__dual_stack_weight"),
    pytest.param([DB, "A"], "NOERROR", [f"{DB}. 5 IN A {DB_0}", f"{DB}. 5 IN A {DB_1}"], id="a_headless"),
    pytest.param([f"db-0.{DB}", "A"], "NOERROR", [f"db-0.{DB}. 5 IN A {DB_0}"], id="a_endpoint_hostname"),
    pytest.param([f"_postgres._tcp.{DB}", "SRV"], "NOERROR",
                 [f"_postgres._tcp.{DB}. 5 IN SRV 0 50 5432 db-0.{DB}.",
                  f"_postgres._tcp.{DB}. 5 IN SRV 0 50 5432 10-244-2-12.{DB}."], id="srv_headless_per_endpoint"),
    pytest.param(["-x", "10.96.0.20"], "NOERROR", [f"20.0.96.10.in-addr.arpa. 5 IN PTR {WEB}."], id="ptr_cluster_ip"),
    pytest.param(["-x", "fd00:10:96::20"], "NOERROR",
                 [f"{ipaddress.ip_address('fd00:10:96::20').reverse_pointer}. 5 IN PTR {WEB}."],
                 id="ptr_cluster_ipv6"),
    pytest.param(["-x", DB_0], "NOERROR", [f"11.2.244.10.in-addr.arpa. 5 IN PTR db-0.{DB}."], id="ptr_endpoint"),
    pytest.param([EXT, "CNAME"], "NOERROR", [f"{EXT}. 5 IN CNAME www.example.test."], id="cname_external_name"),
    # An out-of-zone CNAME target is looked up upstream (plugin/backend_lookup.go A).
    pytest.param([EXT, "A"], "NOERROR",
                 [f"{EXT}. 5 IN CNAME www.example.test.", "www.example.test. * IN A 203.0.113.7"],
                 id="external_name_target_asked_upstream"),
    pytest.param([INNER, "A"], "NOERROR", [f"{INNER}. 5 IN CNAME {WEB}.", f"{WEB}. 5 IN A 10.96.0.20"],
                 id="external_name_in_zone_chased"),
    pytest.param(["dns-version.cluster.local", "TXT"], "NOERROR", ['dns-version.cluster.local. 28800 IN TXT "1.1.0"'],
                 id="txt_dns_version"),
    pytest.param(["www.example.test", "A"], "NOERROR", ["www.example.test. * IN A 203.0.113.7"], id="forwarded"),
    pytest.param(["www.example.test", "AAAA"], "NOERROR", ["www.example.test. * IN AAAA 2001:db8::7"],
                 id="forwarded_aaaa"),
    # ready = publishNotReadyAddresses || ... (staging/src/k8s.io/endpointslice/utils.go podToEndpoint).
    pytest.param([fqdn("warming"), "A"], "NOERROR", [f"{fqdn('warming')}. 5 IN A 10.244.1.13"],
                 id="publish_not_ready_addresses__manifests_write_ready_as_the_controller"),
    pytest.param([fqdn("nope"), "A"], "NXDOMAIN", NEGATIVE, id="nxdomain_with_soa"),
    pytest.param(["nowhere.svc.cluster.local", "A"], "NXDOMAIN", NEGATIVE, id="nxdomain_unknown_namespace"),
    pytest.param([WEB, "TXT"], "NOERROR", NEGATIVE, id="nodata_other_type_with_soa"),
    pytest.param([DB, "AAAA"], "NOERROR", NEGATIVE, id="nodata_aaaa_on_ipv4_only"),
    pytest.param(["shop.svc.cluster.local", "A"], "NOERROR", NEGATIVE, id="nodata_existing_namespace"),
]


@pytest.mark.parametrize("pod", PODS)
@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("args, status, expected", RECORD_CASES)
def test_dig_from_a_pod(topology, cluster, pod, proto, args, status, expected) -> None:
    """kubernetes/dns docs/specification.md, answered as CoreDNS's plugin/kubernetes does."""
    result = dig(topology.pod(*pod), *proto, *args)
    assert result.status == status, result.output
    if expected is NEGATIVE:
        assert result.answer == () and len(result.authority) == 1 and SOA.fullmatch(result.authority[0]), \
            result.output
    else:
        assert same_records(result.answer, expected), result.output
    if "example.test" not in args[0]:
        assert "aa" in result.flags, result.output  # authoritative for the cluster and reverse zones


def test_external_nxdomain_is_relayed(topology, cluster) -> None:
    result = dig(topology.pod("a", 1), "gone.example.test", "A")
    assert result.status == "NXDOMAIN" and result.answer == ()
    assert result.authority and result.authority[0].startswith("example.test. ")


def test_reverse_zone_soa_is_answered_here_not_upstream(topology, cluster) -> None:
    """CoreDNS plugin/kubernetes/handler.go ServeDNS and plugin/backend_lookup.go SOA, in a reverse zone."""
    ns = topology.pod("a", 1)
    apex = dig(ns, "in-addr.arpa", "SOA")
    assert apex.status == "NOERROR" and len(apex.answer) == 1, apex.output
    assert apex.answer[0].startswith("in-addr.arpa. 5 IN SOA ns.dns.in-addr.arpa. hostmaster.in-addr.arpa. ")
    below = dig(ns, "20.0.96.10.in-addr.arpa", "SOA")
    assert below.status == "NOERROR" and below.answer == () and "aa" in below.flags, below.output
    assert below.authority == apex.answer, below.output


def test_forwarded_answer_too_big_for_udp_keeps_what_fits(topology, cluster) -> None:
    """Trimmed to whole records with TC (CoreDNS request/request.go Scrub), not emptied: a client
    that never retries over TCP (musl before 1.2.4) still gets addresses. Asked twice: relayed,
    then cached."""
    ns = topology.pod("a", 1)
    many = {f"198.51.100.{i}" for i in range(1, 41)}
    for _ in range(2):
        udp = dig(ns, "+ignore", "+noedns", "many.example.test", "A")
        assert "tc" in udp.flags and 0 < len(udp.answer) < len(many), udp.output
        assert {line.split()[-1] for line in udp.answer} < many, udp.output
    tcp = dig(ns, "+tcp", "many.example.test", "A")
    assert "tc" not in tcp.flags and {line.split()[-1] for line in tcp.answer} == many, tcp.output


@pytest.mark.parametrize("pod", PODS)
def test_getent_through_the_pod_resolv_conf(topology, cluster, pod) -> None:
    """glibc with search <ns>.svc.cluster.local svc.cluster.local cluster.local, ndots:5."""
    ns = topology.pod(*pod)
    with pod_resolv_conf(ns):
        assert _getent(ns, "hosts", WEB) in ({"10.96.0.20"}, {"fd00:10:96::20"})
        assert _getent(ns, "ahostsv4", WEB) == {"10.96.0.20"}
        assert _getent(ns, "ahostsv4", "web") == {"10.96.0.20"}  # short name, first search domain
        assert _getent(ns, "ahostsv6", "web") == {"fd00:10:96::20"}
        assert _getent(ns, "ahostsv4", "web.shop") == {"10.96.0.20"}  # second search domain
        assert _getent(ns, "ahostsv4", "db") == {DB_0, DB_1}
        assert _getent(ns, "ahostsv4", "www.example.test") == {"203.0.113.7"}  # search misses, then upstream
        assert run_in(ns, "getent", "hosts", "nope", check=False).returncode == 2  # not found


def _getent(ns: str, database: str, name: str) -> set[str]:
    return {line.split()[0] for line in run_in(ns, "getent", database, name).stdout.splitlines()}


@pytest.mark.parametrize("pod", PODS)
def test_headless_with_300_endpoints_truncates_over_udp_and_succeeds_over_tcp(topology, cluster, pod) -> None:
    ns = topology.pod(*pod)
    udp = dig(ns, "+ignore", "+noedns", BIG, "A")
    assert "tc" in udp.flags and 0 < len(udp.answer) < BIG_ENDPOINTS, udp.output
    tcp = dig(ns, "+tcp", BIG, "A")
    assert "tc" not in tcp.flags and sorted(line.split()[-1] for line in tcp.answer) == sorted(big_addresses())
    retried = dig(ns, BIG, "A")  # dig retries over TCP by itself on TC
    assert len(retried.answer) == BIG_ENDPOINTS and "Truncated, retrying in TCP mode" in retried.output


def test_manifest_edit_is_answered_at_once(topology, cluster) -> None:
    """Time from the file rename to the first answer with the new endpoint, on both nodes."""
    probes = {}
    for which in ("a", "b"):
        proc = spawn_in(topology.pod(which, 1), sys.executable, "-I", "-c", FRESHNESS_PROBE, DNS_SERVICE_IP,
                        LIVE, LIVE_AFTER[-1], stdout=subprocess.PIPE)
        probes[which] = LineReader(proc, f"freshness probe in {which}1")
    for probe in probes.values():
        assert probe.line(10) == "ready"
    written = time.time()
    write(cluster, "live", *live(LIVE_AFTER))
    delays = {which: float(probe.line(10)) - written for which, probe in probes.items()}
    print("\nmanifest edit -> new answer in a pod: "
          + ", ".join(f"node-{which} {delay * 1000:.1f} ms" for which, delay in delays.items()))
    for which in delays:
        result = dig(topology.pod(which, 1), LIVE, "A")
        assert same_records(result.answer, [f"{LIVE}. 5 IN A {ip}" for ip in LIVE_AFTER]), result.output


def _header(packet: bytes) -> tuple[int, int, int]:
    query_id, flags = struct.unpack_from("!HH", packet)
    return query_id, flags & 0x8000, flags & 0xF


FORMERR = 1
QUERY = (struct.pack("!HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0)
         + b"\x03web\x04shop\x03svc\x07cluster\x05local\x00" + struct.pack("!HH", 1, 1))
MALFORMED = {
    "too_short_for_a_header": (b"\x12", None),
    "truncated_header": (b"\x12\x34\x01\x00\x00\x01", None),
    "compression_loop": (struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + b"\xc0\x0c\x00\x01\x00\x01", FORMERR),
    "pointer_past_the_end": (struct.pack("!HHHHHH", 0x1235, 0x0100, 1, 0, 0, 0) + b"\xc0\xff\x00\x01\x00\x01",
                             FORMERR),
    "truncated_question": (QUERY[:20], FORMERR),
    "qdcount_0": (struct.pack("!HHHHHH", 0x1236, 0x0100, 0, 0, 0, 0), FORMERR),
    "qdcount_2": (struct.pack("!HHHHHH", 0x1237, 0x0100, 2, 0, 0, 0) + b"\x00\x00\x01\x00\x01" * 2, FORMERR),
}


def test_malformed_packets_get_formerr_or_are_dropped__and_the_server_keeps_answering(topology, cluster) -> None:
    ns = topology.pod("a", 1)
    rng = random.Random(5)
    random_packets = []
    for _ in range(40):
        packet = bytearray(rng.randbytes(rng.randrange(12, 200)))
        packet[2] &= 0x07  # a query (QR=0), opcode QUERY: a response to us would be dropped
        random_packets.append(bytes(packet))
    named = list(MALFORMED.values())
    udp = [packet.hex() for packet, _ in named] + [p.hex() for p in random_packets] + [QUERY.hex()]
    tcp = ["t:" + MALFORMED["compression_loop"][0].hex(), "t:" + MALFORMED["truncated_header"][0].hex(),
           "t:" + QUERY.hex()]
    lines = python_in(ns, MALFORMED_PROBE, DNS_SERVICE_IP, *udp, *tcp, timeout=60).stdout.split()
    assert len(lines) == len(udp) + len(tcp)
    for (name, (packet, rcode)), line in zip(MALFORMED.items(), lines):
        if rcode is None:
            assert line == "-", f"{name}: no header, dropped"
        else:
            assert line != "-", f"{name}: answered"
            assert _header(bytes.fromhex(line)) == (struct.unpack("!H", packet[:2])[0], 0x8000, rcode), name
    for packet, line in zip(random_packets, lines[len(named):]):
        assert line != "-", f"random packet {packet.hex()} got no answer"
        assert _header(bytes.fromhex(line))[:2] == (struct.unpack("!H", packet[:2])[0], 0x8000)
    tail = lines[len(udp) - 1:]
    assert _header(bytes.fromhex(tail[0])) == (0x4242, 0x8000, 0)  # a good query after the garbage
    assert _header(bytes.fromhex(tail[1]))[2] == FORMERR  # TCP: compression loop
    assert tail[2] == "closed"  # TCP: a frame without a header ends the stream
    assert _header(bytes.fromhex(tail[3])) == (0x4242, 0x8000, 0)  # a new connection is served
    assert same_records(dig(ns, WEB, "A").answer, [f"{WEB}. 5 IN A 10.96.0.20"])

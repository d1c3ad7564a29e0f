"""Reply sizes against a miekg/dns-style encoder, the one CoreDNS answers through.

The reference below is written from miekg/dns msg.go (packDomainName: every name written,
compressed or not, makes its suffixes known to the names after it, at offsets below 0x3FFF;
only owner names and NS/CNAME/PTR/SOA data point back; SRV targets are written whole,
RFC 2782) and ``Msg.Truncate`` (records kept in order while they fit, the cut set TC). It
works on the records as a client reads them, so it checks kubeport's bytes, not its
encoder's bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from dnslib import QTYPE, DNSRecord

from kubeport.dns.answer import Answerer
from kubeport.dns.config import DnsConfig
from kubeport.dns.records import RecordIndex

from support.api import endpoint_slice, namespace, service, snapshot_of
from support.zonetext import question

MAX_COMPRESSION_OFFSET = 0x3FFF  # miekg/dns msg.go maxCompressionOffset
HEADER_SIZE = 12
#: types whose RDATA names miekg/dns packs as "cdomain-name" (compressible)
COMPRESSIBLE = {"CNAME", "NS", "PTR", "SOA"}


class MiekgSizer:
    """Sizes of names and records as miekg/dns packs them into one message."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.offset = HEADER_SIZE

    def name(self, text: str, compress: bool) -> int:
        labels = [label for label in text.rstrip(".").split(".") if label]
        size = 0
        for index in range(len(labels)):
            suffix = ".".join(labels[index:])
            if suffix in self.names:
                if compress:
                    return size + 2
            elif self.offset + size < MAX_COMPRESSION_OFFSET:
                self.names[suffix] = self.offset + size
            size += 1 + len(labels[index])
        return size + 1

    def advance(self, size: int) -> int:
        self.offset += size
        return size

    def question(self, name: str) -> int:
        return self.advance(self.name(name, True) + 4)

    def record(self, rr) -> int:
        owner = self.advance(self.name(str(rr.rname), True) + 10)
        kind = QTYPE[rr.rtype]
        if kind == "A":
            return owner + self.advance(4)
        if kind == "AAAA":
            return owner + self.advance(16)
        if kind == "SRV":
            self.advance(6)
            return owner + 6 + self.advance(self.name(str(rr.rdata.target), False))
        if kind == "SOA":
            mname = self.advance(self.name(str(rr.rdata.mname), True))
            rname = self.advance(self.name(str(rr.rdata.rname), True))
            return owner + mname + rname + self.advance(20)
        if kind in COMPRESSIBLE:
            return owner + self.advance(self.name(str(rr.rdata.label), True))
        raise AssertionError(f"no size rule for {kind}")


def miekg_size(reply: DNSRecord) -> int:
    sizer = MiekgSizer()
    size = HEADER_SIZE + sizer.question(str(reply.q.qname))
    for rr in reply.rr + reply.auth + reply.ar:
        size += sizer.record(rr)
    return size


def miekg_truncate(reply: DNSRecord, limit: int) -> tuple[int, bool]:
    """(records kept, TC) as miekg/dns Msg.Truncate(limit) leaves a message (no OPT)."""
    sizer = MiekgSizer()
    size = HEADER_SIZE + sizer.question(str(reply.q.qname))
    records = reply.rr + reply.auth + reply.ar
    for kept, rr in enumerate(records):
        size += sizer.record(rr)
        if size > limit:
            return kept, True
    return len(records), False


def addresses(count: int, v6: bool = False) -> list[str]:
    return [f"fd00:10:244::{i + 1:x}" if v6 else f"10.244.0.{i + 1}" for i in range(count)]


LONG = "n" * 63
HTTP = [{"name": "http", "port": 80, "protocol": "TCP"}]
CLUSTER = [
    namespace("testns"), namespace(LONG),
    service("six", "testns", clusterIP="None", ports=HTTP),
    endpoint_slice("six", "testns", ports=HTTP, endpoints=addresses(6)),
    service("named", "testns", clusterIP="None", ports=HTTP),
    endpoint_slice("named", "testns", ports=HTTP, endpoints=[
        {"addresses": [address], "hostname": f"pet-{i}"} for i, address in enumerate(addresses(6))]),
    service("dual", "testns", clusterIP="None", ports=HTTP),
    endpoint_slice("dual", "testns", ports=HTTP, endpoints=addresses(3)),
    endpoint_slice("dual", "testns", name="dual-v6", address_type="IPv6", ports=HTTP,
                   endpoints=addresses(3, v6=True)),
    service("big", "testns", clusterIP="None", ports=HTTP),
    endpoint_slice("big", "testns", ports=HTTP, endpoints=[f"10.245.{i // 250}.{i % 250 + 1}" for i in range(300)]),
    service("s" * 63, LONG, clusterIP="None", ports=HTTP),
    endpoint_slice("s" * 63, LONG, ports=HTTP, endpoints=addresses(4)),
    service("web", "testns", clusterIPs=["10.96.0.20", "fd00:10:96::20"], ports=HTTP),
]
ZONE = "svc.cluster.local."
LONG_NAME = f"{'s' * 63}.{LONG}.{ZONE}"


@pytest.fixture(scope="module")
def answerer() -> Answerer:
    config = DnsConfig(upstreams=(), addresses=("10.96.0.10",))
    return Answerer(config, RecordIndex.build(snapshot_of(CLUSTER), now=1))


@dataclass(frozen=True)
class SizeCase:
    name: str
    qtype: str
    tcp: bool = False
    #: small enough for UDP without EDNS (512 bytes)
    fits_udp: bool = True


SIZE_CASES = [
    pytest.param(SizeCase(f"_http._tcp.six.testns.{ZONE}", "SRV"), id="headless_6_endpoints_srv"),
    pytest.param(SizeCase(f"_http._tcp.named.testns.{ZONE}", "SRV"), id="headless_6_hostnames_srv"),
    pytest.param(SizeCase(f"six.testns.{ZONE}", "A"), id="headless_6_endpoints_a"),
    pytest.param(SizeCase(f"_http._tcp.dual.testns.{ZONE}", "SRV", tcp=True, fits_udp=False),
                 id="dual_stack_headless_srv_tcp"),
    pytest.param(SizeCase(f"dual.testns.{ZONE}", "AAAA"), id="dual_stack_headless_aaaa"),
    pytest.param(SizeCase(f"_http._tcp.web.testns.{ZONE}", "SRV"), id="dual_stack_cluster_ip_srv"),
    pytest.param(SizeCase(f"big.testns.{ZONE}", "A", tcp=True, fits_udp=False), id="headless_300_endpoints_a_tcp"),
    pytest.param(SizeCase(f"_http._tcp.big.testns.{ZONE}", "SRV", tcp=True, fits_udp=False),
                 id="headless_300_endpoints_srv_tcp"),
    pytest.param(SizeCase(f"_http._tcp.{LONG_NAME}", "SRV", tcp=True, fits_udp=False), id="long_names_srv_tcp"),
    pytest.param(SizeCase(f"nope.testns.{ZONE}", "A"), id="nxdomain_soa"),
    pytest.param(SizeCase("20.0.96.10.in-addr.arpa.", "PTR"), id="ptr"),
]


@pytest.mark.parametrize("c", SIZE_CASES)
def test_reply_size_is_the_miekg_size(answerer: Answerer, c: SizeCase) -> None:
    raw = answerer.answer(question(c.name, c.qtype), tcp=c.tcp)
    assert isinstance(raw, bytes), raw
    reply = DNSRecord.parse(raw)
    assert not reply.header.tc
    assert len(raw) == miekg_size(reply)
    if c.fits_udp:
        assert len(raw) <= 512


def test_six_endpoint_srv_fits_512_bytes_as_coredns_s_does(answerer: Answerer) -> None:
    """Every glue owner points into its SRV target (a 2-byte name instead of 41), so the 6 SRV
    records and their 6 A records fit a 512-byte UDP reply without EDNS, TC clear."""
    raw = answerer.answer(question(f"_http._tcp.six.testns.{ZONE}", "SRV"))
    reply = DNSRecord.parse(raw)
    assert (len(reply.rr), len(reply.ar), reply.header.tc) == (6, 6, 0)
    assert len(raw) == miekg_size(reply) == 507


@pytest.mark.parametrize("name, qtype", [
    pytest.param(f"big.testns.{ZONE}", "A", id="300_a_records"),
    pytest.param(f"_http._tcp.big.testns.{ZONE}", "SRV", id="300_srv_with_glue"),
    pytest.param(f"_http._tcp.{LONG_NAME}", "SRV", id="long_names"),
    pytest.param(f"_http._tcp.dual.testns.{ZONE}", "SRV", id="dual_stack_srv_with_a_and_aaaa_glue"),
])
def test_udp_truncation_keeps_what_miekg_truncate_keeps(answerer: Answerer, name: str, qtype: str) -> None:
    """Over UDP without EDNS: the records miekg/dns Msg.Truncate(512) keeps, TC when it cut."""
    full = DNSRecord.parse(answerer.answer(question(name, qtype), tcp=True))
    cut = DNSRecord.parse(answerer.answer(question(name, qtype)))
    kept, truncated = miekg_truncate(full, 512)
    assert (len(cut.rr) + len(cut.auth) + len(cut.ar), bool(cut.header.tc)) == (kept, truncated)

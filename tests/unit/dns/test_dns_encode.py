"""The record encoder that replaced dnslib on the answer path: the same records on the wire
(read back by dnslib), names compressed where RFC 1035/3597 allow it and never in SRV data
(RFC 2782, as miekg/dns packs it), and no pointer past the 14 bits of an offset."""

from __future__ import annotations

import struct

import pytest
from dnslib import DNSRecord

from kubeport.dns.encode import (
    Packer,
    Record,
    address_record,
    same_name,
    soa_data,
    srv_record,
    txt_data,
)
from kubeport.dns.wire import T_CNAME, T_NS, T_PTR, T_SOA, T_TXT

from support.zonetext import record_lines

WEB = (b"web", b"default", b"svc", b"cluster", b"local")
ZONE = (b"cluster", b"local")


def labels(text: str) -> tuple[bytes, ...]:
    return tuple(label.encode() for label in text.rstrip(".").split("."))


def message(qname: tuple[bytes, ...], records: list[Record]) -> bytes:
    question = b"".join(bytes((len(x),)) + x for x in qname) + b"\x00" + struct.pack("!HH", 1, 1)
    packer = Packer(struct.pack("!HHHHHH", 0, 0x8400, 1, len(records), 0, 0), question, qname)
    packer.records(records)
    return bytes(packer.buffer)


@pytest.mark.parametrize("record, line", [
    pytest.param(address_record(WEB, "10.96.0.20", 5), "web.default.svc.cluster.local. 5 IN A 10.96.0.20", id="a"),
    pytest.param(address_record(WEB, "fd00::20", 5), "web.default.svc.cluster.local. 5 IN AAAA fd00::20", id="aaaa"),
    pytest.param(srv_record(WEB, 5, 0, 100, 80, WEB), "web.default.svc.cluster.local. 5 IN SRV 0 100 80 "
                 "web.default.svc.cluster.local.", id="srv"),
    pytest.param(Record(WEB, T_CNAME, 5, (labels("www.example.com"),)),
                 "web.default.svc.cluster.local. 5 IN CNAME www.example.com.", id="cname"),
    pytest.param(Record(labels("20.0.96.10.in-addr.arpa"), T_PTR, 5, (WEB,)),
                 "20.0.96.10.in-addr.arpa. 5 IN PTR web.default.svc.cluster.local.", id="ptr"),
    pytest.param(Record(ZONE, T_NS, 5, ((b"ns", b"dns") + ZONE,)), "cluster.local. 5 IN NS ns.dns.cluster.local.",
                 id="ns"),
    pytest.param(Record(ZONE, T_SOA, 5, soa_data((b"ns", b"dns") + ZONE, (b"hostmaster",) + ZONE, 7, 7200, 1800,
                                                   86400, 5)),
                 "cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 7 7200 1800 86400 5",
                 id="soa"),
    pytest.param(Record(labels("dns-version.cluster.local"), T_TXT, 28800, txt_data(b"1.1.0")),
                 'dns-version.cluster.local. 28800 IN TXT "1.1.0"', id="txt"),
])
def test_records_read_back_as_zone_text(record: Record, line: str) -> None:
    assert record_lines([record]) == [line]


def test_owner_equal_to_the_question_points_at_offset_12__rfc1035_4_1_4() -> None:
    packed = message(WEB, [address_record(WEB, "10.96.0.20", 5)])
    question_end = 12 + 31 + 4
    assert packed[question_end : question_end + 2] == b"\xc0\x0c"
    assert DNSRecord.parse(packed).rr[0].rname == "web.default.svc.cluster.local."


def test_srv_target_is_not_compressed__rfc2782_but_its_glue_owner_is() -> None:
    srv_owner = (b"_http", b"_tcp") + WEB
    packed = message(srv_owner, [srv_record(srv_owner, 5, 0, 100, 80, WEB), address_record(WEB, "10.96.0.20", 5)])
    full_name = b"\x03web\x07default\x03svc\x07cluster\x05local\x00"
    assert packed.count(full_name) == 2  # in the question after _http._tcp, and written out in the SRV data
    assert b"\xc0\x17\x00\x01" in packed  # the glue A owner points into the question (12 + 6 + 5)
    parsed = DNSRecord.parse(packed)
    assert str(parsed.rr[0].rdata.target) == "web.default.svc.cluster.local." and str(parsed.rr[1].rname) == str(
        parsed.rr[0].rdata.target)


def test_names_in_cname_data_are_compressed_against_earlier_names() -> None:
    packed = message(WEB, [Record(WEB, T_CNAME, 5, ((b"other", b"default", b"svc") + ZONE,))])
    assert packed.endswith(b"\x05other\xc0\x10")  # "default.svc.cluster.local" of the question at 16


def test_compression_keeps_letter_case_apart() -> None:
    upper = (b"WEB",) + WEB[1:]
    packed = message(upper, [address_record(WEB, "10.96.0.20", 5)])
    assert DNSRecord.parse(packed).rr[0].rname.label == WEB  # not a pointer to "WEB..."


def test_no_pointer_to_offsets_beyond_14_bits() -> None:
    records = [Record(labels(f"n{i}.example"), T_TXT, 5, txt_data(b"x" * 200)) for i in range(90)]
    records.append(Record(labels("late.name.example"), T_TXT, 5, txt_data(b"y")))
    records.append(Record(labels("late.name.example"), T_TXT, 5, txt_data(b"z")))
    packed = message(WEB, records)
    assert len(packed) > 0x4000
    parsed = DNSRecord.parse(packed)
    assert [str(rr.rname) for rr in parsed.rr[-2:]] == ["late.name.example."] * 2
    late = packed.rindex(b"\x04late")
    assert late > 0x3FFF and packed[late + 19 : late + 21] != b"\xc0\x00"  # written out, then not pointed to


def test_record_ends_allow_cutting_the_message_after_any_record() -> None:
    packer = Packer(bytes(12), b"\x00\x00\x01\x00\x01", ())
    packer.records([address_record(WEB, "10.0.0.1", 5), address_record(WEB, "10.0.0.2", 5)])
    assert packer.ends[0] == 17 and packer.ends[-1] == len(packer.buffer) and len(packer.ends) == 3


@pytest.mark.parametrize("a, b, same", [
    pytest.param((b"Web", b"Local"), (b"web", b"local"), True, id="case_insensitive__rfc4343"),
    pytest.param((b"web",), (b"web", b"local"), False, id="different_length"),
    pytest.param((b"web", b"x"), (b"web", b"y"), False, id="different_label"),
])
def test_same_name(a: tuple[bytes, ...], b: tuple[bytes, ...], same: bool) -> None:
    assert same_name(a, b) is same

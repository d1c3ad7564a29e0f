"""A test upstream DNS server, authoritative for example.test, on UDP and TCP port 53.

Run inside the ext namespace (`ip netns exec <P>-ext python -I fake_upstream_dns.py`);
prints "ready" once both listeners are bound, then serves until killed. Every name of
example.test other than those in RECORDS is NXDOMAIN with the zone's SOA; names outside
example.test are REFUSED (a test must never depend on a real resolver). With ``--zone Z
--answer IP`` it is authoritative for Z instead, every name there an A record of IP (a stub
domain's server, as a Consul agent would be).
"""

from __future__ import annotations

import argparse
import sys
import threading

from dnslib import AAAA, QTYPE, RCODE, RR, SOA, A, DNSLabel
from dnslib.server import BaseResolver, DNSLogger, DNSServer

ZONE = DNSLabel("example.test.")
TTL = 300
RECORDS: dict[str, list[RR]] = {
    "www.example.test.": [RR("www.example.test.", QTYPE.A, rdata=A("203.0.113.7"), ttl=TTL),
                          RR("www.example.test.", QTYPE.AAAA, rdata=AAAA("2001:db8::7"), ttl=TTL)],
    "api.example.test.": [RR("api.example.test.", QTYPE.A, rdata=A("203.0.113.8"), ttl=TTL)],
    # TTL 1: expired from a cache within its 5 s minimum (serve_stale tests)
    "brief.example.test.": [RR("brief.example.test.", QTYPE.A, rdata=A("203.0.113.9"), ttl=1)],
    # 40 A records: 675 bytes, over the 512 of a client without EDNS.
    "many.example.test.": [RR("many.example.test.", QTYPE.A, rdata=A(f"198.51.100.{i}"), ttl=TTL)
                           for i in range(1, 41)],
}
ZONE_SOA = RR("example.test.", QTYPE.SOA, ttl=60, rdata=SOA(
    "ns.example.test.", "admin.example.test.", (1, 7200, 1800, 86400, 60)))


class StubZone(BaseResolver):
    """Every A question in ``zone`` answered with ``answer``; any other name REFUSED."""

    def __init__(self, zone: str, answer: str) -> None:
        self.zone = DNSLabel(zone)
        self.answer = answer

    def resolve(self, request, handler):
        reply = request.reply()
        if not request.q.qname.matchSuffix(self.zone):
            reply.header.rcode = RCODE.REFUSED
        elif request.q.qtype == QTYPE.A:
            reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(self.answer), ttl=TTL))
        return reply


class ExampleTest(BaseResolver):
    def resolve(self, request, handler):
        reply = request.reply()
        qname = request.q.qname
        if not qname.matchSuffix(ZONE):
            reply.header.rcode = RCODE.REFUSED
            return reply
        records = RECORDS.get(str(qname).lower())
        if records is None:
            reply.header.rcode = RCODE.NXDOMAIN
        for record in records or ():
            if request.q.qtype in (record.rtype, QTYPE.ANY):
                reply.add_answer(RR(qname, record.rtype, rdata=record.rdata, ttl=record.ttl))
        if not reply.rr:
            reply.add_auth(ZONE_SOA)
        return reply


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=53)
    parser.add_argument("--zone", help="serve this zone instead of example.test (with --answer)")
    parser.add_argument("--answer", default="198.51.100.53", help="the A record of every name of --zone")
    args = parser.parse_args()
    # Errors only, to stderr: stdout is a pipe the test stops reading after "ready".
    quiet = DNSLogger("-request,-reply,-truncated", prefix=False, logf=lambda line: print(line, file=sys.stderr))
    resolver = StubZone(args.zone, args.answer) if args.zone else ExampleTest()
    servers = [DNSServer(resolver, address=args.address, port=args.port, tcp=tcp, logger=quiet)
               for tcp in (False, True)]
    for server in servers:
        server.start_thread()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    threading.Event().wait()


if __name__ == "__main__":
    main()

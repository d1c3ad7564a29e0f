"""Stub domains: names under a zone forwarded to that zone's upstreams, the longest zone
winning as CoreDNS picks a server block (core/dnsserver/server.go ServeDNS), each zone with
its own forwarder and cache (a server block per stub domain, as NodeLocal DNSCache writes
them: kubernetes/dns cmd/node-cache/app/configmap.go), and the kube-dns ConfigMap's
``stubDomains`` / ``upstreamNameservers`` (kubernetes/dns pkg/dns/config/config.go) merged
in as NodeLocal DNSCache does. The server tests use real loopback sockets."""

from __future__ import annotations

import asyncio
import json

import pytest
from dnslib import QTYPE, RR, A, DNSRecord

from kubeport.dns.config import DnsConfig, DnsConfigError, parse_stub_domains
from kubeport.dns.forward.forwarder import upstream_label
from kubeport.dns.forward.zones import ZoneRoutes, zone_key
from kubeport.dns.kubedns import KubeDnsConfig, KubeDnsConfigError, merged, parse_kube_dns
from kubeport.dns.metrics import DnsCollector
from kubeport.dns.server import DnsServer
from kubeport.dns.settings import DnsSettings

from support.wait import until
from support.zonetext import question, read_reply


# --- the flag's syntax and the field's validation --------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("consul.local=10.150.0.1", {"consul.local": ["10.150.0.1"]}),
    ("Consul.Local.=10.150.0.1:5353;10.150.0.2", {"consul.local": ["10.150.0.1:5353", "10.150.0.2"]}),
    ("a.example=[fd00::53]:5353;fd00::54,b.example=192.0.2.1", {"a.example": ["[fd00::53]:5353", "fd00::54"],
                                                                "b.example": ["192.0.2.1"]}),
    (" corp = 192.0.2.1 ; , ", {"corp": ["192.0.2.1"]}),
])
def test_flag_syntax(text, expected) -> None:
    assert parse_stub_domains(text) == expected


@pytest.mark.parametrize("text, message", [
    ("consul.local", "'consul.local': expected ZONE=IP[:PORT][;IP[:PORT]...]"),
    ("consul.local=", "expected ZONE="),
    ("=10.0.0.1", "expected ZONE="),
    ("a=10.0.0.1,a=10.0.0.2", "zone 'a' is given twice"),
    ("a=10.0.0.300", "'10.0.0.300' is not an IP address"),
    ("a=10.0.0.1:99999", "port '99999' is outside 1..65535"),
    ("a=[fd00::1]x", "expected [IPv6]:PORT"),
])
def test_flag_syntax_errors(text, message) -> None:
    with pytest.raises(DnsConfigError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        parse_stub_domains(text)


@pytest.mark.parametrize("value, message", [
    ({"a..b": ["192.0.2.1"]}, "stubDomains\n  Value error, 'a..b' is not a domain name"),
    ({"under_score.example": ["192.0.2.1"]}, "'under_score.example' is not a domain name"),
    ({".": ["192.0.2.1"]}, "the root zone is the default upstreams'"),
    ({"svc.cluster.local": ["192.0.2.1"]}, "'svc.cluster.local' is in the cluster zone cluster.local"),
    ({"cluster.local": ["192.0.2.1"]}, "'cluster.local' is in the cluster zone"),
    ({"consul.local": []}, "zone consul.local: []: a stub domain needs a list of at least one IP[:PORT]"),
    ({"consul.local": ["consul.example"]}, "zone consul.local: upstream 'consul.example': 'consul.example' is not an IP"),
    ({"consul.local": ["192.0.2.1"], "CONSUL.local.": ["192.0.2.2"]}, "zone 'consul.local' is given twice"),
])
def test_field_errors_name_the_field_and_the_value(value, message) -> None:
    with pytest.raises(ValueError) as caught:
        DnsSettings(stubDomains=value)
    assert message in str(caught.value)


def test_field_into_the_server_config() -> None:
    settings = DnsSettings(stubDomains=["Consul.Local=10.150.0.1;10.150.0.1:53,corp=[fd00::53]"])
    config = DnsConfig.from_settings(dict(settings), addresses=("10.96.0.10",))
    assert config.stub_domains == (("consul.local", (("10.150.0.1", 53),)), ("corp", (("fd00::53", 53),)))


# --- routing ------------------------------------------------------------------------------------

ROUTES = ZoneRoutes("default", {zone_key("consul.local"): "consul", zone_key("dc1.consul.local"): "dc1",
                                zone_key("10.in-addr.arpa"): "ten"})


@pytest.mark.parametrize("name, target", [
    ("web.service.consul.local", "consul"),
    ("consul.local", "consul"),  # the zone's apex is in it
    ("WEB.Service.DC1.Consul.Local", "dc1"),  # the longest zone wins, any case
    ("dc1.consul.local", "dc1"),
    ("xconsul.local", "default"),  # a suffix of a label is not a zone
    ("local", "default"),
    ("www.example.com", "default"),
    ("7.0.0.10.in-addr.arpa", "ten"),
    ("7.0.0.11.in-addr.arpa", "default"),
    ("", "default"),  # the root
])
def test_longest_zone_wins(name, target) -> None:
    labels = tuple(label.encode() for label in name.split(".") if label)
    assert ROUTES.route(labels) == target


def test_zones_as_the_cache_metrics_name_them() -> None:
    assert [zone for zone, _ in ROUTES] == [".", "10.in-addr.arpa.", "consul.local.", "dc1.consul.local."]


@pytest.mark.parametrize("upstream, label", [
    (("10.150.0.1", 53), "10.150.0.1:53"),
    (("fd00::53", 5353), "[fd00::53]:5353"),  # net.JoinHostPort, as CoreDNS's `to`
])
def test_to_label(upstream, label) -> None:
    assert upstream_label(upstream) == label


# --- the kube-dns ConfigMap -----------------------------------------------------------------------

@pytest.mark.parametrize("data, expected", [
    (None, KubeDnsConfig()),
    ({}, KubeDnsConfig()),
    ({"federations": '{"x": "y.example"}'}, KubeDnsConfig()),  # not kubeport's business
    ({"stubDomains": '{"acme.local": ["1.2.3.4"], "corp": ["[fd00::53]:5353", "1.2.3.5:54"]}',
      "upstreamNameservers": '["8.8.8.8", "8.8.4.4:53"]'},
     KubeDnsConfig((("acme.local", (("1.2.3.4", 53),)), ("corp", (("fd00::53", 5353), ("1.2.3.5", 54)))),
                   (("8.8.8.8", 53), ("8.8.4.4", 53)))),
    ({"stubDomains": "", "upstreamNameservers": " "}, KubeDnsConfig()),
])
def test_kube_dns_data(data, expected) -> None:
    assert parse_kube_dns(data, "cluster.local") == expected


@pytest.mark.parametrize("data, message", [
    ({"stubDomains": '{"acme.local": ["1.2.3.4"]'}, "stubDomains: '{\"acme.local\": [\"1.2.3.4\"]': not JSON"),
    ({"stubDomains": '["1.2.3.4"]'}, "stubDomains: '[\"1.2.3.4\"]': not a JSON object of zone"),
    ({"stubDomains": '{"acme.local": "1.2.3.4"}'}, "stubDomains[acme.local]: \"1.2.3.4\": not a non-empty list"),
    ({"stubDomains": '{"acme.local": []}'}, "stubDomains[acme.local]: []: not a non-empty list"),
    ({"stubDomains": '{"acme..local": ["1.2.3.4"]}'}, "stubDomains: 'acme..local' is not a domain name"),
    ({"stubDomains": '{"acme.local": ["1.2.3.400"]}'}, "stubDomains[acme.local]: '1.2.3.400' is not an IP address"),
    ({"stubDomains": '{"acme.local": ["1.2.3.4:0"]}'}, "stubDomains[acme.local]: '1.2.3.4:0': port '0' is outside"),
    ({"upstreamNameservers": '"8.8.8.8"'}, "upstreamNameservers: '\"8.8.8.8\"': not a JSON list"),
    ({"upstreamNameservers": '["1.1.1.1", "1.0.0.1", "8.8.8.8", "8.8.4.4"]'}, "4 entries: at most 3"),
])
def test_kube_dns_bad_data(data, message) -> None:
    with pytest.raises(KubeDnsConfigError) as caught:
        parse_kube_dns(data, "cluster.local")
    assert message in str(caught.value)


OWN = DnsConfig(upstreams=(("192.0.2.53", 53),), stub_domains={"consul.local": ["10.0.0.1"]})
BARE = DnsConfig()
CLUSTER = KubeDnsConfig((("consul.local", (("10.9.9.9", 53),)), ("corp", (("10.0.0.2", 53),))),
                        (("8.8.8.8", 53),))


@pytest.mark.parametrize("config, stubs, upstreams", [
    pytest.param(OWN, (("consul.local", (("10.0.0.1", 53),)), ("corp", (("10.0.0.2", 53),))),
                 (("192.0.2.53", 53),), id="own_zones_and_upstreams_win"),
    pytest.param(BARE, CLUSTER.stub_domains, (("8.8.8.8", 53),), id="upstreamNameservers_replace_resolv_conf"),
])
def test_merge(config, stubs, upstreams) -> None:
    result = merged(config, CLUSTER)
    assert result.stub_domains == stubs and result.upstreams == upstreams


# --- the server: each zone to its own upstream and cache -------------------------------------------

class Upstream(asyncio.DatagramProtocol):
    """Answers every A question with its own address, TTL 300, and counts them."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.asked: list[str] = []
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        request = DNSRecord.parse(data)
        reply = request.reply()
        if request.q.qtype == QTYPE.A:
            self.asked.append(str(request.q.qname).lower())
            reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(self.answer), ttl=300))
        self.transport.sendto(reply.pack(), addr)

    @property
    def address(self) -> tuple[str, int]:
        return self.transport.get_extra_info("sockname")[:2]


class Client(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.replies: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr) -> None:
        self.replies.put_nowait(data)


async def ask(server: DnsServer, name: str) -> str:
    loop = asyncio.get_running_loop()
    transport, client = await loop.create_datagram_endpoint(Client, remote_addr=("127.0.0.1", server.port))
    try:
        transport.sendto(question(name))
        reply = read_reply(await asyncio.wait_for(client.replies.get(), 8))
        return reply.answer[0].split()[-1] if reply.answer else reply.rcode
    finally:
        transport.close()


@pytest.fixture
async def rig():
    loop = asyncio.get_running_loop()
    upstreams = {}
    for name, answer in (("default", "192.0.2.1"), ("consul", "192.0.2.2"), ("dc1", "192.0.2.3")):
        _, upstreams[name] = await loop.create_datagram_endpoint(lambda a=answer: Upstream(a),
                                                                 local_addr=("127.0.0.1", 0))
    config = DnsConfig(addresses=("127.0.0.1",), port=0, upstreams=(upstreams["default"].address,),
                       upstream_timeout=0.5, stub_domains={"consul.local": [f"127.0.0.1:{upstreams['consul'].address[1]}"]})
    server = DnsServer(config)
    await server.start()
    yield server, upstreams
    await server.stop()
    for upstream in upstreams.values():
        upstream.transport.close()


async def test_each_zone_reaches_its_upstream_and_its_own_cache(rig) -> None:
    server, upstreams = rig
    assert await ask(server, "web.service.consul.local") == "192.0.2.2"
    assert await ask(server, "www.example.com") == "192.0.2.1"
    assert await ask(server, "web.service.consul.local") == "192.0.2.2"  # cached: asked once
    assert upstreams["consul"].asked == ["web.service.consul.local."]
    assert upstreams["default"].asked == ["www.example.com."]
    caches = {zone: len(forwarder.cache) for zone, forwarder in server.forwarders}
    assert caches == {".": 1, "consul.local.": 1}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for family in DnsCollector(server).collect()
               for s in family.samples}
    consul_to = f"127.0.0.1:{upstreams['consul'].address[1]}"
    assert samples[("coredns_forward_requests_total", (("to", consul_to),))] == 1
    assert samples[("coredns_cache_entries", (("server", f"dns://:{server.port}"), ("type", "success"),
                                              ("view", ""), ("zones", "consul.local.")))] == 1


async def test_kube_dns_changes_live_and_bad_data_keeps_the_last_good(rig) -> None:
    server, upstreams = rig
    dc1 = f"127.0.0.1:{upstreams['dc1'].address[1]}"
    assert await ask(server, "db.dc1.consul.local") == "192.0.2.2"  # the consul.local zone, cached there
    server.kube_dns_changed({"stubDomains": json.dumps({"dc1.consul.local": [dc1]})})
    await until(lambda: len(list(server.forwarders)) == 3, "the ConfigMap's zone applied")
    # the longer zone now wins; the answer cached for consul.local does not answer for it
    assert await ask(server, "db.dc1.consul.local") == "192.0.2.3"
    server.kube_dns_changed({"stubDomains": '{"dc1.consul.local": ['})
    assert server.problems and server.problems[0].startswith(
        "ConfigMap kube-system/kube-dns: stubDomains: '{\"dc1.consul.local\": [': not JSON")
    assert "keeping the last good settings (stub domains: dc1.consul.local" in server.problems[0]
    assert await ask(server, "x.dc1.consul.local") == "192.0.2.3"
    server.kube_dns_changed(None)  # deleted: the defaults, the flags' zone stays
    assert not server.problems
    await until(lambda: len(list(server.forwarders)) == 2, "the ConfigMap's zone gone")
    assert await ask(server, "y.dc1.consul.local") == "192.0.2.2"

"""Helpers for tests of kubeport.dns: clusters from manifest-like dicts, questions, zone text.

Kept in the package (not in tests/) so unit and integration tests share them; nothing
here is used at run time.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from dnslib import EDNS0, QTYPE, DNSRecord

from kubeport.dns.encode import Packer, Record
from kubeport.dns.wire import RCODE_NAMES
from kubeport.endpoints import model
from kubeport.endpoints.state import ClusterState
from kubeport.endpoints.types import Snapshot


def service(name: str, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    return {"kind": "Service", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def endpoint_slice(service_name: str, namespace: str = "default", *, name: str | None = None,
                   address_type: str = "IPv4", endpoints: Iterable[dict[str, Any] | str] = (),
                   ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An EndpointSlice; endpoints may be plain addresses (ready) or full endpoint dicts."""
    items = [{"addresses": [e]} if isinstance(e, str) else e for e in endpoints]
    body: dict[str, Any] = {
        "kind": "EndpointSlice",
        "metadata": {"name": name or f"{service_name}-{address_type.lower()}", "namespace": namespace,
                     "labels": {model.LABEL_SERVICE_NAME: service_name}},
        "addressType": address_type,
        "endpoints": items,
    }
    if ports is not None:
        body["ports"] = ports
    return body


def namespace(name: str) -> dict[str, Any]:
    return {"kind": "Namespace", "metadata": {"name": name}}


def to_model(obj: dict[str, Any]) -> model.KubeObject:
    return model.KIND_MODELS[obj["kind"]].model_validate(obj)  # type: ignore[return-value]


def cluster_state(objects: Iterable[dict[str, Any]], *, synced: bool = True) -> ClusterState:
    state = ClusterState("node-1", implicit_namespaces=True)
    for obj in objects:
        state.upsert(to_model(obj))
    if synced:
        state.mark_synced("Service")
        state.mark_synced("EndpointSlice")
    return state


def snapshot_of(objects: Iterable[dict[str, Any]], *, synced: bool = True) -> Snapshot:
    state = cluster_state(objects, synced=synced)
    state.commit()
    return state.snapshot


def question(name: str, qtype: str | int = "A", *, query_id: int = 4660, rd: bool = True,
             edns: int | None = None, do: bool = False, options: Iterable[Any] = ()) -> bytes:
    """A query packet as a stub resolver sends it (RD set, no EDNS unless asked)."""
    record = DNSRecord.question(name, qtype if isinstance(qtype, str) else QTYPE.get(qtype))
    record.header.id = query_id
    record.header.rd = int(rd)
    if edns is not None:
        record.add_ar(EDNS0(udp_len=edns, flags="do" if do else "", opts=list(options)))
    return bytes(record.pack())


@dataclass(frozen=True)
class Reply:
    """A reply as zone text: ``"web.default.svc.cluster.local. 5 IN A 10.96.0.20"``."""

    rcode: str
    answer: tuple[str, ...]
    authority: tuple[str, ...]
    additional: tuple[str, ...]
    flags: frozenset[str]
    id: int
    size: int
    edns: tuple[int, bool] | None  # (udp size, DO) of the OPT record

    @property
    def records(self) -> int:
        return len(self.answer)


def zone_line(rr: Any) -> str:
    return " ".join(rr.toZone().split())


def record_lines(records: Iterable[Record]) -> list[str]:
    """Records (kubeport.dns.encode) as zone text lines, through the wire and dnslib."""
    records = list(records)
    packer = Packer(struct.pack("!HHHHHH", 0, 0x8000, 0, len(records), 0, 0), b"", ())
    packer.records(records)
    return [zone_line(rr) for rr in DNSRecord.parse(bytes(packer.buffer)).rr]


def read_reply(packet: bytes) -> Reply:
    record = DNSRecord.parse(packet)
    header = record.header
    flags = frozenset(name for name in ("qr", "aa", "tc", "rd", "ra", "ad", "cd") if getattr(header, name))
    opt = [rr for rr in record.ar if rr.rtype == 41]
    edns = None
    rcode = header.rcode
    if opt:
        ttl = opt[0].ttl
        edns = (opt[0].rclass, bool(ttl & 0x8000))
        rcode |= (ttl >> 24) << 4
    return Reply(
        rcode=RCODE_NAMES.get(rcode, str(rcode)),
        answer=tuple(zone_line(rr) for rr in record.rr),
        authority=tuple(zone_line(rr) for rr in record.auth),
        additional=tuple(zone_line(rr) for rr in record.ar if rr.rtype != 41),
        flags=flags,
        id=header.id,
        size=len(packet),
        edns=edns,
    )


def header_only(packet: bytes) -> tuple[int, int, str, tuple[int, int, int, int]]:
    """(id, flags, rcode name, section counts) of any reply, even one dnslib cannot parse."""
    query_id, flags, qd, an, ns, ar = struct.unpack_from("!HHHHHH", packet)
    return query_id, flags, RCODE_NAMES.get(flags & 0xF, str(flags & 0xF)), (qd, an, ns, ar)


class LoopbackDnsPort:
    """UDP and TCP on one 127.0.0.1 port, each query answered by ``reply(proto, packet)``
    (None: no answer): the serving half of the tests' fake upstreams."""

    def __init__(self, reply: Callable[[str, bytes], bytes | None]):
        self._reply = reply
        self.port = 0
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        reply = self._reply

        class Udp(asyncio.DatagramProtocol):
            def connection_made(self, transport):
                self.transport = transport

            def datagram_received(self, data, addr):
                answer = reply("udp", data)
                if answer is not None:
                    self.transport.sendto(answer, addr)

        async def tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    size = int.from_bytes(await reader.readexactly(2), "big")
                    answer = reply("tcp", await reader.readexactly(size))
                    if answer is not None:
                        writer.write(len(answer).to_bytes(2, "big") + answer)
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()

        for _ in range(20):  # a free UDP port may be taken for TCP: try another
            self._udp, _ = await loop.create_datagram_endpoint(Udp, local_addr=("127.0.0.1", 0))
            self.port = self._udp.get_extra_info("sockname")[1]
            try:
                self._tcp = await asyncio.start_server(tcp, "127.0.0.1", self.port)
                return
            except OSError:
                self._udp.close()
        raise RuntimeError("no port free for both UDP and TCP")

    async def stop(self) -> None:
        self._udp.close()
        self._tcp.close()
        await self._tcp.wait_closed()

"""Test support for the proxy: slim snapshot builders, loopback relays and backends, uvloop runs.

Shipped with the package so that every test module (and the lead's) can use it; nothing in the
proxy itself imports it.
"""

from __future__ import annotations

import asyncio
import functools
import random
from types import MappingProxyType
from typing import Iterable

import uvloop

from kubeport.endpoints.types import (
    EndpointInfo,
    EndpointPortInfo,
    NodeInfo,
    PortEndpoint,
    PortSpec,
    ServiceInfo,
    ServiceName,
    ServicePortName,
    ServiceState,
    SliceInfo,
    Snapshot,
)


def port(port: int, *, name: str = "", protocol: str = "TCP", target: int | str | None = None,
         node_port: int = 0) -> PortSpec:
    return PortSpec(name=name, protocol=protocol, port=port, target_port=target if target is not None else port,
                    node_port=node_port)


def service(name: str, cluster_ips: Iterable[str], ports: Iterable[PortSpec], *, namespace: str = "default",
            type: str = "ClusterIP", **fields) -> ServiceInfo:
    cluster_ips = tuple(cluster_ips)
    return ServiceInfo(
        name=ServiceName(namespace, name), uid=f"uid-{name}", type=type, cluster_ips=cluster_ips,
        headless=fields.pop("headless", False), external_name=fields.pop("external_name", None),
        ports=tuple(ports), **fields,
    )


def endpoint(address: str, *, node: str | None = "node-a", ready: bool = True, serving: bool | None = None,
             terminating: bool = False, zone: str | None = None) -> EndpointInfo:
    return EndpointInfo(address=address, ready=ready, serving=ready if serving is None else serving,
                        terminating=terminating, node_name=node, zone=zone)


def endpoint_slice(name: str, endpoints: Iterable[EndpointInfo], ports: Iterable[tuple[str, str, int]],
                   address_type: str = "IPv4") -> SliceInfo:
    return SliceInfo(name=name, address_type=address_type,
                     ports=tuple(EndpointPortInfo(n, p, num) for n, p, num in ports),
                     endpoints=tuple(endpoints))


def snapshot(states: Iterable[ServiceState], *, generation: int = 1, node: NodeInfo | None = None,
             synced: bool = True, previous: Snapshot | None = None) -> Snapshot:
    services = {s.service.name: s for s in states}
    if previous is not None:
        names = set(services) | set(previous.services)
        changed = frozenset(n for n in names if services.get(n) != previous.services.get(n))
        generation = previous.generation + 1
    else:
        changed = frozenset(services)
    return Snapshot(
        generation=generation,
        services=MappingProxyType(services),
        node=node if node is not None else NodeInfo(name="node-a"),
        synced=synced,
        changed=changed,
        node_changed=previous is None or (node is not None and node != previous.node),
    )


# --- running on loopback (relay and Proxier tests) ------------------------------------------------

DEADLINE = 10.0


def on_uvloop(test):
    """Run an async test on uvloop, as the daemon runs (to pytest-asyncio it is a sync test)."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        return uvloop.run(test(*args, **kwargs))

    return run


async def until(condition, what: str, deadline: float = DEADLINE) -> None:
    """Wait for ``condition()`` to hold, checking on every loop turn; fail after ``deadline``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not condition():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


class LoopbackRelay:
    """A TcpListener on 127.0.0.1:<ephemeral> in front of the given (ip, port) endpoints."""

    def __init__(self, endpoints: list[tuple[str, int]], **config) -> None:
        from kubeport.proxy.balancer import Balancer, Route, ServicePortPool
        from kubeport.proxy.config import ProxyConfig
        from kubeport.proxy.relay.context import RelayContext
        from kubeport.proxy.relay.tcp import TcpListener
        from kubeport.proxy.table import Frontend

        config.setdefault("seed", 1)
        self.config = ProxyConfig(**config)
        self.fatal: list[BaseException] = []
        self.ctx = RelayContext(asyncio.get_running_loop(), self.config, on_fatal=self.fatal.append)
        name = ServicePortName(ServiceName("default", "web"), "", "TCP")
        balancer = Balancer(random.Random(self.config.seed), eject_after=self.config.eject_after_failures)
        self.pool = ServicePortPool(name, balancer)
        wanted = [PortEndpoint(endpoint(ip), number) for ip, number in endpoints]
        self.pool.sync(wanted)
        route = Route(self.pool, self.pool.states(wanted))
        self.listener = TcpListener(self.ctx, Frontend("127.0.0.1", 0, "TCP"), route)
        self.listener.open()
        self.address = self.listener.sock.getsockname()

    @property
    def stats(self):
        return self.pool.stats

    def close(self) -> None:
        self.listener.close()
        for conn in list(self.ctx.conns):
            conn.abort()
        self.ctx.close()


class Backends:
    """Named servers on 127.0.0.1: TCP answers "<name>\\n" then echoes; UDP answers "<name> <data>"."""

    def __init__(self) -> None:
        self.servers: list = []
        self.transports: list = []

    async def tcp(self, name: str) -> int:
        async def handle(reader, writer):
            writer.write(name.encode() + b"\n")
            try:
                while data := await reader.read(65536):
                    writer.write(data)
            except ConnectionError:
                pass
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.servers.append(server)
        return server.sockets[0].getsockname()[1]

    async def udp(self, name: str) -> int:
        class Echo(asyncio.DatagramProtocol):
            def connection_made(self, transport):
                self.transport = transport

            def datagram_received(self, data, addr):
                self.transport.sendto(name.encode() + b" " + data, addr)

        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(Echo, local_addr=("127.0.0.1", 0))
        self.transports.append(transport)
        return transport.get_extra_info("sockname")[1]

    def close(self) -> None:
        for server in self.servers:
            server.close()
        for transport in self.transports:
            transport.close()


async def start_proxier(*, leftover_addresses=(), capture=True, **config):
    """A started Proxier (ProxyWorkers with ``workers`` > 1) with fake addresses (node: 127.0.0.1,
    ::1; ``leftover_addresses`` as a predecessor left them) and a fake firewall (``capture``:
    with policy routing for externalIPs and LB IPs, see capture.py)."""
    from kubeport.proxy.config import ProxyConfig
    from kubeport.proxy.host.addresses import FakeAddresses
    from kubeport.proxy.host.nftables import FakeFirewall
    from kubeport.proxy.workers import create_proxier

    config.setdefault("seed", 1)
    config.setdefault("nodeport_addresses", ("primary", "localhost"))
    addresses = FakeAddresses(["127.0.0.1", "::1"], owned=leftover_addresses)
    firewall = FakeFirewall()
    firewall.can_capture = capture
    proxier = create_proxier(ProxyConfig(**config), "node-a", addresses=addresses, firewall=firewall)
    await proxier.start(extra_addresses=["127.0.0.53"])
    return proxier, addresses, firewall

"""Generators shared by the DNS and control-plane benchmarks: N services x M endpoints as
manifests, the same services as zone records, and dnsperf query files."""

from __future__ import annotations

import ipaddress
import json
import random
from collections.abc import Iterable
from pathlib import Path

NAMESPACE = "bench"
ZONE = "cluster.local"
CLUSTER_IP_BASE = ipaddress.ip_address("10.100.0.0")  # inside 10.96.0.0/12, clear of 10.96.0.10 (DNS)
POD_IP_BASE = ipaddress.ip_address("10.200.0.0")  # 10.200.0.0/14: room for 262,144 endpoints
SERVICE_PORT = 80
TARGET_PORT = 8080


def cluster_ip(i: int) -> str:
    return str(CLUSTER_IP_BASE + i + 1)


def pod_ip(i: int, j: int, per_service: int) -> str:
    return str(POD_IP_BASE + i * per_service + j + 1)


def service_name(i: int) -> str:
    return f"svc-{i}"


def fqdn(name: str, namespace: str = NAMESPACE) -> str:
    return f"{name}.{namespace}.svc.{ZONE}."


def service(name: str, ip: str | None, ports: list[dict], namespace: str = NAMESPACE,
            headless: bool = False) -> dict:
    spec: dict = {"ports": ports, "type": "ClusterIP"}
    if headless:
        spec["clusterIP"] = "None"
    elif ip:
        spec["clusterIP"] = ip
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
            "spec": spec}


def endpoint_slice(service_name_: str, addresses: Iterable[str], ports: list[dict],
                   namespace: str = NAMESPACE, suffix: str = "s1", node: str | None = None) -> dict:
    endpoints = []
    for address in addresses:
        endpoint: dict = {"addresses": [address], "conditions": {"ready": True, "serving": True, "terminating": False}}
        if node:
            endpoint["nodeName"] = node
        endpoints.append(endpoint)
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{service_name_}-{suffix}", "namespace": namespace,
                         "labels": {"kubernetes.io/service-name": service_name_}},
            "addressType": "IPv4", "endpoints": endpoints, "ports": ports}


def spread(total: int, services: int) -> tuple[int, int]:
    """``total`` endpoints over ``services`` as evenly as whole numbers allow: (q, r), the first r
    services get q + 1, the others q (5,006 services, 250,011 endpoints: 4,717 x 50 + 289 x 49)."""
    return divmod(total, services)


def endpoint_count(i: int, spread_: tuple[int, int]) -> int:
    q, r = spread_
    return q + 1 if i < r else q


def first_pod(i: int, spread_: tuple[int, int]) -> int:
    """Index of service ``i``'s first endpoint when the endpoints are numbered service by service."""
    q, r = spread_
    return i * q + min(i, r)


def http_service_objects(i: int, endpoints_per_service: int, first: int | None = None) -> list[dict]:
    """Service ``i``; its endpoints are pods ``first``.. (default: as if every service had
    ``endpoints_per_service``, the addresses pod_ip gives)."""
    name = service_name(i)
    objects = [service(name, cluster_ip(i), [{"name": "http", "port": SERVICE_PORT,
                                              "targetPort": TARGET_PORT, "protocol": "TCP"}])]
    if endpoints_per_service:
        first = i * endpoints_per_service if first is None else first
        addresses = (str(POD_IP_BASE + first + j + 1) for j in range(endpoints_per_service))
        objects.append(endpoint_slice(name, addresses, [{"name": "http", "port": TARGET_PORT, "protocol": "TCP"}]))
    return objects


def write_list(path: Path, objects: list[dict]) -> None:
    """A `kind: List` JSON manifest, written atomically (rename) so a watcher never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.parent / f".{path.name}.tmp"
    temporary.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    temporary.rename(path)


def write_cluster(directory: Path, services: int, endpoints_per_service: int, per_file: int = 500,
                  total_endpoints: int | None = None) -> None:
    """``services`` ClusterIP services with ``endpoints_per_service`` ready endpoints each or, given
    ``total_endpoints``, that many spread over them (``spread``)."""
    shares = spread(total_endpoints, services) if total_endpoints is not None else (endpoints_per_service, 0)
    for start in range(0, services, per_file):
        objects: list[dict] = []
        for i in range(start, min(services, start + per_file)):
            objects.extend(http_service_objects(i, endpoint_count(i, shares), first_pod(i, shares)))
        write_list(directory / f"services-{start // per_file:04d}.json", objects)


def zone_records(services: int, ttl: int = 5) -> list[str]:
    """What the CoreDNS kubernetes plugin answers for those services: A and the named port's SRV."""
    records = []
    for i in range(services):
        name = fqdn(service_name(i))
        records.append(f"{name} {ttl} IN A {cluster_ip(i)}")
        records.append(f"_http._tcp.{name} {ttl} IN SRV 0 100 {SERVICE_PORT} {name}")
    return records


def cluster_queries(services: int, count: int = 20000, seed: int = 7) -> list[str]:
    """dnsperf lines: 80% A of a service, 10% SRV of its port, 10% NXDOMAIN."""
    rng = random.Random(seed)
    lines = []
    for k in range(count):
        kind = k % 10
        i = rng.randrange(services)
        if kind < 8:
            lines.append(f"{fqdn(service_name(i))} A")
        elif kind == 8:
            lines.append(f"_http._tcp.{fqdn(service_name(i))} SRV")
        else:
            lines.append(f"nx-{k}.{NAMESPACE}.svc.{ZONE}. A")
    rng.shuffle(lines)
    return lines


def external_records(count: int, domain: str = "example.com", ttl: int = 3600) -> list[str]:
    return [f"host-{i}.{domain}. {ttl} IN A {ipaddress.ip_address('192.0.2.0') + (i % 250) + 1}"
            for i in range(count)]


def external_queries(count: int, domain: str = "example.com") -> list[str]:
    return [f"host-{i}.{domain}. A" for i in range(count)]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path

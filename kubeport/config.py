"""The daemon's configuration: one validated object, built once at start.

Field names follow KubeProxyConfiguration (``hostnameOverride``, ``healthzBindAddress``,
``nodePortAddresses`` ...) where kube-proxy has the same setting, and the CoreDNS
kubernetes plugin's options for the DNS part. Flags map onto these fields.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field."""


class _Section(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class SourceConfig(_Section):
    manifests: Path | None = Field(None, description="Directory of manifests (the embedded default).")
    kubeconfig: Path | None = Field(None, description="kubeconfig of a real kube-apiserver.")
    in_cluster: bool = Field(False, description="Use the pod's service account to reach the API server.")

    @model_validator(mode="after")
    def _exactly_one(self) -> "SourceConfig":
        chosen = [self.manifests is not None, self.kubeconfig is not None, self.in_cluster]
        if sum(chosen) > 1:
            raise ValueError("source: choose one of manifests, kubeconfig, inCluster")
        return self


class DnsSettings(_Section):
    cluster_domain: str = Field("cluster.local", description="The cluster zone (CoreDNS `kubernetes <zone>`).")
    addresses: list[str] = Field(
        default_factory=list,
        description="Listen addresses; default the 10th address of the first service range (kube-dns).",
    )
    port: int = Field(53, ge=1, le=65535, description="UDP and TCP port of the DNS server.")
    upstreams: list[str] = Field(
        default_factory=list,
        description="IP[:PORT] upstream resolvers; default the host's resolv.conf minus loopback stubs.",
    )
    ttl: int = Field(5, ge=0, le=3600, description="TTL of cluster records (CoreDNS `ttl`).")
    pods: Literal["disabled", "insecure", "verified"] = Field("disabled", description="CoreDNS `pods` mode.")
    endpoint_pod_names: bool = Field(False, description="CoreDNS `endpoint_pod_names`.")

    @field_validator("cluster_domain")
    @classmethod
    def _strip_dot(cls, value: str) -> str:
        return value.strip(".").lower()


class KubeportConfiguration(_Section):
    """Everything `kubeport run` needs; validated once, never mutated."""

    hostname_override: str = Field(
        default_factory=socket.gethostname, description="This node's name (its Node object)."
    )
    source: SourceConfig = Field(default_factory=SourceConfig)
    service_cluster_ip_range: list[IPNetwork] = Field(
        default_factory=lambda: [ipaddress.ip_network("10.96.0.0/12")],
        description="One CIDR, or two (one per family) for dual-stack.",
    )
    service_node_port_range: tuple[int, int] = Field((30000, 32767), description="Inclusive NodePort range.")
    node_port_addresses: list[str] = Field(
        default_factory=lambda: ["primary"],
        description="primary | localhost | all | CIDRs: where NodePorts listen (kube-proxy's nodePortAddresses).",
    )
    cluster_cidr: list[IPNetwork] = Field(
        default_factory=list,
        description="Pod CIDRs: sources treated as in-cluster for externalTrafficPolicy Local (detectLocalMode ClusterCIDR).",
    )
    state_dir: Path = Field(Path("/var/lib/kubeport"), description="Where allocations persist.")
    healthz_bind_address: str = Field("0.0.0.0:10256", description="/healthz, /livez, /readyz.")
    metrics_bind_address: str = Field("127.0.0.1:10249", description="/metrics and the `kubeport get` status API.")
    vip_interface: str = Field("lo", description="Link that carries ClusterIP/externalIP/LB addresses.")
    udp_idle_timeout: float = Field(30.0, gt=0, description="Seconds a UDP flow lives without traffic.")
    dns: DnsSettings = Field(default_factory=DnsSettings)

    @field_validator("service_cluster_ip_range")
    @classmethod
    def _ranges(cls, ranges: list[IPNetwork]) -> list[IPNetwork]:
        if not 1 <= len(ranges) <= 2:
            raise ValueError("one CIDR, or two of different families")
        if len(ranges) == 2 and ranges[0].version == ranges[1].version:
            raise ValueError("two CIDRs must be of different IP families")
        return ranges

    @field_validator("service_node_port_range")
    @classmethod
    def _port_range(cls, value: tuple[int, int]) -> tuple[int, int]:
        low, high = value
        if not (1 <= low <= high <= 65535):
            raise ValueError(f"invalid port range {low}-{high}")
        return value

    @field_validator("healthz_bind_address", "metrics_bind_address")
    @classmethod
    def _host_port(cls, value: str) -> str:
        split_host_port(value)
        return value

    @property
    def dns_addresses(self) -> list[str]:
        if self.dns.addresses:
            return list(self.dns.addresses)
        return [str(self.service_cluster_ip_range[0].network_address + 10)]


def split_host_port(value: str) -> tuple[str, int]:
    """'0.0.0.0:10256' / '[::]:10256' -> (host, port); ValueError naming the value."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r} is not HOST:PORT")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{value!r}: {host!r} is not an IP address") from None
    return host, int(port)


def parse_port_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ConfigError(f"--service-node-port-range: {text!r} is not LOW-HIGH")
    return int(low), int(high)


def parse_cidrs(text: str, flag: str) -> list[IPNetwork]:
    try:
        return [ipaddress.ip_network(part.strip(), strict=True) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from None

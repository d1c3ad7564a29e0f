"""The daemon's configuration: one validated object, built once at start.

The file format is a versioned YAML document::

    apiVersion: kubeport.io/v1alpha1
    kind: KubeportConfiguration

Proxy fields reuse KubeProxyConfiguration's names and meanings (``hostnameOverride``,
``healthzBindAddress``, ``nodePortAddresses``, ``clientConnection.kubeconfig``,
``conntrack.udpTimeout`` ...); the ``dns`` section mirrors the CoreDNS kubernetes
plugin's options. Flags override the file. Unknown fields are errors naming the field.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

API_VERSION = "kubeport.io/v1alpha1"
KIND = "KubeportConfiguration"

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field (and the file)."""


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any) -> float:
    """A Go duration ("30s", "1m30s", "500ms") or a number of seconds -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not a duration like 30s or 1m30s")
    text, total, position = value.strip(), 0.0, 0
    if text == "0":
        return 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        position = match.end()
    if position != len(text):
        raise ValueError(f"{value!r} is not a duration like 30s or 1m30s")
    return total


def format_duration(seconds: float) -> str:
    if seconds and seconds == int(seconds):
        whole = int(seconds)
        hours, rest = divmod(whole, 3600)
        minutes, secs = divmod(rest, 60)
        return "".join(f"{n}{u}" for n, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if n) or "0s"
    return f"{seconds * 1000:g}ms"


Duration = Annotated[float, BeforeValidator(parse_duration), PlainSerializer(format_duration, return_type=str)]


def _cidr_list(value: Any) -> Any:
    # kube-proxy's clusterCIDR is a comma-separated string; a YAML list is accepted too.
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


CIDRList = Annotated[
    list[IPNetwork],
    BeforeValidator(_cidr_list),
    PlainSerializer(lambda nets: ",".join(str(n) for n in nets), return_type=str),
]


def _port_range(value: Any) -> Any:
    if isinstance(value, str):
        low, sep, high = value.partition("-")
        if not sep or not low.strip().isdigit() or not high.strip().isdigit():
            raise ValueError(f"{value!r} is not LOW-HIGH")
        return (int(low), int(high))
    return value


PortRange = Annotated[
    tuple[int, int],
    BeforeValidator(_port_range),
    PlainSerializer(lambda r: f"{r[0]}-{r[1]}", return_type=str),
]


class _Section(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class ClientConnection(_Section):
    kubeconfig: Path | None = Field(None, description="kubeconfig of a real kube-apiserver.")


class Conntrack(_Section):
    udp_timeout: Duration = Field(
        30.0, gt=0, description="How long a UDP flow lives without traffic (conntrack's nf_conntrack_udp_timeout)."
    )
    udp_stream_timeout: Duration = Field(
        120.0, gt=0, description="The same for a flow the endpoint answered and still in use 2 s after it began "
        "(nf_conntrack_udp_timeout_stream)."
    )


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
    cache_size: int = Field(9984, ge=0, description="Entries of the upstream answer cache (CoreDNS cache size).")
    cache_max_ttl: Duration = Field(3600.0, ge=0, alias="cacheMaxTTL", description="Cap on TTLs of cached upstream answers.")
    cache_max_denial_ttl: Duration = Field(1800.0, ge=0, alias="cacheMaxDenialTTL", description="Cap on TTLs of cached negative answers.")
    lame_duck: Duration = Field(5.0, ge=0, description="Keep answering this long after SIGTERM (CoreDNS health lameduck).")

    @field_validator("cluster_domain")
    @classmethod
    def _strip_dot(cls, value: str) -> str:
        return value.strip(".").lower()

    @field_validator("addresses")
    @classmethod
    def _ips(cls, values: list[str]) -> list[str]:
        return [str(ipaddress.ip_address(v)) for v in values]

    @field_validator("upstreams")
    @classmethod
    def _upstreams(cls, values: list[str]) -> list[str]:
        from kubeport.dns.config import DnsConfigError, parse_upstream

        for value in values:
            try:
                parse_upstream(value)
            except DnsConfigError as exc:
                raise ValueError(str(exc)) from None
        return values


class KubeportConfiguration(_Section):
    """Everything `kubeport run` needs; validated once, never mutated."""

    api_version: Literal["kubeport.io/v1alpha1"] = Field(API_VERSION, description="The file format version.")
    kind: Literal["KubeportConfiguration"] = KIND
    hostname_override: str = Field(
        default_factory=lambda: _node_name(""), description="This node's name (its Node object)."
    )
    manifests: Path | None = Field(None, description="Directory of manifests (the embedded source, the default).")
    client_connection: ClientConnection = Field(default_factory=ClientConnection)
    in_cluster: bool = Field(False, description="Reach the kube-apiserver with the pod's service account.")
    bind_address: str = Field(
        "0.0.0.0",
        description="kube-proxy's bindAddress: an IPv6 one moves the healthz/metrics defaults to [::] and [::1].",
    )
    service_cluster_ip_range: CIDRList = Field(
        default_factory=lambda: [ipaddress.ip_network("10.96.0.0/12")],
        alias="serviceClusterIPRange",
        description="One CIDR, or two (one per family) for dual-stack.",
    )
    service_node_port_range: PortRange = Field((30000, 32767), description="Inclusive NodePort range.")
    node_port_addresses: list[str] = Field(
        default_factory=lambda: ["primary"],
        description="primary | localhost | all | CIDRs: where NodePorts listen (kube-proxy's nodePortAddresses).",
    )
    cluster_cidr: CIDRList = Field(
        default_factory=list,
        alias="clusterCIDR",
        description="Pod CIDRs: sources treated as in-cluster for externalTrafficPolicy Local.",
    )
    state_dir: Path = Field(Path("/var/lib/kubeport"), description="Where allocations persist.")
    healthz_bind_address: str = Field("0.0.0.0:10256", description="/healthz, /livez, /readyz.")
    metrics_bind_address: str = Field("127.0.0.1:10249", description="/metrics and the `kubeport get` status API.")
    config_sync_period: Duration = Field(900.0, gt=0, description="Full resync period of the API source.")
    vip_interface: str = Field("lo", description="Link that carries ClusterIP/externalIP/LB addresses.")
    conntrack: Conntrack = Field(default_factory=Conntrack)
    shutdown_grace_period: Duration = Field(
        30.0, ge=0, description="How long established connections may drain after SIGTERM."
    )
    workers: int = Field(
        1, ge=1, le=64, description="Relay processes sharing the service listeners (SO_REUSEPORT)."
    )
    log_format: Literal["text", "json"] = Field("text", description="Log line format.")
    verbosity: int = Field(0, ge=0, le=10, description="Log verbosity (-v).")
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

    @field_validator("bind_address")
    @classmethod
    def _bind_address(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address") from None
        return value

    @field_validator("healthz_bind_address", "metrics_bind_address")
    @classmethod
    def _host_port(cls, value: str, info: ValidationInfo) -> str:
        value = append_port_if_needed(value, _DEFAULT_PORTS[info.field_name])
        split_host_port(value)
        return value

    @model_validator(mode="before")
    @classmethod
    def _bind_address_defaults(cls, data: Any) -> Any:
        """An IPv6 bindAddress moves the servers' defaults to [::] and [::1], as kube-proxy's
        SetDefaults_KubeProxyConfiguration does."""
        if not isinstance(data, dict):
            return data
        bind = data.get("bindAddress", data.get("bind_address"))
        try:
            ipv6 = bind is not None and ipaddress.ip_address(bind).version == 6
        except (TypeError, ValueError):
            return data  # the field validator names the problem
        if ipv6:
            data = dict(data)
            for alias, name, default in (("healthzBindAddress", "healthz_bind_address", "[::]:10256"),
                                         ("metricsBindAddress", "metrics_bind_address", "[::1]:10249")):
                if alias not in data and name not in data:
                    data[alias] = default
        return data

    @field_validator("hostname_override")
    @classmethod
    def _node_name(cls, value: str) -> str:
        """kube-proxy's GetHostname: trimmed and lower-cased (Node names are), the host's name
        when empty."""
        return _node_name(value)

    @field_validator("node_port_addresses")
    @classmethod
    def _node_port_addresses(cls, values: list[str]) -> list[str]:
        for value in values:
            if value not in ("primary", "localhost", "all"):
                try:
                    ipaddress.ip_network(value, strict=False)
                except ValueError:
                    raise ValueError(f"{value!r} is not primary, localhost, all or a CIDR") from None
        return values

    @property
    def source_kind(self) -> Literal["manifests", "kubeconfig", "in-cluster"]:
        if self.client_connection.kubeconfig is not None:
            return "kubeconfig"
        if self.in_cluster:
            return "in-cluster"
        return "manifests"

    @property
    def dns_addresses(self) -> list[str]:
        if self.dns.addresses:
            return list(self.dns.addresses)
        return [str(self.service_cluster_ip_range[0].network_address + 10)]

    def to_yaml(self) -> str:
        data = self.model_dump(mode="json", by_alias=True)
        return yaml.safe_dump(data, sort_keys=False)


_DEFAULT_PORTS = {"healthz_bind_address": 10256, "metrics_bind_address": 10249}


def _node_name(value: str) -> str:
    name = value.strip() or socket.gethostname().strip()
    if not name:
        raise ValueError("empty hostname is invalid")
    return name.lower()


def append_port_if_needed(value: str, port: int) -> str:
    """kube-proxy's AppendPortIfNeeded: a bare IP gets the default port ('::' -> '[::]:port')."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return value  # HOST:PORT already, or invalid: split_host_port says which
    return f"{ip}:{port}" if ip.version == 4 else f"[{ip}]:{port}"


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


def format_errors(exc: ValidationError, origin: str) -> str:
    lines = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"]) or "(document)"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown field"
        lines.append(f"{origin}: {field}: {message}")
    return "\n".join(lines)


def load_file(path: Path) -> dict[str, Any]:
    """The file's fields (camelCase, as written); ConfigError naming the file on any problem."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a KubeportConfiguration document")
    if data.get("apiVersion") != API_VERSION or data.get("kind") != KIND:
        raise ConfigError(
            f"{path}: apiVersion/kind must be {API_VERSION}/{KIND}, "
            f"got {data.get('apiVersion')}/{data.get('kind')}"
        )
    return data


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def build(file: Path | None, flags: dict[str, Any]) -> KubeportConfiguration:
    """File (if any) overridden by flags (camelCase keys, nested like the file)."""
    data: dict[str, Any] = {}
    if file is not None:
        data = load_file(file)
        try:
            KubeportConfiguration.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(format_errors(exc, str(file))) from None
    try:
        return KubeportConfiguration.model_validate(_merge(data, flags))
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, "flags")) from None

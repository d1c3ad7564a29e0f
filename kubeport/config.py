"""The daemon's configuration: one validated object, built once at start.

The file format is a versioned YAML document::

    apiVersion: kubeport.io/v1alpha1
    kind: KubeportConfiguration

Proxy fields reuse KubeProxyConfiguration's names and meanings (``hostnameOverride``,
``healthzBindAddress``, ``nodePortAddresses``, ``clientConnection.kubeconfig``,
``conntrack.udpTimeout`` ...); the ``dns`` section mirrors the CoreDNS kubernetes
plugin's options. Flags override the file. Unknown fields are errors naming the field.
kube-proxy's own ``KubeProxyConfiguration`` is read too (kubeport.kubeproxy_config).
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from kubeport import kubeproxy_config
from kubeport.config_values import (  # noqa: F401 - parse_*/format_duration/split_host_port are used as config.*
    CIDRList,
    Duration,
    IPNetwork,
    PortRange,
    append_port_if_needed,
    format_duration,
    parse_cidr,
    parse_duration,
    split_host_port,
)
from kubeport.dns.settings import DnsSettings

API_VERSION = "kubeport.io/v1alpha1"
KIND = "KubeportConfiguration"


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field (and the file)."""


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


class ManifestLimits(_Section):
    file_bytes: int = Field(
        64 << 20, ge=1, description="A manifest file larger than this is not read (a problem line).")
    total_bytes: int = Field(256 << 20, ge=1, description="All manifest files read together hold at most this.")
    read_timeout: Duration = Field(10.0, gt=0, description="A manifest file not read to its end this soon is not read.")


class KubeportConfiguration(_Section):
    """Everything `kubeport run` needs; validated once, never mutated."""

    api_version: Literal["kubeport.io/v1alpha1"] = Field(API_VERSION, description="The file format version.")
    kind: Literal["KubeportConfiguration"] = KIND
    hostname_override: str = Field(
        default_factory=lambda: _node_name(""), description="This node's name (its Node object)."
    )
    manifests: Path | None = Field(None, description="Directory of manifests (the embedded source, the default).")
    manifest_limits: ManifestLimits = Field(default_factory=ManifestLimits)
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
    state_dir: Path = Field(Path("/var/lib/kubeport"),
                            description="Where allocations and the last applied state persist.")
    hold_sockets: bool = Field(
        False, description="Run the daemon under a small supervisor that holds its listening sockets and "
                           "starts it again at once when it is killed: connections and queries arriving "
                           "meanwhile wait in the kernel's queues instead of being refused.")
    fd_store: Path | None = Field(
        None, description="With holdSockets: the directory of a `kubeport fd-store` process (a sidecar "
                          "container of the pod) that keeps the held sockets too, so that they outlive a "
                          "restart of this container. Under systemd the unit's descriptor store does it.")
    last_state_max_age: Duration = Field(
        3600.0, ge=0, description="A restarted daemon serves the last applied state kept in the state "
                                  "directory until its source has synced, if it is younger than this; 0: neither "
                                  "kept nor served.")
    healthz_bind_address: str = Field(
        "0.0.0.0:10256", description="/healthz, /livez, /readyz; empty (flag only): no such server.")
    metrics_bind_address: str = Field(
        "127.0.0.1:10249",
        description="/metrics, /healthz, /proxyMode, /readyz; empty (flag only): no such server.")
    status_bind_address: str = Field(
        "", description="IP:PORT serving the status API (`kubeport get --server`) over TCP too, readable by "
                        "whoever reaches it; empty (the default): only on the owner-only Unix socket in the "
                        "state directory.")
    dns_metrics_bind_address: str = Field(
        "0.0.0.0:9253",
        description="The DNS server's /metrics alone, where CoreDNS users scrape it (NodeLocal DNSCache's "
        "`prometheus :9253`: a node-local DNS on the host network); empty (flag only): no such server.")
    config_sync_period: Duration = Field(
        900.0, gt=0, description="kube-proxy's informer resync period: accepted and validated, without effect. "
        "client-go's resync re-delivers the cache to the handlers, which changes nothing; kubeport's "
        "informers relist when a watch expires and the proxy rewrites the host in full hourly.")
    vip_interface: str = Field(
        "lo", description="Link the local routes of ClusterIP/externalIP/LB addresses go through.")
    conntrack: Conntrack = Field(default_factory=Conntrack)
    shutdown_grace_period: Duration = Field(
        30.0, ge=0, description="How long established connections may drain after SIGTERM."
    )
    workers: int = Field(
        1, ge=1, le=64, description="Relay processes sharing the service listeners (SO_REUSEPORT)."
    )
    tcp_relay: Literal["auto", "sockmap", "splice"] = Field(
        "splice", description="How bulk TCP bytes move: `sockmap` (a BPF sockhash redirects them in the kernel; "
        "the start fails without CAP_BPF and CAP_NET_ADMIN or kernel support), `splice` (through pipes in "
        "the relay process), `auto` (sockmap when it can be loaded, else splice).")
    keep_client_address: bool = Field(
        True, description="The relay's upstream side binds the client's address (IP_TRANSPARENT) wherever "
        "kube-proxy keeps it: pods (clusterCIDR) reaching a ClusterIP, externalIP or LB IP, and any client of an "
        "externalTrafficPolicy Local NodePort, externalIP or LB IP; elsewhere, and where the node cannot, the "
        "node's address.")
    connect_balancing: bool = Field(
        True, description="The node's pods (the processes of connectBalancingCgroup) reach ClusterIPs, externalIPs "
        "and LoadBalancer IPs straight at an endpoint: BPF programs on the cgroup translate the Service address "
        "inside connect() and sendmsg(), choosing among the endpoints kubeport selected; NodePorts and clients "
        "outside the node stay on the relay. Without cgroup v2 or BPF privileges the relay serves them.")
    connect_balancing_cgroup: str = Field(
        "/", pattern=r"^/", description="The cgroup v2 (a path in the hierarchy, e.g. /kubepods.slice) whose "
        "processes are balanced at connect(); / is every process of the node, as Cilium's socket LB.")
    bpf_root: Path = Field(
        Path("/sys/fs/bpf"), description="The bpffs where connect-time balancing pins its programs' links and "
        "maps (under kubeport/<node>), so they outlive the process; mounted there when it is not a bpffs.")
    after_handover: Literal["exit", "wait"] = Field(
        "exit",
        description="What this process does once a new instance has taken the node over: exit, or "
                    "wait for SIGTERM (a DaemonSet pod, which the kubelet would restart if it exited).")
    handover_generation: int = Field(
        0, ge=0, description="An instance never takes the node over from one of a later generation "
                             "(a DaemonSet pod's pod-template-generation label): an old pod's restarted "
                             "container does not take the node back from the new pod.")
    ready_file: Path | None = Field(
        None, description="A file present while this process serves the node and is ready: a pod's own "
                          "readiness, where /readyz on the node's shared port may be another pod's.")
    live_file: Path | None = Field(
        None, description="A file holding the second until which this process vouches that it is live, "
                          "renewed every 5 s: a pod's own liveness, where /livez on the node's shared port "
                          "may be another pod's.")
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

    @field_validator("healthz_bind_address", "metrics_bind_address", "dns_metrics_bind_address")
    @classmethod
    def _host_port(cls, value: str, info: ValidationInfo) -> str:
        if value == "":
            return value  # the server is disabled (kube-proxy's "Set empty to disable")
        value = append_port_if_needed(value, _DEFAULT_PORTS[info.field_name])
        split_host_port(value)
        return value

    @field_validator("status_bind_address")
    @classmethod
    def _status_host_port(cls, value: str) -> str:
        if value:
            split_host_port(value)  # no default port: the address is chosen on purpose, whole
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


_DEFAULT_PORTS = {"healthz_bind_address": 10256, "metrics_bind_address": 10249, "dns_metrics_bind_address": 9253}


def _node_name(value: str) -> str:
    name = value.strip() or socket.gethostname().strip()
    if not name:
        raise ValueError("empty hostname is invalid")
    return name.lower()


#: pydantic error types whose message already names the bad value (our validators' own).
_MESSAGE_NAMES_VALUE = frozenset({"value_error", "assertion_error", "extra_forbidden"})


def format_errors(exc: ValidationError, origin: str, flag_names: Mapping[str, str] | None = None) -> str:
    """One line per error: ``origin: field.path: message``, or ``--flag: message`` when
    ``flag_names`` ({field path: flag given}) says a flag set the field."""
    lines = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"]) or "(document)"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown field"
        elif error["type"] not in _MESSAGE_NAMES_VALUE and not isinstance(error.get("input"), (dict, list)):
            message = f"{message} (got {_short_repr(error.get('input'))})"
        flag = _flag_for(field, flag_names or {})
        lines.append(f"{flag}: {message}" if flag else f"{origin}: {field}: {message}")
    return "\n".join(lines)


def _flag_for(field: str, flag_names: Mapping[str, str]) -> str | None:
    """The flag that set ``field`` or its parent (``dns.addresses.1`` -> ``--dns-address``)."""
    for path, flag in flag_names.items():
        if field == path or field.startswith(path + "."):
            return flag
    return None


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_file(path: Path) -> dict[str, Any]:
    """The file's fields (camelCase, as written); ConfigError naming the file on any problem.
    A KubeProxyConfiguration is translated into kubeport's fields (kubeport.kubeproxy_config)."""
    return read_file(path).fields


class _DuplicateKey(yaml.YAMLError):
    pass


class _StrictLoader(yaml.SafeLoader):
    """A key given twice is an error, as in kube-proxy's strict decoding (sigs.k8s.io/yaml:
    'mapping key "mode" already defined'), not the last one silently winning."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                continue  # an unhashable key: SafeLoader's own error names it
            if key in seen:
                raise _DuplicateKey(f"line {line}: mapping key {key!r} already defined at line {seen[key]}")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping)


def ignored_fields(path: Path) -> list[str]:
    """The fields of a KubeProxyConfiguration file that a userspace proxy does not apply."""
    return read_file(path).ignored


def read_file(path: Path) -> kubeproxy_config.Translation:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except _DuplicateKey as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a {KIND} or {kubeproxy_config.KIND} document")
    if kubeproxy_config.is_kube_proxy_configuration(data):
        try:
            return kubeproxy_config.translate(data)
        except kubeproxy_config.KubeProxyConfigError as exc:
            raise ConfigError("\n".join(f"{path}: {line}" for line in str(exc).splitlines())) from None
    if data.get("apiVersion") != API_VERSION or data.get("kind") != KIND:
        raise ConfigError(
            f"{path}: apiVersion/kind must be {API_VERSION}/{KIND} "
            f"(or {kubeproxy_config.API_VERSION}/{kubeproxy_config.KIND}), "
            f"got {data.get('apiVersion')}/{data.get('kind')}"
        )
    return kubeproxy_config.Translation(data)


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _file_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """An empty bind address in the file means the default, as SetDefaults_KubeProxyConfiguration
    fills it in when decoding; only the flag's empty value disables a server."""
    return {key: value for key, value in data.items()
            if not (key in _BIND_ADDRESS_FIELDS and value in ("", None))}


_BIND_ADDRESS_FIELDS = ("healthzBindAddress", "metricsBindAddress", "dnsMetricsBindAddress")


def _without_source(data: dict[str, Any]) -> dict[str, Any]:
    """The file's fields less the ones naming the source: a source flag replaces the file's
    (``--manifests DIR`` with a kube-proxy file whose kubeconfig is the node's)."""
    data = {key: value for key, value in data.items() if key not in ("manifests", "inCluster")}
    connection = {key: value for key, value in (data.get("clientConnection") or {}).items() if key != "kubeconfig"}
    data.pop("clientConnection", None)
    return {**data, "clientConnection": connection} if connection else data


def _names_source(flags: dict[str, Any]) -> bool:
    return ("manifests" in flags or "inCluster" in flags
            or "kubeconfig" in (flags.get("clientConnection") or {}))


def build(
    file: Path | None, flags: dict[str, Any], flag_names: Mapping[str, str] | None = None
) -> KubeportConfiguration:
    """File (if any) overridden by flags (camelCase keys, nested like the file).

    :param flag_names: {field path: flag given} (``{"dns.port": "--dns-port"}``): errors in
        those fields name the flag instead of the field.
    """
    data: dict[str, Any] = {}
    if file is not None:
        data = _file_defaults(load_file(file))
        try:
            KubeportConfiguration.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(format_errors(exc, str(file))) from None
        if _names_source(flags):
            data = _without_source(data)
    try:
        return KubeportConfiguration.model_validate(_merge(data, flags))
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, "flags", flag_names)) from None


def changed_fields(old: BaseModel, new: BaseModel, names: Iterable[str] | None = None) -> list[str]:
    """The file's names (camelCase, dotted into sections) of the fields that differ.

    :param names: the Python names of the top-level fields to compare (default: all).
    """
    fields = type(old).model_fields
    paths: list[str] = []
    for name in fields if names is None else names:
        before, after = getattr(old, name), getattr(new, name)
        if before == after:
            continue
        alias = fields[name].alias or name
        if isinstance(before, BaseModel) and isinstance(after, BaseModel):
            paths += [f"{alias}.{path}" for path in changed_fields(before, after)]
        else:
            paths.append(alias)
    return paths

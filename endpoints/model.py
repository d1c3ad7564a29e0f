"""The subset of the Kubernetes API the data plane reads, as pydantic v2 models.

Field names are the API's camelCase names (``targetPort``); Python code uses the
snake_case attribute names. Unknown fields are ignored, as a client of a newer API
server must. Defaults are the API server's defaulting (``pkg/apis/core/v1/defaults.go``)
so that a hand-written manifest and an object read from a cluster look the same.

These models exist only at the ingest boundary. Inside the daemon everything is
converted once into the slim frozen types of :mod:`kubeport.endpoints.types`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

DEFAULT_AFFINITY_TIMEOUT_SECONDS = 10800
MAX_AFFINITY_TIMEOUT_SECONDS = 86400

LABEL_SERVICE_NAME = "kubernetes.io/service-name"
LABEL_SERVICE_PROXY_NAME = "service.kubernetes.io/service-proxy-name"
LABEL_HEADLESS = "service.kubernetes.io/headless"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
ANNOTATION_TOPOLOGY_MODE = "service.kubernetes.io/topology-mode"
ANNOTATION_TOPOLOGY_AWARE_HINTS = "service.kubernetes.io/topology-aware-hints"
#: kubeport's own: "v2" has each TCP connection open with a PROXY protocol v2 header
ANNOTATION_PROXY_PROTOCOL = "kubeport.io/proxy-protocol"
TAINT_TO_BE_DELETED = "ToBeDeletedByClusterAutoscaler"

Protocol = Literal["TCP", "UDP", "SCTP"]


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
    )

    def to_api(self) -> dict[str, Any]:
        """The object as the API would print it (camelCase, no nulls)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class OwnerOrTargetRef(ApiModel):
    kind: str | None = None
    namespace: str | None = None
    name: str | None = None
    uid: str | None = None


class ObjectMeta(ApiModel):
    name: str = ""
    namespace: str = "default"
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_empty(cls, data: Any) -> Any:
        # The API prints `labels: null` for some objects; treat it as empty.
        if isinstance(data, dict):
            for key in ("labels", "annotations"):
                if key in data and data[key] is None:
                    data = {**data, key: {}}
            if data.get("namespace") in (None, ""):
                data = {**data, "namespace": "default"}
        return data


# --- core/v1 Service -------------------------------------------------------


class ServicePort(ApiModel):
    name: str | None = None
    protocol: Protocol = "TCP"
    port: int
    target_port: int | str | None = None
    node_port: int | None = None
    app_protocol: str | None = None

    @model_validator(mode="after")
    def _default_target_port(self) -> "ServicePort":
        # API defaulting: targetPort defaults to port; a zero/empty value too.
        if self.target_port in (None, 0, ""):
            self.target_port = self.port
        elif isinstance(self.target_port, str) and self.target_port.isdigit():
            # IntOrString in YAML written as a quoted number is a number.
            self.target_port = int(self.target_port)
        if self.name == "":
            self.name = None
        return self


class ClientIPConfig(ApiModel):
    timeout_seconds: int | None = None


class SessionAffinityConfig(ApiModel):
    client_ip: ClientIPConfig | None = Field(default=None, alias="clientIP")


class ServiceSpec(ApiModel):
    type: Literal["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"] = "ClusterIP"
    cluster_ip: str | None = Field(default=None, alias="clusterIP")
    cluster_ips: list[str] | None = Field(default=None, alias="clusterIPs")
    ip_families: list[Literal["IPv4", "IPv6"]] | None = None
    ip_family_policy: Literal["SingleStack", "PreferDualStack", "RequireDualStack"] | None = None
    ports: list[ServicePort] = Field(default_factory=list)
    selector: dict[str, str] | None = None
    session_affinity: Literal["None", "ClientIP"] = "None"
    session_affinity_config: SessionAffinityConfig | None = None
    external_ips: list[str] = Field(default_factory=list, alias="externalIPs")
    external_name: str | None = None
    external_traffic_policy: Literal["Cluster", "Local"] | None = None
    internal_traffic_policy: Literal["Cluster", "Local"] | None = None
    health_check_node_port: int | None = None
    traffic_distribution: str | None = None
    publish_not_ready_addresses: bool = False
    allocate_load_balancer_node_ports: bool | None = None
    load_balancer_class: str | None = None
    load_balancer_ip: str | None = Field(default=None, alias="loadBalancerIP")
    load_balancer_source_ranges: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_empty(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in ("ports", "externalIPs", "loadBalancerSourceRanges"):
                if key in data and data[key] is None:
                    data = {**data, key: []}
        return data

    @model_validator(mode="after")
    def _api_defaults(self) -> "ServiceSpec":
        external = self.type in ("NodePort", "LoadBalancer")
        if self.type != "ExternalName":
            if self.internal_traffic_policy is None:
                self.internal_traffic_policy = "Cluster"
            if external and self.external_traffic_policy is None:
                self.external_traffic_policy = "Cluster"
        if self.type == "LoadBalancer" and self.allocate_load_balancer_node_ports is None:
            self.allocate_load_balancer_node_ports = True
        if self.session_affinity == "None":
            # SetDefaults_Service drops it before validation: kubectl apply accepts such a Service.
            self.session_affinity_config = None
        if self.session_affinity == "ClientIP":
            if self.session_affinity_config is None:
                self.session_affinity_config = SessionAffinityConfig()
            if self.session_affinity_config.client_ip is None:
                self.session_affinity_config.client_ip = ClientIPConfig()
            if self.session_affinity_config.client_ip.timeout_seconds is None:
                self.session_affinity_config.client_ip.timeout_seconds = DEFAULT_AFFINITY_TIMEOUT_SECONDS
        # clusterIP and clusterIPs[0] mirror each other (API server semantics).
        if self.cluster_ips and not self.cluster_ip:
            self.cluster_ip = self.cluster_ips[0]
        elif self.cluster_ip and not self.cluster_ips:
            self.cluster_ips = [self.cluster_ip]
        return self

    @property
    def headless(self) -> bool:
        return self.cluster_ip == "None"

    @property
    def affinity_timeout_seconds(self) -> int:
        """0 when session affinity is off."""
        if self.session_affinity != "ClientIP":
            return 0
        assert self.session_affinity_config and self.session_affinity_config.client_ip
        return self.session_affinity_config.client_ip.timeout_seconds or DEFAULT_AFFINITY_TIMEOUT_SECONDS


class LoadBalancerIngress(ApiModel):
    ip: str | None = None
    hostname: str | None = None
    ip_mode: Literal["VIP", "Proxy"] | None = None


class LoadBalancerStatus(ApiModel):
    ingress: list[LoadBalancerIngress] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _null_ingress(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("ingress") is None:
            data = {**data, "ingress": []}
        return data


class ServiceStatus(ApiModel):
    load_balancer: LoadBalancerStatus = Field(default_factory=LoadBalancerStatus)


class Service(ApiModel):
    api_version: str = "v1"
    kind: Literal["Service"] = "Service"
    metadata: ObjectMeta
    spec: ServiceSpec = Field(default_factory=ServiceSpec)
    status: ServiceStatus = Field(default_factory=ServiceStatus)


# --- discovery.k8s.io/v1 EndpointSlice ---------------------------------------


class EndpointConditions(ApiModel):
    # nil has a meaning for each (ready/serving: "unknown, treat as true";
    # terminating: "false"), so None is kept, not defaulted.
    ready: bool | None = None
    serving: bool | None = None
    terminating: bool | None = None


class ForZone(ApiModel):
    name: str


class ForNode(ApiModel):
    name: str


class EndpointHints(ApiModel):
    for_zones: list[ForZone] | None = None
    for_nodes: list[ForNode] | None = None


class Endpoint(ApiModel):
    addresses: list[str]
    #: ``conditions: null`` is read as ``{}`` by EndpointSlice's validator: one Python call
    #: per slice, not one per endpoint (a third of a slice's validation time).
    conditions: EndpointConditions = Field(default_factory=EndpointConditions)
    hostname: str | None = None
    node_name: str | None = None
    zone: str | None = None
    hints: EndpointHints | None = None
    target_ref: OwnerOrTargetRef | None = None


class EndpointPort(ApiModel):
    # The API defaults name to "" and protocol to TCP; port may be nil
    # ("all ports" in theory, ignored by kube-proxy in practice).
    name: str | None = ""
    protocol: Protocol | None = "TCP"
    port: int | None = None
    app_protocol: str | None = None


def _null_conditions(endpoint: Any) -> bool:
    return isinstance(endpoint, dict) and "conditions" in endpoint and endpoint["conditions"] is None


class EndpointSlice(ApiModel):
    api_version: str = "discovery.k8s.io/v1"
    kind: Literal["EndpointSlice"] = "EndpointSlice"
    metadata: ObjectMeta
    address_type: Literal["IPv4", "IPv6", "FQDN"]
    endpoints: list[Endpoint] = Field(default_factory=list)
    ports: list[EndpointPort] | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_endpoints(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        endpoints = data.get("endpoints")
        if endpoints is None:
            return {**data, "endpoints": []}
        if isinstance(endpoints, list) and any(map(_null_conditions, endpoints)):
            fixed = [{**e, "conditions": {}} if _null_conditions(e) else e for e in endpoints]
            data = {**data, "endpoints": fixed}
        return data

    @property
    def service_name(self) -> str | None:
        return self.metadata.labels.get(LABEL_SERVICE_NAME)


# --- core/v1 Node and Namespace ------------------------------------------------


class NodeAddress(ApiModel):
    type: str
    address: str


class Taint(ApiModel):
    key: str
    value: str | None = None
    effect: str | None = None


class NodeSpec(ApiModel):
    taints: list[Taint] = Field(default_factory=list)
    pod_cidrs: list[str] = Field(default_factory=list, alias="podCIDRs")

    @model_validator(mode="before")
    @classmethod
    def _null_lists(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in ("taints", "podCIDRs"):
                if key in data and data[key] is None:
                    data = {**data, key: []}
        return data


class NodeCondition(ApiModel):
    type: str
    status: str


class NodeStatus(ApiModel):
    addresses: list[NodeAddress] = Field(default_factory=list)
    allocatable: dict[str, str] = Field(default_factory=dict)
    conditions: list[NodeCondition] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _null_lists(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, empty in (("addresses", []), ("allocatable", {}), ("conditions", [])):
                if key in data and data[key] is None:
                    data = {**data, key: empty}
        return data


class Node(ApiModel):
    api_version: str = "v1"
    kind: Literal["Node"] = "Node"
    metadata: ObjectMeta
    spec: NodeSpec = Field(default_factory=NodeSpec)
    status: NodeStatus = Field(default_factory=NodeStatus)


class Namespace(ApiModel):
    api_version: str = "v1"
    kind: Literal["Namespace"] = "Namespace"
    metadata: ObjectMeta


# --- networking.k8s.io/v1 ServiceCIDR (KEP-1880, MultiCIDRServiceAllocator) ------------------

#: the API server's default ServiceCIDR, made from --service-cluster-ip-range
#: (pkg/controlplane/controller/defaultservicecidr)
DEFAULT_SERVICE_CIDR_NAME = "kubernetes"


class ServiceCIDRSpec(ApiModel):
    cidrs: list[str] = Field(default_factory=list, alias="cidrs")

    @model_validator(mode="before")
    @classmethod
    def _null_list(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("cidrs", []) is None:
            data = {**data, "cidrs": []}
        return data


class ServiceCIDRCondition(ApiModel):
    type: str
    status: str
    reason: str | None = None
    message: str | None = None


class ServiceCIDRStatus(ApiModel):
    conditions: list[ServiceCIDRCondition] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _null_list(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("conditions", []) is None:
            data = {**data, "conditions": []}
        return data


class ServiceCIDR(ApiModel):
    api_version: str = "networking.k8s.io/v1"
    kind: Literal["ServiceCIDR"] = "ServiceCIDR"
    metadata: ObjectMeta
    spec: ServiceCIDRSpec = Field(default_factory=ServiceCIDRSpec)
    status: ServiceCIDRStatus = Field(default_factory=ServiceCIDRStatus)

    @property
    def ready(self) -> bool:
        """Its Ready condition, true when it has none: the allocator's ``isReady``
        (pkg/registry/core/service/ipallocator/cidrallocator.go), which assumes a
        ServiceCIDR without the condition is ready so allocation works without the
        controller manager."""
        for condition in self.status.conditions:
            if condition.type == "Ready":
                return condition.status == "True"
        return True


# --- core/v1 Pod (manifest mode: what the EndpointSlice controller and `pods verified` read) ---


class ContainerPort(ApiModel):
    name: str | None = None
    container_port: int
    protocol: Protocol = "TCP"


class Container(ApiModel):
    name: str = ""
    ports: list[ContainerPort] = Field(default_factory=list)
    #: init containers only: ``Always`` makes a sidecar, whose ports a Service may name.
    restart_policy: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_ports(cls, data: Any) -> Any:
        if isinstance(data, dict) and "ports" in data and data["ports"] is None:
            data = {**data, "ports": []}
        return data


class PodSpec(ApiModel):
    node_name: str | None = None
    hostname: str | None = None
    subdomain: str | None = None
    containers: list[Container] = Field(default_factory=list)
    init_containers: list[Container] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _null_lists(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in ("containers", "initContainers"):
                if key in data and data[key] is None:
                    data = {**data, key: []}
        return data


class PodIP(ApiModel):
    ip: str


class PodCondition(ApiModel):
    type: str
    status: str


class ContainerStateReason(ApiModel):
    reason: str | None = None


class ContainerState(ApiModel):
    waiting: ContainerStateReason | None = None
    terminated: ContainerStateReason | None = None


class ContainerStatus(ApiModel):
    name: str = ""
    ready: bool = False
    restart_count: int = 0
    state: ContainerState = Field(default_factory=ContainerState)


class PodStatus(ApiModel):
    phase: str | None = None
    reason: str | None = None
    pod_ip: str | None = Field(default=None, alias="podIP")
    pod_ips: list[PodIP] = Field(default_factory=list, alias="podIPs")
    conditions: list[PodCondition] = Field(default_factory=list)
    container_statuses: list[ContainerStatus] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _null_lists(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in ("podIPs", "conditions", "containerStatuses"):
                if key in data and data[key] is None:
                    data = {**data, key: []}
        return data

    @model_validator(mode="after")
    def _mirror_pod_ip(self) -> "PodStatus":
        # The v1 conversion (Convert_v1_PodStatus_To_core_PodStatus): podIP alone is podIPs[0].
        if not self.pod_ips and self.pod_ip:
            self.pod_ips = [PodIP(ip=self.pod_ip)]
        elif self.pod_ips and not self.pod_ip:
            self.pod_ip = self.pod_ips[0].ip
        return self


class Pod(ApiModel):
    api_version: str = "v1"
    kind: Literal["Pod"] = "Pod"
    metadata: ObjectMeta
    spec: PodSpec = Field(default_factory=PodSpec)
    status: PodStatus = Field(default_factory=PodStatus)


class _PodAddressesMeta(ApiModel):
    name: str = ""
    namespace: str = "default"
    resource_version: str | None = None
    deletion_timestamp: datetime | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_namespace(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("namespace") in (None, ""):
            data = {**data, "namespace": "default"}
        return data


class _PodAddressesSpec(ApiModel):
    node_name: str | None = None


class _PodAddressesStatus(ApiModel):
    phase: str | None = None
    pod_ip: str | None = Field(default=None, alias="podIP")
    pod_ips: list[PodIP] | None = Field(default=None, alias="podIPs")


class PodAddresses(ApiModel):
    """A Pod read from the API server for DNS (``pods verified``, autopath): name, namespace,
    phase, addresses and deletionTimestamp only, as CoreDNS's object.ToPod keeps them; the
    rest of each Pod (containers, labels, managed fields) is never made into objects."""

    api_version: str = "v1"
    kind: Literal["Pod"] = "Pod"
    metadata: _PodAddressesMeta
    spec: _PodAddressesSpec = Field(default_factory=_PodAddressesSpec)
    status: _PodAddressesStatus = Field(default_factory=_PodAddressesStatus)


KubeObject = Union[Service, EndpointSlice, Node, Namespace, Pod, PodAddresses, ServiceCIDR]
KIND_MODELS: dict[str, type[ApiModel]] = {
    "Service": Service,
    "EndpointSlice": EndpointSlice,
    "Node": Node,
    "Namespace": Namespace,
    "Pod": Pod,
    "ServiceCIDR": ServiceCIDR,
}
#: Kinds without a namespace: their metadata.namespace is not meaningful.
CLUSTER_SCOPED_KINDS = frozenset({"Node", "Namespace", "ServiceCIDR"})

AnyKubeObject = Annotated[KubeObject, Field(discriminator="kind")]


def object_key(obj: KubeObject) -> tuple[str, str, str]:
    """(kind, namespace, name) — the identity of an object, "" namespace if cluster-scoped."""
    namespace = "" if obj.kind in CLUSTER_SCOPED_KINDS else obj.metadata.namespace
    return (obj.kind, namespace, obj.metadata.name)

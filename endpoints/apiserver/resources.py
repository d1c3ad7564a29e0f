"""The API resources kubeport watches, their counters, and how failures read to an operator.

No label selectors on Services and EndpointSlices. kube-proxy's informers exclude
Services labelled ``service.kubernetes.io/service-proxy-name`` and objects labelled
``service.kubernetes.io/headless``; the DNS server needs both (headless Services and
their slices are the A records of the pods; a Service handled by another proxy still
has a name). The proxy drops them itself through ``ServiceInfo.proxied`` and
``SliceInfo.proxied``. The Node watch
is limited to this node by a field selector, as kube-proxy does. Pods are watched only for
DNS options that need them: ``pods verified`` every Pod, as CoreDNS does, autopath alone
this node's (the querying pod is always on it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from kubeport.endpoints.apiserver.client import ApiStatusError
from kubeport.endpoints.model import ApiModel, EndpointSlice, Namespace, Node, PodAddresses, Service, ServiceCIDR

#: The permission every watched resource needs (deploy/rbac.yaml grants exactly these).
VERBS = ("get", "list", "watch")


@dataclass(frozen=True, slots=True)
class Resource:
    kind: str
    group: str  # "" for the core group
    version: str
    plural: str
    model: type[ApiModel]
    field_selector: str | None = None
    #: read in this namespace only (a Role's grant), else in all of them
    namespace: str | None = None
    #: an API server may not serve it (older than the resource): its 404 is no problem
    optional: bool = False

    @property
    def path(self) -> str:
        scope = f"namespaces/{self.namespace}/" if self.namespace else ""
        if self.group:
            return f"/apis/{self.group}/{self.version}/{scope}{self.plural}"
        return f"/api/{self.version}/{scope}{self.plural}"

    @property
    def qualified(self) -> str:
        """'endpointslices.discovery.k8s.io', as the API server names it in errors."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def rbac_rule(self) -> str:
        verbs = ", ".join(f'"{v}"' for v in VERBS)
        return f'{{apiGroups: ["{self.group}"], resources: ["{self.plural}"], verbs: [{verbs}]}}'

    def forbidden_problem(self, error: ApiStatusError) -> str:
        """An operator-facing line for a 401/403/404: what is missing and how to fix it."""
        if error.code == 401:
            return (f"{self.kind}: {error.verb} {self.plural}: 401 Unauthorized: the API server rejects "
                    f"kubeport's credentials ({error.message or 'no message'}); check the token or "
                    "client certificate of the kubeconfig / service account")
        if error.code == 404:
            return (f"{self.kind}: {error.verb} {self.path}: 404 NotFound: the API server does not serve "
                    f"{self.group or 'core'}/{self.version} {self.plural}")
        scope = f'in the namespace "{self.namespace}"' if self.namespace else "at the cluster scope"
        denied = f'cannot {error.verb} resource "{self.plural}" in API group "{self.group}" {scope}'
        message = error.message or f"{self.qualified} is forbidden: {denied}"
        if denied not in message:
            message = f"{message} ({denied})"
        role = f"Role in {self.namespace}" if self.namespace else "ClusterRole"
        return f"{self.kind}: {message}; add the rule {self.rbac_rule()} to kubeport's {role} (deploy/rbac.yaml)"


#: which Pods DNS reads: none; this node's (autopath: the pods that may query this node);
#: every one (``pods verified``, as CoreDNS's pod informer)
PodScope = Literal["none", "node", "all"]


def watched_resources(node_name: str, pods: PodScope = "none") -> tuple[Resource, ...]:
    """Services and EndpointSlices (all namespaces), this node's Node, Namespaces, ServiceCIDRs; and Pods
    when DNS needs them, read slim (:class:`~kubeport.endpoints.model.PodAddresses`)."""
    resources = (
        Resource("Service", "", "v1", "services", Service),
        Resource("EndpointSlice", "discovery.k8s.io", "v1", "endpointslices", EndpointSlice),
        Resource("Node", "", "v1", "nodes", Node, field_selector=f"metadata.name={node_name}"),
        Resource("Namespace", "", "v1", "namespaces", Namespace),
        # The service ranges beyond --service-cluster-ip-range (KEP-1880), as kube-proxy's
        # nftables mode watches them (pkg/proxy/config ServiceCIDRConfig).
        Resource("ServiceCIDR", "networking.k8s.io", "v1", "servicecidrs", ServiceCIDR, optional=True),
    )
    if pods == "node":
        resources += (Resource("Pod", "", "v1", "pods", PodAddresses, field_selector=f"spec.nodeName={node_name}"),)
    elif pods == "all":
        resources += (Resource("Pod", "", "v1", "pods", PodAddresses),)
    return resources


@dataclass
class ResourceStats:
    """Counters of one informer, for /metrics and `kubeport get`."""

    kind: str
    lists: int = 0
    relists: int = 0
    watches: int = 0
    watch_restarts: int = 0
    restart_reasons: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)
    #: failed requests by HTTP code or error type
    failures: Counter[str] = field(default_factory=Counter)
    last_sync: float | None = None
    last_event: float | None = None
    resource_version: str = ""
    synced: bool = False
    #: True: streaming list in use; False: it failed, list + watch in use; None: not tried.
    watch_list: bool | None = None
    #: why the streaming list was given up ("" while it is not)
    watch_list_fallback: str = ""
    #: Unix time of the last completed relist, and what asked for the last relist
    last_relist: float | None = None
    relist_cause: str = ""
    #: the delay before the informer's next attempt (0: none pending)
    backoff: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "lists": self.lists, "relists": self.relists, "watches": self.watches,
            "watchRestarts": self.watch_restarts, "restartReasons": dict(self.restart_reasons),
            "events": dict(self.events), "failures": dict(self.failures), "lastSync": self.last_sync,
            "lastEvent": self.last_event, "resourceVersion": self.resource_version, "synced": self.synced,
            "watchList": self.watch_list, "watchListFallback": self.watch_list_fallback,
            "lastRelist": self.last_relist, "relistCause": self.relist_cause, "backoff": self.backoff,
        }

"""Objects shaped like a real kube-apiserver's JSON output (v1.30-era), for the fake server.

The extra fields the data plane never reads (managedFields, ownerReferences, status
details, annotations) are there on purpose: parsing must ignore them, and fast.
"""

from __future__ import annotations

import uuid
from typing import Any

CREATED = "2025-03-14T09:26:53Z"


def _managed_fields(api_version: str, manager: str, fields: dict[str, Any]) -> list[dict[str, Any]]:
    return [{
        "manager": manager, "operation": "Update", "apiVersion": api_version, "time": CREATED,
        "fieldsType": "FieldsV1", "fieldsV1": fields,
    }]


def _meta(name: str, namespace: str | None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta.update(uid=str(uuid.uuid4()), creationTimestamp=CREATED)
    meta.update(extra)
    return meta


def service(name: str, namespace: str = "default", *, cluster_ip: str = "10.96.0.20",
            ports: list[dict[str, Any]] | None = None, type_: str = "ClusterIP",
            labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A Service as `kubectl get svc -o json` prints it (defaults filled by the API server)."""
    ports = ports if ports is not None else [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}]
    body: dict[str, Any] = {
        "ports": ports,
        "selector": {"app": name},
        "clusterIP": cluster_ip,
        "clusterIPs": [cluster_ip],
        "type": type_,
        "sessionAffinity": "None",
        "ipFamilies": ["IPv6" if ":" in cluster_ip else "IPv4"],
        "ipFamilyPolicy": "SingleStack",
        "internalTrafficPolicy": "Cluster",
    }
    if cluster_ip == "None":
        body["clusterIPs"] = ["None"]
    body.update(spec)
    return {
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": _meta(
            name, namespace, labels=labels or {"app": name},
            annotations={"kubectl.kubernetes.io/last-applied-configuration": '{"apiVersion":"v1","kind":"Service"}\n'},
            managedFields=_managed_fields("v1", "kubectl-client-side-apply", {
                "f:metadata": {"f:annotations": {".": {}}, "f:labels": {".": {}, "f:app": {}}},
                "f:spec": {"f:internalTrafficPolicy": {}, "f:ports": {".": {}}, "f:selector": {}},
            }),
        ),
        "spec": body,
        "status": {"loadBalancer": {}},
    }


def endpoint_slice(name: str, service_name: str, namespace: str = "default", *,
                   addresses: list[str] = ("10.244.1.5",), port: int = 8080, port_name: str = "http",
                   node: str = "node-a", zone: str = "zone-a", ready: bool = True,
                   address_type: str = "IPv4") -> dict[str, Any]:
    """An EndpointSlice as the EndpointSlice controller writes it."""
    endpoints = [{
        "addresses": [address],
        "conditions": {"ready": ready, "serving": ready, "terminating": False},
        "nodeName": node,
        "zone": zone,
        "targetRef": {"kind": "Pod", "namespace": namespace, "name": f"{service_name}-7d9c5b8f6-{i:05d}",
                      "uid": str(uuid.uuid4())},
    } for i, address in enumerate(addresses)]
    return {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": _meta(
            name, namespace, generateName=f"{service_name}-", generation=1,
            labels={
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                "kubernetes.io/service-name": service_name,
            },
            annotations={"endpoints.kubernetes.io/last-change-trigger-time": CREATED},
            ownerReferences=[{"apiVersion": "v1", "kind": "Service", "name": service_name,
                              "uid": str(uuid.uuid4()), "controller": True, "blockOwnerDeletion": True}],
            managedFields=_managed_fields("discovery.k8s.io/v1", "kube-controller-manager", {
                "f:addressType": {}, "f:endpoints": {}, "f:ports": {},
            }),
        ),
        "addressType": address_type,
        "endpoints": endpoints or None,
        "ports": [{"name": port_name, "protocol": "TCP", "port": port}],
    }


def node(name: str = "node-a", *, zone: str = "zone-a", internal_ip: str = "192.168.10.11") -> dict[str, Any]:
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": _meta(
            name, None,
            labels={"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                    "topology.kubernetes.io/zone": zone},
            annotations={"node.alpha.kubernetes.io/ttl": "0",
                         "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        ),
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
        "status": {
            "capacity": {"cpu": "2", "memory": "8141452Ki", "pods": "110"},
            "allocatable": {"cpu": "2", "memory": "8039052Ki", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": CREATED,
                            "lastTransitionTime": CREATED, "reason": "KubeletReady",
                            "message": "kubelet is posting ready status"}],
            "addresses": [{"type": "InternalIP", "address": internal_ip}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kubeletVersion": "v1.30.2", "containerRuntimeVersion": "containerd://1.7.18",
                         "kernelVersion": "6.1.0-21-amd64", "osImage": "Debian GNU/Linux 12 (bookworm)",
                         "operatingSystem": "linux", "architecture": "amd64"},
        },
    }


def namespace(name: str) -> dict[str, Any]:
    return {
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": _meta(name, None, labels={"kubernetes.io/metadata.name": name}),
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def service_cidr(name: str, *cidrs: str, deleting: bool = False) -> dict[str, Any]:
    """A ServiceCIDR as the API server stores it once pkg/controller/servicecidrs has added its
    finalizer and set Ready (message "Kubernetes Service CIDR is ready", no reason); while it is
    deleted with addresses still in use, Ready is False with reason Terminating and
    deletionTimestamp is set (the finalizer keeps the object)."""
    condition = {"type": "Ready", "status": "True", "lastTransitionTime": CREATED, "reason": "",
                 "message": "Kubernetes Service CIDR is ready"}
    extra: dict[str, Any] = {"finalizers": ["networking.k8s.io/service-cidr-finalizer"], "generation": 1}
    if deleting:
        condition.update(status="False", reason="Terminating",
                         message="There are still IPAddresses referencing the ServiceCIDR, please remove them or "
                                 "create a new ServiceCIDR")
        extra.update(deletionTimestamp=CREATED, deletionGracePeriodSeconds=0)
    return {
        "kind": "ServiceCIDR",
        "apiVersion": "networking.k8s.io/v1",
        "metadata": _meta(name, None, **extra),
        "spec": {"cidrs": list(cidrs)},
        "status": {"conditions": [condition]},
    }


def pod(name: str, namespace: str = "default", *, ip: str = "10.244.1.11", node_name: str = "node-a",
        phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
    """A Pod as `kubectl get pod -o json` prints it: a Deployment's, with the kubelet's status,
    about 4 KiB of JSON of which DNS reads name, namespace, phase and addresses."""
    extra: dict[str, Any] = {"labels": {"app": name.rsplit("-", 2)[0], "pod-template-hash": "5d9f7c8b6d"},
                             "generateName": name.rsplit("-", 1)[0] + "-", "resourceVersion": "1",
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                                  "name": name.rsplit("-", 1)[0], "uid": str(uuid.uuid4()),
                                                  "controller": True, "blockOwnerDeletion": True}],
                             "managedFields": _managed_fields("v1", "kubelet", {"f:status": {
                                 "f:conditions": {}, "f:containerStatuses": {}, "f:hostIP": {}, "f:phase": {},
                                 "f:podIP": {}, "f:podIPs": {}, "f:startTime": {}}})}
    if deleting:
        extra["deletionTimestamp"] = CREATED
    container = {
        "name": "app", "image": "registry.example/app:1.4.2", "imagePullPolicy": "IfNotPresent",
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
        "volumeMounts": [{"name": "kube-api-access", "readOnly": True,
                          "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
    }
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": _meta(name, namespace, **extra),
        "spec": {
            "containers": [container], "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst", "serviceAccountName": "default", "nodeName": node_name,
            "securityContext": {}, "schedulerName": "default-scheduler", "priority": 0,
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300}],
            "volumes": [{"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}}],
        },
        "status": {
            "phase": phase,
            "conditions": [{"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": CREATED}
                           for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                        "PodScheduled")],
            "hostIP": "192.168.10.11", "hostIPs": [{"ip": "192.168.10.11"}],
            "podIP": ip, "podIPs": [{"ip": ip}], "startTime": CREATED, "qosClass": "Burstable",
            "containerStatuses": [{"name": "app", "state": {"running": {"startedAt": CREATED}}, "ready": True,
                                   "restartCount": 0, "image": "registry.example/app:1.4.2",
                                   "imageID": "registry.example/app@sha256:" + "0" * 64,
                                   "containerID": "containerd://" + "1" * 64, "started": True}],
        },
    }

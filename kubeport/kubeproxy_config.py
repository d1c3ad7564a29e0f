"""kube-proxy's own configuration file (``kubeproxy.config.k8s.io/v1alpha1``
``KubeProxyConfiguration``, the ``config.conf`` of kubeadm's ``kube-proxy`` ConfigMap) read
as kubeport's: the fields a userspace proxy serves become KubeportConfiguration fields with
kube-proxy's meaning, the fields of kernel proxy modes are accepted and named as not
applicable, and a field kube-proxy does not know is an error naming it.

Pure: a dict in, kubeport's fields and the names of the ignored fields out.

Zero values are kube-proxy's "unset" (kubeadm writes every field, most of them zero): they
leave kubeport's default, which is kube-proxy's ``SetDefaults_KubeProxyConfiguration`` one
(``pkg/proxy/apis/config/v1alpha1/defaults.go``): bindAddress 0.0.0.0, healthz
0.0.0.0:10256, metrics 127.0.0.1:10249, configSyncPeriod 15m; conntrack UDP timeouts of 0 keep
the kernel's (30 s and 120 s), which are kubeport's defaults. An empty nodePortAddresses is what
the file's ``mode`` makes it in kube-proxy (``types.go``: "'all' in iptables and ipvs mode, and
'primary' in nftables mode"; an empty mode is iptables): the NodePorts a node served before
kubeport took over stay where they were. An empty ``clientConnection.kubeconfig`` reaches
the API server with the pod's service account, as kube-proxy's ``createClient`` falls back to
the in-cluster configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

API_VERSION = "kubeproxy.config.k8s.io/v1alpha1"
KIND = "KubeProxyConfiguration"

#: Marks a field a userspace proxy has no use for: accepted, named once at start.
IGNORED = "ignored"
#: Marks a field whose value is translated by :func:`translate`.
SERVED = "served"

_SYNC = {"syncPeriod": IGNORED, "minSyncPeriod": IGNORED}
_FORMAT_OPTIONS = {"splitStream": IGNORED, "infoBufferSize": IGNORED}

#: Every field of KubeProxyConfiguration v1alpha1 (``staging/src/k8s.io/kube-proxy/config/v1alpha1/types.go``).
#: A dict is a section whose own fields are known; its unknown fields are errors too.
SCHEMA: dict[str, Any] = {
    "apiVersion": SERVED,
    "kind": SERVED,
    "featureGates": IGNORED,
    "clientConnection": {"kubeconfig": SERVED, "acceptContentTypes": IGNORED, "contentType": IGNORED,
                         "qps": IGNORED, "burst": IGNORED},
    "logging": {"format": SERVED, "verbosity": SERVED, "flushFrequency": IGNORED, "vmodule": IGNORED,
                "options": {"text": _FORMAT_OPTIONS, "json": _FORMAT_OPTIONS}},
    "hostnameOverride": SERVED,
    "bindAddress": SERVED,
    "healthzBindAddress": SERVED,
    "metricsBindAddress": SERVED,
    "bindAddressHardFail": IGNORED,
    "enableProfiling": IGNORED,
    "showHiddenMetricsForVersion": IGNORED,
    "mode": IGNORED,
    "iptables": {"masqueradeAll": IGNORED, "masqueradeBit": IGNORED, "localhostNodePorts": IGNORED,
                 "snatNodeInternalIP": IGNORED, **_SYNC},
    "ipvs": {"scheduler": IGNORED, "excludeCIDRs": IGNORED, "strictARP": IGNORED, "tcpTimeout": IGNORED,
             "tcpFinTimeout": IGNORED, "udpTimeout": IGNORED, **_SYNC},
    "nftables": {"masqueradeAll": IGNORED, "masqueradeBit": IGNORED, **_SYNC},
    "winkernel": {"networkName": IGNORED, "sourceVip": IGNORED, "enableDSR": IGNORED,
                  "rootHnsEndpointName": IGNORED, "forwardHealthCheckVip": IGNORED},
    "detectLocalMode": SERVED,
    "detectLocal": {"bridgeInterface": IGNORED, "interfaceNamePrefix": IGNORED},
    "clusterCIDR": SERVED,
    "nodePortAddresses": SERVED,
    "oomScoreAdj": IGNORED,
    "conntrack": {"udpTimeout": SERVED, "udpStreamTimeout": SERVED, "maxPerCore": IGNORED, "min": IGNORED,
                  "tcpEstablishedTimeout": IGNORED, "tcpCloseWaitTimeout": IGNORED, "tcpBeLiberal": IGNORED},
    "configSyncPeriod": SERVED,
    "portRange": IGNORED,  # deprecated in kube-proxy, and without effect there too
    "udpIdleTimeout": SERVED,  # the userspace mode's, in files of kube-proxy 1.25 and older
    "windowsRunAsService": IGNORED,
}

#: The pod-traffic detection modes kubeport serves: by source CIDR (nftables matches
#: ``clusterCIDR``). The interface modes would need the packet's incoming interface.
_DETECT_LOCAL_MODES = ("", "ClusterCIDR")


class KubeProxyConfigError(ValueError):
    """Lines ``field: message``, one per problem."""


@dataclass(frozen=True)
class Translation:
    fields: dict[str, Any]
    ignored: list[str] = field(default_factory=list)  # "mode=ipvs", "iptables", ...


def is_kube_proxy_configuration(data: dict[str, Any]) -> bool:
    return data.get("kind") == KIND or str(data.get("apiVersion", "")).startswith("kubeproxy.config.k8s.io/")


def translate(data: dict[str, Any]) -> Translation:
    """KubeProxyConfiguration fields -> KubeportConfiguration fields (camelCase, nested)."""
    problems = _unknown(data, SCHEMA, "")
    if data.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion: {data.get('apiVersion')!r}: kubeport reads {API_VERSION}")
    mode = data.get("detectLocalMode") or ""
    if mode not in _DETECT_LOCAL_MODES:
        problems.append(f"detectLocalMode: {mode!r}: kubeport tells pod traffic by clusterCIDR only "
                        f"(ClusterCIDR, the default); set clusterCIDR and leave detectLocalMode empty")
    logging_section = _section(data, "logging", problems)
    log_format = logging_section.get("format") or "text"
    if log_format not in ("text", "json"):
        problems.append(f"logging.format: {log_format!r}: must be text or json")
    if problems:
        raise KubeProxyConfigError("\n".join(problems))

    fields: dict[str, Any] = {}
    for name in ("hostnameOverride", "bindAddress", "healthzBindAddress", "metricsBindAddress", "clusterCIDR",
                 "configSyncPeriod"):
        if not _zero(data.get(name)):
            fields[name] = data[name]
    if data.get("nodePortAddresses"):
        fields["nodePortAddresses"] = data["nodePortAddresses"]
    elif (data.get("mode") or "iptables") != "nftables":
        fields["nodePortAddresses"] = ["all"]
    kubeconfig = _section(data, "clientConnection", problems).get("kubeconfig")
    if kubeconfig:
        fields["clientConnection"] = {"kubeconfig": kubeconfig}
    else:
        fields["inCluster"] = True
    conntrack = {name: value for name, value in _section(data, "conntrack", problems).items()
                 if name in ("udpTimeout", "udpStreamTimeout") and not _zero(value)}
    if not _zero(data.get("udpIdleTimeout")) and "udpTimeout" not in conntrack:
        conntrack["udpTimeout"] = data["udpIdleTimeout"]
    if conntrack:
        fields["conntrack"] = conntrack
    fields["logFormat"] = log_format
    if not _zero(logging_section.get("verbosity")):
        fields["verbosity"] = logging_section["verbosity"]
    return Translation(fields, _ignored(data, SCHEMA, ""))


def _section(data: dict[str, Any], name: str, problems: list[str]) -> dict[str, Any]:
    value = data.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{name}: expected a mapping, got {value!r}")
        return {}
    return value


def _unknown(data: Any, schema: dict[str, Any], prefix: str) -> list[str]:
    """kube-proxy's strict decoding: every field not in its types is an error."""
    if not isinstance(data, dict):
        return []
    problems = []
    for name, value in data.items():
        known = schema.get(name)
        if known is None:
            problems.append(f"{prefix}{name}: unknown field")
        elif isinstance(known, dict):
            problems += _unknown(value, known, f"{prefix}{name}.")
    return problems


def _ignored(data: dict[str, Any], schema: dict[str, Any], prefix: str) -> list[str]:
    """The fields present that kubeport does not apply: a section all of whose fields are
    ignored is named once; a value that is not zero is shown (``mode=ipvs``)."""
    names = []
    for name, value in data.items():
        known = schema[name]
        if isinstance(known, dict) and not _all_ignored(known) and isinstance(value, dict):
            names += _ignored(value, known, f"{prefix}{name}.")
        elif known == IGNORED or (isinstance(known, dict) and _all_ignored(known)):
            names.append(f"{prefix}{name}" if _zero(value) else f"{prefix}{name}={_show(value)}")
    return names


def _all_ignored(schema: dict[str, Any]) -> bool:
    return all(value == IGNORED or (isinstance(value, dict) and _all_ignored(value)) for value in schema.values())


def _zero(value: Any) -> bool:
    """Go's zero value as YAML shows it: "", 0, false, null, 0s, an empty list or map, or a
    map of zeros (kubeadm writes ``options: {json: {infoBufferSize: "0"}}``)."""
    if isinstance(value, dict):
        return all(_zero(item) for item in value.values())
    return value in (None, "", 0, False, [], "0", "0s")


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_show(v)}" for k, v in value.items() if not _zero(v)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_show(v) for v in value) + "]"
    return str(value)

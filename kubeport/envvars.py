"""`kubeport env`: the service environment variables the kubelet gives a pod of a namespace.

Pure: API-shaped Services (as the status API lists them) in, ``(name, value)`` pairs out. The
kubelet's rules, ``pkg/kubelet/kubelet_pods.go getServiceEnvVarMap`` and
``pkg/kubelet/envvars/envvars.go FromServices``:

* which Services: those whose ``spec.clusterIP`` is set (not ``None``, not empty:
  ``IsServiceIPSet``; headless and ExternalName Services give nothing), of the pod's
  namespace (with ``enableServiceLinks``, the default), and the master service ``kubernetes``
  of the ``default`` namespace (always). A Service named ``kubernetes`` of the pod's own
  namespace takes the master's place, as the kubelet's map by name lets it;
* per Service, its name upper-cased with ``-`` and ``.`` as ``_`` (and a leading digit
  behind ``_``: ``makeEnvVariableName``) as the prefix of: ``_SERVICE_HOST`` (the ClusterIP),
  ``_SERVICE_PORT`` (the first port), ``_SERVICE_PORT_<NAME>`` per named port, then the
  Docker link variables (``makeLinkVariables``): ``_PORT`` (``<proto>://<ip>:<port>`` of the
  first port), and per port ``_PORT_<port>_<PROTO>`` with ``_PROTO``, ``_PORT``, ``_ADDR``;
  an IPv6 ClusterIP is bracketed in the URLs (``net.JoinHostPort``).

The kubelet hands the variables over as a map, in no set order; here they come Service by
Service in name order, each Service's in ``FromServices``' order.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from typing import Any

MASTER_SERVICES = frozenset({"kubernetes"})
MASTER_SERVICE_NAMESPACE = "default"


def variable_name(text: str) -> str:
    """``makeEnvVariableName``."""
    name = text.replace(".", "_").replace("-", "_").upper()
    return "_" + name if name[:1].isdigit() else name


def _ip_set(service: dict[str, Any]) -> bool:
    cluster_ip = service.get("spec", {}).get("clusterIP") or ""
    return cluster_ip not in ("", "None")


def services_for(namespace: str, services: Iterable[dict[str, Any]], *,
                 enable_service_links: bool = True) -> list[dict[str, Any]]:
    """``getServiceEnvVarMap``'s choice of Services for a pod of ``namespace``, by name."""
    chosen: dict[str, dict[str, Any]] = {}
    for service in services:
        if not _ip_set(service):
            continue
        meta = service["metadata"]
        name = meta["name"]
        if meta.get("namespace") == MASTER_SERVICE_NAMESPACE and name in MASTER_SERVICES:
            chosen.setdefault(name, service)
        elif meta.get("namespace") == namespace and enable_service_links:
            chosen[name] = service
    return [chosen[name] for name in sorted(chosen)]


def _host_port(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def service_variables(service: dict[str, Any]) -> list[tuple[str, str]]:
    """``FromServices`` for one Service."""
    spec = service["spec"]
    ip = spec["clusterIP"]
    ports = spec.get("ports") or []
    prefix = variable_name(service["metadata"]["name"])
    found = [(f"{prefix}_SERVICE_HOST", ip)]
    if not ports:  # validation requires ports of a Service with a ClusterIP; nothing to say without
        return found
    found.append((f"{prefix}_SERVICE_PORT", str(ports[0]["port"])))
    found += [(f"{prefix}_SERVICE_PORT_{variable_name(p['name'])}", str(p["port"])) for p in ports if p.get("name")]
    for index, port in enumerate(ports):
        protocol = port.get("protocol") or "TCP"
        url = f"{protocol.lower()}://{_host_port(ip, port['port'])}"
        if index == 0:
            found.append((f"{prefix}_PORT", url))
        port_prefix = f"{prefix}_PORT_{port['port']}_{protocol.upper()}"
        found += [(port_prefix, url), (f"{port_prefix}_PROTO", protocol.lower()),
                  (f"{port_prefix}_PORT", str(port["port"])), (f"{port_prefix}_ADDR", ip)]
    return found


def environment(namespace: str, services: Iterable[dict[str, Any]], *,
                enable_service_links: bool = True) -> dict[str, str]:
    """Every variable for a pod of ``namespace``; a later Service's value wins a name, as in the kubelet's map."""
    variables: dict[str, str] = {}
    for service in services_for(namespace, services, enable_service_links=enable_service_links):
        variables.update(service_variables(service))
    return variables


def shell_lines(variables: dict[str, str]) -> str:
    """``KEY=value`` lines a POSIX shell can ``eval`` (values quoted where they need it)."""
    return "\n".join(f"{name}={shlex.quote(value)}" for name, value in variables.items())

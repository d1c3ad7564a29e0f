"""The daemon on a manifest directory: allocation, live reload, broken files, restart.

Everything is checked the way a user would: `kubeport get -o json` against the daemon
running in node-a's namespace.
"""

from __future__ import annotations

import ipaddress
import json
import textwrap
from pathlib import Path

import pytest

from support.netns import KubeportDaemon, kubeport, until_sync
from support.netns.daemon import problems_of

pytestmark = pytest.mark.integration

NODE = """
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {topology.kubernetes.io/zone: zone-a}
status:
  addresses: [{type: InternalIP, address: 192.168.50.11}]
"""

WEB = """
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  ports:
  - {name: http, port: 80, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.244.1.11]
  nodeName: node-a
"""

WEB_TWO_PORTS = WEB.replace(
    "  - {name: http, port: 80, targetPort: 8080}",
    "  - {name: http, port: 80, targetPort: 8080}\n  - {name: metrics, port: 9100}",
)

EDGE = """
apiVersion: v1
kind: Service
metadata: {name: edge, namespace: shop}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  ports:
  - {name: https, port: 443}
"""

KUBE_DNS = """
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system}
spec:
  clusterIP: 10.96.0.10
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
"""


def write(directory: Path, name: str, text: str) -> None:
    # Write-then-rename, as editors and kubectl-style tools do: the watcher sees one event.
    temporary = directory / f".{name}.tmp"
    temporary.write_text(textwrap.dedent(text))
    temporary.rename(directory / name)


def services(ns: str) -> dict[str, dict]:
    listing = json.loads(kubeport(ns, "get", "services", "-A", "-o", "json"))
    return {f"{s['metadata']['namespace']}/{s['metadata']['name']}": s for s in listing["items"]}


def problems(daemon: KubeportDaemon) -> list[str]:
    """What the daemon reports as problems (printed by `kubeport get`)."""
    return problems_of(daemon.ns)


def allocations(svc: dict) -> tuple:
    spec = svc["spec"]
    return (
        tuple(spec.get("clusterIPs", [])),
        tuple(p.get("nodePort") for p in spec.get("ports", [])),
        spec.get("healthCheckNodePort"),
        svc["metadata"].get("uid"),
        svc["metadata"].get("creationTimestamp"),
    )


def test_allocations_live_reload_broken_files_and_restart(topology, tmp_path):
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    for name, text in (("node.yaml", NODE), ("web.yaml", WEB), ("edge.yaml", EDGE), ("kube-dns.yaml", KUBE_DNS)):
        write(manifests, name, text)
    node = topology.node("a")
    daemon = KubeportDaemon(node, manifests, tmp_path / "state", "--upstream", "192.168.50.200")
    daemon.wait_ready()

    held = services(node)
    web, edge = held["shop/web"], held["shop/edge"]
    # Dynamic ClusterIPs come from the upper band of 10.96.0.0/12 (KEP-3070: static band is 10.96.0.1-10.96.1.0).
    assert ipaddress.ip_address(web["spec"]["clusterIP"]) >= ipaddress.ip_address("10.96.1.1")
    # Dynamic NodePorts from the upper band (KEP-3668: 30086-32767), healthCheckNodePort for LB + Local.
    assert 30086 <= edge["spec"]["ports"][0]["nodePort"] <= 32767
    assert 30086 <= edge["spec"]["healthCheckNodePort"] <= 32767
    assert held["kube-system/kube-dns"]["spec"]["clusterIP"] == "10.96.0.10"
    before = {key: allocations(svc) for key, svc in held.items()}

    # A live edit: the new port appears, the ClusterIP stays.
    write(manifests, "web.yaml", WEB_TWO_PORTS)
    web = until_sync(lambda: services(node)["shop/web"] if len(services(node)["shop/web"]["spec"]["ports"]) == 2
                     else None, "web gets its second port", 10)
    assert web["spec"]["clusterIP"] == held["shop/web"]["spec"]["clusterIP"]

    # A broken file keeps its last good objects and is reported, naming the file.
    write(manifests, "web.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: web\n")
    reported = until_sync(lambda: [p for p in problems(daemon) if "web.yaml" in p],
                          "the broken web.yaml is reported", 10)
    assert reported
    assert len(services(node)["shop/web"]["spec"]["ports"]) == 2
    assert daemon.readyz().status == 200  # still ready; the problem is in the status API's detail

    # Other files still reload while one is broken.
    write(manifests, "api.yaml", WEB.replace("name: web", "name: api").replace("web-1", "api-1"))
    until_sync(lambda: "shop/api" in services(node), "api appears", 10)

    # Restart: allocations are the same; the broken file is still reported, and what it held
    # before it broke is still served (its last version that parsed is saved in --state-dir).
    daemon.restart()
    daemon.wait_ready()
    after = services(node)
    for key in ("shop/edge", "kube-system/kube-dns"):
        assert allocations(after[key]) == before[key], key
    assert len(after["shop/web"]["spec"]["ports"]) == 2
    assert after["shop/web"]["spec"]["clusterIP"] == held["shop/web"]["spec"]["clusterIP"]
    assert any("web.yaml: serving the version that last parsed" in p for p in problems(daemon))

    # Fixing the file: its new version is served, with the ClusterIP web had all along.
    write(manifests, "web.yaml", WEB)
    until_sync(lambda: not problems(daemon) and len(services(node)["shop/web"]["spec"]["ports"]) == 1,
               "web.yaml fixed", 10)
    assert services(node)["shop/web"]["spec"]["clusterIP"] == held["shop/web"]["spec"]["clusterIP"]

    # Deleting a file removes its objects.
    (manifests / "edge.yaml").unlink()
    until_sync(lambda: "shop/edge" not in services(node), "edge removed", 10)


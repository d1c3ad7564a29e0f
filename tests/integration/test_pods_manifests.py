"""Pods as manifests: the slices kubeport's EndpointSlice controller makes, served through the
real daemon in node-a's namespace and asked for as a user asks (curl, dig, `kubeport get`,
`kubeport env`). The pods of the topology are the backends: the Pod manifests carry their
addresses in status.podIP."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from support.netns import KubeportDaemon, kubeport, pod_answering, pods_seen, until_sync
from support.netns.cluster_dns import dig

pytestmark = pytest.mark.integration

DUMP = Path(__file__).resolve().parents[1] / "fixtures" / "kubectl-dump" / "cluster.yaml"

NODES = """
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-a}}
status: {addresses: [{type: InternalIP, address: 192.168.50.11}]}
---
apiVersion: v1
kind: Node
metadata: {name: node-b, labels: {topology.kubernetes.io/zone: zone-b}}
status: {addresses: [{type: InternalIP, address: 192.168.50.12}]}
"""

# The first example of the Kubernetes Service documentation (concepts/services-networking/service),
# with the status the kubelet would have written: the pod runs in the topology's a1 or b1.
DOCS_SERVICE = """
apiVersion: v1
kind: Service
metadata:
  name: nginx-service
spec:
  selector:
    app.kubernetes.io/name: proxy
  ports:
  - name: name-of-service-port
    protocol: TCP
    port: 80
    targetPort: http-web-svc
"""


def docs_pod(name: str, ip: str, node: str, *, ready: bool = True) -> str:
    return textwrap.dedent(f"""\
        apiVersion: v1
        kind: Pod
        metadata:
          name: {name}
          labels:
            app.kubernetes.io/name: proxy
        spec:
          nodeName: {node}
          containers:
          - name: nginx
            image: nginx:stable
            ports:
              - containerPort: 8080
                name: http-web-svc
        status:
          phase: Running
          podIP: {ip}
          conditions:
          - {{type: Ready, status: "{'True' if ready else 'False'}"}}
        """)


def write(directory: Path, name: str, text: str) -> None:
    scratch = directory / f".{name}.tmp"
    scratch.write_text(text)
    scratch.rename(directory / name)


def get_json(ns: str, *args: str) -> dict:
    return json.loads(kubeport(ns, "get", *args, "-o", "json"))


def cluster_ip(ns: str, namespace: str, name: str) -> str:
    listing = get_json(ns, "services", "-n", namespace)
    return next(s["spec"]["clusterIP"] for s in listing["items"] if s["metadata"]["name"] == name)


def test_the_service_documentation_example_answers_through_its_cluster_ip(topology, pods, tmp_path):
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    write(manifests, "nodes.yaml", NODES)
    write(manifests, "service.yaml", DOCS_SERVICE)
    a1, b1 = topology.pod_info("a", 1), topology.pod_info("b", 1)
    write(manifests, "nginx-a.yaml", docs_pod("nginx-a", a1.ip(), "node-a"))
    write(manifests, "nginx-b.yaml", docs_pod("nginx-b", b1.ip(), "node-b"))
    node = topology.node("a")
    daemon = KubeportDaemon(node, manifests, tmp_path / "state", "--pods", "verified")
    daemon.wait_ready(timeout=30)
    ip = cluster_ip(node, "default", "nginx-service")
    client = topology.pod("a", 2)
    assert pods_seen(client, ip, 80, {"a1", "b1"}) == {"a1", "b1"}

    # The slice kubeport made: the named port resolved to 8080, both pods, their nodes and zones.
    (generated,) = get_json(node, "endpointslices")["items"]
    assert generated["metadata"]["labels"] == {"kubernetes.io/service-name": "nginx-service",
                                               "endpointslice.kubernetes.io/managed-by":
                                                   "endpointslice-controller.kubeport.io"}
    assert generated["ports"] == [{"name": "name-of-service-port", "protocol": "TCP", "port": 8080}]
    assert sorted((e["addresses"][0], e["nodeName"], e["zone"], e["targetRef"]["name"])
                  for e in generated["endpoints"]) == [(a1.ip(), "node-a", "zone-a", "nginx-a"),
                                                       (b1.ip(), "node-b", "zone-b", "nginx-b")]
    table = kubeport(node, "get", "endpointslices").splitlines()
    assert table[0].split() == ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"]
    assert table[1].split()[1:4] == ["IPv4", "8080", f"{a1.ip()},{b1.ip()}"]
    pods_table = kubeport(node, "get", "pods", "-A").splitlines()
    assert [line.split()[:4] + line.split()[6:] for line in pods_table] == [
        ["NAMESPACE", "NAME", "READY", "STATUS", "IP", "NODE"],
        ["default", "nginx-a", "0/1", "Running", a1.ip(), "node-a"],
        ["default", "nginx-b", "0/1", "Running", b1.ip(), "node-b"]]

    # --pods verified: an A record for a Pod's address in its namespace, none elsewhere.
    name = a1.ip().replace(".", "-")
    assert dig(client, f"{name}.default.pod.cluster.local", "A").answer == (
        f"{name}.default.pod.cluster.local. 5 IN A {a1.ip()}",)
    assert dig(client, f"{name}.kube-system.pod.cluster.local", "A").status == "NXDOMAIN"

    # The pod on node-b is no longer Ready: the slice says so and the ClusterIP stops using it.
    write(manifests, "nginx-b.yaml", docs_pod("nginx-b", b1.ip(), "node-b", ready=False))
    until_sync(lambda: [e["conditions"]["ready"] for e in get_json(node, "endpointslices")["items"][0]["endpoints"]]
               == [True, False], "nginx-b listed as not ready", 15)
    assert {pod_answering(client, ip, 80) for _ in range(12)} == {"a1"}

    # A restart serves the same: the ClusterIP kept, the same slice (by name) made again.
    daemon.restart()
    daemon.wait_ready(timeout=30)
    assert cluster_ip(node, "default", "nginx-service") == ip
    assert [s["metadata"]["name"] for s in get_json(node, "endpointslices")["items"]] == [generated["metadata"]["name"]]
    assert pod_answering(client, ip, 80) == "a1"


def test_a_kubectl_dump_loads_and_serves(topology, pods, tmp_path):
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    shutil.copy(DUMP, manifests / "cluster.yaml")
    node = topology.node("a")
    daemon = KubeportDaemon(node, manifests, tmp_path / "state")
    daemon.wait_ready(timeout=30)
    # The ClusterIP written in the dump, kept; the Deployment's two pods behind it, the Job's
    # completed pod (its address is a2's, where a server runs) left out.
    assert cluster_ip(node, "shop", "web") == "10.103.45.7"
    client = topology.pod("a", 2)  # on node-a, where kubeport runs
    assert pods_seen(client, "10.103.45.7", 80, {"a1", "b1"}) == {"a1", "b1"}
    assert {pod_answering(client, "10.103.45.7", 80) for _ in range(12)} <= {"a1", "b1"}
    slices = {s["metadata"]["labels"]["kubernetes.io/service-name"]: s
              for s in get_json(node, "endpointslices", "-A")["items"]}
    assert sorted(e["targetRef"]["name"] for e in slices["web"]["endpoints"]) == [
        "web-7c9d8f6b5-q8r7t", "web-7c9d8f6b5-x2x9k"]
    assert slices["kube-dns"]["ports"][0]["port"] == 53
    assert "kubernetes" not in slices  # no selector: the API server writes its slices, not in the dump

    # What the kubelet would give a pod of shop, evaluated by a shell.
    env = kubeport(node, "env", "-n", "shop")
    script = env + 'printf "%s|%s|%s" "$WEB_SERVICE_HOST" "$WEB_PORT_80_TCP" "$KUBERNETES_SERVICE_PORT_HTTPS"'
    assert subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout == \
        "10.103.45.7|tcp://10.103.45.7:80|443"
    as_json = json.loads(kubeport(node, "env", "-n", "shop", "-o", "json"))
    assert {"name": "WEB_SERVICE_PORT_HTTP", "value": "80"} in as_json
    assert not any(v["name"].startswith("KUBE_DNS") for v in as_json)  # kube-system's, not shop's

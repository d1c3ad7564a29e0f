"""kubeport's image run the way deploy/daemonset.yaml runs it, under podman, in node-a's network
namespace of the topology, reading the fake kube-apiserver there with `--in-cluster`.

The pod's spec comes from deploy/daemonset.yaml as it is when the test runs (support.netns.image
says how each field is carried out). Pods of node-a resolve and reach a Service through it, the
outside client a NodePort; the exec probes pass as the kubelet runs them; the kubeport container
killed (SIGKILL to its first process) and started again refuses nothing, the fd-store sidecar
holding the listening sockets meanwhile. The image is deploy/image/build.sh's (cached by its
inputs) or $KUBEPORT_IMAGE.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest

from support.apiserver.tls import make_tls
from support.netns import CommandFailed, Topology, dig_in, require_netns, run_in, until_sync
from support.netns.apiserver import NetnsApiServer, k8s, pod_slice, seed
from support.netns.image import (
    ApiEndpoint,
    PodRun,
    build_image,
    image_size,
    image_unavailable_reason,
    podman,
    remove_leftovers,
)
from support.netns.operating import ClientLoop

pytestmark = [
    pytest.mark.integration,
    pytest.mark.host_privileges("podman running containers, and the image's build reaching Debian's mirrors"),
]

WEB_IP, NODEPORT_IP, NODE_PORT = "10.96.0.20", "10.96.0.30", 30080
DNS_IP = "10.96.0.10"
WEB = "web.default.svc.cluster.local"
TOKEN = "kubeport-image-token"
#: capability numbers (linux/capability.h) of what the manifest adds
CAPABILITY_BITS = {"NET_BIND_SERVICE": 10, "NET_ADMIN": 12, "BPF": 39}


@pytest.fixture(scope="session")
def image() -> str:
    require_netns()
    if reason := image_unavailable_reason():
        pytest.skip(reason)
    return build_image()


@dataclass
class Pod:
    run: PodRun
    api: NetnsApiServer
    topology: Topology
    started: dict[str, float] = field(default_factory=dict)
    ready_at: float = 0.0

    @property
    def node(self) -> str:
        return self.run.ns


def readyz_code(ns: str) -> int:
    """/readyz's HTTP status on the node (0: nothing answers yet)."""
    done = run_in(ns, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2",
                  "http://127.0.0.1:10256/readyz", timeout=10, check=False)
    return int(done.stdout or 0)


@pytest.fixture(scope="module")
def pod(image, topology, pods, tmp_path_factory, request) -> Iterator[Pod]:
    remove_leftovers()
    failed_before = request.session.testsfailed
    directory = tmp_path_factory.mktemp("image-pod")
    tls = make_tls(directory / "pki")
    local = [topology.pod_info("a", 1), topology.pod_info("a", 2)]
    with NetnsApiServer(topology.node("a"), tls, token=TOKEN) as api:
        seed(api, topology, local)
        api.apply(k8s.service("web-np", cluster_ip=NODEPORT_IP, type_="NodePort", ports=[
            {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": NODE_PORT}]))
        api.apply(pod_slice("web-np-1", "web-np", local))
        url = urlsplit(api.url)
        run = PodRun(name=f"{topology.prefix}-kubeport", ns=topology.node("a"), node_name="node-a",
                     node_ip=topology.node_ip("a"), image=image,
                     api=ApiEndpoint(url.hostname, url.port, TOKEN, tls.ca_cert), directory=directory)
        running = Pod(run, api, topology)
        try:
            run.start_pod(lambda name, at: running.started.setdefault(name, at))
            def ready() -> bool:
                assert run.state("kubeport")["Status"] == "running", run.logs("kubeport")
                return readyz_code(running.node) == 200

            until_sync(ready, "/readyz 200 from the kubeport container", 30)
            running.ready_at = time.monotonic()
            yield running
        finally:
            if request.session.testsfailed != failed_before:
                print(run.log_tails())  # in the failed test's report
            run.close()


def test_the_pod_starts_as_the_kubelet_starts_it(pod, image):
    run = pod.run
    spec = run.template["spec"]
    # Every init container before kubeport's, in order; the run-to-completion ones ended well,
    # the sidecars still run beside kubeport.
    order = sorted(pod.started, key=pod.started.get)
    assert order == [c["name"] for c in (*spec.get("initContainers", []), *spec["containers"])]
    for container in spec.get("initContainers", []):
        state = run.state(container["name"])
        if container.get("restartPolicy") == "Always":
            assert state["Status"] == "running", (container["name"], state)
        else:
            assert (state["Status"], state["ExitCode"]) == ("exited", 0), (container["name"], state)
    assert run.state("kubeport")["Status"] == "running"
    # Nothing the image lacks (a tool, a file the tools read) failed the daemon's work.
    errors = [line for line in run.logs("kubeport").splitlines() if " ERROR " in line or "Traceback" in line]
    assert not errors, errors
    # The probes as the kubelet runs them, inside the container.
    assert run.probe("kubeport", "readinessProbe")
    assert run.probe("kubeport", "livenessProbe")
    assert run.probe("fd-store", "startupProbe")
    # The securityContext took effect on the daemon's process: only the capabilities added,
    # no_new_privs, a read-only root, and root.
    status = dict(line.split(":\t", 1) for line in
                  podman("exec", run.current("kubeport"), "cat", "/proc/1/status").stdout.splitlines()
                  if ":\t" in line)
    added = run.container_spec("kubeport")["securityContext"]["capabilities"]["add"]
    assert int(status["CapEff"], 16) == sum(1 << CAPABILITY_BITS[cap] for cap in added)
    assert status["NoNewPrivs"].strip() == "1" and status["Uid"].split()[0] == "0"
    refused = podman("exec", run.current("kubeport"), "touch", "/written", check=False)
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr
    print(f"\nimage {image}: {image_size(image) / 1e6:.0f} MB; kubeport container start to /readyz 200: "
          f"{pod.ready_at - pod.started['kubeport']:.2f} s; pod start (first init container) to ready: "
          f"{pod.ready_at - pod.started[order[0]]:.2f} s")


def test_pods_resolve_and_reach_a_service_and_the_client_a_node_port(pod):
    client = pod.topology.pod("a", 1)
    until_sync(lambda: dig_in(client, "+short", WEB, server=DNS_IP).split() == [WEB_IP],
               f"{WEB} A {WEB_IP} from a pod", 10, ignore=(CommandFailed,))
    seen: set[str] = set()

    def both_answered() -> bool:
        seen.add(run_in(client, "curl", "-sS", "--max-time", "3", f"http://{WEB_IP}/").stdout.split()[0])
        return seen >= {"pod=a1", "pod=a2"}

    until_sync(both_answered, "both endpoints through the ClusterIP", 20)
    # From outside the cluster to the node's address (nodePortAddresses: primary).
    outside = run_in(pod.topology.client, "curl", "-sS", "--max-time", "3",
                     f"http://{pod.topology.node_ip('a')}:{NODE_PORT}/").stdout
    assert outside.startswith(("pod=a1 ", "pod=a2 ")), outside


def test_the_kubeport_container_killed_and_started_again_refuses_nothing(pod, tmp_path):
    run = pod.run
    client = ClientLoop.start(pod.topology.pod("a", 1), tmp_path / "client.json", "--tcp", f"{WEB_IP}:80",
                              "--dns", f"{WEB}@10.96.0.10", "--tcp-timeout", "10")
    client.wait_for("the client loop running", tcp_ok=30, dns_ok=30)
    first = run.current("kubeport")
    run.kill("kubeport")
    # The kubelet creates the container again, at once after a first crash (the restart
    # backoff, 10 s doubling, applies to the ones after: the pod lifecycle's restart policy).
    restarted_at = time.monotonic()
    second = run.start("kubeport")
    until_sync(lambda: "from the fd store in" in run.logs("kubeport"), "the new container took the stored sockets", 30)
    client.wait_for("connections and queries through the new container", tcp_ok=client.count("tcp_ok") + 100,
                    dns_ok=client.count("dns_ok") + 100, timeout=30)
    until_sync(lambda: readyz_code(pod.node) == 200, "/readyz 200 again", 30)
    ready_again = time.monotonic() - restarted_at
    counts = client.stop()
    tcp_errors = [e for e in counts["errors"] if e.startswith("tcp:")]
    assert not [e for e in tcp_errors if "Refused" in e or "timed out" in e], counts["errors"]
    assert counts["tcp_fail"] <= 1, counts["errors"]  # the one the killed container was relaying
    assert counts["dns_lost"] == 0, counts["errors"]  # queries wait in the held socket's queue
    assert second != first and run.state("kubeport")["Status"] == "running"
    assert run.state("fd-store")["Status"] == "running"
    until_sync(lambda: run.probe("kubeport", "readinessProbe"), "the readiness probe passing again", 30)
    print(f"\nacross the container's restart: {counts['tcp_ok']} connections, none refused, "
          f"{counts['dns_ok']} queries, none lost "
          f"({counts['tcp_fail']} cut in flight); /readyz 200 {ready_again:.2f} s after the new container's start")


"""Two things an operator changes through the API server while kubeport runs, end to end in
network namespaces (the daemon in a node's namespace reading the fake kube-apiserver of
tests/support/apiserver there, as in test_apiserver_daemon.py; real dig and curl from the
node's pods):

- a ServiceCIDR (networking.k8s.io/v1, KEP-1880) created at run time: its range becomes a
  service range (the nftables set ``services4`` whose unallocated addresses are dropped, as
  kube-proxy's nftables mode drops them: pkg/proxy/nftables/proxier.go, the cluster-ips-check
  chain), and a Service with a ClusterIP in it is served by the proxy and by DNS;
- the ``kube-dns`` ConfigMap of kube-system (kubernetes/dns pkg/dns/config/config.go:
  ``stubDomains`` is JSON text): its stub domain is followed live, as NodeLocal DNSCache
  follows it (cmd/node-cache/app/configmap.go updateCorefile).

What the fake API server imitates here, and where the real behaviour comes from:
- the default ServiceCIDR ``kubernetes`` made from the API server's
  ``--service-cluster-ip-range`` (pkg/controlplane/controller/defaultservicecidr), applied
  by hand before the daemon starts;
- a ServiceCIDR as stored once pkg/controller/servicecidrs has added its finalizer and set
  Ready (support.apiserver.objects.service_cidr);
- the ConfigMap as the API server stores an object written with `kubectl apply`
  (resourceVersion filled by the fake's apply, as the registry's storage does).

DNS servers: fake_upstream_dns.py in the ext namespace; the default upstream is authoritative
for example.test only and REFUSED elsewhere, each stub server authoritative for consul.local
only with its own A record, so the answer names the server that was asked.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pytest
import yaml

from support.apiserver.tls import TlsFiles, make_tls
from support.netns import EXT_IPS, CommandFailed, Topology, curl_in, http_url, run_in, start_podserver, until_sync
from support.netns.apiserver import NetnsApiServer, dig_answer, k8s, pod_slice, seed, start_daemon, status
from support.netns.cluster_dns import dig, start_fake_upstream
from support.netns.policies import curl_exit_code, settle_on

pytestmark = pytest.mark.integration

FLAG = "10.96.0.0/16"  # the daemon's --service-cluster-ip-range; its DNS address is 10.96.0.10
NEW_RANGE = "10.100.0.0/24"
LATE_IP = "10.100.0.20"
UNALLOCATED = "10.100.0.99"  # in NEW_RANGE, held by no Service
LATE = "late.default.svc.cluster.local"
# curl's exit code when the connect timeout passes: the packet was dropped (28), where a
# refused or unroutable one exits 7.
DROPPED = 28

STUB_ANSWERS = {"5353": "198.51.100.53", "5354": "198.51.100.54"}
CONSUL_NAME = "web.service.consul.local"
DEFAULT_NAME, DEFAULT_ANSWER = "www.example.test", "203.0.113.7"


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TlsFiles:
    return make_tls(tmp_path_factory.mktemp("pki"))


@contextlib.contextmanager
def api_server(topology: Topology, tls: TlsFiles, letter: str) -> Iterator[NetnsApiServer]:
    """The fake API server in node `letter`'s namespace, seeded (web on that node's pods)."""
    with NetnsApiServer(topology.node(letter), tls) as api:
        seed(api, topology, [topology.pod_info(letter, 1), topology.pod_info(letter, 2)])
        yield api


# --- ServiceCIDR added at run time --------------------------------------------------------------


def services4(ns: str) -> str:
    return run_in(ns, "nft", "list", "set", "inet", "kubeport", "services4").stdout


@contextlib.contextmanager
def host_beyond_node(topology: Topology, letter: str, address: str) -> Iterator[None]:
    """`address` owned by the ext host (a podserver named "beyond" on it, port 8080) and routed
    there by node `letter`: what the node forwards to it arrives unless it is dropped."""
    node_ns, ext = topology.node(letter), topology.ext
    setup = [(ext, "addr", "add", f"{address}/32", "dev", "lo"),
             (ext, "route", "add", "10.244.0.0/16", "via", topology.node_ip(letter)),
             (node_ns, "route", "add", f"{address}/32", "via", EXT_IPS[0])]
    done = []
    server = None
    try:
        for ns, *args in setup:
            run_in(ns, "ip", *args)
            done.append((ns, args))
        server = start_podserver(ext, "beyond")
        yield
    finally:
        if server is not None:
            server.kill()
            server.wait()
        for ns, (verb, *args) in reversed(done):
            run_in(ns, "ip", verb, "del", *args[1:], check=False)


def test_service_cidr_added_at_run_time_is_served(topology, pods, tls, tmp_path):
    client = topology.pod("a", 1)
    with api_server(topology, tls, "a") as api, host_beyond_node(topology, "a", UNALLOCATED):
        api.apply(k8s.service_cidr("kubernetes", FLAG))  # the API server's default one
        daemon = start_daemon(api, tmp_path, "--service-cluster-ip-range", FLAG, "-v")
        try:
            daemon.wait_ready(timeout=30)
            node_ns = daemon.ns
            assert NEW_RANGE not in services4(node_ns)
            # Not yet a service range: what a pod sends to the address is routed on to its owner.
            assert "pod=beyond" in curl_in(client, http_url(UNALLOCATED, 8080), timeout=3)

            # An operator creates a ServiceCIDR (`kubectl create -f servicecidr.yaml`)...
            api.apply(k8s.service_cidr("extra", NEW_RANGE))
            until_sync(lambda: NEW_RANGE in services4(node_ns), f"{NEW_RANGE} in the set services4", 10,
                       ignore=(CommandFailed,))
            # ...then a Service with a ClusterIP in it, and its EndpointSlice (a pod on each node).
            api.apply(k8s.service("late", cluster_ip=LATE_IP))
            api.apply(pod_slice("late-k4v9z", "late", [pod for pod in topology.pods if pod.name in ("a2", "b1")]))

            settle_on(client, LATE_IP, 80, {"a2", "b1"})
            until_sync(lambda: dig_answer(client, LATE) == ("NOERROR", [LATE_IP]), f"{LATE} A -> {LATE_IP}", 10)
            # The range's unallocated address: dropped now, no longer routed on.
            assert curl_exit_code(client, UNALLOCATED, 8080) == DROPPED
            assert "pod=beyond" in curl_in(node_ns, http_url(UNALLOCATED, 8080))  # (the route still works)
            assert status(node_ns)["source"]["resources"]["ServiceCIDR"]["events"]["ADDED"] >= 2
            assert daemon.running
        finally:
            daemon.stop()


# --- the kube-dns ConfigMap's stub domains ------------------------------------------------------

# As `kubectl -n kube-system get configmap kube-dns -o yaml` prints the ConfigMap of the
# kube-dns addon (cluster/addons/dns/kube-dns/kube-dns.yaml.in) after a `kubectl apply` that
# set its stubDomains; {data}: the data block, or nothing (no data).
KUBE_DNS_YAML = """\
apiVersion: v1
{data}kind: ConfigMap
metadata:
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: |
      {last_applied}
  creationTimestamp: "2025-03-14T09:26:53Z"
  labels:
    addonmanager.kubernetes.io/mode: EnsureExists
  name: kube-dns
  namespace: kube-system
  resourceVersion: "1"
  uid: 6c1e2a7e-3f0b-4d0a-9a4e-0f3f8b1c2d4e
"""


def kube_dns_config_map(stub_domains: dict[str, list[str]] | None) -> dict:
    """The kube-dns ConfigMap with ``stubDomains`` as JSON text (kube-dns reads the value with
    json.Unmarshal), or without data (the key removed: a ConfigMap's data is omitempty)."""
    data = {} if stub_domains is None else {"stubDomains": json.dumps(stub_domains) + "\n"}
    block = "" if not data else "data:\n  stubDomains: |\n    " + data["stubDomains"]
    applied = {"apiVersion": "v1", "kind": "ConfigMap", **({"data": data} if data else {}),
               "metadata": {"annotations": {}, "labels": {"addonmanager.kubernetes.io/mode": "EnsureExists"},
                            "name": "kube-dns", "namespace": "kube-system"}}
    text = KUBE_DNS_YAML.format(data=block, last_applied=json.dumps(applied, separators=(",", ":")))
    obj = yaml.safe_load(text)
    assert obj.get("data", {}) == data, text  # the YAML says what kubectl would print
    return obj


def stub_at(port: str) -> dict[str, list[str]]:
    return {"consul.local": [f"{EXT_IPS[0]}:{port}"]}


def consul_answer(ns: str) -> tuple[str, list[str]]:
    """(rcode, addresses) of `dig CONSUL_NAME A` from `ns` at the node-local DNS."""
    result = dig(ns, CONSUL_NAME, "A")
    return result.status, [line.split()[-1] for line in result.answer]


def test_kube_dns_configmap_stub_domains_followed_live(topology, pods, tls, tmp_path):
    start_fake_upstream(topology)  # the default upstream (start_daemon's --upstream)
    for port, answer in STUB_ANSWERS.items():
        start_fake_upstream(topology, "--port", port, "--zone", "consul.local", "--answer", answer)
    client = topology.pod("b", 1)

    def consul_is(expected: tuple[str, list[str]], what: str) -> None:
        until_sync(lambda: consul_answer(client) == expected, what, 10, ignore=(CommandFailed,))

    with api_server(topology, tls, "b") as api:
        api.apply(kube_dns_config_map(stub_at("5353")))
        daemon = start_daemon(api, tmp_path, "--service-cluster-ip-range", FLAG, "-v")
        try:
            daemon.wait_ready(timeout=30)
            consul_is(("NOERROR", [STUB_ANSWERS["5353"]]),
                      "consul.local answered by the ConfigMap's stub server")
            other = dig(client, DEFAULT_NAME, "A")
            assert (other.status, other.answer) == ("NOERROR", (f"{DEFAULT_NAME}. 300 IN A {DEFAULT_ANSWER}",)), \
                other.output

            # The operator points the stub domain at another server...
            api.apply(kube_dns_config_map(stub_at("5354")))
            consul_is(("NOERROR", [STUB_ANSWERS["5354"]]),
                      "consul.local answered by the stub server the ConfigMap names now")

            # ...then removes stubDomains: the default upstream gets the name (and refuses it).
            api.apply(kube_dns_config_map(None))
            consul_is(("REFUSED", []), "consul.local asked of the default upstream once stubDomains is gone")
            other = dig(client, DEFAULT_NAME, "A")
            assert other.status == "NOERROR" and len(other.answer) == 1, other.output
            assert status(daemon.ns)["source"]["problems"] == 0
            assert daemon.running
        finally:
            daemon.stop()

"""`kubeport env`: the kubelet's service environment variables.

The expected values restate the kubelet's source: pkg/kubelet/kubelet_pods.go
getServiceEnvVarMap (which Services: ClusterIP set, the pod's namespace, the master service
`kubernetes` of `default`) and pkg/kubelet/envvars/envvars.go FromServices,
makeEnvVariableName, makeLinkVariables (names, values, order within a Service). The first
block is the Kubernetes documentation's own example (concepts/services-networking/service,
"Environment variables": REDIS_PRIMARY_SERVICE_HOST=10.0.0.11 ...).
"""

from __future__ import annotations

import subprocess

import pytest

from kubeport import envvars, printers
from kubeport.endpoints import model
from kubeport.endpoints.convert import service_info


def svc(name: str, namespace: str, **spec):
    return printers.service_to_api(service_info(model.Service.model_validate(
        {"metadata": {"name": name, "namespace": namespace}, "spec": spec})))


FIXTURE = [
    svc("kubernetes", "default", clusterIP="10.0.0.1", ports=[{"name": "https", "port": 443, "targetPort": 6443}]),
    svc("redis-primary", "demo", clusterIP="10.0.0.11", ports=[{"port": 6379}]),
    svc("web", "demo", clusterIP="10.0.0.20",
        ports=[{"name": "http", "port": 80}, {"name": "dns-udp", "port": 53, "protocol": "UDP"}]),
    svc("db", "demo", clusterIP="None", ports=[{"port": 5432}]),                        # headless: IsServiceIPSet
    svc("search", "demo", type="ExternalName", externalName="www.example.com"),          # no ClusterIP
    svc("v6", "demo", clusterIP="fd00:96::6", ipFamilies=["IPv6"], ports=[{"name": "grpc.api", "port": 9000}]),
    svc("other", "elsewhere", clusterIP="10.0.0.30", ports=[{"port": 8080}]),            # another namespace
]

DEMO = [
    # the master service (getServiceEnvVarMap: masterServices, always)
    ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
    ("KUBERNETES_SERVICE_PORT", "443"),
    ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
    ("KUBERNETES_PORT", "tcp://10.0.0.1:443"),
    ("KUBERNETES_PORT_443_TCP", "tcp://10.0.0.1:443"),
    ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
    ("KUBERNETES_PORT_443_TCP_PORT", "443"),
    ("KUBERNETES_PORT_443_TCP_ADDR", "10.0.0.1"),
    # the documentation's example, name mangled: '-' -> '_', upper case
    ("REDIS_PRIMARY_SERVICE_HOST", "10.0.0.11"),
    ("REDIS_PRIMARY_SERVICE_PORT", "6379"),
    ("REDIS_PRIMARY_PORT", "tcp://10.0.0.11:6379"),
    ("REDIS_PRIMARY_PORT_6379_TCP", "tcp://10.0.0.11:6379"),
    ("REDIS_PRIMARY_PORT_6379_TCP_PROTO", "tcp"),
    ("REDIS_PRIMARY_PORT_6379_TCP_PORT", "6379"),
    ("REDIS_PRIMARY_PORT_6379_TCP_ADDR", "10.0.0.11"),
    # IPv6: net.JoinHostPort brackets the address; '.' in a port name -> '_'
    ("V6_SERVICE_HOST", "fd00:96::6"),
    ("V6_SERVICE_PORT", "9000"),
    ("V6_SERVICE_PORT_GRPC_API", "9000"),
    ("V6_PORT", "tcp://[fd00:96::6]:9000"),
    ("V6_PORT_9000_TCP", "tcp://[fd00:96::6]:9000"),
    ("V6_PORT_9000_TCP_PROTO", "tcp"),
    ("V6_PORT_9000_TCP_PORT", "9000"),
    ("V6_PORT_9000_TCP_ADDR", "fd00:96::6"),
    # named ports after the first port's; link variables per port, _PORT of the first only
    ("WEB_SERVICE_HOST", "10.0.0.20"),
    ("WEB_SERVICE_PORT", "80"),
    ("WEB_SERVICE_PORT_HTTP", "80"),
    ("WEB_SERVICE_PORT_DNS_UDP", "53"),
    ("WEB_PORT", "tcp://10.0.0.20:80"),
    ("WEB_PORT_80_TCP", "tcp://10.0.0.20:80"),
    ("WEB_PORT_80_TCP_PROTO", "tcp"),
    ("WEB_PORT_80_TCP_PORT", "80"),
    ("WEB_PORT_80_TCP_ADDR", "10.0.0.20"),
    ("WEB_PORT_53_UDP", "udp://10.0.0.20:53"),
    ("WEB_PORT_53_UDP_PROTO", "udp"),
    ("WEB_PORT_53_UDP_PORT", "53"),
    ("WEB_PORT_53_UDP_ADDR", "10.0.0.20"),
]


def test_a_pod_of_demo_gets_what_the_kubelet_gives() -> None:
    assert list(envvars.environment("demo", FIXTURE).items()) == DEMO


@pytest.mark.parametrize("namespace, expected", [
    pytest.param("default", {"KUBERNETES"}, id="default_has_the_master_service_once"),
    pytest.param("elsewhere", {"KUBERNETES", "OTHER"}, id="another_namespace"),
    pytest.param("empty", {"KUBERNETES"}, id="a_namespace_without_services"),
])
def test_which_services(namespace: str, expected: set[str]) -> None:
    hosts = {name[:-len("_SERVICE_HOST")] for name in envvars.environment(namespace, FIXTURE)
             if name.endswith("_SERVICE_HOST")}
    assert hosts == expected


def test_without_service_links_only_the_master_service() -> None:
    variables = envvars.environment("demo", FIXTURE, enable_service_links=False)
    assert {name.split("_")[0] for name in variables} == {"KUBERNETES"}


def test_a_kubernetes_service_of_the_namespace_takes_the_masters_place() -> None:
    own = svc("kubernetes", "demo", clusterIP="10.0.0.99", ports=[{"port": 8443}])
    assert envvars.environment("demo", [*FIXTURE, own])["KUBERNETES_SERVICE_HOST"] == "10.0.0.99"


@pytest.mark.parametrize("name, expected", [
    ("redis-primary", "REDIS_PRIMARY"), ("a.b-c", "A_B_C"), ("9lives", "_9LIVES"),
])
def test_variable_name(name: str, expected: str) -> None:
    assert envvars.variable_name(name) == expected


def test_the_lines_evaluate_in_a_shell() -> None:
    text = envvars.shell_lines(envvars.environment("demo", FIXTURE))
    script = text + '\nprintf "%s %s %s" "$REDIS_PRIMARY_PORT" "$V6_PORT" "$WEB_SERVICE_PORT_DNS_UDP"'
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out == "tcp://10.0.0.11:6379 tcp://[fd00:96::6]:9000 53"

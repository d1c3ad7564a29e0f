"""deploy/: schema-valid against a recent Kubernetes, least privilege, wired to the daemon."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from kubeport.cli import build_configuration, build_parser
from kubeport.config import KubeportConfiguration
from kubeport.readiness import LIVE_RENEW, LIVE_VALIDITY

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
KUBERNETES_VERSION = "1.35.0"
MANIFESTS = ("daemonset.yaml", "rbac.yaml", "configmap.yaml")


def documents(name: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]


def one(name: str, kind: str) -> dict:
    [found] = [doc for doc in documents(name) if doc["kind"] == kind]
    return found


@pytest.mark.parametrize("name", MANIFESTS)
def test_manifest_is_valid_against_the_kubernetes_schema__strict(name):
    for doc in documents(name):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_cluster_role_grants_get_list_watch_on_exactly_the_five_resources():
    role = one("rbac.yaml", "ClusterRole")
    granted = {(group, resource, verb)
               for rule in role["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]}
    expected = {(group, resource, verb)
                for group, resource in (("", "services"), ("discovery.k8s.io", "endpointslices"),
                                        ("", "nodes"), ("", "namespaces"), ("networking.k8s.io", "servicecidrs"))
                for verb in ("get", "list", "watch")}
    assert granted == expected
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in role["rules"])  # no resourceNames etc.


def test_binding_ties_the_role_to_the_daemonsets_service_account():
    account = one("rbac.yaml", "ServiceAccount")
    binding = one("rbac.yaml", "ClusterRoleBinding")
    pod = one("daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": one("rbac.yaml", "ClusterRole")["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": account["metadata"]["namespace"]}]
    assert pod["serviceAccountName"] == account["metadata"]["name"]


def test_daemonset_runs_on_every_node_with_host_networking_and_probes():
    daemonset = one("daemonset.yaml", "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] in ("Default", "ClusterFirstWithHostNet")
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in pod["tolerations"]  # tolerates every taint
    assert set(container["securityContext"]["capabilities"]["add"]) == {"NET_ADMIN", "NET_BIND_SERVICE", "BPF"}
    assert container["livenessProbe"]["exec"]["command"][:2] == ["sh", "-c"]
    assert container["readinessProbe"]["exec"] == {"command": ["cat", "/tmp/ready"]}
    command = container["command"]
    assert command[:3] == ["kubeport", "run", "--in-cluster"]
    assert command[command.index("--config") + 1] == "/etc/kubeport/config.yaml"
    assert command[command.index("--hostname-override") + 1] == "$(NODE_NAME)"
    node_name = next(e for e in container["env"] if e["name"] == "NODE_NAME")
    assert node_name["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["config"] == "/etc/kubeport"
    configmap = one("configmap.yaml", "ConfigMap")
    assert volumes["config"]["configMap"]["name"] == configmap["metadata"]["name"]
    assert configmap["metadata"]["namespace"] == daemonset["metadata"]["namespace"]


def pod_spec() -> dict:
    return one("daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]


def the_container() -> dict:
    [container] = pod_spec()["containers"]
    return container


def init_container(name: str) -> dict:
    [found] = [c for c in pod_spec()["initContainers"] if c["name"] == name]
    return found


@pytest.mark.parametrize(("path", "expected"), [
    pytest.param(("nodeSelector",), {"kubernetes.io/os": "linux"}, id="linux_nodes_only__kubeadm_kube_proxy"),
    pytest.param(("containers", 0, "securityContext", "runAsUser"), 0,
                 id="root__capabilities_are_dropped_for_non_root"),
    pytest.param(("containers", 0, "securityContext", "capabilities", "drop"), ["ALL"], id="drops_all_else"),
])
def test_daemonset_pod_field(path, expected):
    value = pod_spec()
    for key in path:
        value = value[key]
    assert value == expected


def test_daemonset_rollout_hands_over_in_place__surge_then_takeover():
    """The new pod starts beside the old one (maxSurge), is ready only once it holds the node (its
    own file: the /readyz port is shared under hostNetwork), and the old pod waits for its SIGTERM
    (exiting would make the kubelet restart it, and it would take the node back)."""
    strategy = one("daemonset.yaml", "DaemonSet")["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    container = the_container()
    command = container["command"]
    assert command[command.index("--after-handover") + 1] == "wait"
    assert command[command.index("--handover-generation") + 1] == "$(POD_TEMPLATE_GENERATION)"
    generation = next(e for e in container["env"] if e["name"] == "POD_TEMPLATE_GENERATION")
    assert generation["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.labels['pod-template-generation']"}}
    ready_file = command[command.index("--ready-file") + 1]
    assert container["readinessProbe"]["exec"]["command"] == ["cat", ready_file]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    [volume] = [v for v in pod_spec()["volumes"] if v["name"] == mounts[str(Path(ready_file).parent)]]
    assert "emptyDir" in volume  # the pod's own, never shared with the other pod


@pytest.mark.parametrize("vouched_for, passes", [(+15, True), (-1, False), (None, False)],
                         ids=["renewed", "expired", "no_file"])
def test_daemonset_liveness_probe_reads_the_pods_own_live_file(tmp_path, vouched_for, passes):
    """The probe the kubelet runs, run here against a file as LiveFile writes it: /livez on the
    shared port may be answered by the other pod during a rollout."""
    container = the_container()
    command = container["command"]
    live_file = command[command.index("--live-file") + 1]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    [volume] = [v for v in pod_spec()["volumes"] if v["name"] == mounts[str(Path(live_file).parent)]]
    assert "emptyDir" in volume
    probe = container["livenessProbe"]
    assert "httpGet" not in probe
    local = tmp_path / "live"
    if vouched_for is not None:
        local.write_text(f"{int(time.time()) + vouched_for}\n")
    argv = [part.replace(live_file, str(local)) for part in probe["exec"]["command"]]
    assert live_file in " ".join(probe["exec"]["command"])
    result = subprocess.run(argv, capture_output=True, timeout=10)
    assert (result.returncode == 0) is passes
    assert LIVE_VALIDITY > 2 * LIVE_RENEW  # a renewal late under load does not fail a live pod


def test_daemonset_declares_no_ports_under_host_network__kubeadm_kube_proxy():
    """With hostNetwork the kubelet turns every containerPort into a hostPort."""
    assert pod_spec()["hostNetwork"] is True
    assert "ports" not in the_container()


def test_daemonset_keeps_no_node_state__apiserver_allocates_in_a_cluster():
    """No hostPath but the kernel's own filesystems: allocations belong to the API server. The
    state dir is an emptyDir, which outlives the container's restarts and not the pod: the last
    applied state a restarted container serves before it has synced."""
    host_paths = {v["hostPath"]["path"] for v in pod_spec()["volumes"] if "hostPath" in v}
    assert host_paths == {"/sys/fs/bpf", "/sys/fs/cgroup"}
    state = [m for m in the_container()["volumeMounts"] if m["mountPath"] == "/var/lib/kubeport"]
    assert len(state) == 1
    volume = next(v for v in pod_spec()["volumes"] if v["name"] == state[0]["name"])
    assert "emptyDir" in volume


def test_daemonset_holds_its_sockets_across_a_crash_of_the_daemon():
    assert "--hold-sockets" in the_container()["command"]


def test_daemonset_keeps_the_held_sockets_in_a_sidecar_across_a_restart_of_the_container():
    """A native sidecar (KEP-753: an init container with restartPolicy Always, started before
    the containers and kept while the pod lives) runs `kubeport fd-store` on the directory
    kubeport's --fd-store names, an emptyDir both mount."""
    sidecar = init_container("fd-store")
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["command"][:2] == ["kubeport", "fd-store"] and sidecar["image"] == the_container()["image"]
    command = the_container()["command"]
    directory = command[command.index("--fd-store") + 1]
    assert sidecar["command"][2] == directory
    for container in (sidecar, the_container()):
        [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == directory]
        volume = next(v for v in pod_spec()["volumes"] if v["name"] == mount["name"])
        assert "emptyDir" in volume
    assert sidecar["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # kubeport's container starts only once the store listens (its supervisor fetches at start).
    assert sidecar["startupProbe"]["exec"]["command"] == ["test", "-S", f"{directory}/fetch"]


#: What kubeport's container may hold beyond an unprivileged one, and what for (proxy/host/).
#: None is for a sysctl: kubeport-init sets those.
KEPT_CAPABILITIES = {
    "NET_ADMIN": "VIP routes, the nftables table, the capture rule, transparent listeners",
    "NET_BIND_SERVICE": "DNS on port 53, service ports below 1024",
    "BPF": "the sockhash and sk_skb program of --tcp-relay sockmap/auto",
}


def resolved(command: list[str], env: dict[str, str]) -> list[str]:
    """The kubelet's $(VAR) expansion of a container's command."""
    for name, value in env.items():
        command = [part.replace(f"$({name})", value) for part in command]
    return command


def configuration_of(container: dict, tmp_path: Path) -> KubeportConfiguration:
    """The configuration the container's `kubeport run` builds, from the ConfigMap's file."""
    config_file = tmp_path / "config.yaml"
    config_file.write_text(one("configmap.yaml", "ConfigMap")["data"]["config.yaml"])
    command = resolved(container["command"], {"NODE_NAME": "node-a", "POD_TEMPLATE_GENERATION": "3"})
    args = build_parser().parse_args(command[1:])
    args.config = str(config_file)
    return build_configuration(args)


def test_the_init_container_runs_first_and_to_completion():
    """A regular init container (no restartPolicy) before the fd-store sidecar: the kubelet starts
    each init container once the one before it completed (or, for a sidecar, started)."""
    first, *rest = pod_spec()["initContainers"]
    assert first["name"] == "kubeport-init" and "restartPolicy" not in first
    assert [c["name"] for c in rest] == ["fd-store"]
    assert first["image"] == the_container()["image"]


def test_the_init_container_runs_kubeports_own_init_only_with_the_daemons_configuration(tmp_path):
    init = init_container("kubeport-init")
    args = build_parser().parse_args(init["command"][1:])
    assert init["command"][:2] == ["kubeport", "run"] and args.command == "run" and args.init_only
    daemon_args = build_parser().parse_args(the_container()["command"][1:])
    assert (args.config, args.hostname_override) == (daemon_args.config, daemon_args.hostname_override)
    node_name = {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert {e["name"]: e["valueFrom"] for e in init["env"]} == {"NODE_NAME": node_name}
    mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
    assert mounts[str(Path(args.config).parent)] == "config"
    # What decides the settings (the NodePort range) is the daemon's.
    assert (configuration_of(init, tmp_path).service_node_port_range
            == configuration_of(the_container(), tmp_path).service_node_port_range)


def test_only_the_init_container_is_privileged():
    """/proc/sys is read-only in an unprivileged container (and a pod's `sysctls` are refused
    with hostNetwork): kube-proxy's --init-only container runs privileged, as this one."""
    spec = pod_spec()
    assert init_container("kubeport-init")["securityContext"]["privileged"] is True
    others = [c for c in spec["initContainers"] + spec["containers"] if c["name"] != "kubeport-init"]
    for container in others:
        context = container["securityContext"]
        assert not context.get("privileged"), container["name"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context["capabilities"]["drop"] == ["ALL"], container["name"]
    assert not any(spec.get(key) for key in ("hostPID", "hostIPC"))


def test_kubeports_container_keeps_only_the_capabilities_it_uses():
    context = the_container()["securityContext"]
    assert set(context["capabilities"]["add"]) == set(KEPT_CAPABILITIES)
    assert context["readOnlyRootFilesystem"] is True
    assert "procMount" not in context and "sysctls" not in pod_spec().get("securityContext", {})


def test_configmap_holds_a_valid_kubeport_configuration():
    data = one("configmap.yaml", "ConfigMap")["data"]
    config = KubeportConfiguration.model_validate(yaml.safe_load(data["config.yaml"]))
    assert config.in_cluster
    assert config.healthz_bind_address == "0.0.0.0:10256"
    assert "stateDir" not in yaml.safe_load(data["config.yaml"])  # manifest mode only
    assert config.dns.cluster_domain == "cluster.local"


def _quantity_mib(text: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    return float(text[:-2]) * units[text[-2:]]


def test_memory_request_covers_the_rss_measured_at_10000_services():
    [container] = pod_spec()["containers"]
    resources = container["resources"]
    assert _quantity_mib(resources["requests"]["memory"]) >= 150  # 142 MiB (bench) + 8 MiB netlink events
    assert _quantity_mib(resources["limits"]["memory"]) >= 2 * _quantity_mib(resources["requests"]["memory"])


def kustomize(directory: Path) -> list[dict]:
    rendered = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True)
    assert rendered.returncode == 0, rendered.stderr
    return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]


def test_kustomize_renders_the_manifests_with_the_image_and_api_server_set(tmp_path):
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    patch = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "kubeport", "namespace": "kube-system"},
             "spec": {"template": {"spec": {"containers": [
                 {"name": "kubeport", "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": "10.1.2.3"}]}]}}}}
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(DEPLOY, overlay)],
        "images": [{"name": "registry.example.com/kubeport", "newName": "registry.test/kubeport", "newTag": "9.9"}],
        "patches": [{"patch": yaml.safe_dump(patch)}],
    }))
    for rendered, image, host in ((kustomize(DEPLOY), "registry.example.com/kubeport:0.1.0", "192.168.10.10"),
                                  (kustomize(overlay), "registry.test/kubeport:9.9", "10.1.2.3")):
        assert {doc["kind"] for doc in rendered} >= {"DaemonSet", "ConfigMap", "ClusterRole", "ServiceAccount"}
        for doc in rendered:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        [daemonset] = [doc for doc in rendered if doc["kind"] == "DaemonSet"]
        [container] = daemonset["spec"]["template"]["spec"]["containers"]
        for init in daemonset["spec"]["template"]["spec"]["initContainers"]:
            assert init["image"] == image, init["name"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert (container["image"], env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == (
            image, host, "6443")


def test_daemonset_gives_connect_balancing_the_hosts_bpffs_and_cgroup2():
    """Pins outlive the container only in the host's bpffs; the node's pods are in the host's
    cgroup hierarchy, which the daemon looks for at /run/kubeport/cgroup2 first (connectlb/pins.py)."""
    from kubeport.proxy.connectlb import pins

    mounts = {m["mountPath"]: m for m in the_container()["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    assert volumes[mounts["/sys/fs/bpf"]["name"]]["hostPath"]["path"] == "/sys/fs/bpf"
    cgroup = mounts[str(pins.CGROUP2_FALLBACK)]
    assert volumes[cgroup["name"]]["hostPath"]["path"] == "/sys/fs/cgroup" and cgroup["readOnly"] is True
    assert "BPF" in the_container()["securityContext"]["capabilities"]["add"]

"""deploy/daemonset.yaml's pod, run from kubeport's image under podman the way the kubelet runs it.

The pod template is read from deploy/daemonset.yaml when the test runs, so the test follows the
manifest as it is. What the kubelet would do, and how it is imitated here:

- ``hostNetwork: true``: every container joins the node's network namespace of the test
  topology (``podman run --network ns:/run/netns/<node>``); each keeps its own PID namespace
  (``shareProcessNamespace`` unset). ``dnsPolicy: Default``: the node's resolver, here the
  topology's upstream address.
- init containers in order (https://kubernetes.io/docs/concepts/workloads/pods/init-containers/):
  each runs to completion (exit 0) before the next starts; a native sidecar (``restartPolicy:
  Always``) is started and the next one waits for its startupProbe to pass
  (https://kubernetes.io/docs/concepts/workloads/pods/sidecar-containers/). Then the containers.
- ``command`` replaces the image's ENTRYPOINT, ``$(VAR)`` expanded from the container's
  environment (https://kubernetes.io/docs/tasks/inject-data-application/define-interdependent-environment-variables/);
  ``env`` with ``fieldRef``s resolved as the downward API would.
- securityContext: ``privileged`` -> ``--privileged``; capabilities -> ``--cap-drop``/``--cap-add``;
  ``readOnlyRootFilesystem`` -> ``--read-only`` (and no tmpfs of podman's own on /tmp, /run:
  the kubelet adds none); ``allowPrivilegeEscalation: false`` -> no_new_privs; ``runAsUser``.
  No seccompProfile in the pod: Unconfined, the kubelet's default without --seccomp-default.
- ``resources.limits.memory`` -> ``--memory``.
- volumes: ``emptyDir`` -> a directory of the pod's, outliving container restarts, on a tmpfs
  of its own for ``medium: Memory`` (sizeLimit its size); ``configMap`` -> a directory with
  deploy/configmap.yaml's data, always read-only; ``hostPath`` -> the path. The service
  account's token, ca.crt and namespace at /var/run/secrets/kubernetes.io/serviceaccount,
  read-only, in every container (automountServiceAccountToken).
- KUBERNETES_SERVICE_HOST/PORT (the kubelet's for every container, and the manifest's own for
  kubeport's) point at the fake API server in the node's namespace.
- a container restarted (its process killed): a new container from the same spec, as the
  kubelet creates one per restart, with the pod's volumes.

Probes are run as the kubelet's exec probes are: the command inside the container (``podman
exec``), success on exit 0.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import EXT_IPS, REPO, CommandFailed, until_sync

BUILD_SH = REPO / "deploy" / "image" / "build.sh"
DAEMONSET = REPO / "deploy" / "daemonset.yaml"
CONFIGMAP = REPO / "deploy" / "configmap.yaml"
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
#: containers of the test carry this label: leftovers of a killed run are found by it
LABEL = "io.kubeport.test"
#: Debian packages of what the image and its test need, for a skip's reason
DEBIAN_PACKAGES = "podman mmdebstrap runc"


def image_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "not root (podman's rootful storage and mmdebstrap's chroot are root's)"
    needed = ["podman"] if os.environ.get("KUBEPORT_IMAGE") else ["podman", "mmdebstrap"]
    missing = [tool for tool in needed if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (Debian: apt-get install {DEBIAN_PACKAGES})"
    return None


def build_image(timeout: float = 900.0) -> str:
    """$KUBEPORT_IMAGE, or the image deploy/image/build.sh builds (at once when its inputs are unchanged)."""
    if given := os.environ.get("KUBEPORT_IMAGE"):
        return given
    done = subprocess.run([str(BUILD_SH)], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise CommandFailed(None, [str(BUILD_SH)], done.returncode, done.stdout, done.stderr)
    return done.stdout.strip().splitlines()[-1]


@functools.cache
def _build_sh_lines(option: str) -> tuple[str, ...]:
    done = subprocess.run([str(BUILD_SH), option], capture_output=True, text=True, check=True, timeout=30)
    return tuple(done.stdout.split())


def podman(*args: Any, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess:
    """podman with the global options build.sh chose for this host (the OCI runtime)."""
    argv = ["podman", *_build_sh_lines("--podman-args"), *map(str, args)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        raise CommandFailed(None, argv, None, err.stdout, err.stderr) from None
    if check and done.returncode != 0:
        raise CommandFailed(None, argv, done.returncode, done.stdout, done.stderr)
    return done


def image_size(image: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout)


# --- the manifests ------------------------------------------------------------------------------


def _yaml_documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def pod_template() -> dict:
    """The DaemonSet's pod template, as the file has it now."""
    (daemonset,) = [doc for doc in _yaml_documents(DAEMONSET) if doc["kind"] == "DaemonSet"]
    return daemonset["spec"]["template"]


def config_map(name: str) -> dict[str, str]:
    for doc in _yaml_documents(CONFIGMAP):
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == name:
            return doc.get("data") or {}
    raise LookupError(f"no ConfigMap {name} in {CONFIGMAP}")


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion: defined names replaced, undefined ones left as they are,
    $$ an escaped $ (k8s.io/kubernetes third_party/forked/golang/expansion)."""
    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _VAR_REF.sub(one, text)


_QUANTITY = re.compile(r"^(\d+)(Ki|Mi|Gi|k|M|G)?$")
_FACTORS = {None: 1, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "k": 1000, "M": 1000**2, "G": 1000**3}


def quantity_bytes(text: str) -> int:
    match = _QUANTITY.match(str(text))
    if not match:
        raise ValueError(f"unsupported quantity {text!r}")
    return int(match.group(1)) * _FACTORS[match.group(2)]


# --- the pod ------------------------------------------------------------------------------------


@dataclass
class ApiEndpoint:
    """Where the containers reach the API server, and the service account's credentials."""

    host: str
    port: int
    token: str
    ca_cert: Path


@dataclass
class PodRun:
    """One pod of the DaemonSet on a node of the topology; containers by their manifest name."""

    name: str  # unique per run: the containers' names start with it
    ns: str  # the node's network namespace
    node_name: str
    node_ip: str
    image: str
    api: ApiEndpoint
    directory: Path
    template: dict = field(default_factory=pod_template)
    generation: str = "1"  # the pod-template-generation label the DaemonSet controller sets
    #: container name -> the podman names of its runs, the current last
    runs: dict[str, list[str]] = field(default_factory=dict)
    _mounts: list[Path] = field(default_factory=list)
    _volumes: dict[str, tuple[Path, bool]] = field(default_factory=dict)

    # --- volumes ---

    def prepare_volumes(self) -> None:
        """The pod's volumes, made before any container starts, as the kubelet mounts them."""
        spec = self.template["spec"]
        base = self.directory / "volumes"
        for volume in spec.get("volumes", []):
            path = base / volume["name"]
            if "emptyDir" in volume:
                path.mkdir(parents=True)
                empty = volume["emptyDir"] or {}
                if empty.get("medium") == "Memory":
                    size = ["-o", f"size={quantity_bytes(empty['sizeLimit'])}"] if "sizeLimit" in empty else []
                    subprocess.run(["mount", "-t", "tmpfs", *size, "tmpfs", str(path)], check=True, timeout=10)
                    self._mounts.append(path)
                self._volumes[volume["name"]] = (path, False)
            elif "configMap" in volume:
                path.mkdir(parents=True)
                for key, text in config_map(volume["configMap"]["name"]).items():
                    (path / key).write_text(text)
                self._volumes[volume["name"]] = (path, True)  # configMap volumes are always read-only
            elif "hostPath" in volume:
                self._volumes[volume["name"]] = (Path(volume["hostPath"]["path"]), False)
            else:
                raise NotImplementedError(f"volume {volume['name']}: only emptyDir, configMap and hostPath")
        account = base / "kube-api-access"
        account.mkdir(parents=True)
        (account / "token").write_text(self.api.token)
        (account / "ca.crt").write_bytes(self.api.ca_cert.read_bytes())
        (account / "namespace").write_text(self.template.get("metadata", {}).get("namespace", "kube-system"))
        self._volumes[""] = (account, True)

    # --- containers ---

    def container_spec(self, name: str) -> dict:
        spec = self.template["spec"]
        for container in (*spec.get("initContainers", []), *spec["containers"]):
            if container["name"] == name:
                return container
        raise LookupError(f"no container {name} in the pod template")

    def _field(self, path: str) -> str:
        labels = {**self.template.get("metadata", {}).get("labels", {}), "pod-template-generation": self.generation}
        values = {"spec.nodeName": self.node_name, "metadata.name": self.name, "metadata.namespace": "kube-system",
                  "status.hostIP": self.node_ip, "status.podIP": self.node_ip,  # hostNetwork: the node's
                  "spec.serviceAccountName": self.template["spec"].get("serviceAccountName", "default")}
        if label := re.fullmatch(r"metadata\.labels\['([^']+)'\]", path):
            return labels[label.group(1)]
        return values[path]

    def environment(self, container: dict) -> dict[str, str]:
        env = {"KUBERNETES_SERVICE_HOST": self.api.host, "KUBERNETES_SERVICE_PORT": str(self.api.port)}
        for var in container.get("env", []):
            if var["name"] in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
                continue  # the manifest's placeholder for the control-plane endpoint: the fake's
            if "value" in var:
                env[var["name"]] = expand(var["value"], env)
            elif "fieldRef" in var.get("valueFrom", {}):
                env[var["name"]] = self._field(var["valueFrom"]["fieldRef"]["fieldPath"])
            else:
                raise NotImplementedError(f"env {var['name']}: only value and fieldRef")
        return env

    def podman_args(self, container: dict, run_name: str) -> list[str]:
        """`podman run` options and arguments for one run of `container`."""
        spec = self.template["spec"]
        assert spec.get("hostNetwork"), "the pod runs on the host network"
        security = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
        args = ["--detach", "--name", run_name, "--label", f"{LABEL}={self.ns}",
                *_build_sh_lines("--run-args"),
                "--network", f"ns:/run/netns/{self.ns}", "--dns", EXT_IPS[0],
                "--read-only-tmpfs=false"]
        if security.get("privileged"):
            args.append("--privileged")
        else:
            caps = security.get("capabilities", {})
            args += [f"--cap-drop={cap}" for cap in caps.get("drop", [])]
            args += [f"--cap-add={cap}" for cap in caps.get("add", [])]
        if security.get("readOnlyRootFilesystem"):
            args.append("--read-only")
        if security.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        if "runAsUser" in security:
            args += ["--user", str(security["runAsUser"])]
        if "seccompProfile" not in security:
            args += ["--security-opt", "seccomp=unconfined"]
        if memory := container.get("resources", {}).get("limits", {}).get("memory"):
            args += ["--memory", str(quantity_bytes(memory))]
        env = self.environment(container)
        for key, value in env.items():
            args += ["--env", f"{key}={value}"]
        mounts = [("", SERVICE_ACCOUNT_MOUNT, True)]
        mounts += [(m["name"], m["mountPath"], m.get("readOnly", False)) for m in container.get("volumeMounts", [])]
        for volume, target, read_only in mounts:
            source, always_read_only = self._volumes[volume]
            options = "ro" if read_only or always_read_only else "rw"
            args += ["--volume", f"{source}:{target}:{options}"]
        command = [expand(part, env) for part in container.get("command", [])]
        if command:
            args += ["--entrypoint", json.dumps(command)]
        args.append(self.image)
        args += [expand(part, env) for part in container.get("args", [])]
        return args

    def start(self, name: str) -> str:
        """A new run of container `name` (its first, or a restart); returns its podman name."""
        runs = self.runs.setdefault(name, [])
        run_name = f"{self.name}-{name}-{len(runs)}"
        runs.append(run_name)
        podman("run", *self.podman_args(self.container_spec(name), run_name))
        return run_name

    def current(self, name: str) -> str:
        return self.runs[name][-1]

    def probe(self, name: str, kind: str, timeout: float = 10.0) -> bool:
        """The container's exec probe (startupProbe, readinessProbe, livenessProbe) once: passed?"""
        command = self.container_spec(name)[kind]["exec"]["command"]
        done = podman("exec", self.current(name), *command, timeout=timeout, check=False)
        return done.returncode == 0

    def state(self, name: str) -> dict:
        return json.loads(podman("inspect", "--format", "{{json .State}}", self.current(name)).stdout)

    def logs(self, name: str) -> str:
        done = podman("logs", self.current(name), check=False)
        return done.stdout + done.stderr

    def wait_exit(self, name: str, timeout: float) -> int:
        done = podman("wait", self.current(name), timeout=timeout)
        return int(done.stdout.strip().splitlines()[-1])

    def start_pod(self, on_container: Callable[[str, float], None] = lambda name, started: None) -> None:
        """Init containers in order, then the containers, as the kubelet starts a pod.
        ``on_container(name, monotonic start time)`` is called as each container starts."""
        self.prepare_volumes()
        spec = self.template["spec"]
        for container in spec.get("initContainers", []):
            name = container["name"]
            on_container(name, time.monotonic())
            self.start(name)
            if container.get("restartPolicy") == "Always":  # a native sidecar
                if probe := container.get("startupProbe"):
                    period, threshold = probe.get("periodSeconds", 10), probe.get("failureThreshold", 3)
                    until_sync(lambda: self.probe(name, "startupProbe"), f"{name}'s startupProbe",
                               period * threshold + probe.get("initialDelaySeconds", 0), interval=0.1)
            else:
                code = self.wait_exit(name, timeout=60)
                assert code == 0, f"init container {name} exited {code}:\n{self.logs(name)}"
        for container in spec["containers"]:
            on_container(container["name"], time.monotonic())
            self.start(container["name"])

    def kill(self, name: str) -> None:
        """SIGKILL to the container's first process: the container ends with it."""
        podman("kill", "--signal", "KILL", self.current(name))
        self.wait_exit(name, timeout=30)

    def log_tails(self, lines: int = 40) -> str:
        parts = []
        for runs in self.runs.values():
            for run_name in runs:
                text = podman("logs", "--tail", lines, run_name, check=False)
                parts.append(f"--- {run_name}\n{text.stdout}{text.stderr}")
        return "\n".join(parts)

    def close(self) -> None:
        """Every container of the pod removed, then its memory-backed volumes unmounted."""
        names = [run for runs in self.runs.values() for run in runs]
        if names:
            podman("rm", "--force", "--time", "5", *names, timeout=60, check=False)
        for path in self._mounts:
            subprocess.run(["umount", "--lazy", str(path)], check=False, timeout=10)
        self._mounts.clear()


def remove_leftovers() -> None:
    """Containers of an earlier run killed before it could remove them: those whose node
    namespace is gone, or that have stopped (a running one may be another session's)."""
    with contextlib.suppress(CommandFailed):
        listing = podman("ps", "--all", "--filter", f"label={LABEL}",
                         "--format", "{{.ID}} {{.State}} {{index .Labels \"%s\"}}" % LABEL).stdout
        doomed = [ident for ident, state, ns in (line.split() for line in listing.splitlines() if line.strip())
                  if state != "running" or not Path(f"/run/netns/{ns}").exists()]
        if doomed:
            podman("rm", "--force", "--time", "0", *doomed, timeout=60, check=False)

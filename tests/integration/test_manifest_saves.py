"""Every way a tool saves a manifest file keeps the Service's allocations and loses no request;
a directory emptied all at once, or its volume unmounted, is not every Service deleted.

The real tools replace the file (`sed -i`, `mv`, `rm` + `cp`, vim in ex mode, `git checkout`,
`cp --remove-destination`, `install`, a kubectl redirect, a writer that pauses after creating
the file) while a client in pod a1 loops through the ClusterIP over TCP and UDP; `kubeport get
-o json` before and after must show the same uid, creationTimestamp, ClusterIPs, nodePorts
and healthCheckNodePort. KUBEPORT_SAVE_REPS sets the repetitions per tool (3; the issue's
acceptance run is 20).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from support.netns import KubeportDaemon, kubeport, run_in, spawn_in, until_sync
from support.netns.daemon import kubeport_bin, problems_of, status_api
from support.netns.manifests import DAEMON_ARGS, node, write
from support.netns.operating import CLIENT_LOOP

pytestmark = pytest.mark.integration

REPS = int(os.environ.get("KUBEPORT_SAVE_REPS", "3"))
# Debian's vim, and vim-tiny (what .ci/run installs); under CI one of them must be there.
VIMS = [vim for vim in ("vim", "vim.tiny") if shutil.which(vim)] or ["vim.tiny"]


def web_yaml(topology, revision: int) -> str:
    """The Service (LoadBalancer, Local: every kind of allocation) and its slice; the revision is
    the first endpoint's hostname, which `kubeport get endpointslices` shows."""
    pods = [topology.pod_info(n, i) for n, i in (("a", 2), ("b", 1), ("b", 2))]
    endpoints = "".join(
        f"- addresses: [{pod.ip()}]\n  nodeName: {pod.node.name}\n"
        + (f"  hostname: rev{revision}\n" if k == 0 else "")
        for k, pod in enumerate(pods))
    return textwrap.dedent("""\
        apiVersion: v1
        kind: Service
        metadata: {name: web, namespace: demo}
        spec:
          type: LoadBalancer
          externalTrafficPolicy: Local
          ports:
          - {name: http, port: 80, targetPort: 8080}
          - {name: echo, port: 9090, protocol: UDP}
        ---
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSlice
        metadata:
          name: web-1
          namespace: demo
          labels: {kubernetes.io/service-name: web}
        addressType: IPv4
        ports:
        - {name: http, port: 8080}
        - {name: echo, port: 9090, protocol: UDP}
        endpoints:
        """) + endpoints


class Files:
    """The manifest directory, a scratch directory beside it, and the file the tools replace."""

    def __init__(self, topology, tmp_path: Path, web_in: str = "") -> None:
        self.topology = topology
        self.dir = tmp_path / "manifests"
        self.scratch = tmp_path / "scratch"
        self.dir.mkdir(exist_ok=True)  # a volume may be mounted there already
        self.scratch.mkdir()
        self.web = self.dir / web_in / "web.yaml"
        write(self.dir, "node", node(topology, "a"))
        self.web.write_text(web_yaml(topology, 0))

    def staged(self, revision: int) -> Path:
        staged = self.scratch / "web.yaml"
        staged.write_text(web_yaml(self.topology, revision))
        return staged


def run(*cmd: str | Path) -> None:
    subprocess.run([str(c) for c in cmd], check=True, capture_output=True, timeout=30)


def shell(script: str, *args: str | Path) -> None:
    run("sh", "-c", script, "sh", *args)


SUBSTITUTE = r"s/hostname: rev[0-9]*/hostname: rev{}/"
WRITER_PAUSING = (  # unlink, create, pause, write, close: the pause is what is tested
    "import os, sys, time\n"
    "target, pause, text = sys.argv[1], float(sys.argv[2]), open(sys.argv[3]).read()\n"
    "os.unlink(target)\n"
    "with open(target, 'w') as out:\n"
    "    time.sleep(pause)\n"
    "    out.write(text)\n"
)

TRUNCATE_THEN_APPEND = (  # `: > f; cat new >> f` with a pause between: the file is closed empty meanwhile
    "import sys, time\n"
    "target, pause, text = sys.argv[1], float(sys.argv[2]), open(sys.argv[3]).read()\n"
    "open(target, 'w').close()\n"
    "time.sleep(pause)\n"
    "with open(target, 'a') as out:\n"
    "    out.write(text)\n"
)


def save_sed(files: Files, n: int) -> int:
    run("sed", "-i", SUBSTITUTE.format(n), files.web)
    return n


def save_mv_over(files: Files, n: int) -> int:
    run("mv", files.staged(n), files.web)
    return n


def save_rm_then_cp(files: Files, n: int) -> int:
    shell('rm "$1" && cp "$2" "$1"', files.web, files.staged(n))
    return n


def save_vim(vim: str, *settings: str) -> Callable[[Files, int], int]:
    def save(files: Files, n: int) -> int:
        options = [arg for setting in settings for arg in ("-c", f"set {setting}")]
        run(vim, "-Es", *options, "-c", "%" + SUBSTITUTE.format(n), "-c", "wq", files.web)
        return n
    return save


def save_git_checkout(files: Files, n: int) -> int:
    run("git", "-C", files.dir, "checkout", "-q", "other" if n % 2 else "main")
    return n % 2


def save_cp_remove_destination(files: Files, n: int) -> int:
    run("cp", "--remove-destination", files.staged(n), files.web)
    return n


def save_install(files: Files, n: int) -> int:
    run("install", "-m", "0644", files.staged(n), files.web)
    return n


def save_kubectl_redirect(files: Files, n: int) -> int:
    shell('kubectl annotate --local -f "$2" kubeport.test/revision="$3" --overwrite -o yaml > "$1"',
          files.web, files.staged(n), str(n))
    return n


def save_writer_pausing(pause: float) -> Callable[[Files, int], int]:
    def save(files: Files, n: int) -> int:
        run(sys.executable, "-c", WRITER_PAUSING, files.web, str(pause), files.staged(n))
        return n
    return save


def save_truncate_then_append(pause: float) -> Callable[[Files, int], int]:
    def save(files: Files, n: int) -> int:
        run(sys.executable, "-c", TRUNCATE_THEN_APPEND, files.web, str(pause), files.staged(n))
        return n
    return save


SAVES = {
    "sed_i": save_sed,
    "mv_over": save_mv_over,
    "rm_then_cp": save_rm_then_cp,
    **{f"{vim}_ex_mode": save_vim(vim) for vim in VIMS},
    # vim's rename-then-write save (`backupcopy=no`), which files under /tmp are otherwise spared.
    **{f"{vim}_ex_mode_renaming_backup": save_vim(vim, "backupcopy=no backupskip=") for vim in VIMS},
    "git_checkout": save_git_checkout,
    "cp_remove_destination": save_cp_remove_destination,
    "install": save_install,
    "kubectl_redirect": save_kubectl_redirect,
    "writer_pausing_20ms": save_writer_pausing(0.02),
    "writer_pausing_100ms": save_writer_pausing(0.1),
    "writer_pausing_300ms": save_writer_pausing(0.3),
    # Emptied and closed, then appended to: held like a deleted file, for the same 3 s.
    "truncate_then_append_100ms": save_truncate_then_append(0.1),
    "truncate_then_append_500ms": save_truncate_then_append(0.5),
    "truncate_then_append_2500ms": save_truncate_then_append(2.5),
}


def git_branches(files: Files) -> None:
    """main holds revision 0, other revision 1 (the manifest directory is the work tree)."""
    git = ("git", "-C", files.dir, "-c", "user.name=kubeport", "-c", "user.email=dev@kubeport.invalid")
    run(*git, "init", "-q", "-b", "main")
    run(*git, "add", "-A")
    run(*git, "commit", "-qm", "revision 0")
    run(*git, "checkout", "-qb", "other")
    files.web.write_text(web_yaml(files.topology, 1))
    run(*git, "commit", "-qam", "revision 1")
    run(*git, "checkout", "-q", "main")


def allocations(ns: str) -> dict[str, tuple]:
    """What kubeport allocated, per Service, from `kubeport get services -o json`."""
    listing = json.loads(kubeport(ns, "get", "services", "-A", "-o", "json"))
    return {f"{s['metadata']['namespace']}/{s['metadata']['name']}": _allocation(s) for s in listing["items"]}


def _allocation(svc: dict) -> tuple:
    spec = svc["spec"]
    return (svc["metadata"].get("uid"), svc["metadata"].get("creationTimestamp"), tuple(spec.get("clusterIPs", [])),
            tuple(p.get("nodePort") for p in spec.get("ports", [])), spec.get("healthCheckNodePort"))


def served(ns: str) -> tuple[tuple, str | None]:
    """web's allocation and the revision its slice carries, from the status API (cheaper than a
    `kubeport get` per repetition)."""
    services = status_api(ns, "/api/v1/namespaces/demo/services")["items"]
    slices = status_api(ns, "/api/v1/namespaces/demo/endpointslices")["items"]
    web = [_allocation(s) for s in services if s["metadata"]["name"] == "web"]
    hostnames = [e.get("hostname") for s in slices for e in s["endpoints"] if e.get("hostname")]
    return (web[0] if web else ()), (hostnames[0] if hostnames else None)


class ClientLoop:
    """client_loop.py in pod a1 through web's ClusterIP, TCP and UDP."""

    def __init__(self, topology, cluster_ip: str, status: Path) -> None:
        self.status = status
        self.proc = spawn_in(topology.pod("a", 1), sys.executable, str(CLIENT_LOOP), "--tcp", f"{cluster_ip}:80",
                             "--udp", f"{cluster_ip}:9090", "--status", str(status), stdout=subprocess.PIPE,
                             text=True)

    def progress(self) -> dict:
        try:
            return json.loads(self.status.read_text())
        except (OSError, ValueError):
            return {"tcp_ok": 0, "udp_ok": 0}

    def running(self, more: int = 20) -> None:
        start = self.progress()
        until_sync(lambda: self.progress()["tcp_ok"] >= start["tcp_ok"] + more
                   and self.progress()["udp_ok"] >= start["udp_ok"] + more, "the client loop making progress", 20)

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=10)
        return json.loads(out.strip().splitlines()[-1])


def start(topology, files: Files, tmp_path: Path) -> tuple[KubeportDaemon, dict[str, tuple], ClientLoop]:
    daemon = KubeportDaemon(topology.node("a"), files.dir, tmp_path / "state", *DAEMON_ARGS)
    daemon.wait_ready()
    before = allocations(daemon.ns)
    client = ClientLoop(topology, before["demo/web"][2][0], tmp_path / "client.json")
    client.running()
    return daemon, before, client


def problems(daemon: KubeportDaemon) -> list[str]:
    return problems_of(daemon.ns)


@pytest.mark.parametrize("save", SAVES.values(), ids=SAVES.keys())
def test_saving_a_file_keeps_its_allocations_and_loses_no_request(topology, pods, tmp_path, save):
    files = Files(topology, tmp_path)
    if save is save_git_checkout:
        git_branches(files)
    daemon, before, client = start(topology, files, tmp_path)
    ns = daemon.ns
    for n in range(1, REPS + 1):
        revision = save(files, n)
        wanted = f"rev{revision}"
        state = until_sync(lambda: (s := served(ns))[1] == wanted and s, f"{wanted} served", 10)  # noqa: B023
        assert state[0] == before["demo/web"], f"repetition {n}: web's allocation changed"
        client.running(5)  # requests between the saves too, not only during them
    client.running()
    counts = client.stop()
    assert counts["tcp_fail"] == 0 and counts["udp_lost"] == 0, counts
    assert allocations(ns) == before
    assert problems(daemon) == []


def test_a_file_left_empty_past_the_grace__its_objects_deleted_as_a_deleted_files(topology, pods, tmp_path):
    """Past the 3 s a deleted file gets, an emptied file is honoured too: the Service goes, and
    the content appended later (here once the deletion is seen, 3 s or more after the
    truncation) is a new Service."""
    files = Files(topology, tmp_path)
    daemon, _, client = start(topology, files, tmp_path)
    client.stop()
    files.web.write_text("")
    gone = until_sync(lambda: "demo/web" not in allocations(daemon.ns) and daemon.log_text(),
                      "web deleted once the grace ended", 15)
    assert "Traceback" not in gone
    with open(files.web, "a") as out:
        out.write(web_yaml(topology, 1))
    until_sync(lambda: served(daemon.ns)[1] == "rev1", "the appended content served", 10)
    assert problems(daemon) == []


def test_directory_recreated_empty__keeps_serving_until_the_marker(topology, pods, tmp_path):
    files = Files(topology, tmp_path)
    daemon, before, client = start(topology, files, tmp_path)
    saved = tmp_path / "saved"
    shutil.copytree(files.dir, saved)
    shell('rm -rf "$1" && mkdir "$1"', files.dir)
    until_sync(lambda: any("the directory was replaced" in p for p in problems(daemon)),
               "the emptied directory reported in /readyz", 15)
    client.running(50)
    assert allocations(daemon.ns) == before
    assert "serving the objects of node.json, web.yaml" in kubeport_get_stderr(daemon.ns)
    shell('cp -a "$1"/. "$2"', saved, files.dir)  # the files come back
    until_sync(lambda: problems(daemon) == [], "the files back, no problem left", 15)
    client.running()
    counts = client.stop()
    assert counts["tcp_fail"] == 0 and counts["udp_lost"] == 0, counts
    assert allocations(daemon.ns) == before

    # Meant: with the marker, an emptied directory deletes what it held.
    (files.dir / ".kubeport-allow-empty").touch()
    shell('rm -f "$1"/*.yaml "$1"/*.json', files.dir)
    until_sync(lambda: "demo/web" not in allocations(daemon.ns), "web deleted once the emptying is meant", 15)
    assert problems(daemon) == []


def kubeport_get_stderr(ns: str) -> str:
    return run_in(ns, kubeport_bin(), "get", "services", "-A").stderr


@pytest.mark.parametrize("volume, reported", [
    pytest.param("", "the directory was replaced", id="the_manifest_directory"),
    pytest.param("team", "another file system at team (mounted over or unmounted)", id="a_subdirectory"),
])
def test_volume_unmounted__keeps_serving_and_the_files_come_back(topology, pods, tmp_path, volume, reported):
    mountpoint = tmp_path / "manifests" / volume
    mountpoint.mkdir(parents=True)
    run("mount", "-t", "tmpfs", "-o", "size=4m", "kubeport-test", mountpoint)
    try:
        files = Files(topology, tmp_path, web_in=volume)
        saved = tmp_path / "saved"
        shutil.copytree(mountpoint, saved)
        daemon, before, client = start(topology, files, tmp_path)
        # `ip netns exec` gave the daemon a mount namespace of its own (the host's / may be
        # private): unmount the volume where the daemon sees it, and in the test's namespace.
        run("nsenter", "-t", str(daemon.proc.pid), "-m", "umount", mountpoint)
        run("umount", mountpoint)
        until_sync(lambda: any(reported in p for p in problems(daemon)), "the unmounted volume reported in /readyz", 15)
        assert reported in daemon.log_text()
        client.running(50)
        assert allocations(daemon.ns) == before
        shell('cp -a "$1"/. "$2"', saved, mountpoint)  # the same files, now in the directory beneath
        until_sync(lambda: problems(daemon) == [], "the files back, no problem left", 15)
        client.running()
        counts = client.stop()
        assert counts["tcp_fail"] == 0 and counts["udp_lost"] == 0, counts
        assert allocations(daemon.ns) == before
    finally:
        try:
            run("umount", mountpoint)
        except subprocess.CalledProcessError:
            pass  # unmounted by the test

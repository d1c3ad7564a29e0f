"""kubeport where kube-proxy ran: kubeadm's kube-proxy config.conf and command line as they are,
and `--cleanup` after a `kill -9` under load leaving the host as before kubeport ran."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from support.netns import KubeportDaemon, curl_in, http_url, kubeport, run_in, spawn_in, until_sync
from support.netns.daemon import kubeport_bin
from support.netns.manifests import DAEMON_ARGS
from support.netns.operating import (  # noqa: F401  (manifests: a fixture)
    ECHO_IP,
    WEB_EXTERNAL_IP,
    WEB_IP,
    ClientLoop,
    manifests,
    vip_present,
)

pytestmark = pytest.mark.integration

KUBEADM_CONFIG = Path(__file__).resolve().parent.parent / "fixtures" / "kubeadm" / "config.conf"


def host_state(ns: str) -> dict[str, str]:
    """What kube-proxy's --cleanup promises to restore, as an operator would look at it."""
    return {
        "local routes": run_in(ns, "ip", "route", "show", "table", "local", "proto", "0x6b").stdout,
        "local routes v6": run_in(ns, "ip", "-6", "route", "show", "table", "local", "proto", "0x6b").stdout,
        "nft tables": run_in(ns, "nft", "list", "tables").stdout,
        "ip rule": run_in(ns, "ip", "rule").stdout,
        "ip -6 rule": run_in(ns, "ip", "-6", "rule").stdout,
    }


def test_kubeadms_config_conf_and_kube_proxy_flags_start_kubeport(topology, pods, manifests, tmp_path):
    before = host_state(topology.node("a"))
    daemon = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS,
                            "--config", str(KUBEADM_CONFIG), "--proxy-mode=iptables", "--v=2")
    daemon.wait_ready()
    assert "table inet kubeport_replies" in host_state(topology.node("a"))["nft tables"]
    assert curl_in(topology.pod("a", 1), http_url(WEB_IP, 80, "/")).startswith("pod=")
    log = daemon.log_text()
    ignored = [line for line in log.splitlines() if "not applicable to a userspace proxy, ignored:" in line]
    assert len(ignored) == 1, log
    assert "mode, nftables" in ignored[0] and "iptables" in ignored[0]
    assert "--proxy-mode=iptables ignored" in log
    assert daemon.stop() == 0
    assert host_state(topology.node("a")) == before  # a clean stop removes what it programmed


def test_cleanup_after_kill_9_under_load_leaves_the_host_as_before(topology, pods, manifests, tmp_path):
    node_ns, state = topology.node("a"), tmp_path / "state"
    before = host_state(node_ns)
    daemon = KubeportDaemon(node_ns, manifests, state, *DAEMON_ARGS, "--ready-file", tmp_path / "ready")
    daemon.wait_ready()
    client = ClientLoop.start(topology.pod("a", 1), tmp_path / "client.json", "--tcp", f"{WEB_IP}:80",
                              "--udp", f"{ECHO_IP}:9090")
    client.wait_for("client running", tcp_ok=20, udp_ok=20)
    daemon.proc.kill()
    daemon.proc.wait(timeout=10)
    left = host_state(node_ns)
    assert vip_present(topology, WEB_IP) and "table inet kubeport" in left["nft tables"]
    # The bridge table too, except in a user namespace (the kernel refuses its link-layer rewrite there).
    assert "table inet kubeport_replies" in left["nft tables"]
    assert "lookup 27499" in left["ip rule"] and (tmp_path / "ready").exists()

    # The next instance reports what the dead one left, then serves as usual.
    daemon.start()
    daemon.wait_ready()
    assert "did not stop cleanly and left:" in daemon.log_text()
    client.wait_for("client served by the next instance", tcp_ok=40)
    daemon.proc.kill()
    daemon.proc.wait(timeout=10)
    client.stop()

    # As kube-proxy is run: its configuration file, no subcommand.
    cleanup = [f"--config={KUBEADM_CONFIG}", "--cleanup", "--hostname-override=node-a", "--state-dir", str(state),
               "--ready-file", str(tmp_path / "ready")]
    out = kubeport(node_ns, *cleanup)
    assert "removed" in out and "local routes" in out and "nftables table inet kubeport" in out, out
    assert "removed nftables table inet kubeport_replies" in out
    assert ("table bridge kubeport" in left["nft tables"]) == ("removed nftables table bridge kubeport" in out)
    assert f"removed {tmp_path / 'ready'}" in out
    assert host_state(node_ns) == before
    assert kubeport(node_ns, *cleanup).strip() == "kubeport: nothing to remove"  # idempotent, exit 0
    gone = run_in(topology.pod("a", 1), "curl", "-s", "--max-time", "1", http_url(WEB_IP, 80, "/"), check=False)
    assert gone.returncode != 0, "the service address no longer answers"


def test_cleanup_refuses_while_an_instance_serves_the_node(topology, pods, manifests, tmp_path):
    node_ns = topology.node("a")
    daemon = KubeportDaemon(node_ns, manifests, tmp_path / "state", *DAEMON_ARGS)
    daemon.wait_ready()
    done = run_in(node_ns, str(kubeport_bin()), "--cleanup", "--hostname-override",
                  "node-a", check=False)
    assert done.returncode == 1 and "stop it first" in done.stderr
    assert vip_present(topology, WEB_IP)
    assert daemon.stop() == 0


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    from support.apiserver.tls import make_tls

    return make_tls(tmp_path_factory.mktemp("pki"))


def test_kubeadms_daemonset_command_line_serves_from_the_api_server(topology, pods, tls, tmp_path):
    """kubeadm's kube-proxy pod, kubeport in its place: `--config=config.conf
    --hostname-override=NODE` and nothing else, the kubeconfig.conf kubeadm writes beside it
    (certificate-authority and tokenFile files, as the pod's service account mounts them)."""
    from support.netns.apiserver import NetnsApiServer, seed

    node_ns = topology.node("b")
    with NetnsApiServer(node_ns, tls) as api:
        seed(api, topology, [topology.pod_info("b", 1), topology.pod_info("b", 2)])
        token = yaml.safe_load(api.kubeconfig(tmp_path / "probe").read_text())["users"][0]["user"]["token"]
        (tmp_path / "token").write_text(token)
        kubeconfig = tmp_path / "kubeconfig.conf"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "default",
            "clusters": [{"name": "default", "cluster": {"certificate-authority": str(tls.ca_cert),
                                                         "server": api.url}}],
            "contexts": [{"name": "default", "context": {"cluster": "default", "namespace": "default",
                                                         "user": "default"}}],
            "users": [{"name": "default", "user": {"tokenFile": str(tmp_path / "token")}}],
        }))
        config_conf = tmp_path / "config.conf"  # kubeadm's, with the kubeconfig where this test put it
        config_conf.write_text(KUBEADM_CONFIG.read_text().replace(
            "kubeconfig: /var/lib/kube-proxy/kubeconfig.conf", f"kubeconfig: {kubeconfig}"))
        log_path = tmp_path / "kubeport.log"
        with open(log_path, "wb") as log:
            daemon = spawn_in(node_ns, str(kubeport_bin()), f"--config={config_conf}",
                              "--hostname-override=node-b", stdout=log, stderr=subprocess.STDOUT)

        def ready() -> bool:
            assert daemon.poll() is None, log_path.read_text()
            done = run_in(node_ns, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "1",
                          "http://127.0.0.1:10256/readyz", check=False)
            return done.stdout == "200"

        until_sync(ready, "kubeport ready from kubeadm's files", 30)
        assert curl_in(topology.pod("b", 1), http_url("10.96.0.20", 80, "/")).startswith("pod=")
        log_text = log_path.read_text()
        assert "source: kubeconfig" in log_text and log_text.count("not applicable to a userspace proxy") == 1
        daemon.terminate()
        assert daemon.wait(timeout=20) == 0, log_path.read_text()

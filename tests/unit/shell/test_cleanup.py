"""`kubeport --cleanup`: which files are leftovers (and which are the cluster's state), how the
host's leftovers are described, and the refusal while an instance serves the node."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from kubeport import cleanup
from kubeport import config as cfg
from kubeport.survival.handover import instance_address
from kubeport.proxy.host import leftovers
from kubeport.proxy.host.leftovers import Leftovers


def configuration(tmp_path: Path, node: str = "node-a") -> cfg.KubeportConfiguration:
    return cfg.build(None, {"stateDir": str(tmp_path / "state"), "readyFile": str(tmp_path / "pod" / "ready"),
                            "liveFile": str(tmp_path / "pod" / "live"), "hostnameOverride": node})


def test_stale_files_are_the_pods_files_and_interrupted_writes_not_the_state(tmp_path):
    config = configuration(tmp_path)
    pod, state = tmp_path / "pod", tmp_path / "state"
    (state / "last-good" / "ns").mkdir(parents=True)
    pod.mkdir()
    stale = [pod / "ready", pod / ".ready.4242", pod / "live", state / "last-good" / "ns" / ".web.yaml.tmp"]
    kept = [state / "allocations.db", state / "last-good" / "ns" / "web.yaml", pod / "other"]
    for path in stale + kept:
        path.write_text("x")
    assert sorted(cleanup.stale_files(config)) == sorted(stale)


@pytest.mark.parametrize(
    "found, lines",
    [
        pytest.param(Leftovers(), [], id="nothing"),
        pytest.param(Leftovers(routes={1: ("10.96.0.1", "10.96.0.10")}),
                     ["2 local routes (ip route show table local proto 0x6b)"], id="routes"),
        pytest.param(Leftovers(nft_table=True, rules=("-4 27499: from all fwmark 0x100000/0x100000 lookup 27499",),
                               table_routes=("-4 local default dev lo scope host",)),
                     ["nftables table inet kubeport",
                      "IPv4 policy rule 27499: from all fwmark 0x100000/0x100000 lookup 27499",
                      "routing table 27499 (1 route)"], id="table_rule_and_routing_table"),
        pytest.param(Leftovers(reply_tables=("inet kubeport_replies", "bridge kubeport")),
                     ["nftables table inet kubeport_replies", "nftables table bridge kubeport"], id="reply_tables"),
    ],
)
def test_leftovers_described(found, lines):
    assert found.describe() == lines and bool(found) == bool(lines)


def test_cleanup_reports_each_removal_then_nothing(tmp_path, monkeypatch):
    config = configuration(tmp_path)
    (tmp_path / "pod").mkdir()
    (tmp_path / "pod" / "ready").write_text("1\n")
    monkeypatch.setattr(leftovers, "find", lambda **_: Leftovers())
    reports: list[str] = []
    cleanup.cleanup_host(config, reports.append)
    cleanup.cleanup_host(config, reports.append)
    assert reports == [f"removed {tmp_path / 'pod' / 'ready'}", "nothing to remove"]


def test_cleanup_refuses_while_an_instance_holds_the_node(tmp_path, monkeypatch):
    node = f"cleanup-test-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setattr(leftovers, "find", lambda **_: pytest.fail("nothing is looked at"))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as holder:
        holder.bind(instance_address(node))
        holder.listen()
        with pytest.raises(cleanup.CleanupRefused, match="stop it first"):
            cleanup.cleanup_host(configuration(tmp_path, node), print)

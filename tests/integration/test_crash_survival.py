"""A daemon killed with SIGKILL under load (`--hold-sockets`): its supervisor holds the
listening sockets and starts it again at once, so connections and queries that arrive in
between wait in the kernel's queues and are served by the new process, which serves the last
applied state before its source has synced. Driven in network namespaces with a client loop
and dig from a pod."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from support.netns import KubeportDaemon, dig_in, spawn_in, until_sync
from support.netns.manifests import DAEMON_ARGS
from support.netns.operating import CLIENT_LOOP, ECHO_IP, WEB_IP, manifests  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration

DNS_IP = "10.96.0.10"


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def the_daemon(supervisor: int) -> int | None:
    found = children(supervisor)
    return found[0] if len(found) == 1 else None


def test_a_killed_daemon_refuses_no_connection_and_loses_no_query(topology, pods, manifests, tmp_path):
    daemon = KubeportDaemon(topology.node("a"), manifests, tmp_path / "state", *DAEMON_ARGS, "--hold-sockets")
    daemon.wait_ready()
    status = tmp_path / "client.json"
    client = spawn_in(topology.pod("a", 1), sys.executable, str(CLIENT_LOOP), "--tcp", f"{WEB_IP}:80",
                      "--udp", f"{ECHO_IP}:9090", "--status", str(status), stdout=subprocess.PIPE, text=True)
    # Queries on their own, every 5 ms: not behind a connection the restart holds up.
    dns_status = tmp_path / "dns.json"
    resolver = spawn_in(topology.pod("a", 2), sys.executable, str(CLIENT_LOOP),
                        "--dns", f"web.demo.svc.cluster.local@{DNS_IP}", "--status", str(dns_status),
                        stdout=subprocess.PIPE, text=True)

    def progress(path=status) -> dict:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return {"tcp_ok": 0, "udp_ok": 0, "tcp_fail": 0, "dns_ok": 0}

    until_sync(lambda: progress()["tcp_ok"] >= 30 and progress()["udp_ok"] >= 30, "the client loop running", 20)
    until_sync(lambda: progress(dns_status)["dns_ok"] >= 30, "the DNS loop running", 20)
    first = until_sync(lambda: the_daemon(daemon.proc.pid), "the supervised daemon", 5)
    key = "web.demo.svc.cluster.local"
    assert dig_in(topology.pod("a", 2), "+short", key, server=DNS_IP).split() == [WEB_IP]
    before = progress()
    os.kill(first, signal.SIGKILL)
    # Sent while no daemon runs: the query waits in the held socket for the next one.
    answer = dig_in(topology.pod("a", 2), "+short", key, server=DNS_IP, timeout=5).split()
    second = until_sync(lambda: (pid := the_daemon(daemon.proc.pid)) not in (None, first) and pid,
                        "the daemon started again", 10)
    until_sync(lambda: progress()["tcp_ok"] >= before["tcp_ok"] + 100, "connections through the new daemon", 20)
    dns_before = progress(dns_status)["dns_ok"]
    until_sync(lambda: progress(dns_status)["dns_ok"] >= dns_before + 50, "queries through the new daemon", 20)
    client.send_signal(signal.SIGTERM)
    counts = json.loads(client.communicate(timeout=10)[0])
    resolver.send_signal(signal.SIGTERM)
    queries = json.loads(resolver.communicate(timeout=10)[0])
    assert answer == [WEB_IP]
    assert counts["tcp_fail"] == 0, counts["errors"]
    assert queries["dns_lost"] == 0, queries["errors"]       # each answered within DNS_TIMEOUT (3 s)
    assert daemon.running and second != first
    assert "was killed by SIGKILL; starting it again" in daemon.log_text()
    # SIGTERM to the supervisor stops the daemon as without it.
    assert daemon.stop() == 0
    print(f"\nacross the kill: {counts['tcp_ok'] - before['tcp_ok']} connections, none refused; "
          f"UDP lost {counts['udp_lost'] - before.get('udp_lost', 0)} of {counts['udp_ok'] - before['udp_ok']}; "
          f"{queries['dns_ok']} DNS queries answered, the longest after {queries['dns_longest_ms']} ms")

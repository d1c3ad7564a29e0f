"""deploy/kubeport.service under a real systemd (Debian's 252, PID 1 of a namespace of its own:
support/netns/systemd.py), in a test node's network namespace, driven as an operator would
with systemctl and kill: a killed daemon is started again by its supervisor, a killed main
process by systemd's Restart=, and in both cases the listening sockets outlive the process
(the supervisor's copies, then systemd's descriptor store: FileDescriptorStoreMax=), so a
connection loop and a DNS loop from pods see no refusal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.netns import POD_ECHO_PORT, CommandFailed, run_in, spawn_in, until_sync
from support.netns import systemd as systemd_support
from support.netns.manifests import DAEMON_ARGS, endpoint_slice, service, write
from support.netns.operating import WEB_IP, ClientLoop, manifests  # noqa: F401 (fixture)

pytestmark = [
    pytest.mark.integration,
    # systemd as PID 1 manages a cgroup tree, and the host's belongs to the host's root.
    pytest.mark.host_privileges("a real systemd as PID 1 (its cgroup tree)"),
]

DNS_IP = "10.96.0.10"
STREAM_IP = "10.96.0.52"
STREAMS = Path(__file__).resolve().parents[1] / "support" / "netns" / "streams.py"
OPEN_STREAMS = 50
UNIT = "kubeport.service"
WEB = "web.demo.svc.cluster.local"


@pytest.fixture
def systemd(manifests, topology, tmp_path, request):
    missing = systemd_support.available()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"systemd cannot run: {missing}")
        pytest.skip(missing)
    booted = systemd_support.Systemd(manifests)
    booted.boot()
    try:
        # The shipped command line, then this topology's node, ranges and an upstream that
        # is no one (no query leaves the test), and no drain: a stop need not wait 30 s.
        booted.install(topology.node("a"), "--hostname-override", "node-a", *DAEMON_ARGS,
                       "--upstream", "127.0.0.1:53535", "--dns-lame-duck=0s", "--shutdown-grace-period=0s",
                       *getattr(request, "param", ()))
        yield booted
    finally:
        journal = booted.journal() if booted.proc is not None else ""
        booted.shutdown()
        (tmp_path / "journal.txt").write_text(journal)
        print(f"\n--- the journal's end (all of it: {tmp_path / 'journal.txt'}) ---\n{journal[-6000:]}")


def children(systemd, pid: int) -> list[int]:
    done = systemd.run("cat", f"/proc/{pid}/task/{pid}/children", check=False)
    return [int(p) for p in done.stdout.split()]


def is_worker(systemd, pid: int) -> bool:
    return "kubeport.relayworker" in systemd.run("cat", f"/proc/{pid}/cmdline", check=False).stdout


def the_daemon(systemd) -> int | None:
    """The supervisor's one child that is no relay worker (the daemon), by its pid in
    systemd's namespace (workers of a killed daemon are the supervisor's children too)."""
    main = int(systemd.show(UNIT, "MainPID") or 0)
    found = [pid for pid in children(systemd, main) if not is_worker(systemd, pid)] if main else []
    return found[0] if len(found) == 1 else None


def workers_line(systemd: systemd_support.Systemd, ns: str) -> str | None:
    try:
        return json.loads(systemd.kubeport(ns, "get", "status", "-o", "json"))["proxy"]["workers"]
    except (CommandFailed, ValueError, KeyError):  # not serving yet
        return None


def refused(errors: list[str]) -> list[str]:
    return [e for e in errors if e.startswith("tcp:") and ("Refused" in e or "timed out" in e)]


def test_kill_9_of_the_daemon_and_of_the_units_main_process_refuses_nothing(systemd, topology, pods, tmp_path):
    systemd.systemctl("start", UNIT)  # Type=notify: returns once the daemon said READY=1
    assert systemd.show(UNIT, "ActiveState") == "active"
    assert "serving" in systemd.show(UNIT, "StatusText")
    client = ClientLoop.start(topology.pod("a", 1), tmp_path / "client.json", "--tcp", f"{WEB_IP}:80",
                              "--tcp-timeout", "10")
    resolver = ClientLoop.start(topology.pod("a", 2), tmp_path / "dns.json", "--dns", f"{WEB}@{DNS_IP}")
    client.wait_for("the client loop running", tcp_ok=30)
    resolver.wait_for("the DNS loop running", dns_ok=30)
    supervisor = int(systemd.show(UNIT, "MainPID"))
    stored = int(systemd.show(UNIT, "NFileDescriptorStore"))
    assert stored >= 3, stored  # web's listener and DNS over UDP and TCP at least

    # 1. The daemon killed: its supervisor (the unit's main process) starts it again.
    first = until_sync(lambda: the_daemon(systemd), "the supervised daemon", 10)
    systemd.kill(first)
    until_sync(lambda: (pid := the_daemon(systemd)) not in (None, first) and pid, "the daemon started again", 10)
    client.wait_for("connections through the restarted daemon", tcp_ok=client.count("tcp_ok") + 100)
    resolver.wait_for("queries through the restarted daemon", dns_ok=resolver.count("dns_ok") + 50)
    assert int(systemd.show(UNIT, "MainPID")) == supervisor
    assert systemd.show(UNIT, "NRestarts") == "0"

    # 2. The main process killed: KillMode=mixed ends the rest of the unit at once, Restart=
    # starts it again, and the sockets wait in systemd's descriptor store meanwhile.
    systemd.kill(supervisor)
    until_sync(lambda: systemd.show(UNIT, "NRestarts") == "1" and systemd.show(UNIT, "ActiveState") == "active",
               "the unit started again by Restart= and ready", 30)
    assert int(systemd.show(UNIT, "MainPID")) != supervisor
    client.wait_for("connections after the unit's restart", tcp_ok=client.count("tcp_ok") + 100)
    resolver.wait_for("queries after the unit's restart", dns_ok=resolver.count("dns_ok") + 50)
    counts, queries = client.stop(), resolver.stop()
    journal = systemd.journal()
    assert "sockets held across a restart of the supervisor, from systemd's descriptor store" in journal
    held = json.loads(systemd.kubeport(topology.node("a"), "get", "status", "-o", "json"))["socketHold"]
    assert held["active"] and held["store"] == "systemd's descriptor store", held
    assert held["heldAtStart"] == stored and held["adopted"] == stored, held
    # Refused or timed out: none. The one request each killed process was relaying may end
    # with it (the loop has one in flight at a time).
    assert not refused(counts["errors"]), counts["errors"]
    assert counts["tcp_fail"] <= 2, counts["errors"]
    assert queries["dns_lost"] == 0, queries["errors"]  # each answered within DNS_TIMEOUT (3 s)
    print(f"\nacross both kills: {counts['tcp_ok']} connections, none refused ({counts['tcp_fail']} cut in "
          f"flight); {queries['dns_ok']} queries answered, the longest after {queries['dns_longest_ms']} ms; "
          f"{stored} sockets in systemd's store")

    # 3. A stop is a stop: the store is flushed, and no socket of the node listens on.
    systemd.systemctl("stop", UNIT)
    assert systemd.show(UNIT, "ActiveState") == "inactive"
    assert systemd.show(UNIT, "NFileDescriptorStore") == "0"
    assert run_in(topology.node("a"), "ss", "-Hltn", f"src {WEB_IP}:80").stdout.strip() == ""


@pytest.mark.parametrize("systemd", [("--workers", "2")], indirect=True)
def test_with_workers_a_killed_daemon_keeps_every_stream_and_a_killed_main_process_refuses_nothing(
        systemd, topology, pods, manifests, tmp_path):
    """What survives which crash under the unit: the daemon killed, its relay workers keep
    their streams (the supervisor stays, and adopts them for the next daemon); the main
    process killed, KillMode=mixed ends the whole unit, workers and streams with it, and only
    the listening sockets live on in systemd's store: new connections wait, none is refused."""
    pod_list = [topology.pod_info(n, i) for n in "ab" for i in (1, 2)]
    echo = [{"name": "echo", "port": POD_ECHO_PORT}]
    write(manifests, "stream", service("stream", [STREAM_IP], [{"name": "echo", "port": 7000}]),
          endpoint_slice("stream-1", "stream", echo, pod_list))
    systemd.systemctl("start", UNIT)
    node = topology.node("a")
    until_sync(lambda: (line := workers_line(systemd, node)) and line.startswith("2 relay processes"),
               "two workers", 10)
    client = ClientLoop.start(topology.pod("a", 1), tmp_path / "client.json", "--tcp", f"{WEB_IP}:80",
                              "--tcp-timeout", "10")
    stream_status = tmp_path / "streams.json"
    streams = spawn_in(topology.pod("a", 2), sys.executable, str(STREAMS), f"{STREAM_IP}:7000",
                       str(OPEN_STREAMS), "--status", str(stream_status), stdout=subprocess.PIPE, text=True)

    def stream_counts() -> dict:
        try:
            return json.loads(stream_status.read_text())
        except (OSError, ValueError):
            return {"rounds": 0, "alive": 0, "dead": 0}

    client.wait_for("the client loop running", tcp_ok=30)
    until_sync(lambda: stream_counts()["rounds"] >= 5, "the streams echoing", 20)
    assert stream_counts()["alive"] == OPEN_STREAMS

    first = until_sync(lambda: the_daemon(systemd), "the supervised daemon", 10)
    systemd.kill(first)
    until_sync(lambda: (line := workers_line(systemd, node)) and line.startswith("2 relay processes, 2 adopted"),
               "the workers adopted by the restarted daemon", 20)
    rounds = stream_counts()["rounds"]
    until_sync(lambda: stream_counts()["rounds"] >= rounds + 20, "the streams echoing after the daemon's kill", 20)
    assert stream_counts()["dead"] == 0 and stream_counts()["alive"] == OPEN_STREAMS, stream_counts()["errors"]

    systemd.kill(int(systemd.show(UNIT, "MainPID")))
    until_sync(lambda: systemd.show(UNIT, "NRestarts") == "1" and systemd.show(UNIT, "ActiveState") == "active",
               "the unit started again by Restart= and ready", 30)
    until_sync(lambda: stream_counts()["dead"] == OPEN_STREAMS, "every stream ended with the unit's processes", 20)
    client.wait_for("connections after the unit's restart", tcp_ok=client.count("tcp_ok") + 100)
    streams.terminate()
    streams.communicate(timeout=10)
    counts = client.stop()
    assert not refused(counts["errors"]), counts["errors"]
    assert counts["tcp_fail"] <= 2, counts["errors"]
    print(f"\ndaemon killed: {OPEN_STREAMS} of {OPEN_STREAMS} streams kept; main process killed: all ended, "
          f"{counts['tcp_ok']} connections, none refused ({counts['tcp_fail']} cut in flight)")


@pytest.mark.parametrize("systemd", [("--service-node-port-range", "30000-")], indirect=True)
def test_a_configuration_that_cannot_start_fails_the_unit_at_its_start_limit_naming_the_flag(systemd):
    """Exit 2 (a bad configuration) is restarted like any exit, RestartSec=200ms apart, until
    systemd's start limit (5 in 10 s) fails the unit: failed, not a restart loop forever,
    and the journal says which flag is wrong."""
    systemd.systemctl("start", UNIT, check=False)  # the start job fails with the first exit
    until_sync(lambda: "Start request repeated too quickly" in systemd.journal(), "the start limit hit", 30)
    assert systemd.show(UNIT, "ActiveState") == "failed"
    assert int(systemd.show(UNIT, "NRestarts")) >= 4
    assert "invalid configuration: --service-node-port-range: '30000-' is not LOW-HIGH" in systemd.journal()

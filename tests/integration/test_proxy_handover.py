"""Seamless restart at Proxier level: instance B starts on the same frontends, instance A
stops with release=False, and clients see no failure.

One network namespace of the test's own: loopback, a pod server on 127.0.0.1, two Proxier
processes with the real address manager (VIPs as local routes through lo, protocol 0x6b) and the real nftables
table, and a client opening a TCP connection and sending a UDP query (fresh source port each)
in a loop. net.ipv4.tcp_migrate_req=1 lets the kernel hand A's not yet accepted connections
to B's listener when A closes its own.

The same file is the runner of those processes: ``python test_proxy_handover.py proxier|client``.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import subprocess
import sys
import time

import pytest

from support.netns import (
    python_in,
    run_in,
    scratch_namespace,
    script_env,
    spawn_in,
    start_podserver,
    until_sync,
    wait_for_output,
)

pytestmark = pytest.mark.integration

VIP, DROPPED_VIP = "10.96.0.50", "10.96.0.51"
HTTP, DNS = 80, 53


# --- the processes (run inside the namespace) ------------------------------------------------


def snapshot():
    from kubeport.endpoints.types import NodeInfo, ServiceState
    from support.slim import endpoint, endpoint_slice, port, service, snapshot as build

    web = service("web", [VIP], [port(HTTP, name="http", target=8080), port(DNS, name="dns", protocol="UDP",
                                                                            target=9090)])
    slices = (endpoint_slice("web-0", [endpoint("127.0.0.1", node="node-a")],
                             [("http", "TCP", 8080), ("dns", "UDP", 9090)]),)
    # iTP=Local with its only endpoint elsewhere: a DROP element in the nftables table.
    local = service("local-only", [DROPPED_VIP], [port(HTTP, target=8080)], internal_policy_local=True)
    remote = (endpoint_slice("local-only-0", [endpoint("10.244.2.9", node="node-b")], [("", "TCP", 8080)]),)
    node = NodeInfo(name="node-a", addresses=(("InternalIP", "127.0.0.1"),))
    return build([ServiceState(web, slices), ServiceState(local, remote)], node=node)


async def run_proxier() -> None:
    import uvloop  # noqa: F401  (the caller runs this on uvloop)

    from kubeport.proxy.config import ProxyConfig
    from kubeport.proxy.proxier import Proxier

    proxier = Proxier(ProxyConfig(udp_idle_timeout=0.5, seed=1), "node-a")
    await proxier.start()
    await proxier.apply(snapshot())
    print("ready", flush=True)
    command = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    _, grace, release = command.split()
    await proxier.stop(float(grace), release=release == "release")
    print("stopped", flush=True)


def http_ok() -> bool:
    with socket.create_connection((VIP, HTTP), timeout=3.0) as conn:
        conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
        reply = b""
        while chunk := conn.recv(4096):
            reply += chunk
    return reply.startswith(b"HTTP/1.") and b" 200 " in reply.split(b"\r\n", 1)[0] and b"pod=p1" in reply


def udp_ok(payload: bytes) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:  # a fresh source port each time
        sock.settimeout(1.0)
        sock.sendto(payload, (VIP, DNS))
        return sock.recv(2048) == b"p1 " + payload


def run_client() -> None:
    """Until stdin has a line: one TCP request and one UDP query per turn; then a JSON summary."""
    counts = {"tcp_ok": 0, "tcp_failed": 0, "udp_ok": 0, "udp_failed": 0, "errors": []}
    turn = 0
    while not select.select([sys.stdin], [], [], 0)[0]:
        turn += 1
        for kind, probe in (("tcp", http_ok), ("udp", lambda: udp_ok(b"q%d" % turn))):
            try:
                good = probe()
            except OSError as exc:
                good, reason = False, repr(exc)
            else:
                reason = "bad reply"
            counts[f"{kind}_{'ok' if good else 'failed'}"] += 1
            if not good:
                counts["errors"].append(f"{kind} turn {turn} at {time.monotonic():.3f}: {reason}")
        if turn == 1:
            print("running", flush=True)
        time.sleep(0.002)
    print(json.dumps(counts), flush=True)


# --- the test ---------------------------------------------------------------------------------


@pytest.fixture
def namespace():
    with scratch_namespace("handover") as ns:
        run_in(ns, "sysctl", "-q", "-w", "net.ipv4.tcp_migrate_req=1")
        yield ns


def start_instance(ns: str, name: str) -> subprocess.Popen:
    proc = spawn_in(ns, sys.executable, __file__, "proxier", env=script_env(), stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE)
    wait_for_output(proc, b"ready", 30, f"proxier {name}")
    return proc


def stop_instance(proc: subprocess.Popen, name: str, grace: float, release: bool) -> float:
    """Seconds the instance took to drain and stop."""
    began = time.monotonic()
    proc.stdin.write(f"stop {grace} {'release' if release else 'keep'}\n".encode())
    proc.stdin.flush()
    wait_for_output(proc, b"stopped", grace + 20, f"proxier {name} stopping")
    took = time.monotonic() - began
    assert proc.wait(10) == 0
    return took


def vip_routes(ns: str) -> str:
    return run_in(ns, "ip", "-o", "route", "show", "table", "local", "proto", "0x6b").stdout


def nft_table(ns: str) -> str:
    return run_in(ns, "nft", "list", "table", "inet", "kubeport", check=False).stdout


def test_successor_takes_over__zero_failed_connections_and_queries(namespace):
    """SO_REUSEPORT (socket(7)), net.ipv4.tcp_migrate_req (Linux Documentation/networking/ip-sysctl.rst)."""
    ns = namespace
    start_podserver(ns, "p1")
    a = start_instance(ns, "A")
    client = spawn_in(ns, sys.executable, __file__, "client", env=script_env(), stdin=subprocess.PIPE,
                      stdout=subprocess.PIPE)
    wait_for_output(client, b"running", 30, "client")

    b = start_instance(ns, "B")  # binds the same frontends, adopts A's VIPs and nftables table
    time.sleep(0.3)  # traffic while both serve (a window to observe, not a synchronisation)
    # A steps aside for UDP too (new datagrams reach B), so its flows go idle long before the grace.
    assert stop_instance(a, "A", grace=10.0, release=False) < 5.0
    assert f"local {VIP} " in vip_routes(ns) and f"{DROPPED_VIP} . tcp . 80" in nft_table(ns)
    time.sleep(0.3)  # traffic on B alone

    client.stdin.write(b"done\n")
    client.stdin.flush()
    assert client.wait(10) == 0
    summary = json.loads(client.stdout.read().splitlines()[-1])
    assert summary["errors"] == [] and summary["tcp_failed"] == summary["udp_failed"] == 0
    assert summary["tcp_ok"] > 20 and summary["udp_ok"] > 20, summary

    stop_instance(b, "B", grace=1.0, release=True)  # a plain shutdown: everything goes
    until_sync(lambda: f"local {VIP} " not in vip_routes(ns), "the VIPs to be removed", 5)
    assert nft_table(ns) == ""


def test_releasing_removes_a_table_this_run_never_wrote(namespace):
    """A killed predecessor's table, adopted by an instance stopped before its first sync
    (which writes the table), must go with that instance's release all the same."""
    run_in(namespace, "nft", "add", "table", "inet", "kubeport")
    python_in(namespace, "import asyncio\n"
                         "from kubeport.proxy.host.nftables import NftFirewall\n"
                         "async def main():\n"
                         "    firewall = NftFirewall()\n"
                         "    await firewall.start(['10.244.0.0/16'], ['10.96.0.0/12'])\n"
                         "    assert firewall.enabled\n"
                         "    await firewall.stop(release=True)\n"
                         "asyncio.run(main())\n")
    assert nft_table(namespace) == ""


if __name__ == "__main__":
    if sys.argv[1] == "proxier":
        import uvloop

        uvloop.run(run_proxier())
    else:
        run_client()

"""VIPs made local by routes, for real, in a namespace of the test's own (netlink batches)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from support.netns import require_netns, run_in

pytestmark = pytest.mark.integration

RUNNER = """
import asyncio, json, sys
from kubeport.proxy.host.addresses import NetlinkAddresses
wanted = json.loads(sys.argv[1]); step = sys.argv[2]
async def main():
    manager = NetlinkAddresses("lo")
    await manager.sync(wanted)
    print(json.dumps(sorted(manager.owned)))
    await manager.stop(release=(step == "release"))
asyncio.run(main())
"""


@pytest.fixture
def namespace():
    require_netns()
    name = f"kpaddr-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def addresses(ns: str) -> set[str]:
    out = run_in(ns, "ip", "-o", "addr", "show", "dev", "lo").stdout
    return {line.split()[3].split("/")[0] for line in out.splitlines()}


def local_routes(ns: str, *selector: str) -> set[str]:
    """The host routes in table local matching ``selector`` (ip route's words), both families."""
    found = set()
    for family in ("-4", "-6"):
        out = run_in(ns, "ip", family, "-o", "route", "show", "table", "local", *selector).stdout
        found |= {line.split()[1] for line in out.splitlines() if line.startswith("local ")}
    return found


def vip_routes(ns: str) -> set[str]:
    """The local routes kubeport added (route protocol 0x6b)."""
    return local_routes(ns, "proto", "0x6b")


def sync(ns: str, wanted: list[str], step: str) -> list[str]:
    import json
    import sys

    done = run_in(ns, sys.executable, "-c", RUNNER, json.dumps(wanted), step, timeout=60)
    return json.loads(done.stdout)


def test_thousands_added_in_batches_marked_ours_and_removed(namespace):
    wanted = [f"10.100.{i // 250}.{i % 250 + 1}" for i in range(3000)] + [f"fd00:10:96::{i:x}" for i in range(1, 500)]
    run_in(namespace, "ip", "addr", "add", "10.100.0.1/32", "dev", "lo")  # someone else's: never ours
    owned = sync(namespace, wanted, "keep")
    assert "10.100.0.1" not in owned and len(owned) == len(wanted) - 1
    assert vip_routes(namespace) == set(wanted) - {"10.100.0.1"}
    assert addresses(namespace) == {"127.0.0.1", "::1", "10.100.0.1"}, "VIPs are routes, not addresses"
    # The next run adopts its leftovers (route protocol 0x6b) and, releasing, removes only those.
    owned = sync(namespace, wanted[:10], "release")
    assert len(owned) == 9
    assert not vip_routes(namespace)
    assert "10.100.0.1" in addresses(namespace) and "10.100.0.1" in local_routes(namespace, "type", "local")


SERVE = """
import socket, sys
family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
server = socket.socket(family, socket.SOCK_STREAM)
server.setsockopt(socket.IPPROTO_IPV6 if family == socket.AF_INET6 else socket.IPPROTO_IP,
                  78 if family == socket.AF_INET6 else 15, 1)  # IP(V6)_FREEBIND, as every listener
server.bind((sys.argv[1], 8080)); server.listen()
client = socket.create_connection((sys.argv[1], 8080), timeout=5)
accepted, peer = server.accept()
print(accepted.getsockname()[0], peer[0])
"""


@pytest.mark.parametrize("vip", ["10.100.7.7", "fd00:10:96::77"])
def test_a_vip_route_is_served_as_a_node_address(namespace, vip):
    """Bound by a listener, connected to from the node itself (the source is the VIP for IPv4)."""
    sync(namespace, [vip], "keep")
    local, peer = run_in(namespace, sys.executable, "-I", "-c", SERVE, vip).stdout.split()
    assert local == vip and (peer == vip or ":" in vip)


NODE_READ = """
import asyncio, json, subprocess, sys
from kubeport.proxy.host.addresses import NetlinkAddresses
async def main():
    manager = NetlinkAddresses("lo")
    await manager.sync([f"10.96.0.{i}" for i in range(1, 200)])
    full = await manager.interface_addresses()
    subprocess.run(["ip", "addr", "add", "10.77.0.5/24", "dev", "late0"], check=True)
    later = await manager.interface_addresses()
    print(json.dumps([full, later]))
    await manager.stop()
asyncio.run(main())
"""


def test_node_addresses_never_include_vips_and_see_a_late_address(namespace):
    """Every 30 s the node's addresses are read again: the VIPs are routes, not among them, and
    an address added on another link is seen."""
    run_in(namespace, "ip", "link", "add", "late0", "type", "veth", "peer", "name", "late0p")
    out = run_in(namespace, sys.executable, "-I", "-c", NODE_READ).stdout
    full, later = json.loads(out)
    assert full == ["127.0.0.1", "::1"]
    assert later == ["10.77.0.5", "127.0.0.1", "::1"]


REPAIR = """
import asyncio, json, subprocess, sys
from kubeport.proxy.host.addresses import NetlinkAddresses
async def main():
    manager = NetlinkAddresses("lo")
    await manager.sync(["10.96.0.1", "10.96.0.2", "10.96.0.3"])
    # Behind its back: one of its routes removed, one replaced by a kernel route of another protocol.
    subprocess.run(["ip", "route", "del", "local", "10.96.0.2", "dev", "lo", "table", "local"], check=True)
    subprocess.run(["ip", "route", "del", "local", "10.96.0.3", "dev", "lo", "table", "local"], check=True)
    subprocess.run(["ip", "route", "add", "local", "10.96.0.3", "dev", "lo", "table", "local", "proto", "kernel"],
                   check=True)
    added_back = await manager.repair(["10.96.0.1", "10.96.0.2", "10.96.0.3"])
    print(json.dumps([added_back, sorted(manager.owned)]))
    await manager.stop(release=True)
asyncio.run(main())
"""


def test_repair_adds_back_what_vanished_and_never_takes_a_route_of_another_protocol(namespace):
    """kube-proxy rewrites its rules in full at least hourly (proxyutil.FullSyncPeriod): a VIP route
    removed by hand comes back; a local route of another protocol stays the kernel's."""
    added_back, owned = json.loads(run_in(namespace, sys.executable, "-c", REPAIR, timeout=60).stdout)
    assert added_back == ["10.96.0.2"]
    assert owned == ["10.96.0.1", "10.96.0.2"]
    assert vip_routes(namespace) == set()  # released: only its own routes went
    assert "10.96.0.3" in local_routes(namespace, "proto", "kernel")

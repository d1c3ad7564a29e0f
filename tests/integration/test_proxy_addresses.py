"""VIP addresses on a link, for real, in a namespace of the test's own (netlink batches)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from netns import require_netns, run_in

pytestmark = pytest.mark.integration

RUNNER = """
import asyncio, json, sys
from kubeport.proxy.addresses import NetlinkAddresses
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
    assert set(wanted) <= addresses(namespace)
    # The next run adopts its leftovers (IFA_PROTO) and, releasing, removes only those.
    owned = sync(namespace, wanted[:10], "release")
    assert len(owned) == 9
    left = addresses(namespace)
    assert "10.100.0.1" in left
    assert not (set(wanted) - {"10.100.0.1"}) & left


QUICK_READ = """
import asyncio, json, subprocess, sys
from kubeport.proxy.addresses import NetlinkAddresses
async def main():
    manager = NetlinkAddresses("lo")
    await manager.sync([f"10.96.0.{i}" for i in range(1, 200)])
    full = await manager.interface_addresses()
    quick = await manager.interface_addresses(quick=True)
    subprocess.run(["ip", "addr", "add", "10.77.0.5/24", "dev", "late0"], check=True)
    later = await manager.interface_addresses(quick=True)
    print(json.dumps([full, quick, later]))
    await manager.stop()
asyncio.run(main())
"""


def test_quick_read_of_the_node_addresses_skips_the_vip_link_and_sees_other_links(namespace):
    """Every 30 s the node's addresses are read again: the VIP link's 10,000 VIPs are not
    (kernel-filtered per-link dumps), yet an address added on another link is seen."""
    run_in(namespace, "ip", "link", "add", "late0", "type", "veth", "peer", "name", "late0p")
    out = run_in(namespace, sys.executable, "-I", "-c", QUICK_READ).stdout
    full, quick, later = json.loads(out)
    assert full == quick == ["127.0.0.1", "::1"]
    assert later == ["10.77.0.5", "127.0.0.1", "::1"]

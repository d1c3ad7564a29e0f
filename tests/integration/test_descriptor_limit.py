"""More Service ports than the open-file limit allows listeners for: the daemon is ready, the
Services that fit are served, the rest are one problem line, the manifests are still read,
and descriptors freed by a change go to the Services waiting for one.

The daemon runs under ``ulimit -n 1200`` (soft and hard: it cannot raise it), the limit a
few hundred Services exceed: reserve.py keeps 75 descriptors for the rest of the daemon and
75 more for relayed connections, so listeners stop at descriptor 1050.
"""

from __future__ import annotations

import re

import pytest

from support.netns import CommandFailed, KubeportDaemon, curl_in, http_url, kubeport, until_sync
from support.netns.daemon import kubeport_bin, status_api
from support.netns.manifests import DAEMON_ARGS, endpoint_slice, node, remove, service, write

pytestmark = pytest.mark.integration

LIMIT = 1200
SERVICES = 1200
PER_FILE = 100
HTTP = {"name": "http", "protocol": "TCP", "port": 8080}
SHORT = re.compile(r"^proxy: ([\d,]+) frontends? (?:has|have) no listener \(descriptor limit (\d+) reached\): "
                   r"demo/svc-(\d{4}):http/TCP on ")


def vip(index: int) -> str:
    return f"10.100.{index // 200}.{1 + index % 200}"


def shortage(ns: str) -> tuple[int, int]:
    """(how many frontends have no listener, the index of the first named) from /readyz's
    problems (the status socket's, which `kubeport get` reads too)."""
    readyz = status_api(ns, "/readyz")
    assert readyz["ready"], readyz
    lines = [line for line in readyz["problems"] if "no listener" in line]
    if not lines:
        return 0, -1
    [line] = lines
    found = SHORT.match(line)
    assert found, line
    assert int(found[2]) == LIMIT, line
    return int(found[1].replace(",", "")), int(found[3])


def answered(ns: str, index: int) -> bool:
    try:
        return curl_in(ns, http_url(vip(index), 80), timeout=3.0).strip() != ""
    except CommandFailed as failed:
        if failed.returncode == 7:  # refused: the VIP's port has no listener
            return False
        raise


def test_services_past_the_limit_are_named_the_rest_served_and_manifests_still_read(topology, pods, tmp_path):
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    write(manifests, "nodes", node(topology, "a"), node(topology, "b"))
    for first in range(0, SERVICES, PER_FILE):
        objects = []
        for index in range(first, first + PER_FILE):
            name = f"svc-{index:04}"
            objects += [service(name, [vip(index)], [{"name": "http", "port": 80, "targetPort": "http"}]),
                        endpoint_slice(f"{name}-1", name, [HTTP], topology.pods)]
        write(manifests, f"batch-{first // PER_FILE:02}", *objects)
    node_a = topology.node("a")
    # ``ulimit -n`` in sh sets soft and hard: the daemon finds nothing to raise.
    daemon = KubeportDaemon(node_a, manifests, tmp_path / "state", *DAEMON_ARGS,
                            program=["sh", "-c", f'ulimit -n {LIMIT} && exec "$0" "$@"', str(kubeport_bin())])
    daemon.wait_ready(timeout=45)
    client = topology.pod("a", 1)

    short, first_short = shortage(node_a)
    # Services are applied in name order; a thread's files open for a moment may have let a
    # later one in, never an earlier one out.
    assert 0 < short < SERVICES and first_short <= SERVICES - short, (short, first_short)
    assert "no listener (descriptor limit 1200 reached)" in kubeport(node_a, "get", "status")
    # The Services that fit are served; the first one without a listener is refused.
    for index in (0, first_short // 2, first_short - 1):
        assert answered(client, index), vip(index)
    assert not answered(client, first_short)

    # A file removed is read and applied: its listeners' descriptors go to the first waiting.
    remove(manifests, "batch-00")
    until_sync(lambda: shortage(node_a)[0] <= short - PER_FILE, "100 more frontends to get a listener", 20)
    assert answered(client, first_short)
    assert not answered(client, 0)

    assert daemon.stop() == 0
    log = daemon.log_text()
    assert f"open-file limit: {LIMIT}" in log
    assert "frontends have no listener (descriptor limit 1200 reached)" in log
    assert "Task exception was never retrieved" not in log and "Traceback" not in log, daemon.log_tail()
    assert "Too many open files" not in log, daemon.log_tail()

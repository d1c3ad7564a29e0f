"""dns.startupTimeout (CoreDNS ``kubernetes`` ``startup_timeout``, plugin/kubernetes/setup.go)
through the real daemon: against the fake API server of tests/support/apiserver in node-a's
namespace, asked with dig from node-a's first pod.

With the first list of Services held, DNS does not listen until the timeout has passed, then
answers: cluster names it cannot know yet SERVFAIL, forwarded names from the upstream. Once
the list completes, cluster names are answered. Without a hold, DNS listens as soon as the
first sync is applied, long before the timeout.
"""

from __future__ import annotations

import time

import pytest

from support.apiserver.tls import TlsFiles, make_tls
from support.netns import CommandFailed, Topology, until_sync
from support.netns.apiserver import NetnsApiServer, seed, start_daemon
from support.netns.apiserver import dig_answer as dig_or_raise
from support.netns.cluster_dns import start_fake_upstream

pytestmark = pytest.mark.integration

WEB = "web.default.svc.cluster.local"
WEB_IP = "10.96.0.20"
#: fake_upstream_dns.py's record, reached through --upstream 192.168.50.200 (start_daemon's)
FORWARDED = ("www.example.test", ("NOERROR", ["203.0.113.7"]))


def dig_answer(ns: str, name: str) -> tuple[str, list[str]]:
    """(rcode, sorted answers); ("NO-REPLY", []) when nothing answers (dig exits non-zero)."""
    try:
        return dig_or_raise(ns, name)
    except CommandFailed:
        return ("NO-REPLY", [])


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TlsFiles:
    return make_tls(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def upstream(topology: Topology) -> None:
    start_fake_upstream(topology)


def test_dns_listens_after_the_timeout_while_the_first_list_is_held(topology, tls, upstream, tmp_path) -> None:
    timeout = 6.0
    client = topology.pod("a", 1)
    # Without the watch-list the first list is a list (a held one never completes).
    with NetnsApiServer(topology.node("a"), tls, watch_list=False) as api:
        seed(api, topology, [topology.pod_info("a", 1), topology.pod_info("a", 2)])
        release = api.hold("services", "list")
        daemon = start_daemon(api, tmp_path, "--dns-startup-timeout", f"{timeout:g}s")
        try:
            # The log line comes after the listeners DNS would open at once: from here DNS waits.
            until_sync(lambda: "kubeport started" in daemon.log_text(), "the daemon started", 30)
            started = time.monotonic()
            assert dig_answer(client, WEB)[0] == "NO-REPLY", "not listening before the first sync"
            ready = daemon.readyz()
            assert ready.status == 503 and "dns: not listening yet" in ready.body, ready
            assert time.monotonic() - started < timeout, "the checks above ran within the timeout"

            # After the timeout: listening, unsynced.
            until_sync(lambda: dig_answer(client, WEB)[0] == "SERVFAIL", "cluster names SERVFAIL once listening",
                       timeout + 20)
            assert time.monotonic() - started >= timeout - 1.0, "not before the timeout"
            assert dig_answer(client, FORWARDED[0]) == FORWARDED[1], "forwarded names are answered"
            assert "did not complete within" in daemon.log_text()
            ready = daemon.readyz()
            assert ready.status == 503 and "dns: not listening yet" not in ready.body, ready

            release()
            daemon.wait_ready(timeout=30)
            until_sync(lambda: dig_answer(client, WEB) == ("NOERROR", [WEB_IP]), f"{WEB} answered", 10)
        finally:
            daemon.stop()


def test_dns_listens_as_soon_as_the_first_sync_is_applied(topology, tls, upstream, tmp_path) -> None:
    timeout = 120.0
    client = topology.pod("a", 1)
    with NetnsApiServer(topology.node("a"), tls) as api:
        seed(api, topology, [topology.pod_info("a", 1), topology.pod_info("a", 2)])
        daemon = start_daemon(api, tmp_path, "--dns-startup-timeout", f"{timeout:g}s")
        try:
            started = time.monotonic()
            daemon.wait_ready(timeout=60)
            assert dig_answer(client, WEB) == ("NOERROR", [WEB_IP])
            assert time.monotonic() - started < timeout
            assert "did not complete within" not in daemon.log_text()
        finally:
            daemon.stop()

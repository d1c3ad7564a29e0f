"""What an operator sees of the daemon: SIGHUP warnings in the file's names, health-check port
failures among the problems, process metrics without kube-proxy-foreign *_created series."""

from __future__ import annotations

import logging
import socket

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from kubeport import components
from kubeport import config as cfg
from kubeport.daemon import Daemon
from kubeport.process import process_registry
from kubeport.endpoints.types import ServiceName

BASE = {"hostnameOverride": "node-a"}


@pytest.mark.parametrize(
    "change, field",
    [
        pytest.param({"serviceNodePortRange": "30000-30100"}, "serviceNodePortRange", id="camel_case_field"),
        pytest.param({"conntrack": {"udpTimeout": "5s"}}, "conntrack.udpTimeout", id="section_leaf"),
        pytest.param({"clusterCIDR": "10.244.0.0/16"}, "clusterCIDR", id="alias_with_acronym"),
    ],
)
async def test_sighup_restart_warning_uses_the_files_field_names(caplog, change, field):
    daemon = Daemon(cfg.build(None, BASE))
    with caplog.at_level(logging.WARNING, logger="kubeport.daemon"):
        await daemon._reload(cfg.build(None, {**BASE, **change}))
    assert [r.getMessage() for r in caplog.records] == [
        f"configuration: {field} changed; it takes effect at the next restart"]


async def test_health_check_port_failures_are_problems():
    """kube-proxy's service_health.go syncs the servers on every sync and logs a port that
    fails to open; here it is a problem line of the proxy until a retry opens it."""
    proxy = components.build_proxy(cfg.build(None, BASE), CollectorRegistry())
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    try:
        await proxy.health_checks.sync({port: (ServiceName("default", "web"), 1)}, ["127.0.0.1"])
    finally:
        blocker.close()
    [problem] = proxy.problems
    assert problem.startswith(f"failed to start healthcheck 'default/web' on port {port}: ")
    assert await proxy.health_checks.retry_failed() == {}
    assert proxy.problems == []
    await proxy.health_checks.close()


@pytest.fixture
def no_created_series():
    prometheus_client.disable_created_metrics()
    yield
    prometheus_client.enable_created_metrics()


def test_process_metrics_as_kube_proxy_exports_and_no_created_series(no_created_series):
    registry = process_registry()
    Counter("kubeproxy_sync_proxy_rules_endpoint_changes", "test", registry=registry).inc()
    text = generate_latest(registry).decode()
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
                 "process_start_time_seconds", "python_gc_collections_total", "python_info"):
        assert f"\n{name}" in text, name
    assert "kubeproxy_sync_proxy_rules_endpoint_changes_total 1.0" in text
    assert "_created" not in text


class _Limits:
    RLIMIT_NOFILE, RLIM_INFINITY = 7, -1

    def __init__(self, soft, hard, fail=False):
        self.limits, self.fail = (soft, hard), fail

    def getrlimit(self, which):
        return self.limits

    def setrlimit(self, which, limits):
        if self.fail:
            raise ValueError("not allowed")
        self.limits = limits


@pytest.mark.parametrize(
    ("soft", "hard", "fail", "expected"),
    [
        pytest.param(1024, 524288, False, 524288, id="container_default__raised_to_hard"),
        pytest.param(1048576, 1048576, False, 1048576, id="already_at_hard__unchanged"),
        pytest.param(1024, -1, False, 1 << 20, id="unlimited_hard__a_million"),
        pytest.param(1024, 4096, True, 1024, id="refused__kept_and_warned"),
    ],
)
def test_open_file_limit_raised_to_the_hard_limit(soft, hard, fail, expected):
    from kubeport.process import raise_open_file_limit

    limits = _Limits(soft, hard, fail)
    assert raise_open_file_limit(limits) == expected
    assert limits.limits[0] == expected

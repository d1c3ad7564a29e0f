"""The series a CoreDNS (or kube-proxy) Grafana dashboard reads, from its queries (tests/fixtures)."""

from __future__ import annotations

import re
from pathlib import Path

#: every series the CoreDNS Grafana dashboard of povilasv/coredns-mixin (dashboards/coredns.libsonnet,
#: listed on monitoring.mixins.dev) reads, with the labels its queries aggregate by
DASHBOARD_QUERIES = Path(__file__).resolve().parents[1] / "fixtures" / "coredns-dashboard-queries.txt"
#: what the dashboard reads that is not a CoreDNS series kubeport can have (Prometheus's own
#: ``up``; Go's goroutines) or that kubeport does not export (see kubeport.dns.metrics)
NOT_EXPORTED = {"up", "go_goroutines"}
#: the same for the kube-proxy dashboard of kubernetes-mixin (dashboards/proxy.libsonnet)
KUBE_PROXY_DASHBOARD_QUERIES = DASHBOARD_QUERIES.with_name("kube-proxy-dashboard-queries.txt")
#: what it reads that kubeport does not export: client-go's rest_client_* (kubeport's API
#: client is not client-go; its own are kubeport_apiserver_*), Go's goroutines, Prometheus's up
KUBE_PROXY_NOT_EXPORTED = {"up", "go_goroutines", "rest_client_requests_total",
                           "rest_client_request_duration_seconds_bucket"}


def dashboard_series(queries: Path = DASHBOARD_QUERIES) -> dict[str, set[str]]:
    """metric name -> the labels the fixture's queries group by (``by (...)``)."""
    series: dict[str, set[str]] = {}
    for query in queries.read_text().splitlines():
        if not query.strip() or query.startswith("#"):
            continue
        by = re.findall(r"by \(([^)]*)\)", query)
        grouped = {label.strip() for group in by for label in group.split(",")} - {"le"}
        for name in re.findall(r"\b([a-z_]+)\{", query):
            series.setdefault(name, set()).update(grouped)
    return series



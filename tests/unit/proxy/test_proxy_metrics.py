"""kube-proxy's sync metrics (changes, no_local_endpoints, network programming latency from
the trigger-time annotation) and the relay's per-port series."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kubeport.endpoints import model
from kubeport.endpoints.convert import TRIGGER_TIME_ANNOTATION, slice_info
from kubeport.endpoints.programming import programming_starts
from kubeport.endpoints.state import ClusterState
from kubeport.endpoints.types import ServiceState
from kubeport.lib.http.server import ConnectionStats
from kubeport.proxy.metrics import HttpConnectionsCollector, ProxyMetrics, RelayCollector

from support.slim import endpoint, endpoint_slice, port, service, snapshot

def _snapshot_with(services, node="node-a", changed_at=None):
    state = ClusterState(node, clock=lambda: changed_at or 0.0)
    state.mark_synced("Service")
    state.mark_synced("EndpointSlice")
    for obj in services:
        state.upsert(obj)
    return state


def _svc(name, **spec):
    spec.setdefault("clusterIP", "10.96.0.20")
    spec.setdefault("ports", [{"name": "http", "port": 80, "nodePort": 30080}])
    return model.Service.model_validate({"metadata": {"name": name}, "spec": spec})


def _slice(service, node):
    return model.EndpointSlice.model_validate({
        "metadata": {"name": f"{service}-1", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
        "endpoints": [{"addresses": ["10.244.2.11"], "nodeName": node}]})


def scrape(registry) -> dict[str, float]:
    values = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}"] = sample.value
    return values


def test_kube_proxy_sync_metrics_and_change_counts():
    registry = CollectorRegistry()
    clock = iter([100.0, 101.0, 102.0, 103.0, 104.0])
    metrics = ProxyMetrics(registry, "node-a", clock=lambda: next(clock))
    state = _snapshot_with([_svc("web", type="NodePort", externalTrafficPolicy="Local"), _slice("web", "node-b")],
                           changed_at=99.0)
    first = state.commit()
    metrics.queued(first)
    metrics.synced(first, 0.004)
    state.upsert(model.EndpointSlice.model_validate({
        "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
        "endpoints": [{"addresses": ["10.244.1.11"], "nodeName": "node-a"}]}))
    second = state.commit()
    metrics.synced(second, 0.002)
    values = scrape(registry)
    assert values["kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=IPv4}"] == 2
    assert values["kubeproxy_sync_proxy_rules_service_changes_total{}"] == 1
    assert values["kubeproxy_sync_proxy_rules_endpoint_changes_total{}"] == 1
    assert values["kubeproxy_network_programming_duration_seconds_count{ip_family=IPv4}"] == 1
    # After the second sync node-a has a local endpoint: the eTP=Local service is no longer counted.
    assert values["kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=IPv4,traffic_policy=external}"] == 0
    assert values["kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=IPv4}"] > 0


SYNC_SERIES = ("kubeproxy_sync_proxy_rules_duration_seconds_count", "kubeproxy_sync_full_proxy_rules_duration_seconds_count",
               "kubeproxy_sync_partial_proxy_rules_duration_seconds_count",
               "kubeproxy_sync_proxy_rules_nftables_sync_failures_total")


@pytest.mark.parametrize(
    ("families", "syncs", "expected", "last_synced"),
    [
        pytest.param(("IPv4",), [], {"IPv4": (0, 0, 0, 0)}, False, id="before_any_sync__every_series_at_0"),
        pytest.param(("IPv4",), [(True, False)], {"IPv4": (1, 1, 0, 0)}, True, id="first_apply__full"),
        pytest.param(("IPv4",), [(True, False), (False, False), (False, False)], {"IPv4": (3, 1, 2, 0)}, True,
                     id="applies_after__partial"),
        pytest.param(("IPv4",), [(True, True)], {"IPv4": (1, 1, 0, 1)}, False,
                     id="failed__observed_and_counted__no_last_timestamp"),
        pytest.param(("IPv6",), [(False, False)], {"IPv6": (1, 0, 1, 0)}, True, id="ipv6_only__labelled_ipv6"),
        pytest.param(("IPv4", "IPv6"), [(True, False), (False, True)], {"IPv4": (2, 1, 1, 1), "IPv6": (2, 1, 1, 1)},
                     True, id="dual_stack__each_sync_once_per_family__as_two_proxiers"),
    ],
)
def test_syncs_full_partial_and_failed_per_ip_family(families, syncs, expected, last_synced):
    """pkg/proxy/metrics/metrics.go (1.33): the sync series carry ip_family (IPv4/IPv6)."""
    registry = CollectorRegistry()
    metrics = ProxyMetrics(registry, "node-a", clock=lambda: 100.0, families=families)
    for full, failed in syncs:
        metrics.sync_done(0.004, full=full, failed=failed)
    values = scrape(registry)
    found = {family: tuple(values.get(f"{name}{{ip_family={family}}}") for name in SYNC_SERIES)
             for family in ("IPv4", "IPv6") if f"{SYNC_SERIES[0]}{{ip_family={family}}}" in values}
    assert found == expected
    stamps = {key for key in values if key.startswith("kubeproxy_sync_proxy_rules_last_timestamp_seconds")}
    assert stamps == ({f"kubeproxy_sync_proxy_rules_last_timestamp_seconds{{ip_family={family}}}"
                       for family in families} if last_synced else set())


def test_network_programming_labelled_with_the_slices_family():
    """kube-proxy's proxier of a family observes its own family's slices; none observes an
    FQDN slice, nor a family the node does not serve."""
    registry = CollectorRegistry()
    clock = iter([10.0, 100.0, 100.0])
    metrics = ProxyMetrics(registry, "node-a", clock=lambda: next(clock), families=("IPv4", "IPv6"))
    first = snapshot([_state(_web(cluster_ips=("10.96.0.20", "fd00:96::20")))])
    metrics.synced(first, 0.001, full=True)
    slices = (_traced(endpoint_slice("v4", [REMOTE], HTTP, "IPv4"), 40.0),
              _traced(endpoint_slice("v6", [LOCAL_V6], HTTP, "IPv6"), 70.0),
              _traced(endpoint_slice("fqdn", [REMOTE], HTTP, "FQDN"), 40.0))
    second = snapshot([ServiceState(_web(cluster_ips=("10.96.0.20", "fd00:96::20")), slices)], previous=first)
    metrics.synced(second, 0.001)
    values = scrape(registry)
    assert {family: (values[f"kubeproxy_network_programming_duration_seconds_count{{ip_family={family}}}"],
                     values[f"kubeproxy_network_programming_duration_seconds_sum{{ip_family={family}}}"])
            for family in ("IPv4", "IPv6")} == {"IPv4": (1, 60.0), "IPv6": (1, 30.0)}
    assert not any("FQDN" in key for key in values)


def test_every_sync_series_upstream_labels_with_ip_family_has_it():
    """The names and labels of kube-proxy 1.33's metrics reference, as rendered."""
    registry = CollectorRegistry()
    metrics = ProxyMetrics(registry, "node-a", clock=lambda: 1.0, families=("IPv4",))
    metrics.queued(snapshot([]))
    metrics.synced(snapshot([]), 0.001, full=True)
    labels = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    for name in ("kubeproxy_sync_proxy_rules_duration_seconds_bucket",
                 "kubeproxy_sync_full_proxy_rules_duration_seconds_bucket",
                 "kubeproxy_sync_partial_proxy_rules_duration_seconds_bucket",
                 "kubeproxy_network_programming_duration_seconds_bucket"):
        assert labels[name] == {"ip_family", "le"}, name
    for name in ("kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                 "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                 "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"):
        assert labels[name] == {"ip_family"}, name
    assert labels["kubeproxy_sync_proxy_rules_no_local_endpoints_total"] == {"ip_family", "traffic_policy"}
    for name in ("kubeproxy_sync_proxy_rules_endpoint_changes_total", "kubeproxy_sync_proxy_rules_service_changes_total",
                 "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                 "kubeproxy_sync_proxy_rules_service_changes_pending"):
        assert labels[name] == set(), name


def test_no_local_endpoints_counted_per_policy():
    registry = CollectorRegistry()
    metrics = ProxyMetrics(registry, "node-a", clock=lambda: 1.0)
    state = _snapshot_with([
        _svc("internal", internalTrafficPolicy="Local", ports=[{"name": "http", "port": 80}]),
        _slice("internal", "node-b"),
        _svc("external", clusterIP="10.96.0.21", type="NodePort", externalTrafficPolicy="Local"),
        _slice("external", "node-b"),
    ])
    metrics.synced(state.commit(), 0.001)
    values = scrape(registry)
    assert values["kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=IPv4,traffic_policy=internal}"] == 1
    assert values["kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=IPv4,traffic_policy=external}"] == 1


REMOTE = endpoint("10.244.2.11", node="node-b")
LOCAL = endpoint("10.244.1.11", node="node-a")
LOCAL_TERMINATING = endpoint("10.244.1.12", node="node-a", ready=False, serving=True, terminating=True)
LOCAL_V6 = endpoint("fd00:244::11", node="node-a")
HTTP = [("http", "TCP", 8080)]


def _state(info, *slices):
    return ServiceState(info, tuple(endpoint_slice(f"s{i}", eps, ports, family)
                                    for i, (eps, ports, family) in enumerate(slices)))


def _web(*ports, cluster_ips=("10.96.0.20",), **fields):
    return service("web", cluster_ips, ports or [port(80, name="http", target=8080)], **fields)


NODE_PORT = port(80, name="http", target=8080, node_port=30080)


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        pytest.param(_state(_web(internal_policy_local=True), ([REMOTE], HTTP, "IPv4")), (1, 0),
                     id="itp_local__endpoints_elsewhere_only__drop__counted"),
        pytest.param(_state(_web(internal_policy_local=True)), (0, 0),
                     id="itp_local__no_endpoints_at_all__reject__not_counted"),
        pytest.param(_state(_web(internal_policy_local=True), ([REMOTE, LOCAL_TERMINATING], HTTP, "IPv4")), (0, 0),
                     id="itp_local__local_serving_terminating__fallback_forwards__not_counted"),
        pytest.param(_state(_web(internal_policy_local=True), ([REMOTE, LOCAL], HTTP, "IPv4")), (0, 0),
                     id="itp_local__local_ready__not_counted"),
        pytest.param(_state(_web(NODE_PORT, type="NodePort", external_policy_local=True), ([REMOTE], HTTP, "IPv4")),
                     (0, 1), id="etp_local__endpoints_elsewhere_only__drop__counted"),
        pytest.param(_state(_web(NODE_PORT, type="NodePort", external_policy_local=True),
                            ([REMOTE], HTTP, "IPv4"), ([LOCAL_V6], HTTP, "IPv6")),
                     (0, 1), id="etp_local__only_local_endpoint_of_the_other_family__counted__per_family_proxier"),
        pytest.param(_state(_web(type="LoadBalancer", external_policy_local=True), ([REMOTE], HTTP, "IPv4")),
                     (0, 1), id="etp_local__lb_without_node_ports_or_ingress_yet__counted__external_policy_local"),
        pytest.param(_state(_web(NODE_PORT, type="LoadBalancer", external_policy_local=True,
                                 external_ips=("203.0.113.7",), load_balancer_ips=("198.51.100.9",)),
                            ([REMOTE], HTTP, "IPv4")),
                     (0, 1), id="etp_local__node_port_external_ip_and_lb__counted_once_per_port"),
        pytest.param(_state(_web(port(80, name="http", target=8080), port(9090, name="metrics"),
                                 internal_policy_local=True),
                            ([LOCAL], HTTP, "IPv4"), ([REMOTE], [("metrics", "TCP", 9090)], "IPv4")),
                     (1, 0), id="two_ports__only_one_without_local_endpoints__counted_per_port"),
        pytest.param(_state(_web(cluster_ips=("10.96.0.20", "fd00:96::20"), internal_policy_local=True),
                            ([REMOTE], HTTP, "IPv4"), ([endpoint("fd00:244::12", node="node-b")], HTTP, "IPv6")),
                     {"IPv4": (1, 0), "IPv6": (1, 0)}, id="dual_stack__counted_in_each_family"),
        pytest.param(_state(_web(NODE_PORT, type="NodePort", internal_policy_local=True,
                                 external_policy_local=True), ([REMOTE], HTTP, "IPv4")),
                     (1, 1), id="both_policies_local__counted_in_each"),
        pytest.param(_state(_web(internal_policy_local=True, proxy_name="other"), ([REMOTE], HTTP, "IPv4")), (0, 0),
                     id="not_proxied__not_counted"),
    ],
)
def test_no_local_endpoints__where_kube_proxy_installs_its_drop(state, expected):
    """pkg/proxy/metrics/metrics.go SyncProxyRulesNoLocalEndpointsTotal: where syncProxyRules drops,
    per ip_family (a tuple: IPv4's, none in IPv6)."""
    registry = CollectorRegistry()
    metrics = ProxyMetrics(registry, "node-a", clock=lambda: 1.0, families=("IPv4", "IPv6"))
    metrics.synced(snapshot([state]), 0.001)
    values = scrape(registry)
    found = {family: (values[f"kubeproxy_sync_proxy_rules_no_local_endpoints_total{{ip_family={family},"
                             "traffic_policy=internal}"],
                      values[f"kubeproxy_sync_proxy_rules_no_local_endpoints_total{{ip_family={family},"
                             "traffic_policy=external}"])
             for family in ("IPv4", "IPv6")}
    assert found == (expected if isinstance(expected, dict) else {"IPv4": expected, "IPv6": (0, 0)})


def test_no_local_endpoints__a_removed_service_is_no_longer_counted():
    registry = CollectorRegistry()
    metrics = ProxyMetrics(registry, "node-a", clock=lambda: 1.0)
    first = snapshot([_state(_web(internal_policy_local=True), ([REMOTE], HTTP, "IPv4"))])
    metrics.synced(first, 0.001)
    metrics.synced(snapshot([], previous=first), 0.001)
    assert scrape(registry)[
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=IPv4,traffic_policy=internal}"] == 0


class FakeStats:
    def __init__(self, total):
        self.active, self.total = 1, total
        self.bytes_to_backend = self.bytes_to_client = 10
        self.connect_failures = self.connect_giveups = self.ejections = 0
        self.udp_flows = self.udp_flows_total = self.udp_flows_rejected = 0


class FakeProxier:
    def __init__(self, count):
        self.stats = {f"ns/svc{i}:http/TCP": FakeStats(i) for i in range(count)}


def test_relay_series_are_capped(monkeypatch):
    import kubeport.proxy.metrics as metrics_module

    monkeypatch.setattr(metrics_module, "MAX_SERVICE_PORT_SERIES", 3)
    registry = CollectorRegistry()
    registry.register(RelayCollector(FakeProxier(5)))
    values = scrape(registry)
    totals = {k: v for k, v in values.items() if k.startswith("kubeport_proxy_connections_total")}
    assert totals == {
        "kubeport_proxy_connections_total{service_port=ns/svc4:http/TCP}": 4,
        "kubeport_proxy_connections_total{service_port=ns/svc3:http/TCP}": 3,
        "kubeport_proxy_connections_total{service_port=ns/svc2:http/TCP}": 2,
        "kubeport_proxy_connections_total{service_port=_other}": 1,
    }


def test_relay_series_follow_the_ports_protocol():
    from kubeport.endpoints.types import ServiceName, ServicePortName

    class Proxier:
        stats = {ServicePortName(ServiceName("ns", "web"), "http", "TCP"): FakeStats(1),
                 ServicePortName(ServiceName("ns", "dns"), "dns", "UDP"): FakeStats(0)}

    registry = CollectorRegistry()
    registry.register(RelayCollector(Proxier()))
    names = {key.split("{")[0] + "|" + key.split("service_port=")[1].split(",")[0].rstrip("}")
             for key in scrape(registry) if key.startswith("kubeport_proxy_")}
    assert "kubeport_proxy_connections_total|ns/web:http/TCP" in names
    assert "kubeport_proxy_udp_flows_total|ns/dns:dns/UDP" in names
    assert "kubeport_proxy_connections_total|ns/dns:dns/UDP" not in names
    assert "kubeport_proxy_udp_flows_active|ns/web:http/TCP" not in names
    assert "kubeport_proxy_bytes_total|ns/dns:dns/UDP" in names



def _programmed(old_slices, new_slices, changed_at=50.0, not_before=10.0, service_fields=None):
    old = snapshot([ServiceState(_web(), tuple(old_slices))])
    new = replace(snapshot([ServiceState(_web(**(service_fields or {})), tuple(new_slices))], previous=old),
                  changed_at=changed_at)
    return [started for _, started in programming_starts(old, new, not_before)]


def _traced(slice_, trigger):
    return replace(slice_, trigger_time=trigger)


_S0 = endpoint_slice("s0", [REMOTE], HTTP)
_S0_MOVED = endpoint_slice("s0", [LOCAL], HTTP)
_S1 = endpoint_slice("s1", [LOCAL], HTTP)


@pytest.mark.parametrize(
    ("old", "new", "fields", "expected"),
    [
        pytest.param([], [_traced(_S0, 40.0)], None, [40.0], id="slice_added__its_trigger_time"),
        pytest.param([_traced(_S0, 30.0)], [_traced(_S0_MOVED, 40.0)], None, [40.0], id="slice_changed__new_trigger"),
        pytest.param([_traced(_S0, 30.0)], [_traced(_S0, 40.0)], {"internal_policy_local": True}, [],
                     id="slice_unchanged__service_only_change__nothing"),
        pytest.param([], [_traced(_S0, 5.0)], None, [], id="trigger_before_start__ignored__tracker_start_time"),
        pytest.param([], [_S0], None, [50.0], id="no_annotation__manifests__arrival_time"),
        pytest.param([], [_traced(_S0, 40.0), _traced(_S1, 45.0)], None, [40.0, 45.0],
                     id="two_slices_changed__one_observation_each"),
        pytest.param([_traced(_S0, 30.0), _traced(_S1, 31.0)], [_traced(_S0, 30.0), _traced(_S1, 45.0)], None, [],
                     id="annotation_only_change__not_a_change__es_info_changed"),
    ],
)
def test_network_programming_starts_at_the_trigger_time(old, new, fields, expected):
    """pkg/proxy/metrics/metrics.go NetworkProgrammingLatency, from the slice's trigger-time annotation."""
    assert _programmed(old, new, service_fields=fields) == expected


def test_network_programming_nothing_for_a_removed_service():
    old = snapshot([_state(_web(), ([REMOTE], HTTP, "IPv4"))])
    new = replace(snapshot([], previous=old), changed_at=50.0)
    assert list(programming_starts(old, new, 10.0)) == []


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        pytest.param("2024-01-01T12:00:00Z", 1704110400.0, id="rfc3339"),
        pytest.param("2024-01-01T12:00:00.250000000Z", 1704110400.25, id="rfc3339_nano__as_the_controller_writes"),
        pytest.param("yesterday", None, id="unparseable__ignored"),
        pytest.param(None, None, id="absent"),
    ],
)
def test_trigger_time_annotation_is_read(annotation, expected):
    metadata = {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}}
    if annotation is not None:
        metadata["annotations"] = {TRIGGER_TIME_ANNOTATION: annotation}
    eps = model.EndpointSlice.model_validate({"metadata": metadata, "addressType": "IPv4", "endpoints": []})
    assert slice_info(eps).trigger_time == expected


def test_http_connections_turned_away_are_scraped_from_the_servers_counters():
    """The health, metrics and health-check node ports' caps (kubeport/lib/http/server.py)."""
    stats = ConnectionStats(rejected=3, evicted=5)
    registry = CollectorRegistry()
    registry.register(HttpConnectionsCollector(stats))
    values = scrape(registry)
    assert (values["kubeport_http_connections_rejected_total{}"], values["kubeport_http_connections_evicted_total{}"]) == (3, 5)
    ProxyMetrics(default := CollectorRegistry(), "node-a")  # registers the process's counters
    assert "kubeport_http_connections_rejected_total{}" in scrape(default)


def test_every_series_the_kube_proxy_dashboard_reads_is_exported():
    """The kubernetes-mixin "Kubernetes / Proxy" dashboard's queries (tests/fixtures), against the
    metrics port's registry after one sync of each kind, dual-stack (two ip_family values)."""
    from kubeport.process import process_registry

    from support.coredns_dashboard import KUBE_PROXY_DASHBOARD_QUERIES, KUBE_PROXY_NOT_EXPORTED, dashboard_series

    registry = process_registry()
    metrics = ProxyMetrics(registry, "node-a", clock=lambda: 1.0, families=("IPv4", "IPv6"))
    first = snapshot([_state(_web(), ([REMOTE], HTTP, "IPv4"))])
    metrics.synced(first, 0.004, full=True)
    metrics.synced(snapshot([_state(_web(), ([LOCAL], HTTP, "IPv4"))], previous=first), 0.002)
    scraped: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            scraped.setdefault(sample.name, set()).update(sample.labels)
    wanted = dashboard_series(KUBE_PROXY_DASHBOARD_QUERIES)
    assert {"kubeproxy_sync_proxy_rules_duration_seconds_bucket",
            "kubeproxy_network_programming_duration_seconds_bucket"} <= wanted.keys(), "the fixture's queries"
    assert not {name for name in wanted if name not in scraped} - KUBE_PROXY_NOT_EXPORTED
    for name, grouped in wanted.items():
        if name in scraped:
            assert grouped <= scraped[name] | {"instance", "job"}, name

"""kube-proxy's KubeProxyConfiguration read as it is: kubeadm's ConfigMap content, kube-proxy's
zero-value defaults, fields of other modes named once, unknown fields refused."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
import yaml

from kubeport import config as cfg
from kubeport import kubeproxy_config
from kubeport.cli import build_parser, flag_names, flag_values

KUBEADM = Path(__file__).parents[2] / "fixtures" / "kubeadm" / "config.conf"


def write(tmp_path: Path, changes: dict) -> Path:
    data = yaml.safe_load(KUBEADM.read_text())
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = data
        for parent in parents:
            node = node.setdefault(parent, {})
        if value is KeyError:
            node.pop(leaf)
        else:
            node[leaf] = value
    target = tmp_path / "config.conf"
    target.write_text(yaml.safe_dump(data))
    return target


def test_kubeadms_config_conf_gives_kube_proxys_defaults():
    config = cfg.build(KUBEADM, {})
    assert config.source_kind == "kubeconfig"
    assert config.client_connection.kubeconfig == Path("/var/lib/kube-proxy/kubeconfig.conf")
    assert config.cluster_cidr == [ipaddress.ip_network("10.244.0.0/16")]
    assert (config.bind_address, config.healthz_bind_address, config.metrics_bind_address) == (
        "0.0.0.0", "0.0.0.0:10256", "127.0.0.1:10249")
    assert config.config_sync_period == 900.0  # configSyncPeriod: 0s is kube-proxy's 15m
    assert (config.conntrack.udp_timeout, config.conntrack.udp_stream_timeout) == (30.0, 120.0)
    assert config.node_port_addresses == ["all"]  # mode "" is iptables: every address
    assert (config.log_format, config.verbosity) == ("text", 0)


def test_kubeadms_config_conf_names_the_fields_that_do_not_apply():
    ignored = cfg.ignored_fields(KUBEADM)
    assert {"mode", "iptables", "ipvs", "nftables", "winkernel", "oomScoreAdj", "conntrack.maxPerCore",
            "conntrack.min", "portRange", "detectLocal", "logging.flushFrequency"} <= set(ignored)
    served = {"bindAddress", "clusterCIDR", "clientConnection.kubeconfig", "conntrack.udpTimeout",
              "hostnameOverride", "logging.verbosity", "configSyncPeriod", "nodePortAddresses"}
    assert not served & {name.split("=")[0] for name in ignored}


@pytest.mark.parametrize(
    "changes, field, expected",
    [
        pytest.param({"hostnameOverride": " Node-A "}, "hostname_override", "node-a", id="hostname_override"),
        pytest.param({"bindAddress": "::"}, "healthz_bind_address", "[::]:10256", id="ipv6_bind_address"),
        pytest.param({"healthzBindAddress": "0.0.0.0:10999"}, "healthz_bind_address", "0.0.0.0:10999",
                     id="healthz_bind_address"),
        pytest.param({"metricsBindAddress": "127.0.0.1"}, "metrics_bind_address", "127.0.0.1:10249",
                     id="metrics_bare_ip_gets_port"),
        pytest.param({"clusterCIDR": "10.244.0.0/16,fd00:10:244::/56"}, "cluster_cidr",
                     [ipaddress.ip_network("10.244.0.0/16"), ipaddress.ip_network("fd00:10:244::/56")],
                     id="dual_stack_cluster_cidr"),
        pytest.param({"nodePortAddresses": ["192.168.0.0/16"]}, "node_port_addresses", ["192.168.0.0/16"],
                     id="node_port_addresses"),
        pytest.param({"configSyncPeriod": "5m"}, "config_sync_period", 300.0, id="config_sync_period"),
        pytest.param({"logging.format": "json"}, "log_format", "json", id="logging_format"),
        pytest.param({"logging.verbosity": 4}, "verbosity", 4, id="logging_verbosity"),
        pytest.param({"clientConnection.kubeconfig": ""}, "in_cluster", True,
                     id="empty_kubeconfig_is_in_cluster__createClient"),
        pytest.param({"detectLocalMode": "ClusterCIDR"}, "cluster_cidr", [ipaddress.ip_network("10.244.0.0/16")],
                     id="detect_local_cluster_cidr"),
    ],
)
def test_served_fields_have_kube_proxys_meaning(tmp_path, changes, field, expected):
    assert getattr(cfg.build(write(tmp_path, changes), {}), field) == expected


@pytest.mark.parametrize(
    "mode, expected",
    [("", ["all"]), ("iptables", ["all"]), ("ipvs", ["all"]), ("nftables", ["primary"])],
)
def test_unset_node_port_addresses_default_by_mode__types_go(tmp_path, mode, expected):
    assert cfg.build(write(tmp_path, {"mode": mode}), {}).node_port_addresses == expected


def test_conntrack_udp_timeouts(tmp_path):
    config = cfg.build(write(tmp_path, {"conntrack.udpTimeout": "45s", "conntrack.udpStreamTimeout": "3m"}), {})
    assert (config.conntrack.udp_timeout, config.conntrack.udp_stream_timeout) == (45.0, 180.0)


def test_the_userspace_modes_udp_idle_timeout_of_older_files(tmp_path):
    assert cfg.build(write(tmp_path, {"udpIdleTimeout": "250ms"}), {}).conntrack.udp_timeout == 0.25


def test_a_set_field_of_another_mode_is_shown_with_its_value(tmp_path):
    ignored = cfg.ignored_fields(write(tmp_path, {"mode": "ipvs", "oomScoreAdj": -999, "portRange": "30000-30100",
                                                  "ipvs.scheduler": "rr"}))
    assert {"mode=ipvs", "oomScoreAdj=-999", "portRange=30000-30100", "ipvs={scheduler:rr}"} <= set(ignored)


@pytest.mark.parametrize(
    "changes, line",
    [
        pytest.param({"mdoe": "ipvs"}, "mdoe: unknown field", id="top_level"),
        pytest.param({"iptables.masqueradeAl": True}, "iptables.masqueradeAl: unknown field", id="in_a_section"),
        pytest.param({"logging.options.json.bufferSize": 1}, "logging.options.json.bufferSize: unknown field",
                     id="deep"),
        pytest.param({"conntrack.udpTimeOut": "1s"}, "conntrack.udpTimeOut: unknown field", id="served_section"),
        pytest.param({"apiVersion": "kubeproxy.config.k8s.io/v1beta9"}, "apiVersion: 'kubeproxy.config.k8s.io/v1beta9'",
                     id="version"),
        pytest.param({"detectLocalMode": "BridgeInterface"}, "detectLocalMode: 'BridgeInterface'", id="detect_local"),
        pytest.param({"logging.format": "xml"}, "logging.format: 'xml': must be text or json", id="log_format"),
        pytest.param({"clusterCIDR": "10.244.0.1/16"}, "clusterCIDR: '10.244.0.1/16' has host bits set",
                     id="bad_value_names_field"),
        pytest.param({"conntrack.udpTimeout": "soon"}, "conntrack.udpTimeout: 'soon' is not a duration",
                     id="bad_duration"),
    ],
)
def test_problems_name_the_file_and_field(tmp_path, changes, line):
    path = write(tmp_path, changes)
    with pytest.raises(cfg.ConfigError) as caught:
        cfg.build(path, {})
    assert f"{path}: {line}" in str(caught.value)


def test_every_problem_is_reported_at_once(tmp_path):
    with pytest.raises(cfg.ConfigError) as caught:
        cfg.build(write(tmp_path, {"mdoe": "x", "ipvs.schedular": "rr"}), {})
    assert len(str(caught.value).splitlines()) == 2


def test_a_minimal_kube_proxy_file(tmp_path):
    path = tmp_path / "kube-proxy.yaml"
    path.write_text("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
                    "clusterCIDR: 10.244.0.0/16\n")
    config = cfg.build(path, {})
    assert config.source_kind == "in-cluster"
    assert config.node_port_addresses == ["all"]
    assert cfg.ignored_fields(path) == []


def test_a_source_flag_replaces_the_files_source():
    args = build_parser().parse_args(["run", "--config", str(KUBEADM), "--manifests", "/srv/manifests"])
    config = cfg.build(KUBEADM, flag_values(args), flag_names(args))
    assert config.source_kind == "manifests"
    assert config.cluster_cidr == [ipaddress.ip_network("10.244.0.0/16")]


def test_schema_sections_know_their_fields():
    # Every section kubeadm writes is known with every field it writes (strict decoding would
    # otherwise refuse kubeadm's own file).
    data = yaml.safe_load(KUBEADM.read_text())
    assert kubeproxy_config._unknown(data, kubeproxy_config.SCHEMA, "") == []


@pytest.mark.parametrize("header", [
    "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n",
    "apiVersion: kubeport.io/v1alpha1\nkind: KubeportConfiguration\n",
])
def test_a_field_given_twice_is_an_error_naming_both_lines(tmp_path, header):
    path = tmp_path / "config.conf"
    path.write_text(header + "clusterCIDR: 10.244.0.0/16\nconntrack:\n  udpTimeout: 1s\nclusterCIDR: 10.8.0.0/16\n")
    with pytest.raises(cfg.ConfigError) as caught:
        cfg.build(path, {})
    assert str(caught.value) == f"{path}: line 6: mapping key 'clusterCIDR' already defined at line 3"

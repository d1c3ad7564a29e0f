"""Configuration: file + flags, KubeProxyConfiguration names, errors naming the field."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from kubeport import config as cfg
from kubeport.cli import build_parser, flag_values

HEADER = "apiVersion: kubeport.io/v1alpha1\nkind: KubeportConfiguration\n"


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(HEADER + body)
    return path


@pytest.mark.parametrize(
    "text, seconds",
    [("30s", 30.0), ("1m30s", 90.0), ("500ms", 0.5), ("2h", 7200.0), ("0", 0.0), (15, 15.0), ("1.5s", 1.5)],
)
def test_go_durations(text, seconds):
    assert cfg.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["30", "1x", "s", "", "1m 30s", None])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        cfg.parse_duration(text)


def test_defaults_are_kube_proxy_and_kubeadm_defaults():
    config = cfg.build(None, {})
    assert config.healthz_bind_address == "0.0.0.0:10256"
    assert config.metrics_bind_address == "127.0.0.1:10249"
    assert config.service_node_port_range == (30000, 32767)
    assert config.node_port_addresses == ["primary"]
    assert config.dns_addresses == ["10.96.0.10"]
    assert config.dns.ttl == 5
    assert config.source_kind == "manifests"


@pytest.mark.parametrize(
    "fields, expected",
    [
        pytest.param({}, ("0.0.0.0:10256", "127.0.0.1:10249"), id="ipv4_defaults__set_defaults_kube_proxy_configuration"),
        pytest.param({"bindAddress": "::"}, ("[::]:10256", "[::1]:10249"), id="ipv6_bind_address_moves_defaults"),
        pytest.param({"bindAddress": "::", "healthzBindAddress": "10.0.0.1:9"}, ("10.0.0.1:9", "[::1]:10249"),
                     id="explicit_address_wins_over_bind_address_default"),
        pytest.param({"healthzBindAddress": "0.0.0.0", "metricsBindAddress": "::1"},
                     ("0.0.0.0:10256", "[::1]:10249"), id="bare_ip_gets_default_port__append_port_if_needed"),
    ],
)
def test_bind_addresses_default_as_kube_proxy(fields, expected):
    config = cfg.build(None, fields)
    assert (config.healthz_bind_address, config.metrics_bind_address) == expected


@pytest.mark.parametrize(
    "override, expected",
    [pytest.param(" Worker-1 ", "worker-1", id="trimmed_and_lower_cased__get_hostname"),
     pytest.param("node-a", "node-a", id="as_given")],
)
def test_node_name_as_kube_proxy_reads_it(override, expected):
    assert cfg.build(None, {"hostnameOverride": override}).hostname_override == expected


def test_empty_node_name_is_the_hosts(monkeypatch):
    monkeypatch.setattr(cfg.socket, "gethostname", lambda: "Host-A\n")
    assert cfg.build(None, {"hostnameOverride": "  "}).hostname_override == "host-a"
    assert cfg.build(None, {}).hostname_override == "host-a"


@pytest.mark.parametrize(
    "body, field",
    [
        pytest.param("foo: 1\n", "foo: unknown field", id="unknown_top_level_field"),
        pytest.param("dns:\n  tll: 5\n", "dns.tll: unknown field", id="unknown_nested_field"),
        pytest.param("dns:\n  ttl: 4000\n", "dns.ttl: Input should be less than or equal to 3600", id="ttl_range"),
        pytest.param("healthzBindAddress: localhost\n", "healthzBindAddress:", id="bind_address_shape"),
        pytest.param("bindAddress: somewhere\n", "bindAddress: 'somewhere' is not an IP address", id="bind_address_ip"),
        pytest.param("serviceNodePortRange: 30000\n", "serviceNodePortRange:", id="port_range_shape"),
        pytest.param("conntrack:\n  udpTimeout: forever\n", "conntrack.udpTimeout:", id="duration"),
        pytest.param("nodePortAddresses: [somewhere]\n", "nodePortAddresses:", id="nodeport_addresses"),
        pytest.param("serviceClusterIPRange: 10.96.0.0/12,10.100.0.0/16\n", "different IP families",
                     id="dual_stack_needs_two_families"),
    ],
)
def test_errors_name_the_file_and_field(tmp_path, body, field):
    path = write(tmp_path, body)
    with pytest.raises(cfg.ConfigError) as info:
        cfg.build(path, {})
    assert str(info.value).startswith(f"{path}: ")
    assert field in str(info.value)


@pytest.mark.parametrize(
    "header, message",
    [("apiVersion: v1\nkind: KubeportConfiguration\n", "apiVersion/kind must be"),
     ("[1, 2]\n", "expected a KubeportConfiguration or KubeProxyConfiguration document"),
     ("a: [\n", "not valid YAML")],
)
def test_file_shape_errors(tmp_path, header, message):
    path = tmp_path / "c.yaml"
    path.write_text(header)
    with pytest.raises(cfg.ConfigError, match=message):
        cfg.build(path, {})


def test_flags_override_the_file(tmp_path):
    path = write(tmp_path, "hostnameOverride: from-file\ndns:\n  ttl: 30\n  pods: insecure\n")
    args = build_parser().parse_args(["run", "--config", str(path), "--dns-ttl", "7", "--hostname-override", "n1"])
    config = cfg.build(path, flag_values(args))
    assert (config.hostname_override, config.dns.ttl, config.dns.pods) == ("n1", 7, "insecure")


def test_cluster_cidr_comma_string_like_kube_proxy(tmp_path):
    config = cfg.build(write(tmp_path, "clusterCIDR: 10.244.0.0/16,fd00:10:244::/56\n"), {})
    assert config.cluster_cidr == [ipaddress.ip_network("10.244.0.0/16"), ipaddress.ip_network("fd00:10:244::/56")]


def test_written_defaults_load_back_identically(tmp_path):
    config = cfg.build(None, {"manifests": "examples", "hostnameOverride": "node-a"})
    path = tmp_path / "written.yaml"
    path.write_text(config.to_yaml())
    assert cfg.build(path, {}) == config


@pytest.mark.parametrize(
    "argv, source",
    [(["run"], "manifests"), (["run", "--kubeconfig", "/k"], "kubeconfig"), (["run", "--in-cluster"], "in-cluster")],
)
def test_source_kind_from_flags(argv, source):
    assert cfg.build(None, flag_values(build_parser().parse_args(argv))).source_kind == source


@pytest.mark.parametrize(
    "value, message",
    [
        pytest.param("10.96.0.0/33", "'10.96.0.0/33' is not a CIDR: the prefix length must be 0-32 for IPv4",
                     id="prefix_too_long_v4"),
        pytest.param("fd00::/129", "'fd00::/129' is not a CIDR: the prefix length must be 0-128 for IPv6",
                     id="prefix_too_long_v6"),
        pytest.param("10.96.0.1/12", "'10.96.0.1/12' has host bits set: the network is 10.96.0.0/12",
                     id="host_bits_set__rejected_naming_the_network"),
        pytest.param("x", "'x' is not a CIDR: no /PREFIX-LENGTH", id="not_a_cidr"),
        pytest.param("10.96.0.0", "no /PREFIX-LENGTH", id="bare_ip__go_parse_cidr_needs_a_prefix"),
        pytest.param("10.96.0.300/12", "'10.96.0.300' is not an IP address", id="bad_address"),
        pytest.param("10.96.0.0/255.240.0.0", "the prefix length must be", id="netmask_form__not_go_parse_cidr"),
    ],
)
@pytest.mark.parametrize("field", ["serviceClusterIPRange", "clusterCIDR"])
def test_bad_cidrs_get_one_line_naming_field_and_value(tmp_path, field, value, message):
    path = write(tmp_path, f"{field}: {value}\n")
    with pytest.raises(cfg.ConfigError) as info:
        cfg.build(path, {})
    assert str(info.value).startswith(f"{path}: {field}: ")
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    assert "lax-or-strict" not in str(info.value) and "validator" not in str(info.value)


@pytest.mark.parametrize(
    "value, expected",
    [
        pytest.param("10.96.0.0/12", ["10.96.0.0/12"], id="one"),
        pytest.param("10.96.0.0/12, fd00:10:96::/112", ["10.96.0.0/12", "fd00:10:96::/112"], id="dual_stack_csv"),
        pytest.param(["10.96.0.0/12"], ["10.96.0.0/12"], id="yaml_list"),
    ],
)
def test_good_cidrs(value, expected):
    config = cfg.build(None, {"serviceClusterIPRange": value})
    assert [str(n) for n in config.service_cluster_ip_range] == expected


@pytest.mark.parametrize(
    "body, flags, expected",
    [
        pytest.param("", {"healthzBindAddress": "", "metricsBindAddress": ""}, ("", ""),
                     id="empty_flag_disables__kube_proxy_set_empty_to_disable"),
        pytest.param("healthzBindAddress: ''\nmetricsBindAddress: ''\n", {}, ("0.0.0.0:10256", "127.0.0.1:10249"),
                     id="empty_in_file_is_the_default__set_defaults_kube_proxy_configuration"),
        pytest.param("healthzBindAddress:\n", {}, ("0.0.0.0:10256", "127.0.0.1:10249"), id="null_in_file_is_the_default"),
        pytest.param("healthzBindAddress: 10.0.0.1:1\n", {"healthzBindAddress": ""}, ("", "127.0.0.1:10249"),
                     id="empty_flag_overrides_the_file"),
        pytest.param("bindAddress: '::'\n", {"metricsBindAddress": ""}, ("[::]:10256", ""),
                     id="empty_flag_wins_over_ipv6_default"),
    ],
)
def test_empty_bind_address_as_kube_proxy(tmp_path, body, flags, expected):
    config = cfg.build(write(tmp_path, body), flags)
    assert (config.healthz_bind_address, config.metrics_bind_address) == expected


def test_builtin_errors_show_the_bad_value(tmp_path):
    path = write(tmp_path, "dns:\n  port: 99999\n")
    with pytest.raises(cfg.ConfigError) as info:
        cfg.build(path, {})
    assert str(info.value) == f"{path}: dns.port: Input should be less than or equal to 65535 (got 99999)"


@pytest.mark.parametrize(
    "change, expected",
    [
        pytest.param({"serviceNodePortRange": "30000-30100"}, ["serviceNodePortRange"], id="camel_case_not_python"),
        pytest.param({"serviceClusterIPRange": "10.0.0.0/16"}, ["serviceClusterIPRange"], id="explicit_alias"),
        pytest.param({"conntrack": {"udpTimeout": "5s"}}, ["conntrack.udpTimeout"], id="section_leaf"),
        pytest.param({"clientConnection": {"kubeconfig": "/k"}}, ["clientConnection.kubeconfig"], id="nested"),
        pytest.param({}, [], id="nothing"),
    ],
)
def test_changed_fields_use_the_files_names(change, expected):
    assert cfg.changed_fields(cfg.build(None, {}), cfg.build(None, change)) == expected


@pytest.mark.parametrize(
    "body, expire, max_concurrent",
    [
        pytest.param("", 10.0, 1000, id="coredns_expire_default"),
        pytest.param("dns:\n  forwardExpire: 30s\n  maxConcurrentForwards: 50\n", 30.0, 50, id="set_in_the_file"),
    ],
)
def test_forward_settings_reach_the_forwarder(tmp_path, body, expire, max_concurrent):
    from kubeport.components import dns_config
    from kubeport.dns.server import DnsServer

    settings = dns_config(cfg.build(write(tmp_path, body) if body else None, {})).with_changes(upstreams=())
    forwarder = DnsServer(settings).forwarder
    assert (forwarder._tcp.expire, forwarder.max_concurrent) == (expire, max_concurrent)


def test_bad_forward_expire_names_the_field(tmp_path):
    path = write(tmp_path, "dns:\n  forwardExpire: 0s\n")
    with pytest.raises(cfg.ConfigError, match=r"dns\.forwardExpire: Input should be greater than 0"):
        cfg.build(path, {})


async def test_a_reload_with_a_new_forward_expire_rebuilds_the_forwarder(tmp_path):
    from kubeport.components import dns_config
    from kubeport.dns.server import DnsServer

    server = DnsServer(dns_config(cfg.build(None, {})).with_changes(upstreams=()))
    changed = cfg.build(write(tmp_path, "dns:\n  forwardExpire: 2s\n"), {})
    await server.reconfigure(dns_config(changed).with_changes(upstreams=()))
    assert server.forwarder._tcp.expire == 2.0

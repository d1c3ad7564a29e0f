"""The kubernetes plugin's options as a CoreDNS operator writes them: the configuration file's
``dns`` fields and `kubeport run` flags, down to the DNS server's configuration.

Each row is a Corefile `kubernetes` block line and its kubeport spelling (the table in docs/behaviour-dns.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeport import cli
from kubeport import config as cfg
from kubeport.cli import build_parser, flag_names, flag_values
from kubeport.components import dns_config

HEADER = "apiVersion: kubeport.io/v1alpha1\nkind: KubeportConfiguration\n"


def from_flags(*argv: str):
    args = build_parser().parse_args(["run", *argv])
    return dns_config(cfg.build(None, flag_values(args), flag_names(args)))


def from_file(tmp_path: Path, body: str):
    path = tmp_path / "config.yaml"
    path.write_text(HEADER + "dns:\n" + body)
    return dns_config(cfg.build(path, {}))


#: (Corefile line, flags, file body, DnsConfig field, value)
OPTIONS = [
    pytest.param(["--dns-namespaces", "default, kube-system"], "  namespaces: [default, kube-system]\n",
                 "namespaces", ("default", "kube-system"), id="namespaces_default_kube_system"),
    pytest.param(["--endpoint-pod-names"], "  endpointPodNames: true\n", "endpoint_pod_names", True,
                 id="endpoint_pod_names"),
    pytest.param(["--ignore-empty-service"], "  ignoreEmptyService: true\n", "ignore_empty_service", True,
                 id="ignore_empty_service"),
    pytest.param(["--noendpoints"], "  noendpoints: true\n", "noendpoints", True, id="noendpoints"),
    pytest.param(["--dns-autopath"], "  autopath: true\n", "autopath", True, id="autopath_at_kubernetes"),
    pytest.param(["--dns-labels", "tier in (front)"], "  labels: tier in (front)\n", "labels", "tier in (front)",
                 id="labels_tier_in_front"),
    pytest.param(["--dns-namespace-labels", "team=a"], "  namespaceLabels: team=a\n", "namespace_labels",
                 "team=a", id="namespace_labels_team_a"),
    pytest.param(["--dns-prefetch", "2"], "  prefetch: 2\n", "prefetch", 2, id="cache_prefetch_2"),
    pytest.param(["--dns-serve-stale", "1h", "--dns-serve-stale-refresh-mode", "verify"],
                 "  serveStale: 1h\n  serveStaleRefreshMode: verify\n", "serve_stale", 3600.0,
                 id="cache_serve_stale_1h_verify"),
    pytest.param(["--dns-reverse-zones", "10.96.0.0/12,ip6.arpa"], "  reverseZones: [10.96.0.0/12, ip6.arpa]\n",
                 "reverse_zones", ("10.96.0.0/12", "ip6.arpa"), id="kubernetes_cluster_local_10_96_0_0_12_ip6_arpa"),
    pytest.param(["--dns-reverse-zones", ""], "  reverseZones: []\n", "reverse_zones", (),
                 id="kubernetes_cluster_local_without_reverse_zones"),
    pytest.param(["--dns-fallthrough", ""], "  fallthrough: []\n", "fallthrough", (), id="no_fallthrough"),
    pytest.param(["--dns-fallthrough", "."], "  fallthrough: [.]\n", "fallthrough", (".",),
                 id="fallthrough_without_zones"),
]


@pytest.mark.parametrize("argv, body, field, value", OPTIONS)
def test_option_from_flags_and_from_the_file(tmp_path, argv, body, field, value):
    assert getattr(from_flags(*argv), field) == value
    assert getattr(from_file(tmp_path, body), field) == value


def test_defaults_are_kubeadms_corefile():
    """kubeadm's `kubernetes cluster.local in-addr.arpa ip6.arpa { fallthrough in-addr.arpa ip6.arpa }`."""
    config = from_flags()
    assert (config.zone, config.reverse_zones, config.fallthrough) == \
        ("cluster.local", ("in-addr.arpa", "ip6.arpa"), ("in-addr.arpa", "ip6.arpa"))
    assert (config.namespaces, config.endpoint_pod_names, config.ignore_empty_service) == ((), False, False)


def test_a_flag_turns_off_what_the_file_turned_on(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(HEADER + "dns:\n  endpointPodNames: true\n  ignoreEmptyService: true\n")
    args = build_parser().parse_args(["run", "--no-endpoint-pod-names", "--no-ignore-empty-service"])
    config = dns_config(cfg.build(path, flag_values(args), flag_names(args)))
    assert (config.endpoint_pod_names, config.ignore_empty_service) == (False, False)


@pytest.mark.parametrize("argv, line", [
    pytest.param(["--dns-namespaces", "Default"], "--dns-namespaces: 'Default' is not a namespace name",
                 id="namespace"),
    pytest.param(["--dns-reverse-zones", "example.org"],
                 "--dns-reverse-zones: example.org: a reverse zone is in-addr.arpa or ip6.arpa, or a CIDR",
                 id="reverse_zone"),
    pytest.param(["--dns-fallthrough", "10.0.0.0/99"], "--dns-fallthrough: '10.0.0.0/99' is not a CIDR",
                 id="fallthrough"),
])
def test_bad_values_name_the_flag(capsys, tmp_path, argv, line):
    assert cli.main(["run", *argv, "--write-config-to", str(tmp_path / "out.yaml")]) == 2
    assert f"kubeport: invalid configuration: {line}" in capsys.readouterr().err.splitlines()


def test_bad_file_value_names_the_file_and_field(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(HEADER + "dns:\n  namespaces: [Bad_Name]\n")
    with pytest.raises(cfg.ConfigError, match=r"config\.yaml: dns\.namespaces: 'Bad_Name' is not a namespace name"):
        cfg.build(path, {})

"""`kubeport run` flags: kube-proxy's names and forms, and errors that name the flag and the bad value."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kubeport import cli
from kubeport import config as cfg
from kubeport.cli import FIELD_FLAGS, build_parser, flag_names, flag_values, main


def run_errors(capsys, tmp_path: Path, *argv: str) -> list[str]:
    """The stderr lines of `kubeport run ARGV` that stops at configuration (exit 2 expected)."""
    code = cli.main(["run", *argv, "--write-config-to", str(tmp_path / "out.yaml")])
    assert code == 2
    return capsys.readouterr().err.splitlines()


@pytest.mark.parametrize(
    "argv, line",
    [
        pytest.param(["--service-cluster-ip-range", "10.96.0.0/33"],
                     ("--service-cluster-ip-range: '10.96.0.0/33' is not a CIDR: the prefix length must be 0-32 "
                      "for IPv4"), id="cidr_prefix_too_long"),
        pytest.param(["--service-cluster-ip-range", "10.96.0.1/12"],
                     "--service-cluster-ip-range: '10.96.0.1/12' has host bits set: the network is 10.96.0.0/12",
                     id="cidr_host_bits"),
        pytest.param(["--cluster-cidr", "x"], "--cluster-cidr: 'x' is not a CIDR: no /PREFIX-LENGTH (e.g. 10.96.0.0/12)",
                     id="cidr_garbage"),
        pytest.param(["--dns-port", "99999"], "--dns-port: Input should be less than or equal to 65535 (got 99999)",
                     id="int_range_names_flag_and_value"),
        pytest.param(["--dns-ttl", "4000"], "--dns-ttl: Input should be less than or equal to 3600 (got 4000)",
                     id="ttl_range"),
        pytest.param(["--workers", "0"], "--workers: Input should be greater than or equal to 1 (got 0)", id="workers"),
        pytest.param(["--dns-address", "10.0.0.1", "--dns-address", "foo"],
                     "--dns-address: 'foo' does not appear to be an IPv4 or IPv6 address", id="repeatable_flag_element"),
        pytest.param(["--udp-idle-timeout", "5x"], "--udp-idle-timeout: '5x' is not a duration like 30s or 1m30s",
                     id="alias_named_as_given"),
        pytest.param(["--conntrack-udp-timeout", "5x"],
                     "--conntrack-udp-timeout: '5x' is not a duration like 30s or 1m30s", id="kube_proxy_name"),
        pytest.param(["--conntrack-udp-timeout-stream", "0"],
                     "--conntrack-udp-timeout-stream: Input should be greater than 0 (got 0.0)", id="stream_timeout"),
        pytest.param(["--shutdown-grace-period", "soon"],
                     "--shutdown-grace-period: 'soon' is not a duration like 30s or 1m30s", id="grace"),
        pytest.param(["--dns-lame-duck", "soon"], "--dns-lame-duck: 'soon' is not a duration like 30s or 1m30s",
                     id="lame_duck"),
        pytest.param(["--healthz-bind-address", "nowhere:1"],
                     "--healthz-bind-address: 'nowhere:1': 'nowhere' is not an IP address", id="healthz_address"),
        pytest.param(["--metrics-bind-address", "1.2.3.4:x"],
                     "--metrics-bind-address: '1.2.3.4:x' is not HOST:PORT", id="metrics_address"),
        pytest.param(["--service-node-port-range", "5"], "--service-node-port-range: '5' is not LOW-HIGH",
                     id="port_range"),
        pytest.param(["--nodeport-addresses", "all,nowhere"],
                     "--nodeport-addresses: 'nowhere' is not primary, localhost, all or a CIDR", id="nodeport_addresses"),
        pytest.param(["--upstream", "nowhere"], "--upstream:", id="upstream"),
        pytest.param(["--v=11"], "--v: Input should be less than or equal to 10 (got 11)", id="verbosity"),
    ],
)
def test_bad_flag_values_name_the_flag_in_one_line(capsys, tmp_path, argv, line):
    lines = run_errors(capsys, tmp_path, *argv)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"kubeport: invalid configuration: {line}")
    assert "lax-or-strict" not in lines[0] and "flags:" not in lines[0]


def test_file_errors_still_name_the_file_and_field(capsys, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("apiVersion: kubeport.io/v1alpha1\nkind: KubeportConfiguration\nclusterCIDR: 10.0.0.1/8\n")
    assert run_errors(capsys, tmp_path, "--config", str(path), "--dns-port", "53") == [
        f"kubeport: invalid configuration: {path}: clusterCIDR: '10.0.0.1/8' has host bits set: "
        "the network is 10.0.0.0/8"]


def _field_paths(model: type[cfg.BaseModel] = cfg.KubeportConfiguration, prefix: str = "") -> set[str]:
    paths = set()
    for name, info in model.model_fields.items():
        alias = f"{prefix}{info.alias or name}"
        paths.add(alias)
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, cfg.BaseModel):
            paths |= _field_paths(annotation, alias + ".")
    return paths


def test_every_flag_maps_to_a_real_field_and_every_run_flag_is_mapped():
    assert set(FIELD_FLAGS) <= _field_paths()
    run = next(a for a in build_parser()._subparsers._group_actions[0].choices.values() if a.prog.endswith(" run"))
    options = {o for action in run._actions for o in action.option_strings if o.startswith("--")
               and not (isinstance(action, argparse.BooleanOptionalAction) and o.startswith("--no-"))}
    mapped = {flag for flags in FIELD_FLAGS.values() for flag in flags}
    assert options - mapped == {"--help", "--config", "--write-config-to", "--verbose", "--cleanup", "--init-only",
                                "--proxy-mode"}


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", *argv])


@pytest.mark.parametrize(
    "argv, level",
    [
        pytest.param([], None, id="not_given__file_or_default"),
        pytest.param(["-v=2"], 2, id="klog_short_equals"),
        pytest.param(["--v=2"], 2, id="klog_long_equals__not_ambiguous_with_vip_interface"),
        pytest.param(["-v", "2"], 2, id="klog_short_space"),
        pytest.param(["--v", "3"], 3, id="klog_long_space"),
        pytest.param(["-v4"], 4, id="pflag_shorthand_attached"),
        pytest.param(["--v=0"], 0, id="explicit_zero_overrides_the_file"),
        pytest.param(["-v"], 1, id="counting_one"),
        pytest.param(["-vv"], 2, id="counting_two"),
        pytest.param(["-vvv"], 3, id="counting_three"),
        pytest.param(["-v", "-v"], 2, id="counting_repeated"),
        pytest.param(["--verbose"], 1, id="verbose_long"),
        pytest.param(["-v", "--manifests", "m"], 1, id="bare_v_before_another_flag"),
    ],
)
def test_verbosity_forms(argv, level):
    values = flag_values(parse(*argv))
    assert values.get("verbosity") == level


def test_verbosity_garbage_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        parse("--v=x")
    assert info.value.code == 2
    assert "argument --v: expected a level" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, values, names",
    [
        pytest.param(["--conntrack-udp-timeout", "5s"], {"conntrack": {"udpTimeout": "5s"}},
                     {"conntrack.udpTimeout": "--conntrack-udp-timeout"}, id="kube_proxy_udp_timeout"),
        pytest.param(["--udp-idle-timeout", "5s"], {"conntrack": {"udpTimeout": "5s"}},
                     {"conntrack.udpTimeout": "--udp-idle-timeout"}, id="alias_udp_idle_timeout"),
        pytest.param(["--udp-idle-timeout", "9s", "--conntrack-udp-timeout", "5s"], {"conntrack": {"udpTimeout": "5s"}},
                     {"conntrack.udpTimeout": "--conntrack-udp-timeout"}, id="kube_proxy_name_wins_over_alias"),
        pytest.param(["--conntrack-udp-timeout-stream", "3m"], {"conntrack": {"udpStreamTimeout": "3m"}},
                     {"conntrack.udpStreamTimeout": "--conntrack-udp-timeout-stream"}, id="udp_stream_timeout"),
        pytest.param(["--healthz-bind-address", "", "--metrics-bind-address="],
                     {"healthzBindAddress": "", "metricsBindAddress": ""},
                     {"healthzBindAddress": "--healthz-bind-address", "metricsBindAddress": "--metrics-bind-address"},
                     id="empty_bind_addresses_are_given"),
        pytest.param(["--in-cluster", "--nodeport-addresses", "primary, 10.0.0.0/8"],
                     {"inCluster": True, "nodePortAddresses": ["primary", "10.0.0.0/8"]},
                     {"inCluster": "--in-cluster", "nodePortAddresses": "--nodeport-addresses"}, id="converted"),
        pytest.param(["--handover-generation", "7", "--after-handover", "wait"],
                     {"handoverGeneration": "7", "afterHandover": "wait"},
                     {"handoverGeneration": "--handover-generation", "afterHandover": "--after-handover"},
                     id="daemonset_handover_flags"),
        pytest.param(["--ready-file", "/tmp/ready", "--live-file", "/tmp/live"],
                     {"readyFile": "/tmp/ready", "liveFile": "/tmp/live"},
                     {"readyFile": "--ready-file", "liveFile": "--live-file"}, id="pod_probe_files"),
        pytest.param(["--handover-generation", ""], {}, {},
                     id="empty_generation_is_unset__a_pod_label_missing_reads_empty"),
    ],
)
def test_flags_to_fields(argv, values, names):
    args = parse(*argv)
    assert flag_values(args) == values
    assert flag_names(args) == names


def test_udp_stream_timeout_flag_sets_the_field():
    config = cfg.build(None, flag_values(parse("--conntrack-udp-timeout-stream", "3m", "--conntrack-udp-timeout", "5s")))
    assert (config.conntrack.udp_stream_timeout, config.conntrack.udp_timeout) == (180.0, 5.0)


def test_help_says_empty_disables_and_where_the_status_api_is():
    run = next(a for a in build_parser()._subparsers._group_actions[0].choices.values() if a.prog.endswith(" run"))
    text = " ".join(run.format_help().split())
    assert "/metrics, /healthz, /proxyMode, /readyz (default 127.0.0.1:10249). Set empty to disable." in text
    assert "readable by whoever reaches it" in text  # --status-bind-address
    assert "(default 0.0.0.0:10256). Set empty to disable." in text


def test_check_names_its_flag_too(capsys, tmp_path):
    assert cli.main(["check", str(tmp_path), "--service-cluster-ip-range", "10.96.0.1/12"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "kubeport: --service-cluster-ip-range: '10.96.0.1/12' has host bits set: the network is 10.96.0.0/12"]


def test_check_lists_skipped_objects_without_failing(tmp_path, capsys):
    (tmp_path / "app.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: demo}\n---\n"
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\n"
        "spec: {clusterIP: 10.96.0.50, ports: [{port: 80}]}\n")
    assert cli.main(["check", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Deployment" in out and "skipped" in out
    assert out.rstrip().endswith(": ok")


def test_a_reader_that_leaves_early_gets_no_traceback__kubeport_get_status_head(tmp_path):
    """`kubeport get status | head -1`: the pipe closes under a long output."""
    script = ("import sys\nfrom kubeport import cli\n"
              "def long_output(args):\n    for i in range(200000):\n        print('line', i)\n    return 0\n"
              "cli.cmd_check = long_output\nsys.exit(cli.main(['check', '.']))\n")
    done = subprocess.run(["bash", "-o", "pipefail", "-c", f'{shlex.quote(sys.executable)} -c "$0" | head -1', script],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout == "line 0\n"
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode == 141


KUBEADM_CONFIG = Path(__file__).parents[2] / "fixtures" / "kubeadm" / "config.conf"


def test_kube_proxys_command_line_without_a_subcommand(tmp_path):
    """kubeadm's kube-proxy DaemonSet runs `kube-proxy --config=... --hostname-override=$(NODE_NAME)`."""
    out = tmp_path / "effective.yaml"
    assert main([f"--config={KUBEADM_CONFIG}", "--hostname-override=Node-X", "--v=2", "--cluster-cidr=10.1.0.0/16",
                 "--proxy-mode=iptables", "--bind-address=::", "--config-sync-period=1m",
                 f"--write-config-to={out}"]) == 0
    effective = yaml.safe_load(out.read_text())
    assert (effective["hostnameOverride"], effective["verbosity"]) == ("node-x", 2)
    assert effective["clusterCIDR"] == "10.1.0.0/16"
    assert (effective["healthzBindAddress"], effective["configSyncPeriod"]) == ("[::]:10256", "1m")
    assert effective["clientConnection"]["kubeconfig"] == "/var/lib/kube-proxy/kubeconfig.conf"


def test_kube_proxys_version_flag(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("kubeport ")

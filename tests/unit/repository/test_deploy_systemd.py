"""deploy/kubeport.service and deploy/kubeport.yaml: hardening as promised, config loads."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

from kubeport import config
from kubeport.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read(DEPLOY / "kubeport.service")
    return parser


def test_only_the_three_capabilities():
    """CAP_BPF for the sockmap relay (--tcp-relay); the other two for addresses, rules, low ports."""
    service = unit()["Service"]
    wanted = {"CAP_NET_ADMIN", "CAP_NET_BIND_SERVICE", "CAP_BPF"}
    assert set(service["CapabilityBoundingSet"].split()) == wanted
    assert set(service["AmbientCapabilities"].split()) == wanted


def test_hardening_with_a_writable_state_directory():
    service = unit()["Service"]
    assert service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict"
    assert service["StateDirectory"] == "kubeport"
    assert "/var/lib/kubeport" in service["ReadWritePaths"]


def test_reload_is_sighup_and_stop_is_sigterm():
    service = unit()["Service"]
    assert "kill -HUP $MAINPID" in service["ExecReload"]
    assert service["KillSignal"] == "SIGTERM"
    assert "--config /etc/kubeport/config.yaml" in service["ExecStart"]


def test_example_configuration_loads():
    loaded = config.build(DEPLOY / "kubeport.yaml", {})
    assert loaded.source_kind == "manifests"
    assert str(loaded.state_dir) == "/var/lib/kubeport"


def test_notify_with_a_watchdog_and_always_restarted():
    service = unit()["Service"]
    # all: with --hold-sockets the daemon is the supervisor's child, and it is the one that notifies
    assert (service["Type"], service["NotifyAccess"], service["Restart"]) == ("notify", "all", "always")
    assert "--hold-sockets" in service["ExecStart"]
    assert int(service["WatchdogSec"]) >= 10  # pings every WatchdogSec/2 from the event loop
    assert "AF_UNIX" in service["RestrictAddressFamilies"]  # $NOTIFY_SOCKET


def test_the_held_sockets_outlive_the_main_process_in_systemds_store():
    """A killed supervisor (the unit's main process): KillMode=mixed ends the rest at once
    instead of a drain, and FileDescriptorStoreMax keeps the sockets it stored for the
    restart; $FDSTORE (systemd 254 sets it itself) tells kubeport the store is there."""
    service = unit()["Service"]
    assert service["KillMode"] == "mixed"
    store = int(service["FileDescriptorStoreMax"])
    assert store >= 10000 * 3  # a few ports per service at 10,000 services
    assert f"FDSTORE={store}" in service["Environment"].split()
    seconds = float(service["RestartSec"].removesuffix("ms")) / (1000 if service["RestartSec"].endswith("ms") else 1)
    assert seconds < 1  # queries wait in the stored sockets meanwhile


def test_the_node_settings_are_set_before_each_start_outside_the_sandbox():
    """ExecStartPre= runs `kubeport run --init-only` with full privileges ("+": no User=,
    CapabilityBoundingSet= or ProtectKernelTunables= for it) and tolerates a failure ("-"): the
    daemon, whose /proc/sys stays read-only, reports each setting that does not hold."""
    service = unit()["Service"]
    prefix, _, command = service["ExecStartPre"].partition("/")
    assert set(prefix) == {"-", "+"}
    argv = shlex.split("/" + command)
    assert argv[0] == shlex.split(service["ExecStart"])[0]
    args = build_parser().parse_args(argv[1:])
    assert args.command == "run" and args.init_only
    assert args.config == build_parser().parse_args(shlex.split(service["ExecStart"])[1:]).config
    assert service["ProtectKernelTunables"] == "yes"

"""kubeport.nodesettings: which sysctls, to what value, from the configuration and the values read
(pure); setting them under a directory standing in for /proc/sys; --init-only's exit code and
lines; the daemon's check at its start."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kubeport import config as config_module
from kubeport.cli import main
from kubeport.nodesettings import (
    LOCAL_PORT_RANGE,
    LOCAL_RESERVED_PORTS,
    TCP_MIGRATE_REQ,
    SysctlTree,
    check_at_start,
    format_port_list,
    init_only,
    parse_port_list,
    parse_port_range,
    wanted,
)

DEFAULT_NODE_PORTS = (30000, 32767)
#: the values of a stock kernel: nothing reserved, ephemeral ports above the NodePort range
STOCK = {TCP_MIGRATE_REQ: "0", LOCAL_PORT_RANGE: "32768\t60999", LOCAL_RESERVED_PORTS: ""}


def by_name(settings) -> dict:
    return {s.name: s for s in settings}


@pytest.mark.parametrize("current, holds", [
    pytest.param("0", False, id="off"),
    pytest.param("1", True, id="on"),
    pytest.param("1\n", True, id="as_read_with_newline"),
    pytest.param("2", False, id="other_value"),
    pytest.param(None, False, id="kernel_without_it__before_5_14"),
])
def test_tcp_migrate_req_is_always_wanted_at_1(current, holds):
    [setting] = [s for s in wanted(DEFAULT_NODE_PORTS, {**STOCK, TCP_MIGRATE_REQ: current})
                 if s.name == TCP_MIGRATE_REQ]
    assert (setting.value, setting.current, setting.holds) == ("1", current, holds)
    assert "handover" in setting.why


@pytest.mark.parametrize("node_ports, ephemeral, reserved, expected", [
    pytest.param((30000, 32767), "32768\t60999", "", None, id="stock_ranges_do_not_overlap__not_wanted"),
    pytest.param((30000, 32767), "10240\t65535", "", ("30000-32767", False), id="overlap__reserve_the_range"),
    pytest.param((30000, 32767), "32000\t60999", "", ("30000-32767", False), id="partial_overlap__whole_range"),
    pytest.param((30000, 32767), "10240\t65535", "30000-32767", ("30000-32767", True), id="reserved_already"),
    pytest.param((30000, 32767), "32000\t60999", "32000-32767", ("30000-32767", True),
                 id="the_overlap_reserved_is_enough"),
    pytest.param((30000, 32767), "10240\t65535", "22,10250", ("22,10250,30000-32767", False),
                 id="others_kept__merged_in_order"),
    pytest.param((30000, 32767), "10240\t65535", "29000-31000,31001-33000", ("29000-33000", True),
                 id="adjacent_reserved_ranges_cover_it"),
    pytest.param((30000, 32767), "10240\t65535", "30000-31000", ("30000-32767", False), id="partly_reserved"),
    pytest.param((20000, 22767), "32768\t60999", "", None, id="moved_below_the_ephemeral_range"),
    pytest.param((30000, 32767), None, "", None, id="range_unreadable__nothing_to_compare"),
])
def test_reserved_ports_are_wanted_only_where_the_node_port_range_overlaps_the_ephemeral_one(
        node_ports, ephemeral, reserved, expected):
    settings = by_name(wanted(node_ports, {**STOCK, LOCAL_PORT_RANGE: ephemeral, LOCAL_RESERVED_PORTS: reserved}))
    if expected is None:
        assert LOCAL_RESERVED_PORTS not in settings
        return
    setting = settings[LOCAL_RESERVED_PORTS]
    assert (setting.value, setting.holds) == expected
    assert f"{node_ports[0]}-{node_ports[1]}" in setting.why and "ephemeral" in setting.why


@pytest.mark.parametrize("text, ranges, formatted", [
    pytest.param("", [], "", id="empty"),
    pytest.param("8080", [(8080, 8080)], "8080", id="one_port"),
    pytest.param("8080,9148-9150", [(8080, 8080), (9148, 9150)], "8080,9148-9150", id="kernel_example"),
    pytest.param("9148-9150,8080", [(9148, 9150), (8080, 8080)], "8080,9148-9150", id="sorted"),
    pytest.param("1-5,3-9,10", [(1, 5), (3, 9), (10, 10)], "1-10", id="overlapping_and_touching_merge"),
])
def test_reserved_port_lists_parse_and_format_as_the_kernel_prints_them(text, ranges, formatted):
    assert parse_port_list(text) == ranges
    assert format_port_list(ranges) == formatted


@pytest.mark.parametrize("text, parsed", [
    ("32768\t60999", (32768, 60999)), ("1024 65535", (1024, 65535)), ("", None), (None, None), ("9 1", None),
    ("x y", None),
])
def test_local_port_range_parses(text, parsed):
    assert parse_port_range(text) == parsed


# --- writing: a directory standing in for /proc/sys ---------------------------------------------


def fake_proc_sys(root: Path, values: dict[str, str | None]) -> SysctlTree:
    tree = SysctlTree(root)
    for name, value in values.items():
        if value is not None:
            tree.path(name).parent.mkdir(parents=True, exist_ok=True)
            tree.path(name).write_text(value + "\n")
    return tree


class ReadOnlyTree(SysctlTree):
    """/proc/sys as an unprivileged container sees it: mounted read-only."""

    def write(self, name: str, value: str) -> None:
        raise OSError(30, "Read-only file system", str(self.path(name)))


def configuration(node_ports: str = "30000-32767"):
    return config_module.build(None, {"serviceNodePortRange": node_ports})


@pytest.mark.parametrize("node_ports, before, after, code", [
    pytest.param("30000-32767", STOCK, {TCP_MIGRATE_REQ: "1", LOCAL_RESERVED_PORTS: ""}, 0, id="stock_node"),
    pytest.param("30000-32767", {**STOCK, LOCAL_PORT_RANGE: "10240\t65535", LOCAL_RESERVED_PORTS: "22"},
                 {TCP_MIGRATE_REQ: "1", LOCAL_RESERVED_PORTS: "22,30000-32767"}, 0, id="overlapping_ranges"),
    pytest.param("30000-32767", {**STOCK, TCP_MIGRATE_REQ: "1"}, {TCP_MIGRATE_REQ: "1"}, 0, id="holds_already"),
    pytest.param("30000-32767", {**STOCK, TCP_MIGRATE_REQ: None}, {LOCAL_RESERVED_PORTS: ""}, 0,
                 id="kernel_without_tcp_migrate_req__reported_not_failed"),
])
def test_init_only_sets_what_does_not_hold(tmp_path, caplog, node_ports, before, after, code):
    tree = fake_proc_sys(tmp_path, before)
    with caplog.at_level(logging.INFO, logger="kubeport.nodesettings"):
        assert init_only(configuration(node_ports), tree) == code
    assert {name: tree.read(name) for name in after} == after
    if before[TCP_MIGRATE_REQ] is None:
        assert not tree.path(TCP_MIGRATE_REQ).exists()  # never made up
        assert f"{TCP_MIGRATE_REQ}: this kernel has no such setting" in caplog.text


def test_init_only_writes_nothing_that_holds(tmp_path):
    """As kube-proxy's EnsureSysctl: a read-only /proc/sys whose values hold passes."""
    tree = ReadOnlyTree(fake_proc_sys(tmp_path, {**STOCK, TCP_MIGRATE_REQ: "1"}).root)
    assert init_only(configuration(), tree) == 0


def test_init_only_fails_naming_each_setting_it_cannot_write(tmp_path, caplog):
    tree = ReadOnlyTree(fake_proc_sys(tmp_path, {**STOCK, LOCAL_PORT_RANGE: "1024\t65535"}).root)
    assert init_only(configuration(), tree) == 1
    for name in (TCP_MIGRATE_REQ, LOCAL_RESERVED_PORTS):
        assert f"cannot set {name} to " in caplog.text
    assert "Read-only file system" in caplog.text


def test_init_only_from_the_command_line_takes_runs_flags_and_exits(tmp_path, monkeypatch):
    """The same configuration file and flags as `kubeport run`; no source, no daemon."""
    tree = fake_proc_sys(tmp_path / "proc-sys", {**STOCK, LOCAL_PORT_RANGE: "20000\t60999"})
    monkeypatch.setattr("kubeport.nodesettings.PROC_SYS", tree.root)
    config = tmp_path / "config.yaml"
    config.write_text("apiVersion: kubeport.io/v1alpha1\nkind: KubeportConfiguration\ninCluster: true\n")
    assert main(["run", "--init-only", "--in-cluster", "--config", str(config), "--hostname-override", "node-a",
                 "--service-node-port-range", "25000-26000", "--hold-sockets"]) == 0
    assert tree.read(TCP_MIGRATE_REQ) == "1"
    assert tree.read(LOCAL_RESERVED_PORTS) == "25000-26000"


# --- the daemon at its start ---------------------------------------------------------------------


def test_check_at_start_sets_what_it_can_and_reports_nothing(tmp_path, caplog):
    tree = fake_proc_sys(tmp_path, STOCK)
    with caplog.at_level(logging.INFO, logger="kubeport.nodesettings"):
        assert check_at_start(configuration(), tree) == []
    assert tree.read(TCP_MIGRATE_REQ) == "1"
    assert f"set {TCP_MIGRATE_REQ} = 1 (was 0)" in caplog.text


def test_check_at_start_reports_one_problem_line_per_setting_it_cannot_set(tmp_path):
    tree = ReadOnlyTree(fake_proc_sys(tmp_path, {**STOCK, LOCAL_PORT_RANGE: "1024\t65535"}).root)
    problems = check_at_start(configuration(), tree)
    assert len(problems) == 2 and all("\n" not in line for line in problems)
    migrate, reserved = problems
    assert migrate.startswith(f"node setting {TCP_MIGRATE_REQ} is 0, not 1: ")
    assert reserved.startswith(f"node setting {LOCAL_RESERVED_PORTS} is empty, not 30000-32767: ")
    for line in problems:
        assert "kubeport run --init-only" in line and "/etc/sysctl.d/" in line
        assert "Read-only file system" in line
    assert f"`{TCP_MIGRATE_REQ} = 1`" in migrate


def test_check_at_start_is_quiet_when_everything_holds(tmp_path, caplog):
    tree = ReadOnlyTree(fake_proc_sys(tmp_path, {**STOCK, TCP_MIGRATE_REQ: "1"}).root)
    with caplog.at_level(logging.DEBUG, logger="kubeport.nodesettings"):
        assert check_at_start(configuration(), tree) == []
    assert caplog.text == ""


def test_check_at_start_logs_a_kernel_without_the_setting_but_lists_no_problem(tmp_path, caplog):
    tree = ReadOnlyTree(fake_proc_sys(tmp_path, {**STOCK, TCP_MIGRATE_REQ: None}).root)
    assert check_at_start(configuration(), tree) == []
    assert f"{TCP_MIGRATE_REQ}: this kernel has no such setting" in caplog.text

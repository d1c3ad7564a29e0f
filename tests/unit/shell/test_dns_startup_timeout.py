"""dns.startupTimeout (CoreDNS ``kubernetes`` ``startup_timeout``, plugin/kubernetes/setup.go):
when DNS listens, the wait for the first sync, and the flag and field that set it."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from kubeport import cli
from kubeport.config import KubeportConfiguration
from kubeport.daemon import dns_start_wait
from kubeport.dns.settings import DnsSettings
from kubeport.follow import Follower
from kubeport.lib.heldsockets import NOT_HELD

from support.slim import snapshot


@pytest.mark.parametrize(
    ("restored", "timeout", "wait"),
    [
        pytest.param(False, 0.0, 0.0, id="default_0__listens_at_once__cluster_names_servfail_until_synced"),
        pytest.param(False, 5.0, 5.0, id="no_restored_state__waits_up_to_the_timeout__as_coredns"),
        pytest.param(True, 5.0, 0.0, id="restored_state__answered_from_at_once__no_wait"),
        pytest.param(True, 0.0, 0.0, id="restored_state_and_0__at_once"),
    ],
)
def test_when_dns_listens(restored, timeout, wait):
    assert dns_start_wait(restored, timeout) == wait


class FakeHeap:
    def __init__(self) -> None:
        self.changed = asyncio.Event()

    def first_view_served(self) -> None:
        pass


class FakeView:
    def __init__(self) -> None:
        self.applied: dict[str, int] = {}
        self.restored_at: float | None = None

    def all_applied(self) -> bool:
        return "dns" in self.applied


class FakeDns:
    name = "dns"
    problems: list[str] = []

    def __init__(self) -> None:
        self.applied: list[int] = []

    def snapshot_queued(self, snapshot) -> None:
        pass

    async def apply_snapshot(self, snapshot) -> None:
        self.applied.append(snapshot.generation)


@pytest.mark.parametrize(
    ("applied", "synced_in_time"),
    [
        pytest.param([], False, id="nothing_applied__the_timeout_passes"),
        pytest.param(["restored"], False, id="only_a_restored_view__not_the_sync"),
        pytest.param(["synced"], True, id="the_first_synced_view_applied__at_once"),
        pytest.param(["restored", "synced"], True, id="restored_then_synced"),
    ],
)
async def test_wait_synced_ends_with_the_first_synced_view_or_the_timeout(applied, synced_in_time):
    follower = Follower(None, FakeView(), NOT_HELD, FakeHeap(), lambda: None)  # type: ignore[arg-type]
    dns = FakeDns()
    for kind in applied:
        view = snapshot([], synced=kind == "synced")
        if kind == "restored":
            view = replace(view, restored_at=1.0)
        assert await follower.apply(dns, view)
    timeout = 5.0 if synced_in_time else 0.05
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await follower.wait_synced("dns", timeout) is synced_in_time
    assert loop.time() - started < 1.0 or not synced_in_time


async def test_wait_synced_returns_when_the_sync_arrives_during_the_wait():
    follower = Follower(None, FakeView(), NOT_HELD, FakeHeap(), lambda: None)  # type: ignore[arg-type]
    waiting = asyncio.create_task(follower.wait_synced("dns", 5.0))
    await asyncio.sleep(0)
    assert not waiting.done()
    await follower.apply(FakeDns(), snapshot([]))
    assert await asyncio.wait_for(waiting, 1.0) is True


@pytest.mark.parametrize(
    ("argv", "field", "seconds"),
    [
        pytest.param([], None, 0.0, id="unset__0"),
        pytest.param(["--dns-startup-timeout", "5s"], "5s", 5.0, id="coredns_default_5s"),
        pytest.param(["--dns-startup-timeout", "1m30s"], "1m30s", 90.0, id="duration"),
    ],
)
def test_the_flag_sets_dns_startup_timeout(argv, field, seconds):
    args = cli.build_parser().parse_args(["run", *argv])
    values = cli.flag_values(args)
    assert values.get("dns", {}).get("startupTimeout") == field
    assert KubeportConfiguration.model_validate(values).dns.startup_timeout == seconds


def test_the_file_field_is_startup_timeout():
    assert DnsSettings.model_validate({"startupTimeout": "5s"}).startup_timeout == 5.0
    with pytest.raises(ValueError):
        DnsSettings.model_validate({"startupTimeout": "-1s"})


def test_a_bad_value_names_the_flag(capsys, tmp_path: Path):
    code = cli.main(["run", "--dns-startup-timeout", "soon", "--write-config-to", str(tmp_path / "out.yaml")])
    assert code == 2
    assert capsys.readouterr().err.startswith(
        "kubeport: invalid configuration: --dns-startup-timeout: 'soon' is not a duration")

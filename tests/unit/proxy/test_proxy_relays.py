"""Proxier and ProxyWorkers are both Relays: each has every member of the protocol, of the same kind."""

import inspect

import pytest

from kubeport.proxy.proxier import Proxier
from kubeport.proxy.relays import Relays
from kubeport.proxy.workers.parent import ProxyWorkers

MEMBERS = sorted(name for name in vars(Relays) if not name.startswith("_"))


def test_the_protocol_names_what_the_service_drives():
    assert {"start", "stop", "apply", "wait_failed", "wait_ready", "ready", "stats", "problems"} <= set(MEMBERS)


@pytest.mark.parametrize("cls", [Proxier, ProxyWorkers])
@pytest.mark.parametrize("name", MEMBERS)
def test_relays_are_implemented_by(cls, name):
    expected = inspect.getattr_static(Relays, name)
    got = inspect.getattr_static(cls, name)
    assert isinstance(got, property) == isinstance(expected, property)
    if not isinstance(expected, property):
        assert inspect.iscoroutinefunction(got) == inspect.iscoroutinefunction(expected)
        assert list(inspect.signature(got).parameters) == list(inspect.signature(expected).parameters)

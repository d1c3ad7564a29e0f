"""Tests of the sockmap relay path: they need the kernel feature and CAP_BPF/CAP_NET_ADMIN.

Without them a test is skipped, but under ``CI=true`` (where the kernel supports it and the
suite runs as root) it fails: a green CI must mean the sockmap path ran.
"""

from __future__ import annotations

import pytest
from conftest import IN_CI

from kubeport.proxy.relay.sockmap import Sockmap, SockmapUnavailable


def require_sockmap() -> None:
    try:
        Sockmap(16).close()
    except SockmapUnavailable as exc:
        if IN_CI:
            pytest.fail(f"the sockmap cannot be loaded under CI=true: {exc}")
        pytest.skip(f"no sockmap here: {exc}")


#: both TCP relay paths, for tests that hold on either.
RELAY_PATHS = pytest.mark.parametrize("tcp_relay", ["splice", "sockmap"])


def relay_path(tcp_relay: str) -> str:
    """``tcp_relay`` for ProxyConfig, after checking that the path can run here."""
    if tcp_relay == "sockmap":
        require_sockmap()
    return tcp_relay

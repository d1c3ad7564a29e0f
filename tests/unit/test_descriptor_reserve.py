"""The proxy's descriptors stop short of RLIMIT_NOFILE: the rest of the daemon keeps a reserve."""

from __future__ import annotations

import os
import resource
import socket

import pytest

from kubeport.proxy.relay.reserve import DescriptorReserve, reserve_for


@pytest.mark.parametrize(
    "limit, reserve",
    [
        pytest.param(256, 32, id="small_limit_the_minimum"),
        pytest.param(1024, 64, id="a_sixteenth"),
        pytest.param(65536, 1024, id="capped"),
        pytest.param(1 << 20, 1024, id="capped_large"),
    ],
)
def test_reserve_for(limit, reserve):
    assert reserve_for(limit) == reserve


class FakeLimits:
    RLIMIT_NOFILE = resource.RLIMIT_NOFILE

    def __init__(self, soft: int, hard: int) -> None:
        self.limit = (soft, hard)
        self.calls: list[tuple[int, int]] = []

    def getrlimit(self, kind):
        return self.limit

    def setrlimit(self, kind, value):
        self.calls.append(value)
        self.limit = value


def test_the_callback_runs_under_the_ceiling_and_the_limit_comes_back_even_on_error():
    limits = FakeLimits(1024, 4096)
    reserve = DescriptorReserve(limits)
    seen = []

    def callback(value):
        seen.append(limits.limit)
        raise ValueError(value)

    with pytest.raises(ValueError):
        reserve.within(callback)(1)
    assert seen == [(960, 4096)] and limits.limit == (1024, 4096)


def test_too_low_a_limit_is_left_alone():
    limits = FakeLimits(40, 40)
    reserve = DescriptorReserve(limits)
    def callback():
        return None

    assert reserve.ceiling is None and reserve.within(callback) is callback


def test_under_the_ceiling_sockets_fail_with_emfile_and_after_it_they_open():
    """The real limit: at the ceiling the proxy's socket fails, the daemon's next one opens."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    held: list[int] = []
    try:
        reserve = DescriptorReserve()
        assert reserve.ceiling == 256 - 32
        while True:  # fill every descriptor below the ceiling
            try:
                held.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                break
            if held[-1] >= reserve.ceiling:
                break
        while held and held[-1] >= reserve.ceiling:
            os.close(held.pop())
        proxy_socket = reserve.within(lambda: socket.socket())
        with pytest.raises(OSError) as raised:
            proxy_socket()
        assert raised.value.errno == 24  # EMFILE
        with socket.socket() as status_socket:  # the daemon's own, from the reserve
            assert status_socket.fileno() >= reserve.ceiling
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

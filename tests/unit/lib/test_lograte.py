"""Repeated log records counted instead of written (kubeport/lib/lograte.py)."""

from __future__ import annotations

import logging

import pytest

from kubeport.lib.lograte import RepeatFilter

from support.wait import until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logged():
    logger = logging.getLogger("test.lograte")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    clock = Clock()
    repeats = RepeatFilter(logger, interval=10.0, clock=clock)
    logger.addFilter(repeats)
    yield logger, clock, records
    logger.removeFilter(repeats)
    logger.removeHandler(handler)


def fail(logger: logging.Logger, fd: int) -> None:
    logger.error("relay handler for fd %d failed", fd)


def fail_elsewhere(logger: logging.Logger, fd: int) -> None:
    logger.error("relay handler for fd %d failed", fd)


# (steps: "a<fd>" logs at call site a, "b<fd>" at call site b, "+<s>" moves the clock), the lines written
@pytest.mark.parametrize(("steps", "written"), [
    pytest.param(["a1"], ["relay handler for fd 1 failed"], id="first__written"),
    pytest.param(["a1", "a2", "a3"], ["relay handler for fd 1 failed"], id="repeats_in_the_interval__counted"),
    pytest.param(["a1", "a2", "a3", "+10", "a4"],
                 ["relay handler for fd 1 failed", "2 more like this in 10s, the last: relay handler for fd 3 failed",
                  "relay handler for fd 4 failed"], id="after_the_interval__the_count_then_the_next"),
    pytest.param(["a1", "+10", "a2"], ["relay handler for fd 1 failed", "relay handler for fd 2 failed"],
                 id="nothing_suppressed__no_count_line"),
    pytest.param(["a1", "b2", "a3", "b4"], ["relay handler for fd 1 failed", "relay handler for fd 2 failed"],
                 id="another_call_site__its_own_count"),
])
def test_repeats_are_counted(logged, steps, written):
    logger, clock, records = logged
    for step in steps:
        if step.startswith("+"):
            clock.now += float(step[1:])
        else:
            (fail if step[0] == "a" else fail_elsewhere)(logger, int(step[1:]))
    assert [r.getMessage() for r in records] == written


def test_exception_types_are_counted_apart(logged):
    logger, _, records = logged
    for exc in (KeyError("x"), AttributeError("y"), KeyError("z")):
        try:
            raise exc
        except Exception:
            logger.exception("relay handler failed")
    assert [r.exc_info[0] for r in records] == [KeyError, AttributeError]


async def test_the_count_is_written_when_the_interval_ends_on_the_loop():
    logger = logging.getLogger("test.lograte.loop")
    logger.propagate = False
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    logger.addFilter(RepeatFilter(logger, interval=0.05, clock=Clock()))  # still: all 1,000 in one interval
    for fd in range(1000):
        fail(logger, fd)
    await until(lambda: len(records) == 2, "the count line")
    assert [r.getMessage() for r in records] == [
        "relay handler for fd 0 failed", "999 more like this in 0.05s, the last: relay handler for fd 999 failed"]

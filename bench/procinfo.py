"""CPU seconds and RSS of a process under test and its descendants, read from /proc."""

from __future__ import annotations

import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tasks:
        try:
            kids.extend(int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split())
        except OSError:
            pass
    return kids


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live descendant (workers, nsd's server children)."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(_children(current))
    return tree


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of the tree (fields 14 and 15 of /proc/<pid>/stat)."""
    if pid is None:
        return None
    total = 0
    for member in process_tree(pid):
        try:
            stat = Path(f"/proc/{member}/stat").read_text()
        except OSError:
            continue
        # The command name may contain spaces: the fields start after the last ')'.
        fields = stat[stat.rindex(")") + 2:].split()
        total += int(fields[11]) + int(fields[12])
    return total / _TICKS


def rss_bytes(pid: int | None) -> int | None:
    """Resident set size of the tree (sum of members' RSS, field 2 of statm)."""
    if pid is None:
        return None
    total = 0
    for member in process_tree(pid):
        try:
            total += int(Path(f"/proc/{member}/statm").read_text().split()[1]) * _PAGE
        except OSError:
            continue
    return total


class CpuMeter:
    """CPU seconds a process tree used between start() and stop(); None for kernel paths."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self._start: float | None = None

    def start(self) -> "CpuMeter":
        self._start = cpu_seconds(self.pid)
        return self

    def stop(self) -> float | None:
        end = cpu_seconds(self.pid)
        if end is None or self._start is None:
            return None
        return round(end - self._start, 3)


def machine_ticks() -> tuple[int, int, int]:
    """(busy, total, stolen) jiffies of all CPUs from /proc/stat. Busy is everything but idle,
    iowait and steal; stolen (steal) is time the hypervisor ran other guests on these cores."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle, stolen = fields[3] + fields[4], fields[7]
    total = sum(fields)
    return total - idle - stolen, total, stolen


class MachineMeter:
    """How busy every core of the machine was between start() and stop(), in percent.

    The load generator, the backends and the thing under test share the machine's cores:
    near 100 % the figure is bounded by the machine, and only CPU per unit of work can move it."""

    def __init__(self) -> None:
        self._start = (0, 0, 0)
        #: percent of all cores' time the hypervisor gave to other guests during the run
        self.stolen: float | None = None

    def start(self) -> "MachineMeter":
        self._start = machine_ticks()
        return self

    def stop(self) -> float | None:
        busy, total, stolen = machine_ticks()
        elapsed = total - self._start[1]
        if elapsed <= 0:
            return None
        self.stolen = round(100.0 * (stolen - self._start[2]) / elapsed, 1)
        return round(100.0 * (busy - self._start[0]) / elapsed, 1)

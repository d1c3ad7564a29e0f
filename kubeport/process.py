"""Once per process, before the daemon starts: the process metrics and the open-file limit."""

from __future__ import annotations

import logging
import os
import resource
import time

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

log = logging.getLogger(__name__)


def process_registry() -> CollectorRegistry:
    """A registry with the process, platform and GC collectors (process_cpu_seconds_total,
    process_resident_memory_bytes, process_open_fds ..., as kube-proxy and CoreDNS export)."""
    registry = CollectorRegistry()
    for collector in (ProcessCollector, PlatformCollector, GCCollector):
        collector(registry=registry)
    return registry


def raise_open_file_limit(limits=resource) -> int:
    """Soft RLIMIT_NOFILE up to the hard limit; the new soft limit.

    Each relayed TCP connection holds two descriptors, and container runtimes now start
    processes at 1024 soft (containerd 2.x sets no LimitNOFILE): ~500 connections. Go raises
    its soft limit by itself, so kube-proxy and CoreDNS never hit this; Python does not.
    """
    soft, hard = limits.getrlimit(limits.RLIMIT_NOFILE)
    wanted = hard if hard != limits.RLIM_INFINITY else 1 << 20
    if soft != limits.RLIM_INFINITY and soft < wanted:
        try:
            limits.setrlimit(limits.RLIMIT_NOFILE, (wanted, hard))
            log.info("open-file limit: %d (raised from %d to the hard limit)", wanted, soft)
            return wanted
        except (OSError, ValueError) as error:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, wanted, error)
    # Said at every start: it bounds how many Service ports get a listener (proxy/relay/reserve.py).
    log.info("open-file limit: %d", soft)
    return soft


def seconds_since_exec(stat_path: str = "/proc/self/stat") -> float | None:
    """How long ago this process started (its exec's fork), by the kernel's clock: field 22
    of /proc/<pid>/stat, in clock ticks since boot (proc(5)). None where it cannot be read."""
    try:
        with open(stat_path) as handle:
            fields = handle.read().rpartition(")")[2].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, counted from after the name
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)

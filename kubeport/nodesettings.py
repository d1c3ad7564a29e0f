"""The node's kernel settings (sysctls) kubeport relies on: which, to what value, and setting them.

Two, each per network namespace (the node's, for a DaemonSet pod on the host network):

``net.ipv4.tcp_migrate_req = 1``
    A handover (a rollout, a second instance started beside the first) closes the old
    instance's listeners while the new instance's, bound with SO_REUSEPORT, stay open. With
    this setting the kernel moves the connections queued on a closing listener to a sibling;
    without it they are reset (Linux Documentation/networking/ip-sysctl.rst). It applies to
    IPv6 listeners too. Linux 5.14 and later have it; on an older kernel it is reported
    and nothing is set.

``net.ipv4.ip_local_reserved_ports`` covering ``serviceNodePortRange``, only where that range
overlaps ``net.ipv4.ip_local_port_range``
    kubeport listens on every NodePort itself. The kernel gives outgoing connections and
    unbound UDP sockets (the relay's own, to endpoints) a port from the ephemeral range, and
    a NodePort number held that way cannot be bound by its listener (EADDRINUSE) until the
    socket closes. The default ranges (30000-32767, 32768-60999) do not overlap. The range is
    added to what is reserved already, as Cilium's --enable-auto-protect-node-port-range does
    (daemon/cmd/daemon_main.go); Kubernetes asks that the two not overlap (kube-apiserver's
    --service-node-port-range).

Not relied on, so neither set nor checked: ``net.ipv4.ip_nonlocal_bind`` (every listener binds
with IP_FREEBIND), ``net.ipv4.conf.all.route_localnet`` (kube-proxy's iptables mode DNATs
NodePorts on 127.0.0.1; kubeport listens there), ``net.ipv4.ip_forward`` (kubeport forwards
nothing: it terminates connections and opens its own to endpoints), the ``nf_conntrack_*``
limits and timeouts kube-proxy sets (no rule of kubeport's uses conntrack; its UDP flows keep
conntrack's timeouts in user space), and ``fs.pipe-max-size`` (1 MiB by default, the relay's
pipe size; a refusal only shrinks pipes).

Which settings and their values follow from the configuration and the values read now
(:func:`wanted`, pure); :class:`SysctlTree` reads and writes them under /proc/sys.
``kubeport run --init-only`` sets them and exits (:func:`init_only`): kube-proxy's
``--init-only`` (cmd/kube-proxy/app/server.go newProxyServer and server_linux.go createProxier:
the sysctls are set, the proxier is not built), run from a privileged init container so that
the long-running container needs no privilege for them: a container runtime mounts /proc/sys
read-only in an unprivileged container, and a Pod's ``sysctls`` are refused with hostNetwork.
As kube-proxy's EnsureSysctl (pkg/proxy/util/utils.go), a setting that already holds is not
written, so the daemon's own check at its start (:func:`check_at_start`) passes read-only; there
a setting that does not hold is set when the daemon can write it, and is a problem line when it
cannot.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kubeport.config import KubeportConfiguration

log = logging.getLogger(__name__)

PROC_SYS = Path("/proc/sys")

TCP_MIGRATE_REQ = "net.ipv4.tcp_migrate_req"
LOCAL_PORT_RANGE = "net.ipv4.ip_local_port_range"
LOCAL_RESERVED_PORTS = "net.ipv4.ip_local_reserved_ports"
#: what :func:`wanted` needs to have read
READ = (TCP_MIGRATE_REQ, LOCAL_PORT_RANGE, LOCAL_RESERVED_PORTS)

FIX = ("`kubeport run --init-only` in a privileged init container (deploy/daemonset.yaml), "
       "or `{name} = {value}` in a file in /etc/sysctl.d/")

PortRange = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Setting:
    """A sysctl kubeport relies on under this configuration, its value now and the one wanted."""

    name: str
    #: what to write when it does not hold
    value: str
    #: as read; None: this kernel has no such setting
    current: str | None
    holds: bool
    #: what goes wrong while it does not hold
    why: str


def wanted(node_port_range: PortRange, current: Mapping[str, str | None]) -> list[Setting]:
    """The settings kubeport relies on, given the NodePort range and the values of :data:`READ`."""
    migrate = current.get(TCP_MIGRATE_REQ)
    settings = [Setting(
        TCP_MIGRATE_REQ, "1", migrate, migrate is not None and migrate.strip() == "1",
        "without it, a handover (a rollout, an instance started beside the running one) resets the "
        "connections the kernel queued on the old instance's listeners instead of moving them to the new one's")]
    ephemeral = parse_port_range(current.get(LOCAL_PORT_RANGE))
    overlap = _intersection(node_port_range, ephemeral) if ephemeral is not None else None
    if overlap is not None:
        text = current.get(LOCAL_RESERVED_PORTS)
        reserved = parse_port_list(text) if text is not None else []
        low, high = node_port_range
        settings.append(Setting(
            LOCAL_RESERVED_PORTS, format_port_list([*reserved, node_port_range]), text,
            text is not None and _covered(overlap, reserved),
            f"the NodePort range {low}-{high} overlaps the ephemeral port range {ephemeral[0]}-{ephemeral[1]} "
            f"({LOCAL_PORT_RANGE}): the kernel hands ports {overlap[0]}-{overlap[1]} to outgoing connections "
            "and UDP sockets, and a NodePort listener cannot bind its port while one holds it"))
    return settings


def parse_port_range(text: str | None) -> PortRange | None:
    """``ip_local_port_range``: two numbers, tab-separated as the kernel prints them."""
    parts = (text or "").split()
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        return None
    low, high = int(parts[0]), int(parts[1])
    return (low, high) if low <= high else None


def parse_port_list(text: str) -> list[PortRange]:
    """``ip_local_reserved_ports``: comma-separated ports and LOW-HIGH ranges; empty: none."""
    ranges = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        ranges.append((int(low), int(high or low)))
    return ranges


def format_port_list(ranges: Iterable[PortRange]) -> str:
    """Ranges merged where they overlap or touch, in order, as the kernel prints them."""
    merged: list[list[int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in merged)


def _intersection(a: PortRange, b: PortRange) -> PortRange | None:
    low, high = max(a[0], b[0]), min(a[1], b[1])
    return (low, high) if low <= high else None


def _covered(span: PortRange, ranges: list[PortRange]) -> bool:
    merged = parse_port_list(format_port_list(ranges))
    return any(low <= span[0] and span[1] <= high for low, high in merged)


class SysctlTree:
    """/proc/sys, or a directory standing in for it (tests)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = PROC_SYS if root is None else root

    def path(self, name: str) -> Path:
        return self.root.joinpath(*name.split("."))

    def read(self, name: str) -> str | None:
        """The value as the kernel prints it, stripped; None when this kernel has no such setting."""
        try:
            return self.path(name).read_text().strip()
        except FileNotFoundError:
            return None

    def read_all(self, names: Iterable[str] = READ) -> dict[str, str | None]:
        return {name: self.read(name) for name in names}

    def write(self, name: str, value: str) -> None:
        # "r+", not "w": a setting the kernel lacks is an error here too, never a new file.
        with open(self.path(name), "r+") as sysctl:
            sysctl.write(value + "\n")


def settings_for(config: KubeportConfiguration, tree: SysctlTree) -> list[Setting]:
    return wanted(tuple(config.service_node_port_range), tree.read_all())


def init_only(config: KubeportConfiguration, tree: SysctlTree | None = None) -> int:
    """``kubeport run --init-only``: set what does not hold; 0, or 1 when a setting could not be set."""
    tree = tree or SysctlTree()
    try:
        settings = settings_for(config, tree)
    except OSError as exc:
        log.error("init-only: cannot read %s: %s", exc.filename or tree.root, exc.strerror or exc)
        return 1
    failed = 0
    for setting in settings:
        if setting.current is None:
            log.warning("init-only: %s: this kernel has no such setting (%s)", setting.name, setting.why)
        elif setting.holds:
            log.info("init-only: %s = %s already", setting.name, setting.current)
        else:
            try:
                tree.write(setting.name, setting.value)
            except OSError as exc:
                log.error("init-only: cannot set %s to %s (it is %s): %s", setting.name, setting.value,
                          setting.current or "empty", exc.strerror or exc)
                failed += 1
            else:
                log.info("init-only: set %s = %s (was %s)", setting.name, setting.value, setting.current or "empty")
    if failed:
        log.error("init-only: %d setting(s) not set: run it with full root privileges (a privileged container)",
                  failed)
        return 1
    log.info("init-only: the node's settings hold; exiting")
    return 0


def check_at_start(config: KubeportConfiguration, tree: SysctlTree | None = None) -> list[str]:
    """At the daemon's start: set what does not hold where this process can; a problem line for
    each setting that still does not hold (also logged)."""
    tree = tree or SysctlTree()
    try:
        settings = settings_for(config, tree)
    except OSError as exc:
        log.warning("cannot read the node's settings under %s: %s", tree.root, exc)
        return []
    problems = []
    for setting in settings:
        if setting.holds:
            continue
        if setting.current is None:
            # Nothing an operator can set: a log line, not a standing problem.
            log.warning("%s: this kernel has no such setting (%s)", setting.name, setting.why)
            continue
        try:
            tree.write(setting.name, setting.value)
        except OSError as exc:
            problem = (f"node setting {setting.name} is {setting.current or 'empty'}, not {setting.value}: "
                       f"{setting.why}. Set it with {FIX.format(name=setting.name, value=setting.value)} "
                       f"(this process cannot: {exc.strerror or exc})")
            log.warning("%s", problem)
            problems.append(problem)
        else:
            log.info("set %s = %s (was %s)", setting.name, setting.value, setting.current or "empty")
    return problems

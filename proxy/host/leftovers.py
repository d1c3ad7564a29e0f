"""What kubeport programs on a host, found and removed whole: its local routes (``table local
proto 0x6b``, on any link), the ``inet kubeport`` nftables table, the tables that take
replies to clients' addresses back (replies.py), the capture's policy rule and routing
table (capture.py), and the pinned links and maps of connect-time balancing (connectlb/pins.py:
unpinned, the programs detach). kube-proxy's ``--cleanup`` does the same for its own
(``cmd/kube-proxy/app/server.go cleanupAndExit``, each proxier's ``CleanupLeftovers``).

Blocking (netlink and two small commands): the CLI's ``--cleanup``, and once at a daemon's
start, where it runs off the event loop.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from kubeport.proxy.connectlb import pins
from kubeport.proxy.host import capture, netlink, replies
from kubeport.proxy.host.addresses import ADDRESS_PROTO
from kubeport.proxy.host.netlink import RouteOp
from kubeport.proxy.host.nftables import TABLE

_FAMILIES = ("-4", "-6")


@dataclass(frozen=True)
class Leftovers:
    routes: dict[int, tuple[str, ...]] = field(default_factory=dict)  # link index -> VIPs
    nft_table: bool = False
    rules: tuple[str, ...] = ()  # "ip -4 rule" lines of the capture's rule
    table_routes: tuple[str, ...] = ()  # "ip -4 route show table 27499" lines
    #: the client-reply tables present ("inet kubeport_replies", "bridge kubeport")
    reply_tables: tuple[str, ...] = ()
    #: directories of pinned connect-time balancing links and maps, one per node name
    pin_directories: tuple[Path, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.routes or self.nft_table or self.rules or self.table_routes or self.reply_tables
                    or self.pin_directories)

    def describe(self) -> list[str]:
        lines = []
        count = sum(len(vips) for vips in self.routes.values())
        if count:
            lines.append(f"{count} local route{'s' if count != 1 else ''} (ip route show table local "
                         f"proto {ADDRESS_PROTO:#x})")
        if self.nft_table:
            lines.append(f"nftables table {TABLE}")
        lines += [f"nftables table {table}" for table in self.reply_tables]
        lines += [f"{_family_name(rule)} policy rule {rule.split(' ', 1)[1]}" for rule in self.rules]
        if self.table_routes:
            lines.append(f"routing table {capture.ROUTE_TABLE} ({len(self.table_routes)} "
                         f"route{'s' if len(self.table_routes) != 1 else ''})")
        lines += [f"connect-time balancing pins in {directory}" for directory in self.pin_directories]
        return lines


def _family_name(text: str) -> str:
    return "IPv6" if text.startswith("-6") else "IPv4"


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def find_pins(bpf_root: Path | None) -> tuple[Path, ...]:
    """The pin directories under ``bpf_root`` when it is a mounted bpffs (nothing is mounted here)."""
    if bpf_root is None or Path(bpf_root) not in pins.mounts_of(Path("/proc/self/mountinfo").read_text(), "bpf"):
        return ()
    directory = Path(bpf_root) / pins.PIN_DIRECTORY
    return tuple(sorted(p for p in directory.iterdir() if p.is_dir())) if directory.is_dir() else ()


def find(nft: str = "nft", ip: str = "ip", bpf_root: Path | None = None) -> Leftovers:
    routes: dict[int, list[str]] = {}
    for address, index, proto in netlink.dump_local_routes():
        if proto == ADDRESS_PROTO:
            routes.setdefault(index, []).append(address)
    nft_table = False
    reply_tables: tuple[str, ...] = ()
    if shutil.which(nft) is not None:
        listed = _run([nft, "list", "tables"]).stdout.splitlines()
        nft_table = f"table {TABLE}" in listed
        reply_tables = tuple(t for t in (replies.INET_TABLE, replies.BRIDGE_TABLE) if f"table {t}" in listed)
    rules: list[str] = []
    table_routes: list[str] = []
    if shutil.which(ip) is not None:
        for family in _FAMILIES:
            listed = _run([ip, family, "rule", "list", "priority", str(capture.RULE_PRIORITY)]).stdout
            rules += [f"{family} {' '.join(line.split())}" for line in listed.splitlines()
                      if f"lookup {capture.ROUTE_TABLE}" in line]
            shown = _run([ip, family, "route", "show", "table", str(capture.ROUTE_TABLE)]).stdout
            table_routes += [f"{family} {line.strip()}" for line in shown.splitlines() if line.strip()]
    return Leftovers({index: tuple(sorted(vips)) for index, vips in routes.items()}, nft_table,
                     tuple(rules), tuple(table_routes), reply_tables=reply_tables,
                     pin_directories=find_pins(bpf_root))


def remove(found: Leftovers, nft: str = "nft", ip: str = "ip") -> list[str]:
    """Remove what ``found`` names; a line per thing removed, or per failure (``failed: ...``)."""
    lines = []
    for index, vips in found.routes.items():
        refused = netlink.apply((RouteOp(False, vip) for vip in vips), index, ADDRESS_PROTO)
        gone = [vip for vip in vips if refused.get(vip) in (None, 2, 3)]  # ENOENT, ESRCH: gone already
        lines.append(f"removed {len(gone)} local route{'s' if len(gone) != 1 else ''} "
                     f"(proto {ADDRESS_PROTO:#x}, link {index})")
        lines += [f"failed: removing the local route for {vip}: error {refused[vip]}"
                  for vip in vips if vip not in gone]
    if found.nft_table:
        done = _run([nft, "delete", "table", *TABLE.split()])
        lines.append(f"removed nftables table {TABLE}" if done.returncode == 0
                     else f"failed: nft delete table {TABLE}: {done.stderr.strip()}")
    for table in found.reply_tables:
        done = _run([nft, "delete", "table", *table.split()])
        lines.append(f"removed nftables table {table}" if done.returncode == 0
                     else f"failed: nft delete table {table}: {done.stderr.strip()}")
    if found.rules or found.table_routes:
        for argv in capture.teardown_commands():
            argv = [ip, *argv[1:]]
            family = argv[1]
            wanted = found.rules if "rule" in argv else found.table_routes
            if not any(line.startswith(family + " ") for line in wanted):
                continue
            done = _run(argv)
            what = (f"policy rule {' '.join(argv[4:])}" if "rule" in argv
                    else f"routing table {capture.ROUTE_TABLE}")
            lines.append(f"removed {_family_name(family)} {what}" if done.returncode == 0
                         else f"failed: {' '.join(argv)}: {done.stderr.strip()}")
    for directory in found.pin_directories:
        try:
            pins.remove_pins(directory)
            lines.append(f"removed connect-time balancing pins in {directory}")
        except OSError as exc:
            lines.append(f"failed: removing {directory}: {exc}")
    return lines

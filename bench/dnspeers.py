"""DNS peers from Debian's packages: knot, nsd, unbound and dnsmasq, configured in a work
directory and started in a namespace. Each serves the same records (a zone as text) on
one address, with a given number of workers, in the foreground, logging to a file."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from .topology import Topology


@dataclass(frozen=True)
class Zone:
    """An authoritative zone: origin ('cluster.local') and records as zone-file lines (absolute names)."""

    origin: str
    records: tuple[str, ...]
    ttl: int = 5

    def text(self) -> str:
        head = [
            f"$ORIGIN {self.origin}.",
            f"$TTL {self.ttl}",
            f"@ IN SOA ns.dns.{self.origin}. hostmaster.{self.origin}. 1 7200 1800 86400 {self.ttl}",
            f"@ IN NS ns.dns.{self.origin}.",
            "ns.dns IN A 127.0.0.1",
        ]
        return "\n".join(head + list(self.records)) + "\n"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def start_knot(topo: Topology, role: str, workdir: Path, address: str, zones: list[Zone],
               workers: int, port: int = 53, tag: str = "knot") -> subprocess.Popen:
    directory = workdir / tag
    (directory / "db").mkdir(parents=True, exist_ok=True)
    zone_conf = []
    for zone in zones:
        _write(directory / f"{zone.origin}.zone", zone.text())
        zone_conf.append(f"""  - domain: {zone.origin}.
    storage: "{directory}"
    file: "{zone.origin}.zone"
    zonefile-sync: -1
    zonefile-load: whole
    journal-content: none
    semantic-checks: off
""")
    conf = _write(directory / "knot.conf", f"""server:
    rundir: "{directory}"
    listen: {address}@{port}
    udp-workers: {workers}
    tcp-workers: 1
    background-workers: 1
database:
    storage: "{directory}/db"
log:
  - target: stderr
    any: warning
zone:
{''.join(zone_conf)}""")
    return topo.spawn(role, ["knotd", "-c", str(conf)], tag)


def start_nsd(topo: Topology, role: str, workdir: Path, address: str, zones: list[Zone],
              workers: int, port: int = 53) -> subprocess.Popen:
    directory = workdir / "nsd"
    directory.mkdir(parents=True, exist_ok=True)
    zone_conf = []
    for zone in zones:
        _write(directory / f"{zone.origin}.zone", zone.text())
        zone_conf.append(f"zone:\n    name: {zone.origin}\n    zonefile: \"{directory}/{zone.origin}.zone\"\n")
    conf = _write(directory / "nsd.conf", f"""server:
    ip-address: {address}@{port}
    server-count: {workers}
    username: ""
    chroot: ""
    zonesdir: "{directory}"
    database: ""
    zonelistfile: "{directory}/zone.list"
    xfrdfile: "{directory}/xfrd.state"
    xfrdir: "{directory}"
    pidfile: "{directory}/nsd.pid"
    logfile: "{directory}/nsd-internal.log"
    verbosity: 0
    hide-version: yes
    round-robin: no
    minimal-responses: yes
    rrl-ratelimit: 0
    rrl-whitelist-ratelimit: 0
remote-control:
    control-enable: no
{''.join(zone_conf)}""")
    return topo.spawn(role, ["nsd", "-d", "-c", str(conf)], "nsd")


def _unbound_common(directory: Path, address: str, port: int, workers: int) -> str:
    return f"""server:
    interface: {address}@{port}
    port: {port}
    num-threads: {workers}
    so-reuseport: yes
    access-control: 0.0.0.0/0 allow
    username: ""
    chroot: ""
    directory: "{directory}"
    pidfile: "{directory}/unbound.pid"
    use-syslog: no
    logfile: ""
    verbosity: 0
    do-ip6: no
    do-not-query-localhost: no
    module-config: "iterator"
    minimal-responses: yes
    harden-referral-path: no
    qname-minimisation: no
    msg-cache-size: 64m
    rrset-cache-size: 128m
    num-queries-per-thread: 4096
    outgoing-range: 8192
"""


def start_unbound_local(topo: Topology, role: str, workdir: Path, address: str, zone: Zone,
                        workers: int, port: int = 53) -> subprocess.Popen:
    """unbound answering the zone from local-data (a static local-zone: NXDOMAIN for the rest)."""
    directory = workdir / "unbound-local"
    directory.mkdir(parents=True, exist_ok=True)
    data = "\n".join(f'    local-data: "{line}"' for line in zone.records)
    conf = _write(directory / "unbound.conf", _unbound_common(directory, address, port, workers)
                  + f'    local-zone: "{zone.origin}." static\n{data}\n')
    return topo.spawn(role, ["unbound", "-d", "-c", str(conf)], "unbound-local")


def start_unbound_forwarder(topo: Topology, role: str, workdir: Path, address: str, upstream: str,
                            workers: int, port: int = 53) -> subprocess.Popen:
    """unbound as a caching forwarder of every name to ``upstream`` (IP[@PORT])."""
    directory = workdir / "unbound-forward"
    directory.mkdir(parents=True, exist_ok=True)
    conf = _write(directory / "unbound.conf", _unbound_common(directory, address, port, workers)
                  + f'forward-zone:\n    name: "."\n    forward-addr: {upstream}\n')
    return topo.spawn(role, ["unbound", "-d", "-c", str(conf)], "unbound-forward")


def start_dnsmasq(topo: Topology, role: str, workdir: Path, address: str, zone: Zone,
                  port: int = 53) -> subprocess.Popen:
    """dnsmasq with host-record / srv-host lines; ``local=/zone/`` makes other zone names NXDOMAIN."""
    directory = workdir / "dnsmasq"
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f"listen-address={address}", f"port={port}", "bind-interfaces", "no-resolv", "no-hosts",
             f"local=/{zone.origin}/", f"local-ttl={zone.ttl}", "cache-size=10000",
             "dns-forward-max=10000", f"pid-file={directory}/dnsmasq.pid", "user=root", "group=root"]
    for record in zone.records:
        name, _ttl, _cls, rtype, *rdata = record.split()
        if rtype == "A":
            lines.append(f"host-record={name.rstrip('.')},{rdata[0]}")
        elif rtype == "SRV":
            priority, weight, srv_port, target = rdata
            lines.append(f"srv-host={name.rstrip('.')},{target.rstrip('.')},{srv_port},{priority},{weight}")
    conf = _write(directory / "dnsmasq.conf", "\n".join(lines) + "\n")
    return topo.spawn(role, ["dnsmasq", "-k", f"--conf-file={conf}"], "dnsmasq")


"""Dig parsing, the fake upstream, the pods' resolver configuration and probes for
test_dns_netns.py; its manifests are support.netns.manifests' builders in namespace NS.

Every Service has explicit clusterIPs: one daemon runs per node, each with its own
allocator, so only explicit addresses are the same on both nodes.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import DNS_SERVICE_IP, EXT_IPS, Topology, WaitTimeout, dig_in, spawn_in, wait_for_output

NS = "shop"
ZONE = "cluster.local"
FAKE_UPSTREAM = Path(__file__).resolve().parent / "fake_upstream_dns.py"
#: the cluster zone's SOA as kubeport writes it (serial: unix time of the last change)
SOA = re.compile(r"cluster\.local\. 5 IN SOA ns\.dns\.cluster\.local\. hostmaster\.cluster\.local\. "
                 r"\d+ 7200 1800 86400 5")
BIG_ENDPOINTS = 300


def fqdn(name: str) -> str:
    return f"{name}.{NS}.svc.{ZONE}"


def big_addresses() -> list[str]:
    return [f"10.244.{3 + i // 250}.{i % 250 + 1}" for i in range(BIG_ENDPOINTS)]


# --- dig ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dig:
    status: str
    flags: frozenset[str]
    answer: tuple[str, ...]
    authority: tuple[str, ...]
    output: str


def dig(ns: str, *args: str, server: str = DNS_SERVICE_IP) -> Dig:
    """`dig` from a pod namespace at the node-local DNS, parsed (zone text, whitespace squeezed)."""
    output = dig_in(ns, "+noall", "+comments", "+answer", "+authority", *args, server=server, timeout=3)
    return parse_dig(output)


def parse_dig(output: str) -> Dig:
    status = re.findall(r"status: (\w+)", output)
    flags = re.findall(r";; flags: ([a-z ]*);", output)
    sections: dict[str, list[str]] = {"ANSWER": [], "AUTHORITY": []}
    current = None
    for line in output.splitlines():
        header = re.match(r";; (\w+) SECTION:", line)
        if header:
            current = header.group(1)
        elif line.startswith(";"):
            current = None if line.startswith(";; ->>HEADER") else current
        elif line.strip() and current in sections:
            sections[current].append(" ".join(line.split()))
    return Dig(status[-1] if status else "", frozenset(flags[-1].split()) if flags else frozenset(),
               tuple(sections["ANSWER"]), tuple(sections["AUTHORITY"]), output)


def same_records(actual: tuple[str, ...], expected: list[str]) -> bool:
    """Zone lines equal as sets; a TTL written "*" in `expected` matches any TTL (upstream
    answers come back from kubeport's cache with their TTL aged)."""
    if len(actual) != len(expected):
        return False
    pending = list(actual)
    for pattern in expected:
        wanted = pattern.split()
        found = next((line for line in pending if _fields_match(line.split(), wanted)), None)
        if found is None:
            return False
        pending.remove(found)
    return True


def _fields_match(fields: list[str], wanted: list[str]) -> bool:
    return len(fields) == len(wanted) and all(w in ("*", f) for f, w in zip(fields, wanted))


# --- the upstream and the pods' resolver configuration ----------------------------------------


def start_fake_upstream(topology: Topology, *options: str) -> subprocess.Popen:
    """fake_upstream_dns.py on <ext>:53 (UDP and TCP), ready on return, stopped with its owner;
    ``options``: more of its arguments (``--port``, ``--zone``, ``--answer``)."""
    log = tempfile.TemporaryFile()
    proc = spawn_in(topology.ext, sys.executable, "-I", FAKE_UPSTREAM, "--address", EXT_IPS[0], *options,
                    stdout=subprocess.PIPE, stderr=log)
    try:
        wait_for_output(proc, b"ready\n", 10, "fake upstream DNS")
    except Exception:
        log.seek(0)
        raise RuntimeError(f"fake upstream did not start:\n{log.read().decode(errors='replace')}") from None
    return proc


@contextlib.contextmanager
def netns_resolv_conf(ns: str, text: str) -> Iterator[Path]:
    """``text`` as /etc/netns/<ns>/resolv.conf, which `ip netns exec` bind-mounts over
    /etc/resolv.conf in that namespace. Removed afterwards."""
    directory = Path("/etc/netns") / ns
    parent_existed = directory.parent.exists()
    directory.mkdir(parents=True, exist_ok=False)
    path = directory / "resolv.conf"
    path.write_text(text)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
        directory.rmdir()
        if not parent_existed:
            with contextlib.suppress(OSError):
                directory.parent.rmdir()


def pod_resolv_conf(pod_ns: str, nameserver: str = DNS_SERVICE_IP) -> contextlib.AbstractContextManager[Path]:
    """A pod's /etc/resolv.conf as the kubelet writes it (ClusterFirst)."""
    return netns_resolv_conf(pod_ns, f"nameserver {nameserver}\nsearch {NS}.svc.{ZONE} svc.{ZONE} {ZONE}\n"
                                     "options ndots:5\n")


def host_resolv_conf(node_ns: str, nameserver: str) -> contextlib.AbstractContextManager[Path]:
    """A node's /etc/resolv.conf without search domains, for a daemon started in it meanwhile
    (its upstream and autopath's host search domains are read from it)."""
    return netns_resolv_conf(node_ns, f"nameserver {nameserver}\n")


class LineReader:
    """Lines from a spawned process's stdout pipe, each awaited with a deadline."""

    def __init__(self, proc: subprocess.Popen, what: str):
        self.proc, self.what, self.buffer = proc, what, b""

    def line(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(f"{self.what}: no line within {timeout:g}s; got {self.buffer!r}")
            if select.select([fd], [], [], remaining)[0]:
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise RuntimeError(f"{self.what} exited ({self.proc.wait()}); got {self.buffer!r}")
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode().strip()


# --- probes run inside a pod namespace (python -I -c) -----------------------------------------

#: argv: server, then hex packets. Sends each over UDP, prints one line per packet: the
#: reply in hex or "-" (nothing within the timeout). Then one TCP connection per "t:"-prefixed
#: packet: the framed reply in hex, "closed" when the server hung up, "-" on timeout.
MALFORMED_PROBE = r"""
import socket, sys
server, packets = sys.argv[1], sys.argv[2:]
for item in packets:
    tcp = item.startswith("t:")
    packet = bytes.fromhex(item[2:] if tcp else item)
    if not tcp:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(0.5)
            sock.sendto(packet, (server, 53))
            try:
                print(sock.recv(65535).hex())
            except TimeoutError:
                print("-")
        continue
    with socket.create_connection((server, 53), timeout=2) as sock:
        sock.sendall(len(packet).to_bytes(2, "big") + packet)
        try:
            size = sock.recv(2)
            if not size:
                print("closed")
                continue
            size = int.from_bytes(size, "big")
            data = b""
            while len(data) < size:
                data += sock.recv(size - len(data))
            print(data.hex())
        except TimeoutError:
            print("-")
        except ConnectionResetError:
            print("closed")
"""

#: argv: server, name, address. Asks `name` A over UDP (one query per millisecond) and prints
#: "ready" at the first answer, then the unix time of the first answer that holds `address`.
FRESHNESS_PROBE = r"""
import socket, sys, time
from dnslib import DNSRecord
server, name, address = sys.argv[1:4]
query = DNSRecord.question(name, "A")
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.settimeout(1.0)
sock.connect((server, 53))
ready = False
while True:
    sock.send(query.pack())
    try:
        reply = DNSRecord.parse(sock.recv(65535))
    except TimeoutError:
        continue
    seen = time.time()
    if address in [str(rr.rdata) for rr in reply.rr]:
        print(f"{seen:.6f}", flush=True)
        break
    if not ready:
        print("ready", flush=True)
        ready = True
    time.sleep(0.001)
"""

"""Harness for integration tests in the netns topology of netns-scripts/topology.sh.

The address plan, Topology, pods, clients, and (re-exported from proc, daemon and
support.wait) processes, the kubeport daemon and waiting. Every process a test
starts goes through `spawn_in` and is killed when its owner ends (the test, or the topology for
processes started by module fixtures); every wait goes through `until_sync`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Re-exported: tests import everything from this package.
from ..wait import WaitTimeout, until_sync  # noqa: F401
from .daemon import DAEMONS, DaemonExited, KubeportDaemon, Readyz, kubeport, probe_address  # noqa: F401
from .proc import (  # noqa: F401
    CommandFailed,
    current_scope,
    in_ns,
    process_scope,
    reap_all,
    reap_namespaces,
    run_in,
    spawn_in,
    stop_process,
    wait_for_output,
)

REPO = Path(__file__).resolve().parents[3]
TOPOLOGY_SH = REPO / "netns-scripts" / "topology.sh"
PODSERVER = REPO / "netns-scripts" / "podserver.py"

# The address plan of netns-scripts/README.md.
LAN_CIDRS = ("192.168.50.0/24", "fd00:50::/64")
CLIENT_IPS = ("192.168.50.100", "fd00:50::100")
EXT_IPS = ("192.168.50.200", "fd00:50::200")
SERVICE_CIDRS = ("10.96.0.0/12", "fd00:10:96::/112")
CLUSTER_CIDRS = ("10.244.0.0/16", "fd00:10:244::/56")
EXTERNAL_IP_CIDRS = ("192.168.60.0/24", "fd00:60::/64")
LOADBALANCER_CIDRS = ("192.168.70.0/24", "fd00:70::/64")
DNS_SERVICE_IP = "10.96.0.10"
HEALTHZ_PORT = 10256
METRICS_PORT = 10249
POD_HTTP_PORT = 8080
POD_UDP_PORT = 9090
POD_ECHO_PORT = 7000
POD_ARGS = ("--http", str(POD_HTTP_PORT), "--udp", str(POD_UDP_PORT), "--echo", str(POD_ECHO_PORT))
PATTERN_PERIOD = 251  # podserver's /bytes pattern: byte[i] = (i + seed) % 251


def _family_index(family: int) -> int:
    if family not in (4, 6):
        raise ValueError(f"family must be 4 or 6, not {family!r}")
    return family == 6


@dataclass(frozen=True)
class NodeSpec:
    letter: str  # "a"
    index: int  # 1 for node-a: the third octet of its pod subnet
    name: str  # "node-a", the Node object's name and --hostname-override
    zone: str  # topology.kubernetes.io/zone label
    lan_ips: tuple[str, str]  # (IPv4, IPv6) on the LAN, eth0
    pod_cidrs: tuple[str, str]
    gateways: tuple[str, str]  # br0 addresses: the pods' default routes


def _node_spec(letter: str, index: int) -> NodeSpec:
    return NodeSpec(
        letter=letter, index=index, name=f"node-{letter}", zone=f"zone-{letter}",
        lan_ips=(f"192.168.50.{10 + index}", f"fd00:50::{10 + index}"),
        pod_cidrs=(f"10.244.{index}.0/24", f"fd00:10:244:{index}::/64"),
        gateways=(f"10.244.{index}.1", f"fd00:10:244:{index}::1"),
    )


NODES = {"a": _node_spec("a", 1), "b": _node_spec("b", 2)}


@dataclass(frozen=True)
class Pod:
    name: str  # "a1": podserver's --name and the namespace's short name
    ns: str
    node: NodeSpec
    ips: tuple[str, str]  # (IPv4, IPv6)

    def ip(self, family: int = 4) -> str:
        return self.ips[_family_index(family)]


def namespaces_with_prefix(prefix: str) -> list[str]:
    """The namespaces topology.sh owns for `prefix`, including leftovers of a crashed run."""
    own = re.compile(rf"{re.escape(prefix)}-(lan|client|ext|node-[ab]|[ab][0-9]+)")
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return sorted(name for line in listing.splitlines() if own.fullmatch(name := line.split(" ", 1)[0]))


def topology_script(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return run_in(None, str(TOPOLOGY_SH), *args, timeout=timeout)


@dataclass(frozen=True)
class Topology:
    prefix: str
    pods_per_node: int = 2

    @classmethod
    def up(cls, prefix: str, pods_per_node: int = 2) -> Topology:
        topology_script("up", "--prefix", prefix, "--pods-per-node", str(pods_per_node))
        return cls(prefix, pods_per_node)

    def down(self) -> None:
        """Kill the harness's processes in these namespaces, then let topology.sh remove everything."""
        reap_namespaces(set(self.namespaces))
        topology_script("down", "--prefix", self.prefix)

    def node(self, which: str) -> str:
        return f"{self.prefix}-{self.node_spec(which).name}"

    def node_spec(self, which: str) -> NodeSpec:
        letter = which.removeprefix("node-")
        if letter not in NODES:
            raise ValueError(f"unknown node {which!r}: use 'a', 'b', 'node-a' or 'node-b'")
        return NODES[letter]

    def node_ip(self, which: str, family: int = 4) -> str:
        return self.node_spec(which).lan_ips[_family_index(family)]

    def pod(self, which: str, index: int) -> str:
        return self.pod_info(which, index).ns

    def pod_info(self, which: str, index: int) -> Pod:
        spec = self.node_spec(which)
        if not 1 <= index <= self.pods_per_node:
            raise ValueError(f"pod index {index} out of 1..{self.pods_per_node}")
        octet = 10 + index
        ips = (f"10.244.{spec.index}.{octet}", f"fd00:10:244:{spec.index}::{octet}")
        return Pod(name=f"{spec.letter}{index}", ns=f"{self.prefix}-{spec.letter}{index}", node=spec, ips=ips)

    def pod_ip(self, which: str, index: int, family: int = 4) -> str:
        return self.pod_info(which, index).ips[_family_index(family)]

    @property
    def pods(self) -> tuple[Pod, ...]:
        return tuple(self.pod_info(n, i) for n in NODES for i in range(1, self.pods_per_node + 1))

    @property
    def client(self) -> str:
        return f"{self.prefix}-client"

    @property
    def ext(self) -> str:
        return f"{self.prefix}-ext"

    @property
    def lan(self) -> str:
        return f"{self.prefix}-lan"

    @property
    def namespaces(self) -> tuple[str, ...]:
        return (self.lan, self.client, self.ext, *(self.node(n) for n in NODES), *(p.ns for p in self.pods))


_prefix_counter = itertools.count(1)


def unique_prefix() -> str:
    """A prefix no other run uses now: kp<pid%10000>m<n>, skipping any that has namespaces."""
    while True:
        prefix = f"kp{os.getpid() % 10000}m{next(_prefix_counter)}"
        if not namespaces_with_prefix(prefix):
            return prefix


@contextlib.contextmanager
def scratch_namespace(suffix: str) -> Iterator[str]:
    """A network namespace of the test's own, `lo` up and nothing else; deleted afterwards."""
    require_netns()
    ns = f"{unique_prefix()}-{suffix}"
    run_in(None, "ip", "netns", "add", ns)
    try:
        run_in(ns, "ip", "link", "set", "lo", "up")
        yield ns
    finally:
        run_in(None, "ip", "netns", "del", ns, check=False)


@functools.cache
def netns_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "not root"
    if not TOPOLOGY_SH.exists():
        return f"{TOPOLOGY_SH} missing"
    probe = f"kpprobe{os.getpid()}"
    try:
        subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as err:
        return f"'ip netns add' does not work: {getattr(err, 'stderr', '') or err}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False, timeout=10)
    return None


CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21
_FULL_UID_MAP = ["0", "0", "4294967295"]


@functools.cache
def host_privileges_missing() -> str | None:
    """Why this process is not root of the host (None when it is): root in the initial user
    namespace with CAP_NET_ADMIN and CAP_SYS_ADMIN. A user namespace (netns-scripts/userns.sh)
    gives those over the namespaces made in it, never over the host: BPF programs, host-wide
    sysctls, rlimits above the hard limit, cgroups and a real systemd stay out of reach."""
    if os.geteuid() != 0:
        return "not root"
    status = Path("/proc/self/status").read_text()
    effective = int(re.search(r"^CapEff:\s*([0-9a-f]+)", status, re.M).group(1), 16)
    missing = [name for name, bit in (("CAP_NET_ADMIN", CAP_NET_ADMIN), ("CAP_SYS_ADMIN", CAP_SYS_ADMIN))
               if not effective >> bit & 1]
    if missing:
        return f"root without {' and '.join(missing)}"
    if Path("/proc/self/uid_map").read_text().split() != _FULL_UID_MAP:
        return "root of a user namespace, not of the host"
    return None


def require_netns() -> None:
    """Skip the test when network namespaces can't be used (under CI=true the suite fails instead)."""
    if reason := netns_unavailable_reason():
        pytest.skip(f"network namespaces unavailable: {reason}")


# --- pods ---------------------------------------------------------------------------------------


def start_podserver(ns: str, name: str, *args: str, timeout: float = 10.0, wait: bool = True) -> subprocess.Popen:
    """Start podserver.py in `ns` (POD_ARGS unless args are given) and wait until it listens.
    Its stderr goes to an anonymous file, `proc.stderr_log`, shown if it fails to start."""
    stderr_log = tempfile.TemporaryFile()
    proc = spawn_in(ns, sys.executable, "-I", PODSERVER, "--name", name, *(args or POD_ARGS),
                    stdout=subprocess.PIPE, stderr=stderr_log)
    proc.stderr_log = stderr_log  # type: ignore[attr-defined]
    if wait:
        wait_podserver_ready(proc, name, timeout)
    return proc


def wait_podserver_ready(proc: subprocess.Popen, name: str, timeout: float = 10.0) -> None:
    try:
        wait_for_output(proc, b"ready\n", timeout, f"podserver {name}")
    except (WaitTimeout, RuntimeError) as err:
        proc.stderr_log.seek(0)
        raise type(err)(f"{err}\npodserver stderr:\n{proc.stderr_log.read().decode(errors='replace')}") from None


def start_pods(topology: Topology, *args: str, timeout: float = 10.0) -> dict[str, subprocess.Popen]:
    """Run podserver in every pod namespace, named like the pod (a1, b2, ...), all ready on return."""
    procs = {pod.name: start_podserver(pod.ns, pod.name, *args, wait=False) for pod in topology.pods}
    for name, proc in procs.items():
        wait_podserver_ready(proc, name, timeout)
    return procs


def parse_pod_reply(text: str) -> tuple[str, str]:
    """("b1", "10.244.1.11") from podserver's "pod=b1 client=10.244.1.11:40356"."""
    fields = dict(part.split("=", 1) for part in text.split())
    return fields["pod"], fields["client"].rsplit(":", 1)[0]


def pattern_bytes(length: int, seed: int = 0) -> bytes:
    """What podserver's GET /bytes/<length>?seed=<seed> sends."""
    period = bytes(range(PATTERN_PERIOD))
    start = seed % PATTERN_PERIOD
    return (period * (length // PATTERN_PERIOD + 2))[start:start + length]


def pattern_sha256(length: int, seed: int = 0) -> str:
    """sha256 hex digest of pattern_bytes(length, seed), in constant memory (for GiB transfers)."""
    block_len = PATTERN_PERIOD * 4096  # whole periods: every block starts the same way
    block = pattern_bytes(block_len, seed)
    digest = hashlib.sha256()
    full, rest = divmod(length, block_len)
    for _ in range(full):
        digest.update(block)
    digest.update(block[:rest])
    return digest.hexdigest()


# --- clients ------------------------------------------------------------------------------------


def http_url(host: str, port: int, path: str = "/") -> str:
    return f"http://[{host}]:{port}{path}" if ":" in host else f"http://{host}:{port}{path}"


def curl_in(ns: str, url: str, *curl_args: str, timeout: float = 5.0) -> str:
    """curl's stdout; CommandFailed carries curl's exit code (7 refused/unreachable, 28 timeout)."""
    cmd = ["curl", "-sS", "-g", "--noproxy", "*", "--max-time", f"{timeout:g}", *curl_args, url]
    return run_in(ns, *cmd, timeout=timeout + 5).stdout


def pod_answering(ns: str, host: str, port: int, path: str = "/", timeout: float = 3.0) -> str:
    """The pod name in podserver's answer to one HTTP request."""
    return parse_pod_reply(curl_in(ns, http_url(host, port, path), timeout=timeout))[0]


def pods_seen(ns: str, host: str, port: int, want: set[str], attempts: int = 80) -> set[str]:
    """Request until every pod in `want` has answered (or attempts run out); the pods seen."""
    seen: set[str] = set()
    for _ in range(attempts):
        seen.add(pod_answering(ns, host, port))
        if want <= seen:
            break
    return seen


def dig_in(ns: str, *args: str, server: str | None = None, port: int | None = None, timeout: int = 2) -> str:
    """dig's stdout, e.g. dig_in(ns, "+short", "web.default.svc.cluster.local", "A", server=DNS_SERVICE_IP)."""
    cmd = ["dig", f"+time={timeout}", "+tries=1"]
    cmd += [f"@{server}"] if server else []
    cmd += ["-p", str(port)] if port else []
    return run_in(ns, *cmd, *args, timeout=timeout + 5).stdout


def script_env() -> dict[str, str]:
    """The environment of a test file run as a script (its own subprocess runner): tests/ on
    PYTHONPATH, as pytest has it, so that the script imports support as the tests do."""
    paths = [str(REPO / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def python_in(ns: str, code: str, *args: Any, timeout: float = 10.0, check: bool = True) -> subprocess.CompletedProcess:
    """Run a Python snippet in `ns` (isolated mode: the repo's dns/ folder can't shadow anything)."""
    return run_in(ns, sys.executable, "-I", "-c", code, *args, timeout=timeout, check=check)


class NoReply(AssertionError):
    pass


_UDP_CLIENT = """
import socket, sys
host, port, payload, timeout, sport = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
sock.settimeout(timeout)
if sport:
    sock.bind(("", sport))
sock.connect((host, port))
sock.send(payload)
try:
    sys.stdout.write(sock.recv(65535).hex())
except TimeoutError:
    sys.exit(3)
except ConnectionRefusedError:
    sys.exit(4)
"""


def udp_request(ns: str, addr: str, port: int, payload: bytes | str, timeout: float = 2.0,
                source_port: int = 0) -> bytes:
    """Send one datagram from `ns`, return the reply. ICMP port unreachable raises
    ConnectionRefusedError (kube-proxy's REJECT); silence raises NoReply."""
    data = payload.encode() if isinstance(payload, str) else payload
    done = python_in(ns, _UDP_CLIENT, addr, port, data.hex(), timeout, source_port, timeout=timeout + 10, check=False)
    if done.returncode == 3:
        raise NoReply(f"no UDP reply from {addr}:{port} within {timeout:g}s (from {ns})")
    if done.returncode == 4:
        raise ConnectionRefusedError(f"UDP {addr}:{port} refused (ICMP port unreachable) (from {ns})")
    if done.returncode != 0:
        raise CommandFailed(ns, ["udp_request", addr, str(port)], done.returncode, done.stdout, done.stderr)
    return bytes.fromhex(done.stdout)


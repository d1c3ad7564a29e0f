"""What the operating and rollout tests share: a node with two services (web over TCP with an
externalIP, echo over UDP) on four pods, and readers of addresses and metrics."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import curl_in, run_in, spawn_in, until_sync
from .manifests import endpoint_slice, node, service, write

WEB_IP = "10.96.0.50"
ECHO_IP = "10.96.0.51"
WEB_EXTERNAL_IP = "192.168.60.50"  # taken by port (proxy/host/capture.py): the handover must keep it too
CLIENT_LOOP = Path(__file__).resolve().parent / "client_loop.py"
FIRST_ANSWER = Path(__file__).resolve().parent / "first_answer.py"


@pytest.fixture
def manifests(topology, tmp_path) -> Path:
    directory = tmp_path / "manifests"
    directory.mkdir()
    pods = [topology.pod_info(n, i) for n in "ab" for i in (1, 2)]
    http = [{"name": "http", "port": 8080}]
    udp = [{"name": "echo", "protocol": "UDP", "port": 9090}]
    write(directory, "node", node(topology, "a"))
    write(directory, "web", service("web", [WEB_IP], [{"name": "http", "port": 80, "targetPort": 8080}],
                                    externalIPs=[WEB_EXTERNAL_IP]),
          endpoint_slice("web-1", "web", http, pods))
    write(directory, "echo",
          service("echo", [ECHO_IP], [{"name": "echo", "protocol": "UDP", "port": 9090}]),
          endpoint_slice("echo-1", "echo", udp, pods))
    return directory


def vip_present(topology, ip: str) -> bool:
    """A VIP is a local route kubeport added (route protocol 0x6b)."""
    family = "-6" if ":" in ip else "-4"
    out = run_in(topology.node("a"), "ip", family, "-o", "route", "show", "table", "local", "proto", "0x6b").stdout
    return f"local {ip} " in out


def scrape(ns: str, address: str = "127.0.0.1:10249") -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = curl_in(ns, f"http://{address}/metrics")
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}"] = values.get(f"{sample.name}{{{labels}}}", 0) + sample.value
    return values


def total(values: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in values.items() if k.startswith(prefix))


def unreachable_kubeconfig(directory: Path) -> Path:
    """A kubeconfig whose API server is nowhere (a port with nothing behind it on the node's
    loopback): an instance using it starts, and never syncs."""
    path = directory / "unreachable-kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                    "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:9'}}]\n"
                    "users: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n")
    return path


@dataclass
class ClientLoop:
    """client_loop.py running in a pod namespace: its counts so far, and its last ones."""

    proc: subprocess.Popen
    status: Path

    @classmethod
    def start(cls, ns: str, status: Path, *args: str) -> ClientLoop:
        """``args``: client_loop.py's --tcp / --udp / --dns; the counts are kept in ``status``."""
        proc = spawn_in(ns, sys.executable, str(CLIENT_LOOP), *args, "--status", str(status),
                        stdout=subprocess.PIPE, text=True)
        return cls(proc, status)

    def progress(self) -> dict:
        try:
            return json.loads(self.status.read_text())
        except (OSError, ValueError):  # not written yet, or being replaced
            return {}

    def count(self, key: str) -> int:
        return self.progress().get(key, 0)

    def wait_for(self, what: str, timeout: float = 20, **at_least: int) -> None:
        """Until every named count (tcp_ok=30, ...) has reached its value."""
        until_sync(lambda: all(self.count(key) >= value for key, value in at_least.items()), what, timeout)

    def stop(self) -> dict:
        """SIGTERM; the final counts it prints."""
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=10)
        return json.loads(out.strip().splitlines()[-1])


@dataclass
class FirstAnswer:
    """first_answer.py in a pod namespace: when a DNS name and a TCP service first answered
    (CLOCK_MONOTONIC, the clock of time.monotonic() here too)."""

    proc: subprocess.Popen

    @classmethod
    def start(cls, ns: str, *args: str) -> FirstAnswer:
        """``args``: first_answer.py's --dns NAME@IP / --tcp IP:PORT; returns once it probes."""
        proc = spawn_in(ns, sys.executable, str(FIRST_ANSWER), *args, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "probing", "first_answer.py did not start"
        return cls(proc)

    def times(self, timeout: float = 30) -> dict[str, float | None]:
        out, _ = self.proc.communicate(timeout=timeout)
        return json.loads(out.strip().splitlines()[-1])

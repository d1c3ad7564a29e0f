"""Backends (nginx, iperf3) and the proxy peers (nftables DNAT, HAProxy), started in namespaces.

The nftables ruleset has the shape of kube-proxy's nftables mode: a verdict map keyed by
(daddr, l4proto, dport) jumps to a per-service chain that picks an endpoint with
``numgen random`` and DNATs to it.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from .topology import Topology


@dataclass(frozen=True)
class Forward:
    """One service port: VIP:port/protocol -> backend:target_port."""

    name: str
    protocol: str  # "TCP" or "UDP"
    port: int
    backend: str
    target_port: int


def start_nginx(topo: Topology, role: str, workdir: Path, http_port: int, idle_port: int,
                workers: int = 2) -> subprocess.Popen:
    """nginx: `ok` on http_port (keep-alive without limits), and a port that holds idle connections."""
    directory = workdir / f"nginx-{role}"
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / "nginx.conf"
    conf.write_text(f"""worker_processes {workers};
worker_rlimit_nofile 200000;
pid {directory}/nginx.pid;
error_log {directory}/error.log error;
events {{ worker_connections 60000; multi_accept on; }}
http {{
    access_log off;
    keepalive_requests 100000000;
    keepalive_timeout 600s;
    client_header_timeout 600s;
    client_body_temp_path {directory}/body;
    proxy_temp_path {directory}/proxy;
    default_type text/plain;
    server {{ listen {http_port} backlog=65535; location / {{ return 200 "ok\\n"; }} }}
    server {{ listen {idle_port} backlog=65535; location / {{ return 200 "idle\\n"; }} }}
}}
""")
    return topo.spawn(role, ["nginx", "-p", str(directory), "-c", str(conf), "-g", "daemon off;"], f"nginx-{role}")


def start_echo_nginx(topo: Topology, workdir: Path, name: str, listen: str | int, variable: str,
                     connections: int = 1024) -> subprocess.Popen:
    """nginx in ``be`` answering every request with one nginx variable: ``$remote_addr`` (the
    address the backend saw), ``$server_addr`` (which endpoint address was dialled)."""
    directory = workdir / name
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / "nginx.conf"
    conf.write_text(f"""worker_processes 1;
pid {directory}/nginx.pid;
error_log {directory}/error.log error;
events {{ worker_connections {connections}; }}
http {{
    access_log off;
    default_type text/plain;
    server {{ listen {listen}; location / {{ return 200 "{variable}\\n"; }} }}
}}
""")
    return topo.spawn("be", ["nginx", "-p", str(directory), "-c", str(conf), "-g", "daemon off;"], name)


def start_iperf3(topo: Topology, role: str, port: int) -> subprocess.Popen:
    return topo.spawn(role, ["iperf3", "-s", "-p", str(port)], f"iperf3-{role}")


def nft_dnat_ruleset(vip: str, forwards: list[Forward], table: str = "kpbench") -> str:
    elements, chains = [], []
    for fwd in forwards:
        proto = fwd.protocol.lower()
        elements.append(f"{vip} . {proto} . {fwd.port} : goto svc-{fwd.name}")
        # nft 1.0.6 wants a newline before a chain's closing brace.
        chains.append(f"    chain svc-{fwd.name} {{\n"
                      f"        numgen random mod 1 vmap {{ 0 : goto sep-{fwd.name} }}\n    }}")
        chains.append(f"    chain sep-{fwd.name} {{\n"
                      f"        meta l4proto {proto} dnat to {fwd.backend}:{fwd.target_port}\n    }}")
    return f"""table ip {table} {{
    map service-ips {{
        type ipv4_addr . inet_proto . inet_service : verdict
        elements = {{ {', '.join(elements)} }}
    }}
    chain services {{
        ip daddr . meta l4proto . th dport vmap @service-ips
    }}
    chain nat-prerouting {{
        type nat hook prerouting priority dstnat; policy accept;
        jump services
    }}
{chr(10).join(chains)}
}}
"""


def apply_nft(topo: Topology, role: str, ruleset: str) -> None:
    topo.run(role, ["nft", "-f", "-"], timeout=10, input=ruleset)


def flush_nft(topo: Topology, role: str) -> None:
    topo.run(role, ["nft", "flush", "ruleset"], timeout=10)


def haproxy_config(vip: str, forwards: list[Forward], threads: int, maxconn: int = 9000) -> str:
    """mode tcp, splice on, ``nbthread`` as given (= kubeport's workers).

    maxconn and maxpipes keep HAProxy's descriptor need (2 x maxconn + 2 x maxpipes + listeners)
    under the hard RLIMIT_NOFILE of machines without CAP_SYS_RESOURCE (20,000 here).
    """
    parts = [f"""global
    nbthread {threads}
    maxconn {maxconn}
    maxpipes 500
defaults
    mode tcp
    timeout connect 5s
    timeout client 10m
    timeout server 10m
    option splice-auto
    option splice-request
    option splice-response
"""]
    for fwd in forwards:
        if fwd.protocol != "TCP":
            continue  # HAProxy 2.6 proxies no UDP
        parts.append(f"""frontend f-{fwd.name}
    bind {vip}:{fwd.port} backlog 65535
    default_backend b-{fwd.name}
backend b-{fwd.name}
    server s1 {fwd.backend}:{fwd.target_port}
""")
    return "".join(parts)


def start_haproxy(topo: Topology, role: str, workdir: Path, config: str) -> subprocess.Popen:
    path = workdir / "haproxy.cfg"
    path.write_text(config)
    return topo.spawn(role, ["haproxy", "-db", "-f", str(path)], "haproxy")

"""When a service first answers: a DNS query and a TCP request every 5 ms until each has
succeeded once, printed as CLOCK_MONOTONIC seconds (the same clock in every namespace).

Run inside a pod namespace, started before the server it waits for. `dig` cannot measure
this: with nothing listening, the node answers with ICMP port unreachable, which the kernel
sends at most 6 at once and then one a second per peer (net.ipv4.icmp_ratelimit), so a dig
loop soon waits out its own +time for a query that was simply dropped. Here each query has
its own ID on one unconnected socket: a lost one costs nothing but the 5 ms to the next.
Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import sys
import threading
import time

from client_loop import dns_query, host_port, tcp_once

PACE = 0.005


def first_dns_answer(name: str, server: tuple[str, int], deadline: float) -> float | None:
    sock = socket.socket(socket.AF_INET6 if ":" in server[0] else socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    ident = 0
    while time.monotonic() < deadline:
        ident = (ident + 1) % 65536
        try:
            sock.sendto(dns_query(name, ident), server)
        except OSError:  # no route yet: the next round tries again
            pass
        ready, _, _ = select.select([sock], [], [], PACE)
        while ready:
            try:
                data = sock.recv(4096)
            except OSError:
                break
            # Any of our queries answered with records: the server serves the name.
            if len(data) >= 12 and data[3] & 0x0F == 0 and int.from_bytes(data[6:8], "big") > 0:
                return time.monotonic()
            ready, _, _ = select.select([sock], [], [], 0)
    return None


def first_tcp_reply(address: tuple[str, int], deadline: float) -> float | None:
    while time.monotonic() < deadline:
        try:
            tcp_once(address, timeout=0.1)
            return time.monotonic()
        except Exception:  # noqa: BLE001 - refused, reset or timed out: not yet
            time.sleep(PACE)  # pacing of the probe, not synchronisation
    return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dns", metavar="NAME@IP")
    parser.add_argument("--tcp", metavar="IP:PORT")
    parser.add_argument("--timeout", type=float, default=20.0)
    args = parser.parse_args()
    deadline = time.monotonic() + args.timeout
    found: dict[str, float | None] = {}
    probes = []
    if args.dns:
        name, _, ip = args.dns.partition("@")
        probes.append(threading.Thread(target=lambda: found.__setitem__("dns", first_dns_answer(name, (ip, 53),
                                                                                                 deadline))))
    if args.tcp:
        address = host_port(args.tcp)
        probes.append(threading.Thread(target=lambda: found.__setitem__("tcp", first_tcp_reply(address, deadline))))
    print("probing", flush=True)  # the caller starts the server after this line
    for probe in probes:
        probe.start()
    for probe in probes:
        probe.join()
    print(json.dumps(found), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

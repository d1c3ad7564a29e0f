"""Taking the service ports of an externalIP or LoadBalancer IP, and only those.

kube-proxy's iptables and nftables modes DNAT ``IP:port`` of each externalIP and LB
ingress IP; its IPVS mode binds the IPs to a dummy link, which takes the whole address
on every node: an externalIP that is a real host's address (another node's, to expose a
service there) then cuts that host off on every port. kubeport does what kube-proxy's
nftables mode does, without NAT: the firewall (firewall.py) marks a packet whose
(daddr . l4proto . dport) is a served frontend, on the prerouting and output hooks,
and a policy-routing rule sends marked packets to a table whose one route makes every
destination local. The packet is delivered to the frontend's listener, bound to the
address with IP_FREEBIND and IP_TRANSPARENT (its replies leave from an address the node
does not hold); other ports of the address are routed as before, to its owner.

The rule and the table are set up once per run, each only if missing (``ip rule``/``ip
route``: iproute2 is a requirement of the host like nft), left in place on a handover and
removed on release.
Without them (no ``ip``, or the kernel refuses), externalIPs and LB IPs fall back to
local addresses on the VIP link, with an error line.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket

log = logging.getLogger(__name__)

#: the fwmark bit of captured packets (kube-proxy uses 0x4000 and 0x8000; Calico 0xffff0000
#: by default; Cilium 0x0f00-0xff00): one bit, so other marks on the packet survive.
MARK = 0x00100000
#: the routing table holding ``local default dev lo`` ('k' 'k'), and the rule's priority:
#: before the main table (32766), after the local one (0).
ROUTE_TABLE = 0x6B6B
RULE_PRIORITY = 0x6B6B


class CaptureError(RuntimeError):
    pass


def _rule_spec() -> list[str]:
    return ["fwmark", f"{MARK:#x}/{MARK:#x}", "lookup", str(ROUTE_TABLE), "priority", str(RULE_PRIORITY)]


def teardown_commands() -> list[list[str]]:
    commands = [["ip", family, "rule", "del", *_rule_spec()] for family in ("-4", "-6")]
    return commands + [["ip", family, "route", "flush", "table", str(ROUTE_TABLE)] for family in ("-4", "-6")]


async def _run(argv: list[str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace").strip()


async def set_up() -> None:
    """The table's route and the rule, each only if missing: a successor taking over a running
    instance (handover) must not leave a moment without them. CaptureError names what failed."""
    if shutil.which("ip") is None:
        raise CaptureError("ip (iproute2) not found")
    await _run(["ip", "link", "set", "lo", "up"])  # a route through a link that is down is refused
    for family, default in (("-4", "0.0.0.0/0"), ("-6", "::/0")):
        code, _, err = await _run(["ip", family, "route", "replace", "local", default, "dev", "lo",
                                   "table", str(ROUTE_TABLE)])
        if code and family == "-6" and ("not supported" in err or "disabled" in err):
            continue  # no IPv6 here: no IPv6 frontends either
        if code:
            raise CaptureError(f"ip {family} route replace local {default} table {ROUTE_TABLE}: {err}")
        code, listed, err = await _run(["ip", family, "rule", "list", "priority", str(RULE_PRIORITY)])
        if not code and f"lookup {ROUTE_TABLE}" in listed:
            continue
        code, _, err = await _run(["ip", family, "rule", "add", *_rule_spec()])
        if code:
            raise CaptureError(f"ip {family} rule add {' '.join(_rule_spec())}: {err}")


async def tear_down() -> None:
    for argv in teardown_commands():
        code, _, err = await _run(argv)
        if code and "No such" not in err and "not supported" not in err:
            log.warning("removing the capture routing: %s: %s", " ".join(argv), err)


_IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)
_IPV6_FREEBIND = 78
_IP_TRANSPARENT = getattr(socket, "IP_TRANSPARENT", 19)
_IPV6_TRANSPARENT = 75
_warned = False


def bind_anywhere(sock: socket.socket, ipv6: bool, transparent: bool) -> None:
    """The options of a frontend listener, set before bind: its address may not be the node's.

    FREEBIND always: a VIP is added while its listeners open, not before. TRANSPARENT for a
    captured frontend (``transparent``): its SYN-ACKs and UDP replies leave from an address
    the node does not hold. That needs CAP_NET_ADMIN, as the firewall does; without it the
    listener still serves an address that is local (the fallback)."""
    global _warned
    if ipv6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    level, freebind, transparent_option = ((socket.IPPROTO_IPV6, _IPV6_FREEBIND, _IPV6_TRANSPARENT) if ipv6
                                           else (socket.IPPROTO_IP, _IP_FREEBIND, _IP_TRANSPARENT))
    sock.setsockopt(level, freebind, 1)
    if not transparent:
        return
    try:
        sock.setsockopt(level, transparent_option, 1)
    except PermissionError as exc:
        if not _warned:
            log.warning("listeners of externalIPs and LB IPs are not transparent (%s): captured ports "
                        "cannot answer", exc)
            _warned = True

"""Connect-time balancing for the node's own pods: the forwarding table, written into BPF maps.

Python keeps deciding which endpoints a Service port may use on this node (table.py: topology,
traffic policies, terminating fallback, trafficDistribution, the relay's own selection); the
programs (programs.py), run by the kernel inside the pods' ``connect()``/``sendmsg()``, only
pick among them. A pod's socket then connects straight to the endpoint: no relay, no per-packet
NAT, the pod's own address at the endpoint.

Which frontends (``connect_entry``, pure): ClusterIPs, externalIPs and LoadBalancer IPs over TCP
and UDP. Pods and the node are the clients here, so an ``externalTrafficPolicy: Local`` frontend
uses its short-circuit set, as kube-proxy sends pod and node traffic to any endpoint
(pkg/proxy/nftables/proxier.go, the external chain's "short-circuit" rules). Left to the relay:
NodePorts (reached from outside the node), LoadBalancer IPs with ``loadBalancerSourceRanges`` (the
relay's filter decides by the client's address, which a connect hook does not know yet), PROXY
protocol ports (the relay writes the header) and SCTP. A frontend whose Local policy has no local
endpoint (kube-proxy's DROP) is not written: the connect goes to the Service address, where the
node drops it as before. A frontend with no endpoint at all is written with none: its connects
fail at once with ECONNREFUSED, kube-proxy's REJECT without the round trip.

The shell (``ConnectBalancing``) writes the whole table into maps of its own at the first apply
and only then switches the pinned links (pins.py) to its programs, so a predecessor's programs
serve the pods until then; after that, each rule change writes only its own entries.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from kubeport.endpoints.types import ServicePortName
from kubeport.proxy.connectlb import pins
from kubeport.proxy.table import Action, Frontend, FrontendKind, FrontendRule, RuleChange

log = logging.getLogger(__name__)

#: Service protocols the programs translate -> the socket's protocol number (bpf_sock_addr.protocol)
PROTOCOLS = {"TCP": 6, "UDP": 17}
#: entries written between two turns of the event loop while a big table is written
_ENTRIES_PER_TURN = 500
DEFAULT_BPF_ROOT = Path("/sys/fs/bpf")


@dataclass(frozen=True, slots=True)
class Entry:
    """What a frontend's connects may use: endpoints (objects with ``ip`` and ``port``; none:
    refused) and the ClientIP affinity timeout in seconds (0: none)."""

    endpoints: tuple
    affinity_timeout: int = 0

    def backends(self) -> list[tuple[str, int]]:
        return [(endpoint.ip, endpoint.port) for endpoint in self.endpoints]


def connect_entry(frontend: Frontend, rule: FrontendRule | None) -> Entry | None:
    """The map entry of one frontend for clients on this node; None: not balanced at connect(). Pure."""
    if rule is None or frontend.protocol not in PROTOCOLS:
        return None
    if rule.kind is FrontendKind.NODE_PORT or rule.source_ranges is not None or rule.proxy_protocol:
        return None
    if rule.action is Action.REFUSE:
        return Entry((), rule.affinity_timeout)
    # Pods and the node are "local" clients: an eTP=Local frontend's short-circuit set is theirs.
    chosen = rule.local_client_endpoints if rule.local_client_endpoints is not None else rule.endpoints
    if not chosen:
        return None  # DROP: no local endpoint under a Local policy
    return Entry(tuple(chosen), rule.affinity_timeout)


def _bpffs_mounts() -> list[Path]:
    return pins.mounts_of(Path("/proc/self/mountinfo").read_text(), "bpf")


def remove_left_over(bpf_root: Path | str, node: str) -> bool:
    """Unpin what a previous instance of ``node`` pinned under ``bpf_root`` (when it is a mounted
    bpffs: nothing is mounted here). For an instance that does not balance at connect()
    (``--no-connect-balancing``, a failed start): a predecessor's links would otherwise go on
    sending the pods to the endpoints of the day it stopped, with no one updating them."""
    try:
        if Path(bpf_root) not in _bpffs_mounts():
            return False
        where = pins.Pins(Path(bpf_root), node)
        if where.remove():
            log.warning("connect-time balancing: removed what a previous instance pinned in %s (its programs "
                        "would go on with endpoints no one updates)", where.directory)
            return True
    except (OSError, ValueError) as exc:
        log.warning("connect-time balancing: left pinned: %s", exc)
    return False


def _key(frontend: Frontend) -> tuple[str, int, int]:
    return frontend.ip, frontend.port, PROTOCOLS[frontend.protocol]


class ConnectBalancing:
    """The programs attached to the pods' cgroup and the maps kept in step with the table.

    ``start`` never raises: where the kernel, the privileges or the filesystems refuse, ``problem``
    says why and the relay serves the pods as before."""

    def __init__(self, node: str, cgroup: str = "/", bpf_root: Path | str = DEFAULT_BPF_ROOT,
                 capacity: int = 65536) -> None:
        self.node = node
        self.cgroup = cgroup if cgroup.startswith("/") else f"/{cgroup}"
        self.bpf_root = Path(bpf_root)
        self.capacity = capacity
        #: why the relay serves the pods instead (None: started and attached, or not started yet)
        self.problem: str | None = None
        self.adopted = False
        self._maps = None
        self._pins: pins.Pins | None = None
        self._written: dict[Frontend, Entry] = {}
        self._ports: dict[Frontend, ServicePortName] = {}
        self._reconciled = False
        self._program_fds: dict[str, int] = {}  # loaded, not attached yet (until the first apply)
        self._attach_types: dict[str, int] = {}
        self._cgroup_dir: Path | None = None
        #: frontends a map refused in this apply (full): logged once per apply, not per frontend
        self._refused: list[tuple[Frontend, Exception]] = []

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        try:
            self._start()
        except (OSError, ValueError) as exc:
            self._close_maps()
            self.problem = str(exc) or type(exc).__name__
            log.warning("connect-time balancing unavailable, the relay serves the pods: %s", self.problem)
            self._unpin_left_over()
        else:
            self.problem = None
            log.info("connect-time balancing: cgroup %s, pinned in %s; the programs are attached once the first "
                     "snapshot is written%s", self.cgroup, self._pins.directory,
                     " (the previous instance's serve until then)" if self.adopted else "")

    def _start(self) -> None:
        """Maps made (a predecessor's taken over as ConnectMaps.succeed says) and the programs
        loaded; nothing attached yet: the first apply writes the whole table, then switches the
        links (``_switch``), so a predecessor's programs serve until this process can."""
        from kubeport.proxy.connectlb import programs
        from kubeport.proxy.connectlb.maps import ConnectMaps

        cgroup_root = pins.cgroup2_root()
        self._cgroup_dir = cgroup = pins.cgroup_path(cgroup_root, self.cgroup)
        if not cgroup.is_dir():
            raise OSError(f"cgroup {self.cgroup} does not exist (looked in {cgroup})")
        self._pins = where = pins.Pins(pins.bpffs_at(self.bpf_root), self.node)
        if where.names("map"):
            try:
                self._maps = ConnectMaps.succeed(where.open_maps(), self.capacity)
                self.adopted = True
            except (OSError, ValueError) as exc:
                log.warning("connect-time balancing: not taking over %s (%s): starting afresh", where.directory, exc)
        if self._maps is None:
            self._maps = ConnectMaps.create(self.capacity)
        self._program_fds = programs.load_programs(self._maps)
        self._attach_types = dict(programs.HOOKS)

    def _switch(self) -> None:
        """The links run this process's programs over its maps (a predecessor's links updated in
        place, or new ones made), and the maps are pinned; a refusal is the problem line."""
        try:
            self._attach(self._pins, self._program_fds, self._cgroup_dir, self._attach_types)
            for name, fd in self._maps.fds().items():
                self._pins.pin_map(name, fd)
        except OSError as exc:
            self.problem = f"attaching to cgroup {self.cgroup}: {exc}"
            log.warning("connect-time balancing unavailable, the relay serves the pods: %s", self.problem)
            self._close_maps()
            self._unpin_left_over()
        else:
            log.info("connect-time balancing: the node's pods in cgroup %s reach %d frontends at connect()%s",
                     self.cgroup, len(self._written),
                     " (taken over from the previous instance)" if self.adopted else "")
        finally:
            self._close_programs()

    def _close_programs(self) -> None:
        for fd in self._program_fds.values():
            os.close(fd)
        self._program_fds = {}

    def _attach(self, where: pins.Pins, program_fds: Mapping[str, int], cgroup: Path,
                attach_types: Mapping[str, int]) -> None:
        """Each hook's link runs this process's program: an adopted link on the same cgroup is
        updated in place; otherwise a new link is made and pinned over the old one's pin (which
        then detaches)."""
        links = where.open_links()
        try:
            wanted = pins.cgroup_id(cgroup)
            cgroup_fd = pins.open_cgroup(cgroup)
            try:
                for hook, prog_fd in program_fds.items():
                    link = links.get(hook)
                    if link is not None and pins.link_cgroup_id(link) == wanted:
                        pins.link_update(link, prog_fd)
                        continue
                    created = pins.link_create(prog_fd, cgroup_fd, attach_types[hook])
                    try:
                        where.pin_link(hook, created)
                    finally:
                        os.close(created)
            finally:
                os.close(cgroup_fd)
        finally:
            for fd in links.values():
                os.close(fd)

    def _unpin_left_over(self) -> None:
        """After a failed start: links a predecessor pinned (or this start, before it failed) keep
        their programs attached, translating the pods' connects with maps no one updates any
        more. Unpinned, the pods reach the Service addresses, the relay, as ``problem`` says."""
        if self._pins is None:
            remove_left_over(self.bpf_root, self.node)
            return
        try:
            if self._pins.remove():
                log.warning("connect-time balancing: removed what was pinned in %s (its programs would go on "
                            "with endpoints no one updates)", self._pins.directory)
        except OSError as exc:
            log.warning("connect-time balancing: left pinned: %s", exc)

    def stop(self, release: bool) -> None:
        """``release``: unpin the links and maps (the programs detach, pods' connects go to the
        Service addresses again); else leave them to the next instance, serving meanwhile."""
        if release and self._pins is not None and self.problem is None:
            try:
                self._pins.remove()
            except OSError as exc:
                log.warning("connect-time balancing: %s", exc)
        self._close_maps()

    def _close_maps(self) -> None:
        self._close_programs()
        if self._maps is not None:
            self._maps.close()
            self._maps = None

    # --- views --------------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return self.problem is None and self._maps is not None

    @property
    def pin_directory(self) -> Path | None:
        return self._pins.directory if self._pins is not None else None

    @property
    def frontends(self) -> frozenset[Frontend]:
        """The frontends whose connects are balanced in the kernel now."""
        return frozenset(self._written)

    def connects(self) -> dict[ServicePortName, int]:
        """Connects balanced in the kernel per service port (the program counts them)."""
        if not self.active:
            return {}
        by_key = {_key(frontend): port for frontend, port in self._ports.items()}
        totals: dict[ServicePortName, int] = {}
        for key, count in self._maps.connects().items():
            port = by_key.get(key)
            if port is not None:
                totals[port] = totals.get(port, 0) + count
        return totals

    # --- keeping the maps in step -------------------------------------------------------------

    async def apply(self, changes: Iterable[RuleChange], rules: Mapping[Frontend, FrontendRule]) -> None:
        """The maps in line with the table: the whole table the first time (what a predecessor
        left is reconciled: entries no longer wanted are removed), then only ``changes``."""
        if not self.active:
            return
        if not self._reconciled:
            await self._write_all(rules)
            self._reconciled = True
            if self._program_fds:
                self._switch()
        else:
            for count, change in enumerate(changes, 1):
                self._write(change.frontend, change.new)
                if not count % _ENTRIES_PER_TURN:
                    await asyncio.sleep(0)
        if self._refused:
            frontend, exc = self._refused[0]
            log.warning("connect-time balancing: %d frontends left to the relay, the maps refused them "
                        "(first: %s: %s)", len(self._refused), frontend, exc)
            self._refused.clear()

    async def _write_all(self, rules: Mapping[Frontend, FrontendRule]) -> None:
        """Every frontend's entry, into maps of this process's own (nothing of a predecessor's to
        remove: its maps are not written here, ConnectMaps.succeed)."""
        for count, (frontend, rule) in enumerate(list(rules.items()), 1):
            self._write(frontend, rule)
            if not count % _ENTRIES_PER_TURN:
                await asyncio.sleep(0)

    def _write(self, frontend: Frontend, rule: FrontendRule | None) -> bool:
        """One frontend's entry written (True) or removed; unchanged entries cost nothing."""
        entry = connect_entry(frontend, rule)
        old = self._written.get(frontend)
        if entry is None:
            if old is not None:
                del self._written[frontend]
                self._ports.pop(frontend, None)
                self._maps.remove_service(*_key(frontend))
            return False
        if entry != old:
            try:
                self._maps.set_service(*_key(frontend), entry.backends(), entry.affinity_timeout)
            except (OSError, ValueError) as exc:
                # a full map: this frontend stays with the relay, as if never balanced
                self._refused.append((frontend, exc))
                if old is not None:
                    del self._written[frontend]
                    self._ports.pop(frontend, None)
                    self._maps.remove_service(*_key(frontend))
                return False
            self._written[frontend] = entry
        self._ports[frontend] = rule.port_name  # a port renamed, its endpoints the same: counted as renamed
        return True

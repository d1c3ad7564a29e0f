"""ProxyConfig: every knob of the service proxy, validated once at construction."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from kubeport.proxy.nodeports import parse_nodeport_addresses


class ProxyConfigError(ValueError):
    """A proxy setting is invalid; the message names the field."""


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    #: --nodeport-addresses: "primary", "localhost", "all" and/or CIDRs (KEP-6032 keywords).
    nodeport_addresses: tuple[str, ...] = ("primary",)
    #: --cluster-cidr: pod CIDRs. Sources inside them are "local" for the eTP=Local short-circuit.
    cluster_cidrs: tuple[str, ...] = ()
    #: --service-cluster-ip-range: what is routed to an address in them that is no ClusterIP here
    #: (not a local address) is dropped, as kube-proxy's nftables mode does.
    service_cidrs: tuple[str, ...] = ()
    #: the link that carries the VIP addresses (/32, /128). The `dummy` type may not exist; lo always does.
    vip_interface: str = "lo"
    #: seconds a backend connect may take before the next endpoint is tried.
    connect_timeout: float = 5.0
    #: endpoints tried per TCP connection before the client is reset (kube-proxy userspace: retry on dial failure).
    connect_attempts: int = 3
    #: seconds a UDP flow lives without traffic either way: conntrack's 30 s (nf_conntrack_udp_timeout).
    udp_idle_timeout: float = 30.0
    #: the same for a flow answered and still in use 2 s after it began (nf_conntrack_udp_timeout_stream).
    udp_stream_timeout: float = 120.0
    #: UDP flows per frontend; new clients beyond it are dropped (counted).
    udp_max_flows: int = 65536
    #: UDP flows one client IP may hold per frontend (a single client cannot exhaust the table).
    udp_max_flows_per_client: int = 1024
    #: None: established connections outlive the deletion of their endpoint, like conntrack.
    #: A number: they are reset that many seconds after their endpoint is deleted.
    endpoint_grace_period: float | None = None
    #: consecutive connect failures that eject an endpoint (passive outlier detection).
    eject_after_failures: int = 2
    #: first ejection time in seconds; doubles per consecutive ejection up to ``eject_max_seconds``.
    eject_base_seconds: float = 5.0
    eject_max_seconds: float = 300.0
    #: pause before accepting again after EMFILE/ENFILE/ENOBUFS/ENOMEM.
    accept_pause: float = 0.2
    #: splice pipe size in bytes (F_SETPIPE_SZ); falls back to the system default when refused.
    pipe_size: int = 1 << 20
    #: idle pipes kept for reuse.
    pipe_pool_size: int = 256
    #: --tcp-relay: how bulk TCP bytes move. "sockmap": a BPF sockhash redirects them in the kernel
    #: (relay/sockmap.py; the start fails without it); "splice": through pipes in this process;
    #: "auto": sockmap when the kernel and the privileges (CAP_BPF, CAP_NET_ADMIN) allow it, else splice.
    #: splice by default: in the benchmark the sockmap was no faster on any figure (bench/RESULTS.md).
    tcp_relay: str = "splice"
    #: --keep-client-address: the upstream socket binds the client's address where kube-proxy keeps
    #: it (clientaddress.py says where); replies come back through host/replies.py.
    keep_client_address: bool = True
    #: and endpoints on the client's own bridge too (host/replies.py hands their replies to the
    #: host); a parent whose bridge table could not be written tells its relay workers False
    keep_client_address_on_bridge: bool = True
    #: --connect-balancing: the process that programs the host attaches the connect-time programs
    #: (connectlb/) to ``connect_balancing_cgroup`` and pins them under ``bpf_root``
    connect_balancing: bool = True
    connect_balancing_cgroup: str = "/"
    bpf_root: str = "/sys/fs/bpf"
    #: bytes a kernel-relayed direction may run ahead of its destination before its source pauses.
    sockmap_queue_limit: int = 1 << 20
    #: seconds between the sweeps that enforce ``sockmap_queue_limit`` and pass FINs on.
    sockmap_sweep_interval: float = 0.005
    #: listen(2) backlog.
    backlog: int = 4096
    #: relay processes sharing the listeners through SO_REUSEPORT: above 1, ``workers`` children fed
    #: the same snapshots, which outlive a crash of this one (workers/parent.py). 1: this process only.
    workers: int = 1
    #: seconds between worker statistics reports to the parent (the merged stats lag by this much).
    worker_stats_interval: float = 1.0
    #: seconds between sweeps of the ClientIP affinity tables (one timer for all of them).
    affinity_sweep_interval: float = 10.0
    #: affinity entries removed per sweep at most, so a sweep never stalls the loop.
    affinity_sweep_budget: int = 4096
    #: seed of the balancer's random generator (None: from the OS). Tests pass one.
    seed: int | None = None
    #: manage the nftables table ``inet kubeport`` (DROP for Local policies without local endpoints).
    firewall: bool = True
    #: (ip, port, protocol) never proxied: the DNS server's own listeners. Empty: port 53 TCP
    #: and UDP on every extra address given to ``Proxier.start``.
    reserved_frontends: frozenset[tuple[str, int, str]] = frozenset()
    _cidr_networks: tuple = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            parse_nodeport_addresses(self.nodeport_addresses)
        except ValueError as exc:
            raise ProxyConfigError(f"nodeport_addresses: {exc}") from None
        networks = []
        for cidr in self.cluster_cidrs:
            try:
                networks.append(ipaddress.ip_network(cidr, strict=False))
            except ValueError:
                raise ProxyConfigError(f"cluster_cidrs: invalid CIDR {cidr!r}") from None
        object.__setattr__(self, "_cidr_networks", tuple(networks))
        for cidr in self.service_cidrs:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ProxyConfigError(f"service_cidrs: invalid CIDR {cidr!r}") from None
        positive = {
            "connect_timeout": self.connect_timeout,
            "udp_idle_timeout": self.udp_idle_timeout,
            "udp_stream_timeout": self.udp_stream_timeout,
            "accept_pause": self.accept_pause,
            "eject_base_seconds": self.eject_base_seconds,
            "worker_stats_interval": self.worker_stats_interval,
            "affinity_sweep_interval": self.affinity_sweep_interval,
            "sockmap_sweep_interval": self.sockmap_sweep_interval,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ProxyConfigError(f"{name}: must be greater than 0, got {value!r}")
        at_least_one = {
            "connect_attempts": self.connect_attempts,
            "udp_max_flows": self.udp_max_flows,
            "udp_max_flows_per_client": self.udp_max_flows_per_client,
            "eject_after_failures": self.eject_after_failures,
            "backlog": self.backlog,
            "workers": self.workers,
            "pipe_size": self.pipe_size,
            "affinity_sweep_budget": self.affinity_sweep_budget,
            "sockmap_queue_limit": self.sockmap_queue_limit,
        }
        for name, value in at_least_one.items():
            if not isinstance(value, int) or value < 1:
                raise ProxyConfigError(f"{name}: must be an integer >= 1, got {value!r}")
        if self.pipe_pool_size < 0:
            raise ProxyConfigError(f"pipe_pool_size: must be >= 0, got {self.pipe_pool_size!r}")
        if self.endpoint_grace_period is not None and self.endpoint_grace_period < 0:
            raise ProxyConfigError(
                f"endpoint_grace_period: must be >= 0 or None, got {self.endpoint_grace_period!r}"
            )
        if self.eject_max_seconds < self.eject_base_seconds:
            raise ProxyConfigError("eject_max_seconds: must be >= eject_base_seconds")
        for entry in self.reserved_frontends:
            if (
                len(entry) != 3 or not isinstance(entry[1], int) or entry[2] not in ("TCP", "UDP", "SCTP")
            ):
                raise ProxyConfigError(f"reserved_frontends: {entry!r} is not (ip, port, TCP|UDP|SCTP)")
        if self.tcp_relay not in ("auto", "sockmap", "splice"):
            raise ProxyConfigError(f"tcp_relay: must be auto, sockmap or splice, got {self.tcp_relay!r}")
        if not self.vip_interface:
            raise ProxyConfigError("vip_interface: must not be empty")

    @property
    def cluster_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return self._cidr_networks

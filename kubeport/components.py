"""Building the daemon's parts from the configuration, and applying a reloaded one live."""

from __future__ import annotations

import importlib
import logging
import sys
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from kubeport.endpoints.interfaces import Source
from kubeport.endpoints.state import REQUIRED_KINDS, ClusterState

if TYPE_CHECKING:  # the parts are imported when built: `kubeport check` needs neither
    from kubeport.consumers import DnsConsumer
    from kubeport.dns.config import DnsConfig
    from kubeport.dns.server import DnsServer
    from kubeport.proxy.service import ProxyService

from kubeport.config import KubeportConfiguration
from kubeport.lib.heldsockets import NOT_HELD, HeldSockets
from kubeport.lib.logformat import configure_logging

log = logging.getLogger("kubeport.daemon")


class ComponentError(Exception):
    """A part cannot be built from this configuration; the message says why."""


def build_state(config: KubeportConfiguration) -> ClusterState:
    manifest_mode = config.source_kind == "manifests"
    transform = pod_slices = None
    if manifest_mode:
        from kubeport.endpoints.controllers.endpointslice import slices_for
        from kubeport.endpoints.hints import as_the_controller_writes

        transform, pod_slices = as_the_controller_writes, slices_for
    # With an API server, DNS also waits for Namespaces (CoreDNS answers for namespace names),
    # and for Pods under `pods verified` (CoreDNS's pod informer is among those it waits for);
    # autopath does without them until they are listed (the client walks its search path).
    required = REQUIRED_KINDS if manifest_mode else REQUIRED_KINDS | {"Namespace"}
    if not manifest_mode and config.dns.pods == "verified":
        required = required | {"Pod"}
    return ClusterState(config.hostname_override, implicit_namespaces=manifest_mode,
                        slice_transform=transform, pod_slices=pod_slices, required_kinds=required,
                        service_cidrs=[str(cidr) for cidr in config.service_cluster_ip_range])


#: what each kind of source imports as it is built and started
_MANIFEST_SOURCE_MODULES = ("kubeport.endpoints.manifests.source", "kubeport.endpoints.manifests.lastgood",
                            "kubeport.endpoints.registry.registry", "kubeport.endpoints.registry.store",
                            "kubeport.endpoints.convert")
_API_SOURCE_MODULES = ("kubeport.endpoints.apiserver.source", "kubeport.endpoints.convert")


def import_source_modules(config: KubeportConfiguration) -> None:
    """Import what the source will, off the event loop: run on a thread while the loop serves
    a restored state, the loop gets the interpreter every switch interval (5 ms) instead of
    waiting ~0.1 s for the imports (aiohttp, kubernetes_asyncio's client) to finish."""
    if config.source_kind == "manifests":
        for name in _MANIFEST_SOURCE_MODULES:
            importlib.import_module(name)
        return
    for name in _API_SOURCE_MODULES:
        importlib.import_module(name)
    from kubeport.endpoints.apiserver.client import auth_modules

    auth_modules()  # kubernetes_asyncio's credential modules, without its API models


def build_source(config: KubeportConfiguration, state: ClusterState, registry: CollectorRegistry,
                 dns: DnsConsumer | None = None) -> Source:
    """``dns``: given an API server, it follows the kube-dns ConfigMap (``dns.kubeDnsConfigMap``)."""
    if config.source_kind != "manifests":
        from kubeport.dns.kubedns import NAME, NAMESPACE
        from kubeport.endpoints.apiserver.source import ApiServerSource

        follow_kube_dns = dns is not None and config.dns.kube_dns_config_map
        source = ApiServerSource(
            state,
            kubeconfig=config.client_connection.kubeconfig,
            in_cluster=config.in_cluster,
            node_name=config.hostname_override,
            pods=pod_scope(config),
            config_maps=((NAMESPACE, NAME, dns.kube_dns_changed),) if follow_kube_dns else (),  # type: ignore[union-attr]
        )
        registry.register(source.collector())
        return source
    from kubeport.endpoints.manifests.lastgood import LastGoodFiles
    from kubeport.endpoints.manifests.read import ReadLimits
    from kubeport.endpoints.manifests.source import ManifestSource
    from kubeport.endpoints.registry.registry import Registry
    from kubeport.endpoints.registry.store import AllocationStore, StoreError

    directory = config.manifests
    if directory is None:
        raise ComponentError("no source: give --manifests DIR (or --kubeconfig FILE / --in-cluster)")
    if not directory.is_dir():
        raise ComponentError(f"--manifests {directory}: not a directory")
    try:
        store = AllocationStore.in_state_dir(config.state_dir)
    except (OSError, StoreError) as exc:
        raise ComponentError(f"--state-dir {config.state_dir}: {exc}") from exc
    registry_ = Registry(store, list(config.service_cluster_ip_range), config.service_node_port_range)
    limits = config.manifest_limits
    return ManifestSource(directory, registry_, state, last_good=LastGoodFiles.in_state_dir(config.state_dir),
                          limits=ReadLimits(limits.file_bytes, limits.total_bytes, limits.read_timeout))


def pod_scope(config: KubeportConfiguration) -> str:
    """The Pods DNS reads from an API server: every one for `pods verified` (CoreDNS's pod
    index), this node's for autopath alone, else none. Chosen at start: a reload that changes
    it is logged as needing a restart."""
    if config.dns.pods == "verified":
        return "all"
    return "node" if config.dns.autopath else "none"


def dns_config(config: KubeportConfiguration) -> DnsConfig:
    """The DNS server's configuration: the ``dns`` settings field by field
    (:meth:`DnsConfig.from_settings`), the listen addresses defaulted by the daemon."""
    from kubeport.dns.config import DnsConfig

    return DnsConfig.from_settings(dict(config.dns), addresses=config.dns_addresses)


def build_dns(config: KubeportConfiguration, *registries: CollectorRegistry,
              hold: HeldSockets = NOT_HELD) -> DnsServer:
    """The DNS server, its metrics in every registry given (the daemon's and the DNS address's)."""
    from kubeport.dns.metrics import DnsCollector
    from kubeport.dns.server import DnsServer

    server = DnsServer(dns_config(config), hold=hold)
    for registry in registries:
        registry.register(DnsCollector(server))
    return server


def build_proxy(config: KubeportConfiguration, registry: CollectorRegistry,
                hold: HeldSockets = NOT_HELD) -> ProxyService:
    from kubeport.proxy.config import ProxyConfig
    from kubeport.proxy.service import ProxyService

    reserved = {(ip, config.dns.port, proto) for ip in config.dns_addresses for proto in ("UDP", "TCP")}
    proxy_config = ProxyConfig(
        nodeport_addresses=tuple(config.node_port_addresses),
        cluster_cidrs=tuple(str(cidr) for cidr in config.cluster_cidr),
        service_cidrs=tuple(str(cidr) for cidr in config.service_cluster_ip_range),
        vip_interface=config.vip_interface,
        udp_idle_timeout=config.conntrack.udp_timeout,
        udp_stream_timeout=config.conntrack.udp_stream_timeout,
        reserved_frontends=frozenset(reserved),
        workers=config.workers,
        tcp_relay=config.tcp_relay,
        keep_client_address=config.keep_client_address,
        connect_balancing=config.connect_balancing,
        connect_balancing_cgroup=config.connect_balancing_cgroup,
        bpf_root=str(config.bpf_root),
    )
    # Manifest mode may have no Node object at all: then the node counts as eligible.
    from kubeport.proxy.host.address_events import AddressEvents

    return ProxyService(proxy_config, config.hostname_override, registry,
                        families=proxier_families(config), require_node=config.source_kind != "manifests",
                        address_events=AddressEvents(), hold=hold, worker_command=RELAY_WORKER_COMMAND)


#: a relay worker process: kubeport/relayworker.py gives it its channel to the socket holder
RELAY_WORKER_COMMAND = (sys.executable, "-P", "-m", "kubeport.relayworker")


#: What a SIGHUP can change without a restart.
LIVE_FIELDS = ("dns", "log_format", "verbosity")


async def apply_live(
    running: KubeportConfiguration, new: KubeportConfiguration, dns_server: DnsServer | None
) -> tuple[dict[str, Any], list[str]]:
    """Apply what can change live; returns (fields applied, names of fields that need a restart).
    Without a DNS server yet (not started), the new settings are only taken."""
    applied: dict[str, Any] = {}
    if new.dns != running.dns:
        if running.source_kind != "manifests" and pod_scope(new) != pod_scope(running):
            log.warning("configuration: the Pods read from the API server (%s, now %s) change only with a restart",
                        pod_scope(running), pod_scope(new))
        if running.source_kind != "manifests" and new.dns.kube_dns_config_map != running.dns.kube_dns_config_map:
            log.warning("configuration: dns.kubeDnsConfigMap changes only with a restart")
        if dns_server is not None:
            await dns_server.reconfigure(dns_config(new))
        applied["dns"] = new.dns
        log.info("configuration: dns settings applied (ttl %d, pods %s)", new.dns.ttl, new.dns.pods)
    if (new.log_format, new.verbosity) != (running.log_format, running.verbosity):
        configure_logging(new.log_format, new.verbosity)
        applied.update(log_format=new.log_format, verbosity=new.verbosity)
    kept = [
        name for name in type(new).model_fields
        if name not in LIVE_FIELDS and getattr(new, name) != getattr(running, name)
    ]
    return applied, kept


def proxier_families(config: KubeportConfiguration) -> tuple[str, ...]:
    """The IP families proxied, primary first: one /healthz entry each, like kube-proxy's per-family proxiers.

    Services get their clusterIPs from serviceClusterIPRange, so its CIDRs are the families
    served: an IPv6-only cluster must not report an IPv4 proxier, a dual-stack one reports both.
    """
    from kubeport.proxy.healthcheck.proxier_health import IPV4, IPV6

    return tuple(IPV6 if network.version == 6 else IPV4 for network in config.service_cluster_ip_range)

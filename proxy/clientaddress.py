"""Which address an endpoint sees: the client's, or this node's (pure).

kube-proxy keeps the client's address wherever it does not masquerade
(pkg/proxy/nftables/proxier.go syncProxyRules):

- traffic to a ClusterIP is masqueraded only when it comes from outside the cluster CIDR
  (the ``masqueradeAll``-less rule "ip saddr != <clusterCIDR> ... mark-for-masquerade");
- traffic to an external destination (NodePort, externalIP, LoadBalancer IP) goes through the
  service's external chain: with ``externalTrafficPolicy: Cluster`` every packet is marked for
  masquerade; with ``Local`` only the node's own traffic is ("masquerade local traffic", ``fib
  saddr type local``), and pods are short-circuited to the cluster endpoints.

A relay keeps the address by binding its upstream socket to it (IP_TRANSPARENT), which works
only where the endpoint's reply comes back through this node (host/replies.py takes it there):
a pod of this node (its replies are routed to it through the node), or an endpoint of this
node (its default route is the node). A pod of another node reaching a remote endpoint through
this node's externalIP would get its replies from the endpoint directly, so it gets the node's
address, as kube-proxy's masquerade would give it.

One difference from kube-proxy, on purpose: a pod reaching an externalIP or LoadBalancer IP
under ``Cluster`` keeps its address (kube-proxy masquerades it, having no way to know the reply
returns): NetworkPolicy then sees the pod, as it does through the ClusterIP.
"""

from __future__ import annotations

import enum
import ipaddress
from typing import Iterable

from kubeport.proxy.table import FrontendKind


class Keep(enum.IntEnum):
    """What a frontend allows, decided once per rule; each connection then asks ``keeps``."""

    #: the node's address for every client (a NodePort under Cluster, the feature off).
    NEVER = 0
    #: the client's address for pods (ClusterIP; externalIP and LB IP under Cluster).
    PODS = 1
    #: the client's address for every client (NodePort, externalIP, LB IP under Local).
    ANY = 2


def frontend_keep(kind: FrontendKind, external_local: bool, enabled: bool = True) -> Keep:
    if not enabled:
        return Keep.NEVER
    if kind is FrontendKind.CLUSTER_IP:
        return Keep.PODS
    if external_local:
        return Keep.ANY
    if kind is FrontendKind.NODE_PORT:
        return Keep.NEVER
    return Keep.PODS


def _network(text: str):
    return ipaddress.ip_network(text, strict=False)


class ClientAddresses:
    """Who is a pod, which pods and endpoints are this node's, and who is the node itself.

    ``cluster_cidrs``: --cluster-cidr. The node's pods are the addresses in the cluster CIDRs
    that lie in a subnet of one of the node's links (a bridge CNI's ``cni0``/``cbr0``, the
    node's pod CIDR: kube-proxy's NodeCIDR local detector) and are not the node's own. Answers
    are cached per address (bounded): a relay asks once per connection.
    """

    def __init__(self, cluster_cidrs: Iterable[str] = (), cache_size: int = 4096) -> None:
        self._cluster = tuple(_network(c) for c in cluster_cidrs)
        self._node_networks: tuple = ()
        self._node_addresses: frozenset[str] = frozenset()
        self._cache: dict[str, tuple[bool, bool, int]] = {}
        self._cache_size = cache_size
        #: False: a client and an endpoint on one segment (the pods' bridge) get the node's
        #: address, since nothing hands the endpoint's replies to the host (host/replies.py)
        self.on_bridge = True

    def set_node(self, addresses: Iterable[str], networks: Iterable[str]) -> None:
        """The node's own addresses and the subnets of its links (``10.244.1.1/24``)."""
        self._node_addresses = frozenset(addresses)
        self._node_networks = tuple(n for n in (_network(text) for text in networks)
                                    if n.prefixlen < n.max_prefixlen and not n.is_loopback)
        self._cache.clear()

    def classify(self, ip: str) -> tuple[bool, bool, int]:
        """(a pod, a pod of this node, the index of the node's subnet it is in, else -1)."""
        known = self._cache.get(ip)
        if known is not None:
            return known
        try:
            address = ipaddress.ip_address(ip.partition("%")[0])
        except ValueError:
            return False, False, -1
        address = getattr(address, "ipv4_mapped", None) or address
        pod = any(address.version == n.version and address in n for n in self._cluster)
        subnet = next((i for i, n in enumerate(self._node_networks) if address.version == n.version and address in n),
                      -1)
        here = pod and subnet >= 0 and str(address) not in self._node_addresses
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        self._cache[ip] = known = (pod, here, subnet)
        return known

    def keeps(self, keep: Keep, client_ip: str, endpoint_ip: str) -> bool:
        """Does this connection's upstream side bind the client's address?

        Never for the node itself (kube-proxy masquerades it; its address is the source anyway),
        towards one of the node's own addresses (the reply would not pass prerouting), nor for a
        pod that reaches itself (hairpin: kube-proxy's endpoint chain masquerades ``ip saddr`` =
        the endpoint's address; a packet from its own address is a martian to the pod)."""
        if (keep is Keep.NEVER or client_ip == endpoint_ip or client_ip in self._node_addresses
                or endpoint_ip in self._node_addresses):
            return False
        pod, client_here, client_subnet = self.classify(client_ip)
        if not pod:
            # An external client of a Local frontend is served by this node's endpoints only.
            return keep is Keep.ANY and not _loopback(client_ip)
        _, endpoint_here, endpoint_subnet = self.classify(endpoint_ip)
        if not self.on_bridge and client_here and endpoint_subnet == client_subnet:
            return False
        return client_here or endpoint_here


def _loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip == "::1" or ip.startswith("::ffff:127.")

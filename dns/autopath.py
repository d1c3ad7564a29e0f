"""Server-side search path completion: CoreDNS ``autopath @kubernetes``, pure parts.

A pod's resolver (``ndots:5``) asks ``name.<ns>.svc.<zone>`` first, then the other search
names, then ``name`` itself: up to five round trips per address family for an external
name. When the query comes from a Pod of namespace ``ns`` (its source address among the
Pods this node reads), the server walks that same search path itself and answers the first
name that is not NXDOMAIN, behind a CNAME from the name asked (CoreDNS
``plugin/autopath/autopath.go`` ServeDNS, ``cname.go`` cnamer, ``plugin/kubernetes/autopath.go``
AutoPath). When every name is NXDOMAIN the first answer is given, and the client walks its
search path itself.
"""

from __future__ import annotations

from dataclasses import dataclass

Labels = tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Walk:
    """A search path being walked for one query."""

    #: the name asked minus the first search domain, in the query's letter case
    base: Labels
    #: the search domains, the bare name last (``()``)
    search: tuple[Labels, ...]
    #: the search domain being tried
    position: int

    @property
    def name(self) -> Labels:
        return self.base + self.search[self.position]

    def next(self) -> "Walk | None":
        if self.position + 1 >= len(self.search):
            return None
        return Walk(self.base, self.search, self.position + 1)


def search_path(namespace: str, zone: tuple[str, ...], host_search: tuple[str, ...]) -> tuple[Labels, ...]:
    """The kubelet's search path of a pod of ``namespace`` (``<ns>.svc.<zone> svc.<zone> <zone>``
    then the host's domains), and the bare name: CoreDNS kubernetes AutoPath's list with its
    ``""`` sentinel."""
    encoded = tuple(label.encode() for label in zone)
    path: list[Labels] = [(namespace.encode(), b"svc") + encoded, (b"svc",) + encoded, encoded]
    for domain in host_search:
        labels = tuple(label.encode() for label in domain.split("."))
        if labels not in path:
            path.append(labels)
    path.append(())
    return tuple(path)


def start(labels: Labels, lower: tuple[str, ...], namespace: str, zone: tuple[str, ...],
          host_search: tuple[str, ...]) -> Walk | None:
    """The walk for a query name, or None when the name is not strictly below the pod's first
    search domain (CoreDNS firstInSearchPath; the domain itself has no base name to complete)."""
    first = (namespace, "svc") + zone
    if len(lower) <= len(first) or lower[len(lower) - len(first):] != first:
        return None
    return Walk(labels[: len(labels) - len(first)], search_path(namespace, zone, host_search), 0)


def below_search_domain(lower: tuple[str, ...], zone: tuple[str, ...]) -> bool:
    """Whether a name is strictly below some ``<ns>.svc.<zone>``: its answer may depend on the
    namespace of the pod asking, so a name error there is never kept encoded for everyone."""
    depth = len(zone) + 2
    return len(lower) > depth and lower[len(lower) - depth + 1] == "svc" and \
        lower[len(lower) - len(zone):] == zone

"""Which forwarder a name goes to: the longest stub domain it is under, else the default. Pure.

CoreDNS picks the server block of a query by its name, trying the whole name first and then
each shorter suffix (core/dnsserver/server.go ServeDNS), so the longest zone a name is in
wins and ``.`` takes the rest. kubeport has one forwarder (upstreams and their cache) per
stub domain and one for ``.``: a name is always asked of, and cached by, the forwarder of
its own zone, so an answer cached for one zone's upstreams never answers for another's.
"""

from __future__ import annotations

from typing import Generic, Iterator, Mapping, Sequence, TypeVar

T = TypeVar("T")


def zone_key(zone: str) -> tuple[bytes, ...]:
    """A zone (``consul.local``, no trailing dot) as the lower-cased labels names are routed by."""
    return tuple(label.encode("ascii") for label in zone.lower().split(".") if label)


class ZoneRoutes(Generic[T]):
    """``default`` for every name, ``zones[labels]`` for the names at or under those labels."""

    __slots__ = ("default", "zones")

    def __init__(self, default: T, zones: Mapping[tuple[bytes, ...], T] | None = None):
        self.default = default
        self.zones: dict[tuple[bytes, ...], T] = dict(zones or {})

    def route(self, labels: Sequence[bytes]) -> T:
        """The target of the longest zone ``labels`` (a name as asked, any case) is in."""
        zones = self.zones
        if not zones:  # no stub domains: no per-query work
            return self.default
        lowered = tuple(label.lower() for label in labels)
        for start in range(len(lowered)):
            target = zones.get(lowered[start:])
            if target is not None:
                return target
        return self.default

    def __iter__(self) -> Iterator[tuple[str, T]]:
        """(zone as CoreDNS's ``zones`` label writes it: ``consul.local.``, ``.``), target: the default first."""
        yield ".", self.default
        for key, target in sorted(self.zones.items()):
            yield b".".join(key).decode("ascii") + ".", target

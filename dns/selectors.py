"""Label selectors as CoreDNS's ``labels`` option takes them: Kubernetes' selector syntax
(k8s.io/apimachinery ``labels.Parse``): requirements joined by commas, each ``key``,
``!key``, ``key=value``, ``key==value``, ``key!=value``, ``key in (v1,v2)`` or
``key notin (v1,v2)``. ``!=`` and ``notin`` also match an object without the key."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

_REQUIREMENT = re.compile(
    r"\s*(?:(?P<absent>!)\s*(?P<nkey>[^\s!=,()]+)"
    r"|(?P<key>[^\s!=,()]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[^\s,()]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<values>[^()]*)\))?)\s*(?:,|$)")


class SelectorError(ValueError):
    """Not a label selector; the message says where."""


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    #: exists, absent, in, notin
    op: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.op == "exists":
            return value is not None
        if self.op == "absent":
            return value is None
        if self.op == "in":
            return value in self.values
        return value not in self.values  # notin, !=: an object without the key too


@dataclass(frozen=True, slots=True)
class Selector:
    text: str
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(requirement.matches(labels) for requirement in self.requirements)


def parse_selector(text: str) -> Selector:
    """The selector of ``text``; an empty one matches everything."""
    requirements: list[Requirement] = []
    position = 0
    stripped = text.strip()
    while position < len(stripped):
        found = _REQUIREMENT.match(stripped, position)
        if found is None or found.end() == position:
            raise SelectorError(f"{text!r}: not a label selector at {stripped[position:]!r}")
        if found["absent"]:
            requirements.append(Requirement(found["nkey"], "absent"))
        elif found["op"]:
            requirements.append(Requirement(found["key"], "notin" if found["op"] == "!=" else "in",
                                            frozenset((found["value"],))))
        elif found["setop"]:
            values = frozenset(v.strip() for v in found["values"].split(","))
            if "" in values:
                raise SelectorError(f"{text!r}: an empty value in ({found['values']})")
            requirements.append(Requirement(found["key"], found["setop"], values))
        else:
            requirements.append(Requirement(found["key"], "exists"))
        position = found.end()
        if stripped[found.end() - 1:found.end()] == "," and position >= len(stripped):
            raise SelectorError(f"{text!r}: nothing after the last comma")
    return Selector(text, tuple(requirements))

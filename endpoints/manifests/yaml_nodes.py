"""YAML for manifests: libyaml composes nodes, a lean builder turns them into values.

Why not ``yaml.load``: PyYAML's constructor and resolver are generic Python code and
dominate the load time of large manifest sets. Composing nodes (libyaml) and building
plain dicts, lists and scalars directly is about twice as fast, and the nodes give the
source text of each object, whose digest tells an unchanged object without building it.

Semantics are PyYAML's SafeLoader (YAML 1.1: ``yes``/``on`` are booleans, ``010`` is
octal, merge keys, anchors), except that timestamps stay strings, as they do for the
API server (sigs.k8s.io/yaml goes through JSON).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

try:
    _BaseLoader: type = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - PyYAML built without libyaml
    _BaseLoader = yaml.SafeLoader

YAMLError = yaml.YAMLError
MarkedYAMLError = yaml.MarkedYAMLError

_STR = "tag:yaml.org,2002:str"
_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"
_NULL = "tag:yaml.org,2002:null"
_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_MERGE = "tag:yaml.org,2002:merge"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"

#: SafeLoader's implicit resolvers by first character, without timestamps.
_RESOLVERS = {
    first: tuple((tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP)
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_TRUE = frozenset({"yes", "true", "on"})
_SCALAR_CONSTRUCTOR = SafeConstructor()


class _Loader(_BaseLoader):  # type: ignore[misc, valid-type]
    def resolve(self, kind: type, value: str | None, implicit: tuple[bool, bool]) -> str:
        if kind is ScalarNode:
            if implicit[0]:  # plain (unquoted) scalar
                for tag, regexp in _RESOLVERS.get(value[:1] if value else "", ()):
                    if regexp.match(value):
                        return tag
            return _STR
        return _SEQ if kind is SequenceNode else _MAP


def compose_documents(text: str) -> Iterator[Node]:
    """The root node of each document, lazily (raises yaml.YAMLError on bad syntax)."""
    return yaml.compose_all(text, Loader=_Loader)


def check_syntax(text: str) -> None:
    """Raise yaml.YAMLError if ``text`` is not well-formed YAML (no values are built)."""
    for _ in yaml.parse(text, Loader=_Loader):
        pass


def source_text(text: str, node: Node) -> str:
    """The exact text a node was composed from."""
    return text[node.start_mark.index : node.end_mark.index]


def mapping_value(node: Node, key: str) -> Node | None:
    """The value node of a plain string ``key`` in a mapping node."""
    if isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            if key_node.tag == _STR and key_node.value == key:
                return value_node
    return None


def build(node: Node, memo: dict[int, Any] | None = None) -> Any:
    """The Python value of a node: dicts, lists, str, int, float, bool, None."""
    tag = node.tag
    if tag == _STR:
        return node.value
    memo = {} if memo is None else memo
    held = memo.get(id(node))
    if held is not None:
        return held  # an alias: the same object, as PyYAML builds it
    if tag == _MAP:
        return _build_mapping(node, memo)
    if tag == _SEQ:
        items: list[Any] = []
        memo[id(node)] = items
        items.extend(build(item, memo) for item in node.value)
        return items
    return _scalar(node)


def _build_mapping(node: MappingNode, memo: dict[int, Any]) -> dict[Any, Any]:
    mapping: dict[Any, Any] = {}
    memo[id(node)] = mapping
    merged: list[Node] = []
    for key_node, value_node in node.value:
        if key_node.tag == _MERGE:
            merged.extend(value_node.value if isinstance(value_node, SequenceNode) else [value_node])
            continue
        key = build(key_node, memo)
        try:
            mapping[key] = build(value_node, memo)
        except TypeError:
            raise ConstructorError(
                "while building a mapping", node.start_mark, "found an unhashable key", key_node.start_mark
            ) from None
    for source in merged:  # explicit keys win over merged ones (YAML merge key spec)
        values = build(source, memo)
        if not isinstance(values, dict):
            raise ConstructorError(
                "while building a mapping", node.start_mark, "a merge key needs a mapping", source.start_mark
            )
        for key, value in values.items():
            mapping.setdefault(key, value)
    return mapping


def _scalar(node: Node) -> Any:
    tag, value = node.tag, node.value
    if tag == _NULL:
        return None
    if tag == _BOOL:
        return value.lower() in _TRUE
    if tag == _INT and value.isdigit() and (value[0] != "0" or value == "0"):
        return int(value)  # the common case; octal, hex, "_" and sexagesimal go below
    if tag == _TIMESTAMP and isinstance(node, ScalarNode):
        return value  # kept as text, as the API server sees it
    constructor = _SCALAR_CONSTRUCTOR.yaml_constructors.get(tag)
    if constructor is None:
        raise ConstructorError(None, None, f"could not determine a constructor for the tag {tag!r}", node.start_mark)
    result = constructor(_SCALAR_CONSTRUCTOR, node)
    if hasattr(result, "__next__"):  # set, omap, pairs: two-step generators
        data = next(result)
        for _ in result:
            pass
        return data
    return result

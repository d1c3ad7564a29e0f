"""The documents of a manifest file, as object candidates (before validation).

A candidate has its routing fields (apiVersion, kind, metadata) built at once, its full
value and its digest on demand: an object whose text did not change is never built.
``kind: List`` and typed lists (``ServiceList``, whose items carry no kind) are
flattened into their items. JSON files may hold a stream of concatenated values.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Iterator
from typing import Any

from kubeport.endpoints.manifests import yaml_nodes


class SyntaxProblem(Exception):
    pass


def objects(path: str, text: str, *, as_json: bool = False) -> Iterator[tuple[Candidate | BadList, str]]:
    """Every object candidate of a file. A JSON file (or ``as_json``) is decoded whole before
    the first candidate (a syntax error anywhere raises first, so no check_syntax pass is
    needed); YAML documents are composed lazily."""
    if as_json or path.endswith(".json"):
        documents = list(_json_values(text))
        for number, document in enumerate(documents, start=1):
            documents[number - 1] = None  # each document is dropped once its objects are out
            yield from _flatten(_JsonValue(document), f"document {number}")
        return
    for number, node in enumerate(yaml_nodes.compose_documents(text), start=1):
        if node.tag != _YAML_NULL:  # an empty document: `---` twice, comments only
            yield from _flatten(_YamlValue(text, node), f"document {number}")


def syntax_checked_lazily(path: str) -> bool:
    """True when :func:`objects` can raise a syntax error after yielding (YAML): such a file
    needs :func:`check_syntax` before its objects are applied in chunks."""
    return not path.endswith(".json")


def check_syntax(path: str, text: str) -> str | None:
    """The syntax problem line of a file, or None. Builds nothing: cheap for big files."""
    try:
        if path.endswith(".json"):
            for _ in _json_values(text):
                pass
        else:
            yaml_nodes.check_syntax(text)
    except (SyntaxProblem, yaml_nodes.YAMLError) as exc:
        return f"{path}: {syntax_text(exc)}"
    return None


def syntax_text(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "YAML syntax error: nested too deeply"
    if not isinstance(exc, yaml_nodes.MarkedYAMLError):
        return str(exc) if isinstance(exc, SyntaxProblem) else f"YAML syntax error: {exc}"
    mark = exc.problem_mark or exc.context_mark
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    detail = exc.problem or "invalid YAML"
    if exc.context:
        detail += f" ({exc.context})"
    return f"YAML syntax error{where}: {detail}"


def _json_values(text: str) -> Iterator[Any]:
    """Every JSON value in ``text``: kubectl reads a stream of concatenated objects."""
    decoder = json.JSONDecoder()
    position, end = 0, len(text)
    while True:
        while position < end and text[position].isspace():
            position += 1
        if position >= end:
            return
        try:
            value, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError as exc:
            raise SyntaxProblem(f"JSON syntax error at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
        yield value


# --- one shape over YAML nodes and JSON values ---------------------------------------------

_YAML_NULL = "tag:yaml.org,2002:null"
_HEAD_FIELDS = ("apiVersion", "kind", "metadata")


class _Value:
    """A document or list item, before it is built: just enough to route and digest it."""

    def is_mapping(self) -> bool: ...
    def field(self, key: str) -> _Value | None: ...
    def items(self) -> list[_Value] | None: ...  # None unless a sequence
    def build(self) -> Any: ...
    def digest(self, salt: str) -> bytes: ...

    def head(self) -> Any:
        """The routing fields (apiVersion, kind, metadata) of a mapping, else the built value."""
        if not self.is_mapping():
            return self.build()
        fields = ((key, self.field(key)) for key in _HEAD_FIELDS)
        return {key: value.build() for key, value in fields if value is not None}


class _YamlValue(_Value):
    def __init__(self, text: str, node: Any) -> None:
        self.text, self.node = text, node

    def is_mapping(self) -> bool:
        return isinstance(self.node, yaml_nodes.MappingNode)

    def field(self, key: str) -> _Value | None:
        node = yaml_nodes.mapping_value(self.node, key)
        return None if node is None else _YamlValue(self.text, node)

    def items(self) -> list[_Value] | None:
        if not isinstance(self.node, yaml_nodes.SequenceNode):
            return None
        return [_YamlValue(self.text, node) for node in self.node.value]

    def build(self) -> Any:
        return yaml_nodes.build(self.node)

    def digest(self, salt: str) -> bytes:
        # The object's own text: unchanged text is an unchanged object, without building it.
        return _hash(salt + yaml_nodes.source_text(self.text, self.node))


class _JsonValue(_Value):
    def __init__(self, value: Any) -> None:
        self.value = value

    def is_mapping(self) -> bool:
        return isinstance(self.value, dict)

    def head(self) -> Any:
        value = self.value
        if not isinstance(value, dict):
            return value
        return {key: value[key] for key in _HEAD_FIELDS if key in value}

    def field(self, key: str) -> _Value | None:
        return _JsonValue(self.value[key]) if key in self.value else None

    def items(self) -> list[_Value] | None:
        return [_JsonValue(item) for item in self.value] if isinstance(self.value, list) else None

    def build(self) -> Any:
        return self.value

    def digest(self, salt: str) -> bytes:
        # A pickle of decoded JSON is a function of the value, its key order and which of its
        # strings are one object: the decoder shares repeated keys within a document, so the
        # same text always pickles the same. A fifth of the cost of json.dumps(sort_keys=True);
        # reordered keys only cost a re-validation.
        return hashlib.blake2b(salt.encode() + pickle.dumps(self.value, protocol=5), digest_size=16).digest()


def _hash(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class BadList:
    """Stands in for the items of a list whose ``items`` is not a list."""

    def __init__(self, kind: str) -> None:
        self.kind = kind


def _flatten(value: _Value, where: str, inherited: tuple[str, str] | None = None) -> Iterator[tuple[Any, str]]:
    """(value, where) for one document: itself, or the items of a (typed) List, recursively.

    ``inherited`` is (apiVersion, kind) for items of a typed list, which carry neither.
    """
    head = value.head()
    if isinstance(head, dict) and inherited is not None:
        head = {"apiVersion": inherited[0], "kind": inherited[1], **head}
    kind = head.get("kind") if isinstance(head, dict) else None
    items = value.field("items") if isinstance(kind, str) and kind.endswith("List") else None
    if items is None:
        yield Candidate(head, value, inherited), where
        return
    members = items.items()
    if members is None:
        if items.build() is not None:
            yield BadList(kind), where  # type: ignore[arg-type]
        return
    item_type = None if kind == "List" else (str(head.get("apiVersion") or "v1"), kind[: -len("List")])
    for index, item in enumerate(members, start=1):
        yield from _flatten(item, f"{where}, item {index}", item_type)


class Candidate:
    """One object to read: its routing fields now, its full value and digest on demand."""

    __slots__ = ("head", "value", "inherited")

    def __init__(self, head: Any, value: _Value, inherited: tuple[str, str] | None) -> None:
        self.head, self.value, self.inherited = head, value, inherited

    def build(self) -> Any:
        built = self.value.build()
        if self.inherited is not None and isinstance(built, dict):
            built = {"apiVersion": self.inherited[0], "kind": self.inherited[1], **built}
        return built

    def digest(self) -> bytes:
        return self.value.digest(f"{self.inherited}\n" if self.inherited else "")



"""Field errors and the Invalid exception, printed the way the API server prints them.

``FieldError`` mirrors ``k8s.io/apimachinery/pkg/util/validation/field.Error``:
``spec.ports[1].name: Required value``,
``spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive``.
``Invalid`` is the 422 ``StatusReasonInvalid`` error, one line per field error:
``Service "web" is invalid: spec.ports[1].name: Required value``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable, Sequence


class ErrorType(str, Enum):
    NOT_FOUND = "Not found"
    REQUIRED = "Required value"
    DUPLICATE = "Duplicate value"
    INVALID = "Invalid value"
    NOT_SUPPORTED = "Unsupported value"
    FORBIDDEN = "Forbidden"
    TOO_LONG = "Too long"
    TOO_MANY = "Too many"
    INTERNAL = "Internal error"


#: Error types whose text never shows the bad value (field.Error.ErrorBody).
_VALUELESS = frozenset({ErrorType.REQUIRED, ErrorType.FORBIDDEN, ErrorType.TOO_LONG, ErrorType.INTERNAL})


class _Omitted:
    def __repr__(self) -> str:
        return "<omitted>"


OMITTED: Any = _Omitted()


def go_value(value: Any) -> str:
    """A value as Go's field errors print it (%v for scalars, %q for strings, %#v for lists)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return "[]string{" + ", ".join(json.dumps(item, ensure_ascii=False) for item in value) + "}"
    return str(value)


@dataclass(frozen=True, slots=True)
class FieldError:
    path: str
    type: ErrorType
    value: Any = OMITTED
    detail: str = ""

    def __str__(self) -> str:
        if self.type in _VALUELESS or self.value is OMITTED:
            body = self.type.value
        else:
            body = f"{self.type.value}: {go_value(self.value)}"
        if self.detail:
            body += f": {self.detail}"
        return f"{self.path}: {body}"


def required(path: str, detail: str = "") -> FieldError:
    return FieldError(path, ErrorType.REQUIRED, detail=detail)


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(path, ErrorType.INVALID, value, detail)


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError(path, ErrorType.FORBIDDEN, detail=detail)


def duplicate(path: str, value: Any) -> FieldError:
    return FieldError(path, ErrorType.DUPLICATE, value)


def not_supported(path: str, value: Any, supported: Sequence[str]) -> FieldError:
    detail = "supported values: " + ", ".join(json.dumps(s) for s in supported)
    return FieldError(path, ErrorType.NOT_SUPPORTED, value, detail)


def too_many(path: str, actual: int, limit: int) -> FieldError:
    return FieldError(path, ErrorType.TOO_MANY, actual, f"must have at most {limit} items")


def internal(path: str, detail: str) -> FieldError:
    return FieldError(path, ErrorType.INTERNAL, detail=detail)


#: The qualified kind the API server puts in front of "is invalid".
_QUALIFIED_KINDS = {"EndpointSlice": "EndpointSlice.discovery.k8s.io"}


class Invalid(Exception):
    """An object the API server would refuse (HTTP 422); ``errors`` lists every problem."""

    def __init__(self, kind: str, name: str, errors: Iterable[FieldError]) -> None:
        self.kind = kind
        self.name = name
        self.errors: list[FieldError] = list(errors)
        super().__init__(str(self))

    def lines(self) -> list[str]:
        """One line per problem, each naming the object."""
        prefix = f'{_QUALIFIED_KINDS.get(self.kind, self.kind)} "{self.name}" is invalid'
        return [f"{prefix}: {error}" for error in self.errors]

    def __str__(self) -> str:
        return "\n".join(self.lines())

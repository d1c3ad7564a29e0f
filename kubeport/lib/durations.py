"""Go durations ("30s", "1m30s", "500ms") as configuration values: parsed as kube-proxy
reads them, written back in the same shape. In kubeport.lib so that a part's own settings
model (kubeport.dns.settings) can use them without importing the daemon's shell."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any) -> float:
    """A Go duration ("30s", "1m30s", "500ms") or a number of seconds -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not a duration like 30s or 1m30s")
    text, total, position = value.strip(), 0.0, 0
    if text == "0":
        return 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        position = match.end()
    if position != len(text):
        raise ValueError(f"{value!r} is not a duration like 30s or 1m30s")
    return total


def format_duration(seconds: float) -> str:
    if seconds and seconds == int(seconds):
        whole = int(seconds)
        hours, rest = divmod(whole, 3600)
        minutes, secs = divmod(rest, 60)
        return "".join(f"{n}{u}" for n, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if n) or "0s"
    return f"{seconds * 1000:g}ms"


Duration = Annotated[float, BeforeValidator(parse_duration), PlainSerializer(format_duration, return_type=str)]

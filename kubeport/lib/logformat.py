"""Log set-up: one line per event a human needs; text by default, JSON with --log-format json."""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone

#: -v levels: 0 = INFO (start, sync, changes, errors), 1+ = DEBUG.
_LEVELS = {0: logging.INFO}
LIBRARY_DEBUG = 6


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the fields log shippers expect (ts, level, logger, msg)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(log_format: str = "text", verbosity: int = 0) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS.get(verbosity, logging.DEBUG))
    # Third-party libraries are quiet below klog's request-level verbosity (6): kube-proxy
    # manifests commonly run --v=2 or --v=4, which must not turn on asyncio's or the API client's debug.
    for noisy in ("aiohttp", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING if verbosity < LIBRARY_DEBUG else logging.DEBUG)

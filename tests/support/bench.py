"""The bench folder as the package ``kubeport_bench``, as bench/run.py loads it: its dns.py
and proxy.py must not become top-level modules (they would shadow kubeport's)."""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py`` imported as ``kubeport_bench.<name>``."""
    if "kubeport_bench" not in sys.modules:
        package = types.ModuleType("kubeport_bench")
        package.__path__ = [str(BENCH_DIR)]  # type: ignore[attr-defined]
        sys.modules["kubeport_bench"] = package
    return importlib.import_module(f"kubeport_bench.{name}")

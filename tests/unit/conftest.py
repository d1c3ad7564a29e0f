"""Unit-test helpers live beside the tests (registry_support, ...); --import-mode=importlib
keeps test folders off sys.path, so put this one on it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

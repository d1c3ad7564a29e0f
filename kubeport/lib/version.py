"""kubeport's version, in a leaf any part may import (the worker protocol, the last applied
state's format and ``coredns_build_info`` carry it). pyproject.toml's ``version`` is the same
string; a unit test keeps the two equal."""

__version__ = "0.1.0"

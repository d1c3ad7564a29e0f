"""kubeport: a node-local Kubernetes data plane (service proxy + cluster DNS)."""

from kubeport.lib.version import __version__

__all__ = ["__version__"]

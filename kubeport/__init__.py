"""kubeport: a node-local Kubernetes data plane (service proxy + cluster DNS)."""

__version__ = "0.1.0"

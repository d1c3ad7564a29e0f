"""What lets the node's service survive its daemon: a crash, a restart, a rollout.

- ``supervisor.py``: ``--hold-sockets``' parent, which holds every listening socket (the
  daemon's and the relay workers') across a crash of the daemon and starts it again;
  ``sockethold.py`` is the daemon's and the workers' side of its channel.
- ``fdstore.py``: ``kubeport fd-store DIR``, a pod's descriptor store in systemd's stead.
- ``handover.py``: one instance per node and network namespace, and the handover of a
  rollout from the old instance to the new one.
- ``laststate.py``: the last applied state kept in ``--state-dir``; ``restore.py`` serves it
  at the next start until the source has synced.

The parts (``proxy/``, ``dns/``) never import this package: they are handed a
:class:`kubeport.lib.heldsockets.HeldSockets` and bind through it.
"""

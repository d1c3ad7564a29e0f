"""``kubeport --cleanup``: remove every trace kubeport leaves on a host, as kube-proxy's
``--cleanup`` does (``cmd/kube-proxy/app/server.go cleanupAndExit``), and the start-up report
of what a previous instance that died left behind.

On the host: proxy/host/leftovers.py. In the files: the pod's ready and live files (a ready
file left by a killed process would vouch for nothing), and the scratch copies an interrupted
write left in the state directory. Allocations and the last good copies of manifests are the
cluster's state, not leftovers: they stay.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Iterable

from kubeport.config import KubeportConfiguration
from kubeport.proxy.host import leftovers
from kubeport.survival import handover

log = logging.getLogger(__name__)


class CleanupRefused(RuntimeError):
    """An instance serves the node: removing its addresses and rules would cut it off."""


def stale_files(config: KubeportConfiguration) -> list[Path]:
    from kubeport.endpoints.manifests.lastgood import DIRECTORY_NAME  # the manifest reader: not for a start

    found: list[Path] = []
    for path in (config.ready_file, config.live_file):
        if path is not None:
            found += [p for p in (path, *path.parent.glob(f".{path.name}.*")) if p.is_file()]
    last_good = config.state_dir / DIRECTORY_NAME
    if last_good.is_dir():
        found += sorted(p for p in last_good.rglob(".*.tmp") if p.is_file())
    return found


def cleanup_host(config: KubeportConfiguration, report: Callable[[str], None]) -> None:
    """Remove what kubeport leaves; ``report`` gets a line per thing removed. Idempotent:
    a second run reports that nothing was left."""
    if handover.abstract_name_in_use(config.hostname_override):
        raise CleanupRefused(f"a kubeport instance serves node {config.hostname_override} in this network "
                             f"namespace: stop it first (its own shutdown removes what it programmed)")
    lines = leftovers.remove(leftovers.find(bpf_root=config.bpf_root))
    lines += _remove_files(stale_files(config))
    for line in lines or ["nothing to remove"]:
        report(line)


def _remove_files(paths: Iterable[Path]) -> list[str]:
    lines = []
    for path in paths:
        try:
            path.unlink()
            lines.append(f"removed {path}")
        except FileNotFoundError:
            pass
        except OSError as exc:
            lines.append(f"failed: removing {path}: {exc.strerror or exc}")
    return lines


def report_previous_instance() -> None:
    """At the start of the instance serving the node: what a previous one left means it did
    not stop cleanly (a clean stop removes everything; a handover hands it to a successor)."""
    try:
        found = leftovers.find()
    except OSError as exc:
        log.warning("looking for a previous instance's leftovers: %s", exc)
        return
    if found:
        log.warning("a previous instance did not stop cleanly and left: %s; taking them over and "
                    "reconciling", "; ".join(found.describe()))

"""The kube-apiserver source: Services, EndpointSlices, this Node and Namespaces (and Pods
for DNS when asked), each
kept by an informer (list, then watch) that writes into one ClusterState.

Usage (the daemon)::

    source = ApiServerSource(state, kubeconfig=path, in_cluster=False, node_name="node-a")
    registry.register(source.collector())      # kubeport_apiserver_* metrics
    await source.run()                         # forever; ApiServerConfigError if unusable

``snapshot.synced`` becomes true once Services and EndpointSlices have both completed
their first list (ClusterState's required kinds). After that a lost connection keeps
the last known state: the informers reconnect in the background and relist if needed.
``problems`` lists what is wrong right now (RBAC, credentials, invalid objects) in
words an operator can act on; ``stats`` counts per kind.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, Mapping, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kubeport.endpoints.apiserver.backoff import BackoffPolicy
from kubeport.endpoints.apiserver.client import (
    DEFAULT_SERVICE_ACCOUNT_DIR,
    ApiConnection,
    ApiServerConfigError,
    Credentials,
)
from kubeport.endpoints.apiserver.configmaps import ConfigMapSink, OnData, config_map_resource
from kubeport.endpoints.apiserver.informer import Informer
from kubeport.endpoints.apiserver.reflector import Sink
from kubeport.endpoints.apiserver.resources import PodScope, Resource, ResourceStats, watched_resources

log = logging.getLogger(__name__)

__all__ = ["ApiServerConfigError", "ApiServerSource", "BackoffPolicy"]


class ApiServerSource:
    """A kube-apiserver, list and watch per resource, as a :class:`~kubeport.endpoints.interfaces.Source`."""

    kind = "apiserver"

    def __init__(
        self,
        state: Sink,
        *,
        kubeconfig: Path | None = None,
        in_cluster: bool = False,
        node_name: str,
        pods: PodScope = "none",
        context: str | None = None,
        stall_timeout: float = 90.0,
        page_size: int = 500,
        watch_list: bool = True,
        backoff: BackoffPolicy = BackoffPolicy(),
        service_account_dir: Path = DEFAULT_SERVICE_ACCOUNT_DIR,
        environ: Mapping[str, str] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rand: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.time,
        config_maps: Sequence[tuple[str, str, OnData]] = (),
    ) -> None:
        """
        :param kubeconfig: a kubeconfig file (its current context unless ``context``).
        :param in_cluster: use the pod's service account (``service_account_dir`` and the
            KUBERNETES_SERVICE_HOST/PORT variables of ``environ``) instead.
        :param node_name: this node: the only Node watched.
        :param pods: which Pods are watched (for DNS): none, this node's, or all.
        :param stall_timeout: seconds without a response, then without a byte, on a watch
            before it is reopened; the API server's watch cache sends a bookmark about every
            minute on a quiet watch (with ``--watch-cache=false`` quiet watches are simply
            reopened, from their RV).
        :param page_size: objects per list page (``limit``); 0 lists in one response.
        :param watch_list: try the streaming list (sendInitialEvents) first.
        :param backoff: retry delays; ``sleep``, ``rand`` and ``clock`` are injectable for tests.
        :param config_maps: (namespace, name, on_data): ConfigMaps followed besides, each one's
            ``data`` handed to its callback when it changes, None when there is none (the DNS
            server's kube-dns ConfigMap); no part of the state and of its readiness.
        """
        if (kubeconfig is None) == (not in_cluster):
            raise ApiServerConfigError("give exactly one of a kubeconfig or in-cluster configuration")
        self._kubeconfig = kubeconfig
        self._context = context
        self._in_cluster = in_cluster
        self._service_account_dir = service_account_dir
        self._environ = dict(os.environ if environ is None else environ)
        self._credentials: Credentials | None = None
        self._connection: ApiConnection | None = None
        self._problems: dict[str, str] = {}
        self._state = state
        self._make_informer = functools.partial(
            Informer, backoff=backoff, stall_timeout=stall_timeout, page_size=page_size, watch_list=watch_list,
            on_problem=self._set_problem, sleep=sleep, rand=rand, clock=clock,
        )
        self.resources: tuple[Resource, ...] = watched_resources(node_name, pods)
        self._config_maps = [(config_map_resource(namespace, name), ConfigMapSink(name, on_data))
                             for namespace, name, on_data in config_maps]
        self._informers: list[Informer] = []
        self._stats = {r.kind: ResourceStats(r.kind) for r in self.resources}
        self._stats.update((resource.kind, ResourceStats(resource.kind)) for resource, _ in self._config_maps)

    # --- running ------------------------------------------------------------------------

    async def load_credentials(self) -> Credentials:
        """Read the configuration (once); ApiServerConfigError names what is wrong with it.
        The daemon may call this before ``run`` to fail fast at start-up."""
        if self._credentials is None:
            if self._in_cluster:
                self._credentials = Credentials.in_cluster(self._service_account_dir, self._environ)
            else:
                assert self._kubeconfig is not None
                self._credentials = await Credentials.from_kubeconfig(self._kubeconfig, self._context)
        return self._credentials

    async def run(self) -> None:
        """List and watch until cancelled. Raises ApiServerConfigError at once if the
        configuration is unusable; every later failure is retried."""
        credentials = await self.load_credentials()
        connection = self._connection = ApiConnection(credentials)
        await connection.open()
        log.info("watching the API server at %s (%s)", credentials.host, credentials.source)
        self._informers = [
            self._make_informer(resource, self._state, connection) for resource in self.resources
        ] + [self._make_informer(resource, sink, connection) for resource, sink in self._config_maps]
        for informer in self._informers:
            self._stats[informer.resource.kind] = informer.stats
        try:
            async with asyncio.TaskGroup() as tasks:
                for informer in self._informers:
                    tasks.create_task(informer.run(), name=f"informer-{informer.resource.plural}")
        finally:
            await connection.close()

    # --- status -------------------------------------------------------------------------

    @property
    def problems(self) -> list[str]:
        """What is wrong right now, one line each (empty when all is well)."""
        found = [self._problems[kind] for kind in sorted(self._problems)]
        if self._connection is not None and self._connection.problem is not None:
            found.append(self._connection.problem)
        for informer in self._informers:
            found.extend(informer.object_problems[key] for key in sorted(informer.object_problems))
        return found

    @property
    def stats(self) -> Mapping[str, ResourceStats]:
        """Per kind: lists, relists, watch restarts (by reason), events by type, last sync."""
        return self._stats

    def stats_dict(self) -> dict[str, dict]:
        return {kind: stats.as_dict() for kind, stats in self._stats.items()}

    def status(self) -> dict[str, Any]:
        return {"resources": self.stats_dict()}

    def collector(self) -> Collector:
        """A Prometheus collector of ``stats`` (read at scrape time, no bookkeeping)."""
        return _StatsCollector(self)

    def _set_problem(self, kind: str, problem: str | None) -> None:
        held = self._problems.get(kind)
        if problem == held:
            return
        if problem is None:
            del self._problems[kind]
            log.info("%s: resolved: %s", kind, held)
        else:
            self._problems[kind] = problem
            log.error("%s", problem)


class _StatsCollector(Collector):
    def __init__(self, source: ApiServerSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        prefix = "kubeport_apiserver"
        restarts = CounterMetricFamily(f"{prefix}_watch_restarts", "Watch streams that ended and were reopened.",
                                       labels=["kind", "reason"])
        lists = CounterMetricFamily(f"{prefix}_lists", "Completed lists (first list and relists).", labels=["kind"])
        relists = CounterMetricFamily(f"{prefix}_relists", "Completed lists after the first.", labels=["kind"])
        events = CounterMetricFamily(f"{prefix}_watch_events", "Watch events received.", labels=["kind", "type"])
        failures = CounterMetricFamily(f"{prefix}_request_failures", "Failed list/watch requests.",
                                       labels=["kind", "code"])
        last_sync = GaugeMetricFamily(f"{prefix}_last_sync_timestamp_seconds",
                                      "Unix time of the last completed list.", labels=["kind"])
        synced = GaugeMetricFamily(f"{prefix}_synced", "1 once the first list completed.", labels=["kind"])
        problems = GaugeMetricFamily(f"{prefix}_problems", "Current problems (see /api/v1/problems).")
        watch_list = GaugeMetricFamily(f"{prefix}_watch_list",
                                       "1: the streaming list is used; 0: it failed, list + watch is used.",
                                       labels=["kind"])
        backoff = GaugeMetricFamily(f"{prefix}_backoff_seconds", "The delay chosen before the next attempt.",
                                    labels=["kind"])
        for kind, stats in self._source.stats.items():
            for reason, count in sorted(stats.restart_reasons.items()):
                restarts.add_metric([kind, reason], count)
            lists.add_metric([kind], stats.lists)
            relists.add_metric([kind], stats.relists)
            for event_type, count in sorted(stats.events.items()):
                events.add_metric([kind, event_type], count)
            for code, count in sorted(stats.failures.items()):
                failures.add_metric([kind, code], count)
            if stats.last_sync is not None:
                last_sync.add_metric([kind], stats.last_sync)
            synced.add_metric([kind], 1.0 if stats.synced else 0.0)
            if stats.watch_list is not None:
                watch_list.add_metric([kind], 1.0 if stats.watch_list else 0.0)
            backoff.add_metric([kind], stats.backoff)
        problems.add_metric([], len(self._source.problems))
        yield from (restarts, lists, relists, events, failures, last_sync, synced, problems, watch_list, backoff)

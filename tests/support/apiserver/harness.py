"""Shared by the API-server source tests: a fake server plus a source against it, a
recording ClusterState, and waits for what the source publishes."""

from __future__ import annotations

import asyncio

import pytest

from kubeport.endpoints.apiserver.source import ApiServerSource, BackoffPolicy
from kubeport.endpoints.state import ClusterState
from kubeport.endpoints.types import ServiceName

from ..wait import DEADLINE, until
from . import objects as k8s
from .server import FakeApiServer
from .tls import TlsFiles, make_tls, write_kubeconfig

FAST = BackoffPolicy(initial=0.001, cap=0.004, jitter=0.0, relist_jitter=0.001)
WEB = ServiceName("default", "web")
API = ServiceName("default", "kubernetes")


class RecordingState(ClusterState):
    """ClusterState that also logs every write, to check nothing is lost or applied twice."""

    def __init__(self) -> None:
        super().__init__("node-a")
        self.log: list[tuple[str, str, str, str | None]] = []

    def upsert(self, obj) -> None:
        self.log.append(("upsert", obj.kind, obj.metadata.name, obj.metadata.resource_version))
        super().upsert(obj)

    def delete(self, kind: str, namespace: str, name: str) -> None:
        self.log.append(("delete", kind, name, None))
        super().delete(kind, namespace, name)


async def snapshot_where(state: ClusterState, predicate, what: str, timeout: float = DEADLINE):
    """The first snapshot for which ``predicate`` holds (woken by each publication)."""
    return await until(lambda: state.snapshot if predicate(state.snapshot) else None, what, timeout,
                       changed=lambda: state.wait_newer(state.snapshot.generation))


def seed(server: FakeApiServer) -> None:
    for name in ("default", "kube-system"):
        server.apply(k8s.namespace(name))
    server.apply(k8s.node("node-a", zone="zone-a"))
    server.apply(k8s.node("node-b", zone="zone-b", internal_ip="192.168.10.12"))
    server.apply(k8s.service("kubernetes", cluster_ip="10.96.0.1",
                             ports=[{"name": "https", "protocol": "TCP", "port": 443, "targetPort": 6443}]))
    server.apply(k8s.endpoint_slice("kubernetes", "kubernetes", addresses=["192.168.10.11"], port=6443,
                                    port_name="https"))
    server.apply(k8s.service("web"))
    server.apply(k8s.endpoint_slice("web-abc12", "web", addresses=["10.244.1.5", "10.244.2.7"]))


@pytest.fixture(scope="session")
def tls(tmp_path_factory) -> TlsFiles:
    return make_tls(tmp_path_factory.mktemp("pki"))


@pytest.fixture
async def running(tmp_path, tls):
    """Start a fake server (options) and a source against it (options); stop both after.

    ``kubeconfig``: a function of the server writing the kubeconfig to use (default: CA + token);
    ``state``: the ClusterState to feed (default: a RecordingState).
    """
    servers: list[FakeApiServer] = []
    tasks: list[asyncio.Task] = []

    async def start(server_options=None, seeded=True, kubeconfig=None, state=None, **source_options):
        server = await FakeApiServer(tls=tls.server_context(), **(server_options or {})).start()
        servers.append(server)
        if seeded:
            seed(server)
        state = state if state is not None else RecordingState()
        if kubeconfig is None:
            source_options["kubeconfig"] = write_kubeconfig(
                tmp_path / "kubeconfig", server.url, ca=tls.ca_cert, token=server.token)
        else:
            source_options["kubeconfig"] = kubeconfig(server)
        source_options.setdefault("backoff", FAST)
        source = ApiServerSource(state, node_name="node-a", **source_options)
        tasks.append(asyncio.create_task(source.run()))
        return server, source, state

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for server in servers:
        await server.stop()


async def synced(state: ClusterState, source: ApiServerSource | None = None, timeout: float = 15.0):
    """The snapshot once Services and EndpointSlices (and, given ``source``, all kinds) listed."""
    await until(lambda: state.snapshot.synced, "the first sync", timeout)
    if source is not None:
        await until(lambda: all(s.synced for s in source.stats.values()), "every kind's first list", timeout)
    return state.snapshot

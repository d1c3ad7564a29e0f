"""The fake kube-apiserver (support.apiserver) listening inside a node's network namespace, plus
objects and probes for test_apiserver_daemon.py.

The daemon runs in node-a's namespace and reads the API server at 127.0.0.1 there. The
fake is served by this test process: its listening socket is made on a short-lived thread
that setns()'d into the node's namespace (a socket keeps the namespace it was created in),
and aiohttp serves it from an event loop on a background thread. The fake is not
thread-safe, so every call into it runs on that loop (`NetnsApiServer` proxies them).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import re
import socket
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from ..apiserver import objects as k8s
from ..apiserver.server import FakeApiServer
from ..apiserver.tls import TlsFiles, write_kubeconfig
from . import KubeportDaemon, Pod, Topology, curl_in, kubeport, run_in

CLONE_NEWNET = 0x40000000
CALL_TIMEOUT = 10.0
_libc = ctypes.CDLL(None, use_errno=True)


# --- the server -----------------------------------------------------------------------------


def socket_in_netns(ns: str, host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A TCP socket bound to host:port (0: a free one) inside network namespace `ns`.

    setns() moves only the calling thread, so a throwaway thread does it: the test process
    itself stays in the root namespace."""
    made: dict[str, Any] = {}

    def create() -> None:
        try:
            with open(f"/var/run/netns/{ns}", "rb") as handle:
                if _libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"setns into network namespace {ns}: {errno}")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            made["sock"] = sock
        except BaseException as err:  # handed to the caller's thread
            made["error"] = err

    thread = threading.Thread(target=create, name=f"setns-{ns}")
    thread.start()
    thread.join()
    if "error" in made:
        raise made["error"]
    return made["sock"]


class NetnsApiServer:
    """A FakeApiServer listening on 127.0.0.1 inside `ns`, https with a bearer token.

    Public methods of the fake are available here and run on its loop, e.g.
    ``api.apply(obj)``, ``api.cut_watches("services")``, ``api.count("services", "list")``;
    ``hold`` returns a function that releases the held request."""

    def __init__(self, ns: str, tls: TlsFiles, **fake_options: Any) -> None:
        self.ns = ns
        self.tls = tls
        self._fake = FakeApiServer(tls=tls.server_context(), **fake_options)
        self._stopped = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"fake-apiserver-{ns}", daemon=True)
        self._thread.start()
        try:
            self.run(self._fake.start(sock=socket_in_netns(ns)))
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return self._fake.url

    def run(self, coroutine: Coroutine[Any, Any, Any], timeout: float = CALL_TIMEOUT) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        async def on_loop() -> Any:
            return function(*args, **kwargs)

        return self.run(on_loop())

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = None if name.startswith("_") else getattr(self._fake, name, None)
        if not callable(method):
            raise AttributeError(f"NetnsApiServer proxies the fake's public methods, not {name!r}")
        return lambda *args, **kwargs: self.call(method, *args, **kwargs)

    def hold(self, plural: str, verb: str) -> Callable[[], None]:
        """The next `verb` (list|watch) of `plural` waits until the returned function is called."""
        event = self.call(self._fake.hold, plural, verb)
        return lambda: self.call(event.set)

    def go_down(self) -> None:
        """The API server process exits: watches end, the port refuses connections."""
        self.run(self._fake.go_down())

    def come_up(self, *, compact: bool = False) -> None:
        """Started again on the same port (the fake's come_up: a new watch cache, maybe compaction)."""
        self.run(self._fake.come_up(compact=compact, sock=socket_in_netns(self.ns, port=self._fake.port)))

    def kubeconfig(self, path: Path) -> Path:
        return write_kubeconfig(path, self.url, ca=self.tls.ca_cert, token=self._fake.token)

    def stop(self) -> None:
        """The API server goes away: watches end, the port refuses connections."""
        if not self._stopped:
            self._stopped = True
            self.run(self._fake.stop())

    def close(self) -> None:
        try:
            self.stop()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(CALL_TIMEOUT)
            self._loop.close()

    def __enter__(self) -> NetnsApiServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def start_daemon(api: NetnsApiServer, directory: Path, *extra: str) -> KubeportDaemon:
    """kubeport in the API server's namespace, reading it through a kubeconfig (not yet ready)."""
    directory.mkdir(parents=True, exist_ok=True)
    kubeconfig = api.kubeconfig(directory / "kubeconfig")
    return KubeportDaemon(api.ns, None, directory / "state", "--upstream", "192.168.50.200", *extra,
                          kubeconfig=kubeconfig)


# --- objects --------------------------------------------------------------------------------


def node(topology: Topology, which: str) -> dict:
    spec = topology.node_spec(which)
    return k8s.node(spec.name, zone=spec.zone, internal_ip=spec.lan_ips[0])


def pod_slice(name: str, service_name: str, pods: list[Pod], port: int = 8080, port_name: str = "http",
              protocol: str = "TCP") -> dict:
    """An EndpointSlice as the controller writes it, one endpoint per pod on the pod's node."""
    obj = k8s.endpoint_slice(name, service_name, addresses=[pod.ip() for pod in pods], port=port,
                             port_name=port_name)
    for endpoint, pod in zip(obj["endpoints"] or [], pods):
        endpoint.update(nodeName=pod.node.name, zone=pod.node.zone)
        endpoint["targetRef"]["name"] = f"{service_name}-{pod.name}"
    obj["ports"][0]["protocol"] = protocol
    return obj


def seed(api: NetnsApiServer, topology: Topology, web_pods: list[Pod]) -> None:
    """Namespaces, both Nodes, the kubernetes Service, and web (10.96.0.20:80 -> pods:8080,
    and 10.96.0.20:90/UDP -> pods:9090)."""
    for name in ("default", "kube-system"):
        api.apply(k8s.namespace(name))
    for which in ("a", "b"):
        api.apply(node(topology, which))
    api.apply(k8s.service("kubernetes", cluster_ip="10.96.0.1",
                          ports=[{"name": "https", "protocol": "TCP", "port": 443, "targetPort": 6443}]))
    api.apply(k8s.endpoint_slice("kubernetes", "kubernetes", addresses=["192.168.50.11"], port=6443,
                                 port_name="https"))
    api.apply(k8s.service("web", cluster_ip="10.96.0.20", ports=WEB_PORTS))
    api.apply(pod_slice("web-abc12", "web", web_pods))
    api.apply(pod_slice("web-udp12", "web", web_pods, port=9090, port_name="echo", protocol="UDP"))


WEB_PORTS = [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080},
             {"name": "echo", "protocol": "UDP", "port": 90, "targetPort": 9090}]


# --- probes ---------------------------------------------------------------------------------


def status(ns: str) -> dict:
    """`kubeport get status -o json`: the daemon's generation and the source's counters."""
    return json.loads(kubeport(ns, "get", "status", "-o", "json"))


def resource_stats(ns: str, kind: str) -> dict:
    return status(ns)["source"]["resources"][kind]


def metric_samples(ns: str, name: str) -> dict[str, float]:
    """The samples of one metric family in the daemon's /metrics, by their label text."""
    text = curl_in(ns, "http://127.0.0.1:10249/metrics")
    found = re.findall(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)
    return {labels: float(value) for labels, value in found}


def dig_answer(ns: str, name: str, rtype: str = "A") -> tuple[str, list[str]]:
    """(rcode, sorted answer data) of `dig name rtype` against the node-local DNS from `ns`."""
    out = run_in(ns, "dig", "+time=2", "+tries=1", "@10.96.0.10", name, rtype, "+noall", "+comments",
                 "+answer", timeout=10).stdout
    rcode = re.search(r"status: (\w+)", out)
    answers = sorted(line.split()[-1] for line in out.splitlines() if line and not line.startswith(";"))
    return (rcode.group(1) if rcode else "NO-REPLY", answers)

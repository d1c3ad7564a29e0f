"""The connection to a kube-apiserver.

Configuration and authentication come from ``kubernetes_asyncio`` (kubeconfig contexts,
client certificates, bearer tokens and token files, exec plugins, the in-cluster service
account with its token re-read as it rotates); its aiohttp-based REST client supplies the
session with the TLS set-up. The requests themselves are made here, so that the informer
controls streaming, resourceVersion, bookmarks and paging.

kubernetes_asyncio is imported when first used, and only its configuration, REST and
kubeconfig/in-cluster modules (:func:`auth_modules`): its packages' ``__init__`` files import
every generated API class and model, about 1,200 modules and 64 MiB of RSS, of which the
daemon uses none.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import sys
import time
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Mapping

import aiohttp

from kubeport.endpoints.apiserver.wire import Status, parse_status

if TYPE_CHECKING:
    from kubernetes_asyncio.client import Configuration
    from kubernetes_asyncio.client.rest import RESTClientObject

log = logging.getLogger(__name__)

#: Where the kubelet mounts a pod's service account (token, ca.crt, namespace).
DEFAULT_SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
USER_AGENT = "kubeport/0.1.0 (linux) endpoints-informer"
#: client-go re-reads token files about every minute; exec plugins re-run when expired.
CREDENTIAL_REFRESH_SECONDS = 60.0
#: client-go re-reads a CA file named by path every 5 minutes (transport/ca_rotation.go,
#: CARefreshDuration; feature gate ClientsAllowCARotation, on by default): the in-cluster
#: ca.crt is rewritten by the kubelet when the cluster's serving CA rotates.
CA_REFRESH_SECONDS = 300.0


class ApiServerConfigError(Exception):
    """The kubeconfig or in-cluster configuration cannot be used; the message says why."""


class ApiStatusError(Exception):
    """The API server answered a request with an error status (a metav1.Status body)."""

    def __init__(self, code: int, status: Status | None, *, retry_after: float | None = None,
                 verb: str = "", path: str = "") -> None:
        self.code = code
        self.status = status
        self.retry_after = retry_after
        self.verb = verb
        self.path = path
        message = status.message if status and status.message else f"HTTP {code}"
        super().__init__(f"{verb} {path}: {code} {self.reason}: {message}".strip())

    @property
    def reason(self) -> str:
        return self.status.reason if self.status and self.status.reason else ""

    @property
    def message(self) -> str:
        return self.status.message if self.status else ""


#: the packages whose ``__init__`` imports every API class and model; registered bare instead.
_BARE_PACKAGES = ("kubernetes_asyncio", "kubernetes_asyncio.client", "kubernetes_asyncio.client.models")


def auth_modules() -> types.SimpleNamespace:
    """kubernetes_asyncio's ``Configuration``, ``RESTClientObject``, ``kube_config`` and
    ``incluster_config``, imported without the generated API classes and models.

    The three packages of ``_BARE_PACKAGES`` are registered as empty packages over their real
    directories, so importing a submodule does not run their ``__init__``; ``ApiClient``
    (which kube_config names at import time) imports the bare ``models`` package and uses no
    model unless asked to deserialize, which nothing here does. Where the library is already
    imported whole, or the bare import fails (another version, laid out differently), the
    whole library is used: only memory is at stake, never behaviour.
    """
    if "kubernetes_asyncio.client" not in sys.modules:
        try:
            _import_bare()
        except Exception as exc:  # noqa: BLE001 - any failure means: import it the usual way
            for name in [m for m in sys.modules if m == "kubernetes_asyncio" or m.startswith("kubernetes_asyncio.")]:
                del sys.modules[name]
            log.debug("kubernetes_asyncio: importing it whole (%s: %s)", type(exc).__name__, exc)
    from kubernetes_asyncio.client.configuration import Configuration
    from kubernetes_asyncio.client.rest import RESTClientObject
    from kubernetes_asyncio.config import incluster_config, kube_config

    return types.SimpleNamespace(Configuration=Configuration, RESTClientObject=RESTClientObject,
                                 kube_config=kube_config, incluster_config=incluster_config)


class _ApiClientOnDemand:
    """The ``ApiClient`` that kube_config imports by name: it builds one only in
    ``new_client_from_config*``, which nothing here calls. The real class costs dateutil and
    multiprocessing.pool (~1 MiB of RSS), so it is imported when one is built, if ever."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        from kubernetes_asyncio.client.api_client import ApiClient

        return ApiClient(*args, **kwargs)


def _import_bare() -> None:
    spec = importlib.util.find_spec("kubernetes_asyncio")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("kubernetes_asyncio is not installed")
    root = Path(list(spec.submodule_search_locations)[0])
    for name in _BARE_PACKAGES:
        package = types.ModuleType(name)
        package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
        package.__package__ = name
        sys.modules[name] = package
    client = sys.modules["kubernetes_asyncio.client"]
    client.Configuration = importlib.import_module("kubernetes_asyncio.client.configuration").Configuration
    client.ApiClient = _ApiClientOnDemand
    client.rest = importlib.import_module("kubernetes_asyncio.client.rest")
    importlib.import_module("kubernetes_asyncio.config")


class Credentials:
    """A client Configuration plus what it takes to refresh it."""

    def __init__(self, configuration: "Configuration", *, source: str, kubeconfig_loader: Any = None,
                 incluster_loader: Any = None) -> None:
        self.configuration = configuration
        self.source = source
        self._loader = kubeconfig_loader
        self._incluster = incluster_loader
        self._loaded_at = time.monotonic()
        self._tls_checked_at = self._loaded_at
        self._tls_files = self._read_tls_files()
        #: Bumped when a client certificate, key or CA file changed (rotated in place, as the
        #: kubelet's certificate manager does, or rewritten by an exec plugin): the TLS
        #: context must be built again. client-go: transport/cert_rotation.go.
        self.tls_generation = 0
        #: Bumped with it when the client certificate or key changed (not the CA alone):
        #: connections made with the old one must go (client-go's CloseAll).
        self.client_cert_generation = 0

    @classmethod
    async def from_kubeconfig(cls, path: Path, context: str | None = None) -> "Credentials":
        if not path.is_file():
            raise ApiServerConfigError(f"kubeconfig {path}: no such file")
        library = auth_modules()
        configuration = type.__call__(library.Configuration)
        try:
            loader = await library.kube_config.load_kube_config(
                config_file=str(path), context=context, client_configuration=configuration,
                persist_config=False,
            )
        except Exception as exc:  # the library raises ConfigException, KeyError, YAML errors...
            raise ApiServerConfigError(f"kubeconfig {path}: {type(exc).__name__}: {exc}") from exc
        return cls(configuration, source=f"kubeconfig {path}", kubeconfig_loader=loader)

    @classmethod
    def in_cluster(cls, service_account_dir: Path = DEFAULT_SERVICE_ACCOUNT_DIR,
                   environ: Mapping[str, str] | None = None) -> "Credentials":
        """The pod's service account: KUBERNETES_SERVICE_HOST/PORT, token and ca.crt files."""
        library = auth_modules()
        configuration = type.__call__(library.Configuration)
        loader = library.incluster_config.InClusterConfigLoader(
            token_filename=str(service_account_dir / "token"),
            cert_filename=str(service_account_dir / "ca.crt"),
            environ=dict(os.environ if environ is None else environ),
        )
        try:
            loader.load_and_set(configuration)
        except Exception as exc:
            raise ApiServerConfigError(
                f"in-cluster configuration ({service_account_dir}, KUBERNETES_SERVICE_HOST/PORT): {exc} "
                "(not running in a pod? use --kubeconfig)"
            ) from exc
        return cls(configuration, source="in-cluster service account", incluster_loader=loader)

    @property
    def host(self) -> str:
        return self.configuration.host.rstrip("/")

    async def authorization(self) -> str | None:
        """The Authorization header value, refreshing file tokens and expired exec credentials."""
        now = time.monotonic()
        if self._loader is not None and now - self._loaded_at > CREDENTIAL_REFRESH_SECONDS:
            await self.reload(rejected=False)
        elif self._incluster is not None and now - self._tls_checked_at > CA_REFRESH_SECONDS:
            self._tls_checked_at = now
            self._check_tls_files()
        # For in-cluster, the library's refresh hook re-reads the rotating token file here.
        settings = await self.configuration.auth_settings()
        bearer = settings.get("BearerToken")
        return bearer["value"] if bearer else None

    async def reload(self, *, rejected: bool = True) -> None:
        """Load the credentials again: periodically (token files; exec plugins whose
        credential expired), or after a 401 (``rejected``: whatever was cached is stale)."""
        self._loaded_at = time.monotonic()
        if self._incluster is not None:
            # The library's refresh hook re-reads the token file once this moment has passed.
            self._incluster.token_expires_at = datetime.datetime.now()
            return
        if self._loader is None:
            return
        if rejected and hasattr(self._loader, "exec_plugin_expiry"):
            del self._loader.exec_plugin_expiry
        try:
            await self._loader.load_and_set(self.configuration)
        except Exception as exc:
            log.warning("%s: reloading credentials failed: %s", self.source, exc)
        self._check_tls_files()

    def _check_tls_files(self) -> None:
        tls_files = self._read_tls_files()
        if tls_files != self._tls_files:
            if [f for f in tls_files if f[0] != "ca"] != [f for f in self._tls_files if f[0] != "ca"]:
                self.client_cert_generation += 1
            self._tls_files = tls_files
            self.tls_generation += 1
            log.info("%s: the client certificate or CA changed; reconnecting with it", self.source)

    def _read_tls_files(self) -> tuple[tuple[str, str, str], ...]:
        """(role, path, digest of the contents) of the certificate, key and CA files: a file
        rewritten in place keeps its path (and may keep its mtime), so the contents decide."""
        configuration = self.configuration
        files = []
        for role, path in (("cert", configuration.cert_file), ("key", configuration.key_file),
                           ("ca", configuration.ssl_ca_cert)):
            if path:
                try:
                    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                except OSError as exc:
                    digest = f"unreadable: {exc.strerror}"
                files.append((role, str(path), digest))
        return tuple(files)


class ApiConnection:
    """GET requests to one API server, with the session its configuration describes."""

    def __init__(self, credentials: Credentials, *, connect_timeout: float = 10.0,
                 list_timeout: float = 60.0) -> None:
        self.credentials = credentials
        self._connect_timeout = connect_timeout
        self._list_timeout = list_timeout
        self._rest: "RESTClientObject | None" = None
        self._tls_generation = -1
        self._client_cert_generation = credentials.client_cert_generation
        #: requests under way per session; a session replaced after a CA change (only) is
        #: closed once its requests are done: open watches go on, as client-go's
        #: transport/ca_rotation.go closes only the idle connections of the old transport.
        self._in_flight: dict[Any, int] = {}
        self._retired: set[Any] = set()
        #: the changed certificate files could not be used: the previous session is kept
        self.problem: str | None = None

    async def open(self) -> None:
        """Build the session (the TLS context from the certificate files) if there is none,
        or again when the credentials' files changed since it was built."""
        generation = self.credentials.tls_generation
        if self._rest is not None and self._tls_generation == generation:
            return
        try:
            rest = auth_modules().RESTClientObject(self.credentials.configuration)
        except (OSError, ValueError) as exc:  # unreadable CA, or a key not matching the certificate
            problem = f"{self.credentials.source}: TLS set-up: {exc}"
            if self._rest is None:
                raise ApiServerConfigError(problem) from exc
            # Half-way through a rotation (a new certificate, its key not yet written; an
            # empty CA file): client-go keeps what it loaded before, so does this. The next
            # change of the files is tried again.
            self._tls_generation = generation
            self.problem = f"{problem}; the session made with the previous files is kept"
            log.error("%s", self.problem)
            return
        if self.problem is not None:
            log.info("%s: resolved: the certificate files are usable again", self.credentials.source)
            self.problem = None
        previous, self._rest, self._tls_generation = self._rest, rest, generation
        cert_changed = self._client_cert_generation != self.credentials.client_cert_generation
        self._client_cert_generation = self.credentials.client_cert_generation
        if previous is not None:
            if cert_changed or not self._in_flight.get(previous):
                await previous.close()  # open streams end and resume from their resourceVersion
            else:
                self._retired.add(previous)

    async def close(self) -> None:
        for rest in [*self._retired, self._rest]:
            if rest is not None:
                await rest.close()
        self._retired.clear()
        self._rest = None

    async def server_version(self) -> str | None:
        """The API server's ``gitVersion`` (``GET /version``, which every authenticated or
        anonymous user may read: the ``system:public-info-viewer`` ClusterRole), or None when it
        cannot be had."""
        try:
            body = await self.get_bytes("/version", {}, verb="get")
            version = json.loads(body).get("gitVersion")
        except (ApiStatusError, aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError, AttributeError):
            return None
        return version if isinstance(version, str) and version else None

    async def get_bytes(self, path: str, params: Mapping[str, str], *, verb: str) -> bytes:
        """The body of a successful GET (a list); ApiStatusError otherwise."""
        timeout = aiohttp.ClientTimeout(total=self._list_timeout, sock_connect=self._connect_timeout)
        async with self._request(path, params, verb=verb, timeout=timeout) as response:
            return await response.read()

    def stream(self, path: str, params: Mapping[str, str], *, verb: str
               ) -> "contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse]":
        """A watch response whose body is read as it arrives. No overall timeout: the
        caller bounds the wait for the response and for each read (its stall timeout)."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout)
        return self._request(path, params, verb=verb, timeout=timeout)

    @contextlib.asynccontextmanager
    async def _request(self, path: str, params: Mapping[str, str], *, verb: str,
                       timeout: aiohttp.ClientTimeout) -> AsyncIterator[aiohttp.ClientResponse]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        authorization = await self.credentials.authorization()
        if authorization:
            headers["Authorization"] = authorization
        await self.open()  # after the await above: the session may have been replaced meanwhile
        rest = self._rest
        assert rest is not None
        extra: dict[str, Any] = {}
        if rest.server_hostname:
            extra["server_hostname"] = rest.server_hostname
        if rest.proxy:
            extra["proxy"] = rest.proxy
        url = self.credentials.host + path
        self._in_flight[rest] = self._in_flight.get(rest, 0) + 1
        try:
            async with rest.pool_manager.get(url, params=dict(params), headers=headers, timeout=timeout,
                                             **extra) as response:
                if response.status != 200:
                    raise await self._error(response, verb, path)
                yield response
        finally:
            self._in_flight[rest] -= 1
            if not self._in_flight[rest]:
                del self._in_flight[rest]
                if rest in self._retired:  # replaced after a CA change: its last request is done
                    self._retired.discard(rest)
                    await rest.close()

    async def _error(self, response: aiohttp.ClientResponse, verb: str, path: str) -> ApiStatusError:
        body = await response.read()
        status = parse_status(body) if body else None
        if response.status == 401:
            # Whatever was cached is stale; a rotated client certificate gets a new session
            # at the next request (open()).
            await self.credentials.reload()
        return ApiStatusError(response.status, status, retry_after=_retry_after(response, status),
                              verb=verb, path=path)


def _retry_after(response: aiohttp.ClientResponse, status: Status | None) -> float | None:
    header = response.headers.get("Retry-After")
    if header is not None:
        try:
            return max(0.0, float(header))
        except ValueError:
            pass  # an HTTP date: rare from the API server; fall back to the Status
    if status is not None and status.details is not None and status.details.retry_after_seconds is not None:
        return float(status.details.retry_after_seconds)
    return None


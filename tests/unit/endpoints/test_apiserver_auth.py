"""The kube-apiserver source's configuration and credentials: kubeconfig (token, client
certificate, exec plugin), in-cluster service account (and its token rotation), RBAC and
authentication failures reported in words an operator can act on."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import aiohttp
import pytest

from kubeport.endpoints.apiserver import client as apiclient
from kubeport.endpoints.apiserver.client import ApiConnection, Credentials
from kubeport.endpoints.apiserver.source import ApiServerConfigError, ApiServerSource
from kubeport.endpoints.state import ClusterState
from kubeport.endpoints.types import ServiceName

from support.apiserver import objects as k8s
from support.apiserver.harness import (  # noqa: F401  (running, tls: fixtures)
    FAST,
    RecordingState,
    running,
    seed,
    snapshot_where,
    synced,
    tls,
)
from support.apiserver.server import FakeApiServer
from support.apiserver.tls import TlsFiles, _sign, make_tls, write_kubeconfig, write_service_account
from support.wait import until


# --- permissions and credentials -----------------------------------------------------------------


async def test_rbac_403_names_the_missing_permission_and_the_rule_to_add(running):
    server, source, state = await running(seeded=False)
    server.forbid("endpointslices", "watch")
    server.forbid("endpointslices", "list")
    seed(server)
    await until(lambda: source.problems, "a problem")
    [problem] = source.problems
    assert ('endpointslices.discovery.k8s.io is forbidden: User "system:serviceaccount:kube-system:kubeport" '
            'cannot watch resource "endpointslices" in API group "discovery.k8s.io" at the cluster scope') in problem
    assert '{apiGroups: ["discovery.k8s.io"], resources: ["endpointslices"], verbs: ["get", "list", "watch"]}' \
        in problem
    assert not state.snapshot.synced
    server.permit("endpointslices", "watch")
    server.permit("endpointslices", "list")
    await synced(state, source)
    assert source.problems == []


async def test_wrong_token_is_reported_as_unauthorized(running, tmp_path, tls):
    server, source, state = await running(kubeconfig=lambda server: write_kubeconfig(
        tmp_path / "kubeconfig", server.url, ca=tls.ca_cert, token="stolen"))
    await until(lambda: source.problems, "a problem")
    assert all("401 Unauthorized" in p for p in source.problems)
    assert not state.snapshot.synced


async def test_in_cluster_configuration_from_the_service_account_dir(running, tmp_path, tls):
    server = await FakeApiServer(tls=tls.server_context()).start()
    try:
        seed(server)
        account = write_service_account(tmp_path / "serviceaccount", token=server.token, ca=tls.ca_cert)
        port = server.url.rsplit(":", 1)[1]
        state = RecordingState()
        source = ApiServerSource(state, in_cluster=True, node_name="node-a", backoff=FAST,
                                 service_account_dir=account,
                                 environ={"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port})
        task = asyncio.create_task(source.run())
        try:
            await synced(state, source)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await server.stop()


async def test_a_rotated_service_account_token_is_reread_after_401(tmp_path, tls):
    """Bound service-account tokens rotate in the mounted file: read it again, as client-go."""
    server = await FakeApiServer(tls=tls.server_context(), token="token-1").start()
    account = write_service_account(tmp_path / "serviceaccount", token="token-1", ca=tls.ca_cert)
    state = RecordingState()
    source = ApiServerSource(state, in_cluster=True, node_name="node-a", backoff=FAST, service_account_dir=account,
                             environ={"KUBERNETES_SERVICE_HOST": "127.0.0.1",
                                      "KUBERNETES_SERVICE_PORT": server.url.rsplit(":", 1)[1]})
    task = asyncio.create_task(source.run())
    try:
        seed(server)
        await synced(state, source)
        server.token = "token-2"                     # the old token is now refused...
        (account / "token").write_text("token-2")    # ...and the kubelet wrote the new one
        server.cut_watches("services")
        server.apply(k8s.service("after-rotation", cluster_ip="10.96.0.70"))
        await snapshot_where(state, lambda s: ServiceName("default", "after-rotation") in s.services,
                             "the service seen with the new token")
        assert source.stats["Service"].failures["401"] >= 1
        await until(lambda: not source.problems, "the 401 problem to clear")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop()


async def test_in_cluster_outside_a_pod_is_a_clear_configuration_error(tmp_path):
    source = ApiServerSource(ClusterState("node-a"), in_cluster=True, node_name="node-a",
                             service_account_dir=tmp_path, environ={})
    with pytest.raises(ApiServerConfigError, match="KUBERNETES_SERVICE_HOST.*use --kubeconfig"):
        await source.run()


async def test_client_certificate_from_the_kubeconfig_authenticates(running, tmp_path, tls):
    server, source, state = await running(server_options={"token": None}, kubeconfig=lambda server: write_kubeconfig(
        tmp_path / "kubeconfig", server.url, ca=tls.ca_cert, client_cert=tls.client_cert, client_key=tls.client_key))
    await synced(state, source)


async def test_exec_plugin_credentials_authenticate(running, tmp_path, tls):
    server, source, state = await running(server_options={"token": "from-exec"}, kubeconfig=lambda server: (
        write_kubeconfig(tmp_path / "kubeconfig", server.url, ca=tls.ca_cert, exec_token="from-exec")))
    await synced(state, source)


@pytest.mark.parametrize("problem, expected", [
    ("missing", "no such file"),
    ("context", "nope"),
], ids=["missing_file", "unknown_context"])
async def test_unusable_kubeconfig_is_a_clear_configuration_error(tmp_path, problem, expected):
    path = tmp_path / "kubeconfig"
    if problem != "missing":
        write_kubeconfig(path, "https://127.0.0.1:6443", token="t")
    source = ApiServerSource(ClusterState("node-a"), kubeconfig=path, node_name="node-a",
                             context="nope" if problem == "context" else None)
    with pytest.raises(ApiServerConfigError, match=expected):
        await source.run()


# --- client certificates rotated on disk -----------------------------------------------------------------

CLIENT_EXTENSIONS = ("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                     "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\nextendedKeyUsage=clientAuth\n")


def rotating_pki(directory: Path) -> tuple[TlsFiles, Path, Path, Path, Path]:
    """A CA with two client certificates (CN old-cert, new-cert) and the "current" pair
    a kubeconfig names by path, holding the old one (the kubelet's kubelet-client-current.pem)."""
    pki = make_tls(directory / "pki", client_user="old-cert")
    _sign(directory / "pki", "client-new", "/O=system:nodes/CN=new-cert", CLIENT_EXTENSIONS)
    current_cert, current_key = directory / "client-current.crt", directory / "client-current.key"
    shutil.copy(pki.client_cert, current_cert)
    shutil.copy(pki.client_key, current_key)
    return pki, current_cert, current_key, directory / "pki" / "client-new.crt", directory / "pki" / "client-new.key"


def file_kubeconfig(path: Path, server: str, ca: Path, cert: Path, key: Path) -> Path:
    """A kubeconfig naming certificate files (not inline data), as the kubelet's does."""
    user = {"client-certificate": str(cert), "client-key": str(key)}
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "node",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "node", "context": {"cluster": "c", "user": "u"}}]}))
    return path


async def test_credentials_notice_certificate_files_rewritten_in_place(tmp_path):
    pki, cert, key, new_cert, new_key = rotating_pki(tmp_path)
    credentials = await Credentials.from_kubeconfig(
        file_kubeconfig(tmp_path / "kubeconfig", "https://127.0.0.1:6443", pki.ca_cert, cert, key))
    await credentials.reload(rejected=False)
    assert credentials.tls_generation == 0                  # nothing changed: the session stays
    cert.touch()
    await credentials.reload(rejected=False)
    assert credentials.tls_generation == 0                  # same contents, newer mtime: still nothing
    shutil.copy(new_cert, cert)
    shutil.copy(new_key, key)
    await credentials.reload(rejected=False)                # the periodic reload (as after a 401)
    assert credentials.tls_generation == 1


async def test_a_client_certificate_rotated_in_place_is_used__client_go_cert_rotation(tmp_path):
    """The kubelet's certificate manager rewrites the files the kubeconfig names; the old
    certificate stops being accepted. Half-way (new certificate, old key), the session made with
    the previous files stays, and the next change of the files is tried."""
    pki, cert, key, new_cert, new_key = rotating_pki(tmp_path)
    server = await FakeApiServer(token=None, tls=pki.server_context()).start()
    state = RecordingState()
    source = ApiServerSource(state, node_name="node-a", backoff=FAST,
                             kubeconfig=file_kubeconfig(tmp_path / "kubeconfig", server.url, pki.ca_cert, cert, key))
    task = asyncio.create_task(source.run())
    try:
        seed(server)
        await synced(state, source)
        server.refused_users.add("old-cert")
        shutil.copy(new_cert, cert)                          # the certificate first...
        server.cut_watches("services")
        server.bookmark("services")
        # client-go keeps the certificate it has while the new pair does not load; so does kubeport
        await until(lambda: any("TLS set-up" in p and "previous files is kept" in p for p in source.problems),
                         "the half-rotated pair reported")
        shutil.copy(new_key, key)                            # ...then its key
        server.apply(k8s.service("after-rotation", cluster_ip="10.96.0.70"))
        await snapshot_where(state, lambda s: ServiceName("default", "after-rotation") in s.services,
                             "the service seen with the new certificate")
        assert source.stats["Service"].failures["401"] >= 1
        await until(lambda: not source.problems, "the problems to clear")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop()


async def test_in_cluster_ca_rewritten_by_the_kubelet_is_used__client_go_ca_rotation(tmp_path, tls, monkeypatch):
    """client-go re-reads a CA file every 5 minutes (ClientsAllowCARotation) and keeps the roots
    it has when the file is empty or unusable; the pod's ca.crt is rewritten when the CA rotates."""
    account = write_service_account(tmp_path / "serviceaccount", token="t", ca=tls.ca_cert)
    credentials = Credentials.in_cluster(
        account, environ={"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"})
    connection = ApiConnection(credentials)
    await connection.open()
    first = connection._rest
    try:
        await credentials.authorization()
        assert credentials.tls_generation == 0               # not yet time to look
        monkeypatch.setattr(apiclient, "CA_REFRESH_SECONDS", -1.0)
        await credentials.authorization()
        await connection.open()
        assert credentials.tls_generation == 0 and connection._rest is first  # same contents
        (account / "ca.crt").write_text("")                  # caught mid-write
        await credentials.authorization()
        await connection.open()
        assert credentials.tls_generation == 1 and connection._rest is first
        assert "TLS set-up" in connection.problem
        shutil.copy(make_tls(tmp_path / "rotated").ca_cert, account / "ca.crt")
        await credentials.authorization()
        await connection.open()
        assert credentials.tls_generation == 2 and connection._rest is not first
        assert connection.problem is None
    finally:
        await connection.close()


async def open_watch(connection: ApiConnection, server: FakeApiServer):
    listed = json.loads(await connection.get_bytes("/api/v1/services", {}, verb="list"))
    return connection.stream("/api/v1/services", {"watch": "1", "resourceVersion": listed["metadata"]["resourceVersion"]},
                             verb="watch")


@pytest.mark.parametrize(("rewrite", "watch_survives"), [
    pytest.param("ca", True, id="ca_only__open_watches_go_on__client_go_ca_rotation_closes_idle_only"),
    pytest.param("cert", False, id="client_certificate__every_connection_goes__client_go_cert_rotation_closeall"),
])
async def test_a_rotation_replaces_the_session_for_new_requests(tmp_path, tls, rewrite, watch_survives):
    pki, cert, key, new_cert, new_key = rotating_pki(tmp_path)
    server = await FakeApiServer(token=None, tls=pki.server_context()).start()
    ca = tmp_path / "ca.crt"
    shutil.copy(pki.ca_cert, ca)
    credentials = await Credentials.from_kubeconfig(file_kubeconfig(tmp_path / "kubeconfig", server.url, ca, cert, key))
    connection = ApiConnection(credentials)
    try:
        seed(server)
        async with await open_watch(connection, server) as watch:
            first = connection._rest
            if rewrite == "ca":  # a bundle: the old CA and one more, as a rotation starts
                ca.write_bytes(pki.ca_cert.read_bytes() + make_tls(tmp_path / "next").ca_cert.read_bytes())
            else:
                shutil.copy(new_cert, cert)
                shutil.copy(new_key, key)
            await credentials.reload(rejected=False)
            await connection.get_bytes("/api/v1/services", {}, verb="list")  # a new request: a new session
            assert connection._rest is not first
            server.apply(k8s.service("after-rotation", cluster_ip="10.96.0.70"))
            try:
                line = await asyncio.wait_for(watch.content.readline(), 3)
            except (aiohttp.ClientError, asyncio.TimeoutError, RuntimeError):  # aiohttp: "Connection closed."
                line = b""
            assert (b"after-rotation" in line) is watch_survives, line
        assert not connection._retired  # the old session closed with its last request
    finally:
        await connection.close()
        await server.stop()

"""Certificates, kubeconfigs and service-account directories for the fake API server.

A private CA signs the server certificate (SAN 127.0.0.1) and a client certificate, made
with the openssl CLI, as kubeadm lays them out. Nothing here touches the network.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def server_context(self, *, verify_clients: bool = True) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.server_cert, self.server_key)
        if verify_clients:
            # Like kube-apiserver's --client-ca-file: a client certificate is optional, and
            # when presented it authenticates the user named by its CN.
            context.verify_mode = ssl.CERT_OPTIONAL
            context.load_verify_locations(self.ca_cert)
        return context


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _sign(directory: Path, name: str, subject: str, extensions: str) -> None:
    _openssl("req", *EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=directory)
    (directory / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=directory)


def make_tls(directory: Path, *, client_user: str = "system:node:node-a") -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", *EC, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=kubernetes", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", cwd=directory)
    common = ("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
              "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n")
    _sign(directory, "apiserver", "/CN=kube-apiserver",
          common + "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _sign(directory, "client", f"/O=system:nodes/CN={client_user}", common + "extendedKeyUsage=clientAuth\n")
    return TlsFiles(directory / "ca.crt", directory / "apiserver.crt", directory / "apiserver.key",
                    directory / "client.crt", directory / "client.key")


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, *, ca: Path | None = None, token: str | None = None,
                     client_cert: Path | None = None, client_key: Path | None = None,
                     exec_token: str | None = None, token_file: Path | None = None,
                     context: str = "fake", extra_contexts: tuple[str, ...] = ()) -> Path:
    """A kubeconfig as kubeadm/kind write them (certificate data inline, base64)."""
    cluster: dict = {"server": server}
    if ca is not None:
        cluster["certificate-authority-data"] = _b64(ca)
    user: dict = {}
    if token is not None:
        user["token"] = token
    if token_file is not None:
        user["tokenFile"] = str(token_file)
    if client_cert is not None and client_key is not None:
        user["client-certificate-data"] = _b64(client_cert)
        user["client-key-data"] = _b64(client_key)
    if exec_token is not None:
        credential = json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                                 "status": {"token": exec_token}})
        user["exec"] = {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/sh",
                        "args": ["-c", f"printf '%s' '{credential}'"], "interactiveMode": "Never"}
    contexts = [{"name": name, "context": {"cluster": "fake-cluster", "user": "fake-user"}}
                for name in (context, *extra_contexts)]
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": context, "preferences": {},
        "clusters": [{"name": "fake-cluster", "cluster": cluster}],
        "users": [{"name": "fake-user", "user": user}],
        "contexts": contexts,
    }
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    return path


def write_service_account(directory: Path, *, token: str, ca: Path, namespace: str = "kube-system") -> Path:
    """What the kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(token)
    (directory / "ca.crt").write_bytes(ca.read_bytes())
    (directory / "namespace").write_text(namespace)
    return directory

"""Small blocking probes, meant to run on a thread inside a namespace (Topology.call_in)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

from dnslib import QTYPE, RCODE, DNSRecord


def tcp_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_status(url: str, timeout: float = 1.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def http_json(url: str, timeout: float = 1.0):
    """The decoded JSON body of a GET, or None when it fails."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.load(response)
    except (OSError, ValueError):
        return None


def unix_http_json(path: str, resource: str, timeout: float = 1.0):
    """The decoded JSON body of a GET over a Unix socket (the daemon's status API), or None."""
    request = f"GET {resource} HTTP/1.0\r\nHost: kubeport\r\n\r\n".encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendall(request)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        if head.split(b" ", 2)[1:2] != [b"200"]:
            return None
        return json.loads(body)
    except (OSError, ValueError, IndexError):
        return None


def dns_answers(server: str, name: str, qtype: str = "A", port: int = 53,
                timeout: float = 0.5) -> tuple[str, list[str]] | None:
    """(rcode, sorted rdata texts) of one UDP query, or None without an answer."""
    query = DNSRecord.question(name, qtype)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.sendto(query.pack(), (server, port))
            data, _ = sock.recvfrom(4096)
        except OSError:
            return None
    reply = DNSRecord.parse(data)
    wanted = getattr(QTYPE, qtype)
    return RCODE.get(reply.header.rcode), sorted(str(rr.rdata) for rr in reply.rr if rr.rtype == wanted)


def http_body(host: str, port: int, timeout: float = 0.5) -> bytes | None:
    """One `Connection: close` request on a new connection; the raw reply, or None if it failed."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            chunks = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks)
    except OSError:
        return None


def open_idle(host: str, port: int, count: int, timeout: float = 5.0) -> list[socket.socket]:
    """``count`` connected TCP sockets that send nothing (the caller closes them)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.create_connection((host, port), timeout=timeout)
            sockets.append(sock)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def close_all(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()


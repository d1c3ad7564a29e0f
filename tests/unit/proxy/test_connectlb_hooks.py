"""Connect-time load balancing in the kernel: the verifier on each of the eight programs, the
maps written, adopted and read back, and the sockets of a child process in a cgroup v2
directory of the test's own with all the programs attached. Traffic stays on loopback: the
Service addresses 127.0.0.240 and fd00::240 are rewritten before routing.

These need root of the host (CAP_BPF, CAP_NET_ADMIN, cgroups): marked host_privileges; where
they have them and still cannot load or attach, they are skipped, but fail under CI=true.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import struct
import subprocess
import sys
import time

import pytest
from conftest import IN_CI

from kubeport.proxy.connectlb import pins, programs
from kubeport.proxy.connectlb.maps import (
    LAYOUTS,
    ConnectMaps,
    affinity_key,
    backend_key,
    decode_affinity_value,
    decode_backend_value,
    decode_service_value,
    service_key,
)
from kubeport.proxy.connectlb.programs import HOOKS, build_program, connect4_program, load_program, load_programs
from kubeport.proxy.relay.sockmap import Insn

TCP, UDP = socket.IPPROTO_TCP, socket.IPPROTO_UDP
VIP, VIP6 = "127.0.0.240", "fd00::240"
LOOPBACK = {4: "127.0.0.1", 6: "::1"}
SO_NETNS_COOKIE = 71  # include/uapi/asm-generic/socket.h

pytestmark = pytest.mark.host_privileges("BPF programs attached to a cgroup of the host")


def require_connectlb() -> None:
    """Skip where the programs cannot be loaded or attached; under CI=true fail instead."""
    try:
        with contextlib.closing(ConnectMaps.create(4)) as lb:
            for fd in load_programs(lb).values():
                os.close(fd)
        if programs.cgroup2_mount() is None:
            raise OSError(errno.ENOENT, "no cgroup v2 hierarchy mounted")
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        if IN_CI:
            pytest.fail(f"connect-time load balancing cannot run under CI=true: {exc}")
        pytest.skip(f"no connect-time load balancing here: {exc}")


@contextlib.contextmanager
def attached(prog_fds: dict[int, int]):
    """A fresh cgroup v2 directory with the programs (attach type -> fd) attached; detached and
    removed, always."""
    path = programs.cgroup2_mount() / f"kubeport-test-connectlb-{os.getpid()}-{time.monotonic_ns()}"
    path.mkdir()
    try:
        cgroup_fd = pins.open_cgroup(path)
        try:
            with contextlib.ExitStack() as stack:
                for attach_type, prog_fd in prog_fds.items():
                    programs.attach(cgroup_fd, prog_fd, attach_type)
                    stack.callback(programs.detach, cgroup_fd, prog_fd, attach_type)
                yield path
        finally:
            os.close(cgroup_fd)
    finally:
        path.rmdir()


#: run in the child: joins the cgroup first (a socket belongs to its creator's cgroup), then per
#: target says what it got: the peer's address (tcp, udp: connected), the reply's source
#: (sendto: unconnected UDP, waits for one reply), or the errno.
CHILD = r"""
import json, os, socket, sys
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as procs:
    procs.write(str(os.getpid()))
results = []
for kind, host, port in json.loads(sys.argv[2]):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
    sock.settimeout(5)
    try:
        if kind == "sendto":
            sock.sendto(b"ping", (host, port))
            results.append(list(sock.recvfrom(16)[1][:2]))
        else:
            sock.connect((host, port))
            sock.send(b"ping")
            results.append(list(sock.getpeername()[:2]))
    except OSError as exc:
        results.append(exc.errno)
    finally:
        sock.close()
print(json.dumps(results))
"""


def _results(stdout: str) -> list:
    return [tuple(found) if isinstance(found, list) else found for found in json.loads(stdout)]


def connect_from(cgroup, targets: list[tuple[str, str, int]]) -> list:
    done = subprocess.run([sys.executable, "-c", CHILD, str(cgroup), json.dumps(targets)],
                          capture_output=True, text=True, timeout=30, check=True)
    return _results(done.stdout)


def sendto_from(cgroup, host: str, port: int, backend: socket.socket) -> tuple[tuple | int, tuple]:
    """The child's sendto(host, port) and its wait for a reply, which ``backend`` sends:
    (what the child saw as the reply's source, or the errno; where the datagram came from)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(cgroup), json.dumps([("sendto", host, port)])],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        data, source = backend.recvfrom(16)
        assert data == b"ping"
        backend.sendto(b"pong", source)
        stdout, stderr = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, stderr
    return _results(stdout)[0], source


def listener(address: str, kind: str = "tcp") -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
    sock.bind((address, 0))
    if kind == "tcp":
        sock.listen(64)
    sock.settimeout(5)
    return sock


def port_of(sock: socket.socket) -> int:
    return sock.getsockname()[1]


def free_port(address: str) -> int:
    """A port nothing listens on at ``address`` (bound and let go); any port at fd00::240, which
    is not this host's: one of ::1's keeps the tests' service ports apart."""
    address = "::1" if address == VIP6 else address
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as sock:
        sock.bind((address, 0))
        return port_of(sock)


def accepted(*listeners: socket.socket) -> list[int]:
    """How many connections wait in each listener's queue (accepted and closed here)."""
    counts = []
    for sock in listeners:
        sock.setblocking(False)
        count = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                sock.accept()[0].close()
                count += 1
        sock.settimeout(5)
        counts.append(count)
    return counts


@pytest.fixture(scope="module")
def lb():
    """The maps and the eight programs attached to a cgroup of this module's."""
    require_connectlb()
    with contextlib.ExitStack() as stack:
        lb = stack.enter_context(contextlib.closing(ConnectMaps.create(64)))
        prog_fds = load_programs(lb)
        for fd in prog_fds.values():
            stack.callback(os.close, fd)
        cgroup = stack.enter_context(attached({attach_type: prog_fds[hook] for hook, attach_type in HOOKS}))
        yield lb, cgroup


# --- the verifier ------------------------------------------------------------------------------


@pytest.mark.parametrize(("hook", "attach_type"), HOOKS)
def test_the_verifier_accepts_each_program(hook, attach_type):
    require_connectlb()
    with contextlib.closing(ConnectMaps.create(4)) as lb:
        fd, log = load_program(build_program(hook, lb), attach_type, hook,
                               log_level=programs.BPF_LOG_LEVEL1 | programs.BPF_LOG_STATS)
        os.close(fd)
    assert "processed" in log


def test_the_verifier_accepts_connect4_without_set_retval():
    require_connectlb()
    with contextlib.closing(ConnectMaps.create(4)) as lb:
        fd, _ = load_program(connect4_program(lb.fds(), refuse_errno=None))
        os.close(fd)


def test_the_verifier_refuses_a_backend_used_unchecked_and_its_log_says_why():
    require_connectlb()
    with contextlib.closing(ConnectMaps.create(4)) as lb:
        program = connect4_program(lb.fds())
        backends = program.index(Insn(0x18, 1, 1, 0, lb.fds()["backends4"]))
        check = backends + 5  # after the map, r2 = r10 - 28 and the lookup call
        assert program[check].code == 0x15 and program[check].dst == 0
        program[check] = Insn(0x05)  # the backend's NULL check made a "goto +0"
        with pytest.raises(programs.ProgramRejected, match="map_value_or_null"):
            load_program(program)


def test_load_programs__closes_what_it_loaded_when_one_is_refused(monkeypatch):
    require_connectlb()
    opened_before = set(os.listdir("/proc/self/fd"))
    original = programs.build_program

    def broken(hook, maps_):
        program = original(hook, maps_)
        return program[:-1] if hook == "recvmsg4" else program  # no exit: refused

    monkeypatch.setattr(programs, "build_program", broken)
    with contextlib.closing(ConnectMaps.create(4)) as lb:
        maps_open = set(os.listdir("/proc/self/fd"))
        with pytest.raises(programs.ProgramRejected):
            load_programs(lb)
        assert set(os.listdir("/proc/self/fd")) == maps_open
    assert set(os.listdir("/proc/self/fd")) == opened_before


# --- the maps ----------------------------------------------------------------------------------


def test_connect_maps__a_service_port_written_rewritten_and_removed():
    require_connectlb()
    with contextlib.closing(ConnectMaps.create(8)) as lb:
        lb.set_service(VIP, 80, TCP, [("10.0.0.1", 8080), ("10.0.0.2", 8081)])
        found = decode_service_value(lb.services.lookup(service_key(VIP, 80, TCP)))
        assert found.count == 2
        assert lb.backends_of(VIP, 80, TCP) == [("10.0.0.1", 8080), ("10.0.0.2", 8081)]
        lb.set_service(VIP, 80, TCP, [("10.0.0.3", 9090)])
        assert lb.backends.lookup(backend_key(found.slot_base)) is None  # the old range freed
        again = decode_service_value(lb.services.lookup(service_key(VIP, 80, TCP)))
        assert (again.count, again.id) == (1, found.id)  # the id stays: affinity and membership keep
        assert decode_backend_value(lb.backends.lookup(backend_key(again.slot_base))) == ("10.0.0.3", 9090)
        assert lb.backends_of(VIP, 80, UDP) is None
        lb.remove_service(VIP, 80, TCP)
        assert lb.backends_of(VIP, 80, TCP) is None
        assert lb.backends.lookup(backend_key(again.slot_base)) is None
        assert lb.service_ports() == set() and lb.connects() == {}


def test_connect_maps__both_families_and_their_checks():
    require_connectlb()
    with contextlib.closing(ConnectMaps.create(8)) as lb:
        lb.set_service(VIP6, 53, UDP, [("fd00::1", 5353), ("::1", 53)], affinity_timeout=10800)
        lb.set_service(VIP, 53, UDP, [("10.0.0.1", 5353)])
        lb.set_service("10.96.0.1", 443, TCP, [])
        assert lb.service_ports() == {(VIP6, 53, UDP), (VIP, 53, UDP), ("10.96.0.1", 443, TCP)}
        assert lb.backends_of("fd00:0::240", 53, UDP) == [("fd00::1", 5353), ("::1", 53)]
        assert lb.backends_of("10.96.0.1", 443, TCP) == []
        assert lb.connects() == {(VIP6, 53, UDP): 0, (VIP, 53, UDP): 0, ("10.96.0.1", 443, TCP): 0}
        ids = {lb.service_id(*key) for key in lb.service_ports()}
        assert len(ids) == 3 and 0 not in ids
        with pytest.raises(ValueError, match="endpoint 10.0.0.1 of another family than fd00::240"):
            lb.set_service(VIP6, 80, TCP, [("10.0.0.1", 80)])
        with pytest.raises(ValueError, match="IPv4-mapped"):
            lb.set_service("::ffff:10.96.0.1", 80, TCP, [])
        assert set(lb.fds()) == set(LAYOUTS)


def test_adopt__sees_what_a_predecessor_wrote_and_reuses_none_of_its_slots():
    require_connectlb()
    with contextlib.closing(ConnectMaps.create(8)) as old:
        old.set_service(VIP, 80, TCP, [("10.0.0.1", 80), ("10.0.0.2", 80)], affinity_timeout=60)
        old.set_service(VIP6, 80, TCP, [("fd00::1", 80)])
        old.set_service(VIP, 81, TCP, [("10.0.0.3", 80)])
        old.remove_service(VIP, 81, TCP)  # a hole: slot 2 free again
        with contextlib.closing(ConnectMaps.adopt({name: os.dup(fd) for name, fd in old.fds().items()})) as new:
            assert new.service_ports() == old.service_ports() == {(VIP, 80, TCP), (VIP6, 80, TCP)}
            assert new.backends_of(VIP, 80, TCP) == [("10.0.0.1", 80), ("10.0.0.2", 80)]
            assert new.backends_of(VIP6, 80, TCP) == [("fd00::1", 80)]
            held = decode_service_value(new.services.lookup(service_key(VIP, 80, TCP)))
            new.set_service(VIP, 82, TCP, [("10.0.0.4", 80), ("10.0.0.5", 80), ("10.0.0.6", 80)])
            added = decode_service_value(new.services.lookup(service_key(VIP, 82, TCP)))
            in_use = {held.slot_base + i for i in range(held.count)}
            assert in_use.isdisjoint(added.slot_base + i for i in range(added.count))
            assert added.id not in {held.id, new.service_id(VIP6, 80, TCP)}
            assert old.backends_of(VIP, 80, TCP) == [("10.0.0.1", 80), ("10.0.0.2", 80)]
            # an update after adoption keeps the id and frees the predecessor's range
            new.set_service(VIP, 80, TCP, [("10.0.0.2", 80)], affinity_timeout=60)
            assert new.service_id(VIP, 80, TCP) == held.id
            assert all(new.backends.lookup(backend_key(slot)) is None for slot in in_use)


def test_succeed__takes_over_what_the_programs_write_and_the_ids_and_writes_nothing_of_the_predecessors():
    require_connectlb()
    with contextlib.closing(ConnectMaps.create(8)) as old:
        old.set_service(VIP, 80, TCP, [("10.0.0.1", 80)], affinity_timeout=60)
        old.set_service(VIP6, 80, TCP, [("fd00::1", 80)])
        old_ids = {key: old.service_id(*key) for key in old.service_ports()}
        with contextlib.closing(ConnectMaps.succeed({name: os.dup(fd) for name, fd in old.fds().items()})) as new:
            for name in ConnectMaps.PROGRAM_WRITTEN:  # one map: what the old one holds, the new one reads
                key, value = bytes(range(old.maps[name].key_size)), bytes(old.maps[name].value_size)
                old.maps[name].update(key, value)
                assert new.maps[name].lookup(key) == value, name
            assert new.maps["services4"].lookup(service_key(VIP, 80, TCP)) is None
            assert new.service_ports() == set()  # its own maps, empty until written
            new.set_service(VIP, 80, TCP, [("10.0.0.2", 80)])
            new.set_service(VIP, 81, TCP, [("10.0.0.3", 80)])
            assert new.service_id(VIP, 80, TCP) == old_ids[(VIP, 80, TCP)]  # affinity entries name it
            assert new.service_id(VIP, 81, TCP) not in old_ids.values()
            assert old.backends_of(VIP, 80, TCP) == [("10.0.0.1", 80)]  # the predecessor's, untouched
            assert new.backends_of(VIP, 80, TCP) == [("10.0.0.2", 80)]


@pytest.mark.parametrize(("change", "message"), [
    ("missing", "map revnat6 missing"),
    ("resized", r"map revnat6: type, key and value size \(9, 16, 8\), expected \(9, 28, 20\)"),
])
def test_adopt__refuses_a_map_missing_or_of_another_layout(change, message):
    require_connectlb()
    with contextlib.closing(ConnectMaps.create(4)) as old:
        fds = {name: os.dup(fd) for name, fd in old.fds().items()}
        if change == "missing":
            os.close(fds.pop("revnat6"))
        else:
            os.close(fds["revnat6"])
            fds["revnat6"] = os.dup(old.fds()["revnat4"])
        with pytest.raises(ValueError, match=message):
            ConnectMaps.adopt(fds)
        for fd in fds.values():  # taken, and closed with the refusal
            with pytest.raises(OSError, match="Bad file descriptor"):
                os.fstat(fd)


# --- sockets of a child in the cgroup ----------------------------------------------------------


@pytest.mark.parametrize("family", [4, 6])
def test_a_tcp_connect_reaches_the_endpoint_and_getpeername_says_the_service(lb, family):
    maps_, cgroup = lb
    vip = VIP if family == 4 else VIP6
    with listener(LOOPBACK[family]) as backend:
        vip_port = free_port(vip)
        maps_.set_service(vip, vip_port, TCP, [(LOOPBACK[family], port_of(backend))])
        assert connect_from(cgroup, [("tcp", vip, vip_port)]) == [(vip, vip_port)]
        conn, _ = backend.accept()
        with conn:
            conn.settimeout(5)
            assert conn.recv(4) == b"ping"
        assert maps_.connects()[(vip, vip_port, TCP)] == 1


@pytest.mark.parametrize("family", [4, 6])
def test_a_connected_udp_socket_is_sent_to_the_endpoint(lb, family):
    maps_, cgroup = lb
    vip = VIP if family == 4 else VIP6
    with listener(LOOPBACK[family], "udp") as backend:
        vip_port = free_port(vip)
        maps_.set_service(vip, vip_port, UDP, [(LOOPBACK[family], port_of(backend))])
        assert connect_from(cgroup, [("udp", vip, vip_port)]) == [(vip, vip_port)]
        assert backend.recv(16) == b"ping"


@pytest.mark.parametrize("family", [4, 6])
def test_unconnected_udp_goes_to_the_endpoint_and_the_reply_comes_from_the_service(lb, family):
    maps_, cgroup = lb
    vip = VIP if family == 4 else VIP6
    with listener(LOOPBACK[family], "udp") as backend:
        vip_port = free_port(vip)
        maps_.set_service(vip, vip_port, UDP, [(LOOPBACK[family], port_of(backend))])
        seen, source = sendto_from(cgroup, vip, vip_port, backend)
        assert seen == (vip, vip_port)
        assert source[0] == LOOPBACK[family]
        assert maps_.connects()[(vip, vip_port, UDP)] == 0  # a send is not a connect


def test_a_reply_from_an_address_not_dialled_is_left_alone(lb):
    """recvmsg only translates what the socket's own sends translated."""
    maps_, cgroup = lb
    with listener("127.0.0.1", "udp") as backend:
        seen, _ = sendto_from(cgroup, "127.0.0.1", port_of(backend), backend)
        assert seen == ("127.0.0.1", port_of(backend))


@pytest.mark.parametrize("family", [4, 6])
def test_connects_are_spread_over_the_endpoints_without_affinity(lb, family):
    maps_, cgroup = lb
    vip = VIP if family == 4 else VIP6
    with contextlib.ExitStack() as stack:
        backends = [stack.enter_context(listener(LOOPBACK[family])) for _ in range(3)]
        vip_port = free_port(vip)
        maps_.set_service(vip, vip_port, TCP, [(LOOPBACK[family], port_of(b)) for b in backends])
        assert connect_from(cgroup, [("tcp", vip, vip_port)] * 30) == [(vip, vip_port)] * 30
        counts = accepted(*backends)
        assert sum(counts) == 30 and max(counts) < 30
        assert maps_.connects()[(vip, vip_port, TCP)] == 30


@pytest.mark.parametrize("family", [4, 6])
def test_client_ip_affinity__one_endpoint_kept_through_an_added_one_and_dropped_when_it_leaves(lb, family):
    maps_, cgroup = lb
    vip, loopback = (VIP, "127.0.0.1") if family == 4 else (VIP6, "::1")
    with contextlib.ExitStack() as stack:
        backends = [stack.enter_context(listener(loopback)) for _ in range(4)]
        endpoints = [(loopback, port_of(b)) for b in backends]
        vip_port = free_port(vip)
        maps_.set_service(vip, vip_port, TCP, endpoints[:3], affinity_timeout=60)
        connect_from(cgroup, [("tcp", vip, vip_port)] * 20)
        counts = accepted(*backends)
        assert sorted(counts) == [0, 0, 0, 20]
        chosen = counts.index(20)

        maps_.set_service(vip, vip_port, TCP, endpoints, affinity_timeout=60)  # one endpoint more
        connect_from(cgroup, [("tcp", vip, vip_port)] * 20)
        assert accepted(*backends)[chosen] == 20

        maps_.set_service(vip, vip_port, TCP, [e for i, e in enumerate(endpoints) if i != chosen],
                          affinity_timeout=60)  # the chosen one leaves
        connect_from(cgroup, [("tcp", vip, vip_port)] * 20)
        counts = accepted(*backends)
        assert counts[chosen] == 0 and sorted(counts) == [0, 0, 0, 20]  # a new one, kept

        maps_.set_service(vip, vip_port, TCP, endpoints, affinity_timeout=60)  # back: not the chosen one
        connect_from(cgroup, [("tcp", vip, vip_port)] * 10)
        assert accepted(*backends) == [0 if c == 0 else 10 for c in counts]


def netns_cookie() -> int:
    """This process's network namespace's cookie, the child's too (SO_NETNS_COOKIE, Linux 5.14)."""
    with socket.socket() as sock:
        return struct.unpack("=Q", sock.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8))[0]


def test_client_ip_affinity__refreshed_on_use_and_chosen_again_once_expired(lb):
    """The entry's last use is bpf_ktime_get_ns (CLOCK_MONOTONIC): set back by more than the
    timeout, it is expired without waiting for it."""
    maps_, cgroup = lb
    with contextlib.ExitStack() as stack:
        backends = [stack.enter_context(listener("127.0.0.1")) for _ in range(2)]
        vip_port = free_port(VIP)
        maps_.set_service(VIP, vip_port, TCP, [("127.0.0.1", port_of(b)) for b in backends], affinity_timeout=1)
        key = affinity_key(netns_cookie(), maps_.service_id(VIP, vip_port, TCP))
        affinity = maps_.maps["affinity"]
        before = time.monotonic_ns()
        connect_from(cgroup, [("tcp", VIP, vip_port)])
        last, address, port = decode_affinity_value(affinity.lookup(key))
        assert last >= before and (address, port) in {("127.0.0.1", port_of(b)) for b in backends}
        first = accepted(*backends)
        chosen = first.index(1)
        connect_from(cgroup, [("tcp", VIP, vip_port)])
        assert accepted(*backends) == first
        assert decode_affinity_value(affinity.lookup(key))[0] > last  # refreshed

        for _ in range(64):  # a fresh choice is the other endpoint half of the time
            stale = decode_affinity_value(affinity.lookup(key))[0] - 1_100_000_000
            affinity.update(key, struct.pack("=Q", stale) + affinity.lookup(key)[8:])
            connect_from(cgroup, [("tcp", VIP, vip_port)])
            if accepted(*backends)[chosen] == 0:
                break
        else:
            pytest.fail("an expired affinity was kept")


@pytest.mark.parametrize("family", [4, 6])
def test_a_service_port_without_endpoints_refuses_the_connect_at_once(lb, family):
    """ECONNREFUSED from the program, not from the stack: something listens at the VIP's port
    (IPv4), or the VIP is not routed at all (IPv6: ENETUNREACH without the program)."""
    maps_, cgroup = lb
    with listener(VIP if family == 4 else "::1") as there:
        vip = VIP if family == 4 else VIP6
        maps_.set_service(vip, port_of(there), TCP, [])
        started = time.monotonic()
        assert connect_from(cgroup, [("tcp", vip, port_of(there))]) == [errno.ECONNREFUSED]
        assert time.monotonic() - started < 10  # no SYN retries (a child's start included)
        assert maps_.connects()[(vip, port_of(there), TCP)] == 0
        maps_.remove_service(vip, port_of(there), TCP)
        if family == 4:
            assert connect_from(cgroup, [("tcp", vip, port_of(there))]) == [(vip, port_of(there))]


@pytest.mark.parametrize("family", [4, 6])
def test_a_service_port_without_endpoints_refuses_an_unconnected_send(lb, family):
    maps_, cgroup = lb
    vip = VIP if family == 4 else VIP6
    vip_port = free_port(vip)
    maps_.set_service(vip, vip_port, UDP, [])
    assert connect_from(cgroup, [("sendto", vip, vip_port)]) == [errno.ECONNREFUSED]


def test_without_set_retval_a_refusal_is_eperm():
    require_connectlb()
    with contextlib.closing(ConnectMaps.create(4)) as lb, listener(VIP) as there:
        lb.set_service(VIP, port_of(there), TCP, [])
        prog_fd, _ = load_program(connect4_program(lb.fds(), refuse_errno=None))
        try:
            with attached({programs.BPF_CGROUP_INET4_CONNECT: prog_fd}) as cgroup:
                assert connect_from(cgroup, [("tcp", VIP, port_of(there))]) == [errno.EPERM]
        finally:
            os.close(prog_fd)


def test_addresses_and_protocols_not_in_the_maps_are_untouched(lb):
    maps_, cgroup = lb
    with listener("127.0.0.1") as backend, listener("127.0.0.1") as direct, listener(VIP, "udp") as vip_udp:
        vip_port = port_of(vip_udp)
        maps_.set_service(VIP, vip_port, TCP, [("127.0.0.1", port_of(backend))])
        assert connect_from(cgroup, [
            ("tcp", "127.0.0.1", port_of(direct)),  # another address
            ("udp", VIP, vip_port),                 # the same address and port, UDP
        ]) == [("127.0.0.1", port_of(direct)), (VIP, vip_port)]
        assert vip_udp.recv(16) == b"ping"
        assert accepted(backend) == [0]


def test_an_ipv4_mapped_address_on_an_ipv6_socket_is_not_translated(lb):
    """The v6 hooks see ::ffff:127.0.0.240, which services6 never holds: the connect goes where
    it is addressed (Cilium would translate it through its IPv4 maps)."""
    maps_, cgroup = lb
    with listener("127.0.0.1") as backend, listener(VIP) as there:
        maps_.set_service(VIP, port_of(there), TCP, [("127.0.0.1", port_of(backend))])
        mapped = f"::ffff:{VIP}"
        assert connect_from(cgroup, [("tcp", mapped, port_of(there))]) == [(mapped, port_of(there))]
        assert accepted(backend, there) == [0, 1]


def test_an_ipv4_mapped_sendto_on_an_ipv6_socket_is_not_translated(lb):
    """The kernel hands it to the v4 sendmsg hook (udpv6_sendmsg -> udp_sendmsg) but the
    reply's source to the v6 recvmsg hook: translated one way only, it would come back from
    the endpoint. Neither way is translated."""
    maps_, cgroup = lb
    with listener("127.0.0.1", "udp") as backend, listener(VIP, "udp") as there:
        maps_.set_service(VIP, port_of(there), UDP, [("127.0.0.1", port_of(backend))])
        mapped = f"::ffff:{VIP}"
        seen, _ = sendto_from(cgroup, mapped, port_of(there), there)
        assert seen == (mapped, port_of(there))


def test_connects_are_counted_per_service_port_and_kept_across_updates(lb):
    maps_, cgroup = lb
    with listener("127.0.0.1") as backend, listener("127.0.0.1") as other:
        vip_port = free_port(VIP)
        maps_.set_service(VIP, vip_port, TCP, [("127.0.0.1", port_of(backend))])
        connect_from(cgroup, [("tcp", VIP, vip_port)] * 3)
        maps_.set_service(VIP, vip_port, TCP, [("127.0.0.1", port_of(other))])
        connect_from(cgroup, [("tcp", VIP, vip_port)] * 2)
        assert maps_.connects()[(VIP, vip_port, TCP)] == 5
        assert accepted(backend, other) == [3, 2]
        maps_.remove_service(VIP, vip_port, TCP)
        assert (VIP, vip_port, TCP) not in maps_.connects()



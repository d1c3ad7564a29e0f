"""The maps of connect-time load balancing: what Python decided, in the form the program reads.

Two BPF hash maps, created and written with bpf(2):

* ``services``: (IPv4 address, port, protocol) -> (count, slot base). The key's address and
  port are in network byte order, as ``struct bpf_sock_addr`` holds ``user_ip4`` and
  ``user_port`` (include/uapi/linux/bpf.h); the protocol is the socket's (IPPROTO_TCP,
  IPPROTO_UDP), one byte, and one byte of padding the program writes as 0. The value is in
  host byte order: how many endpoints this node may use for the Service port, and the first of
  their ``count`` consecutive slots (modulo 2**32). A count of 0 is a Service port with no
  usable endpoint: the program refuses the connect.
* ``backends``: slot (u32, host order) -> (IPv4 address, port in network order, 2 bytes of padding).

Cilium's ``bpf/bpf_sock.c`` keeps the same split (``lb4_key`` with a ``backend_slot``, slot 0
the service entry holding ``count``, slots 1..count the backend ids, ``lb4_backend`` per id);
here the slots of a Service port are a range of their own, so an update writes the new range
first and then switches the service entry to it in one map update: a connect sees the old
endpoints or the new ones, never a mix.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import os
import struct
from collections.abc import Iterable

from kubeport.proxy.relay.sockmap import (
    BPF_MAP_CREATE,
    BPF_MAP_DELETE_ELEM,
    BPF_MAP_LOOKUP_ELEM,
    BPF_MAP_TYPE_HASH,
    BPF_MAP_UPDATE_ELEM,
    bpf,
)

BPF_ANY = 0  # BPF_MAP_UPDATE_ELEM flags: create or replace

SERVICE_KEY_SIZE = 8
SERVICE_VALUE_SIZE = 8
BACKEND_KEY_SIZE = 4
BACKEND_VALUE_SIZE = 8
SLOTS = 1 << 32

#: Service protocol names -> the socket's protocol number as ``bpf_sock_addr.protocol`` has it.
PROTOCOLS = {"TCP": 6, "UDP": 17, "SCTP": 132}

Address = str | ipaddress.IPv4Address


# --- encoding (pure) ---------------------------------------------------------------------------


def _ipv4(address: Address) -> bytes:
    return ipaddress.IPv4Address(address).packed


def _port(port: int) -> bytes:
    if not 0 < port < 1 << 16:
        raise ValueError(f"port out of range: {port}")
    return port.to_bytes(2, "big")


def service_key(address: Address, port: int, protocol: int) -> bytes:
    """address (4, network order), port (2, network order), protocol (1), padding (1)."""
    if not 0 <= protocol < 1 << 8:
        raise ValueError(f"protocol out of range: {protocol}")
    return _ipv4(address) + _port(port) + bytes([protocol, 0])


def service_value(count: int, slot_base: int) -> bytes:
    """count of backends and the first slot, u32 each in host order."""
    if not 0 <= count < SLOTS or not 0 <= slot_base < SLOTS:
        raise ValueError(f"count or slot base out of range: {count}, {slot_base}")
    return struct.pack("=II", count, slot_base)


def decode_service_value(value: bytes) -> tuple[int, int]:
    count, base = struct.unpack("=II", value)
    return count, base


def backend_key(slot: int) -> bytes:
    return struct.pack("=I", slot % SLOTS)


def backend_value(address: Address, port: int) -> bytes:
    """address (4, network order), port (2, network order), padding (2)."""
    return _ipv4(address) + _port(port) + b"\0\0"


def decode_backend_value(value: bytes) -> tuple[str, int]:
    return str(ipaddress.IPv4Address(value[:4])), int.from_bytes(value[4:6], "big")


# --- maps --------------------------------------------------------------------------------------


class HashMap:
    """A BPF_MAP_TYPE_HASH of fixed key and value sizes, owned by this process (its descriptor)."""

    def __init__(self, key_size: int, value_size: int, capacity: int, name: str = "") -> None:
        self.key_size, self.value_size = key_size, value_size
        attr = struct.pack("<IIIIIII16s", BPF_MAP_TYPE_HASH, key_size, value_size, capacity, 0, 0, 0,
                           name.encode()[:15])
        self.fd = bpf(BPF_MAP_CREATE, attr)

    def _attr(self, key: bytes, value: ctypes.Array | None, flags: int = 0) -> tuple[bytes, ctypes.Array]:
        if len(key) != self.key_size:
            raise ValueError(f"key of {len(key)} bytes, the map's are {self.key_size}")
        key_buf = ctypes.create_string_buffer(key, self.key_size)
        value_p = ctypes.addressof(value) if value is not None else 0
        return struct.pack("<IIQQQ", self.fd, 0, ctypes.addressof(key_buf), value_p, flags), key_buf

    def update(self, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
        if len(value) != self.value_size:
            raise ValueError(f"value of {len(value)} bytes, the map's are {self.value_size}")
        value_buf = ctypes.create_string_buffer(value, self.value_size)
        attr, _key_buf = self._attr(key, value_buf, flags)
        bpf(BPF_MAP_UPDATE_ELEM, attr)

    def lookup(self, key: bytes) -> bytes | None:
        value_buf = ctypes.create_string_buffer(self.value_size)
        attr, _key_buf = self._attr(key, value_buf)
        try:
            bpf(BPF_MAP_LOOKUP_ELEM, attr)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise
        return value_buf.raw

    def delete(self, key: bytes) -> bool:
        """False when the key was not there."""
        attr, _key_buf = self._attr(key, None)
        try:
            bpf(BPF_MAP_DELETE_ELEM, attr)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise
        return True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def allocate_slots(used: set[int], count: int, start: int) -> int:
    """The first base from ``start`` on whose ``count`` slots (modulo 2**32) are all free. Pure."""
    if count > SLOTS - len(used):
        raise ValueError(f"no room for {count} slots")
    base, skipped = start % SLOTS, 0
    while skipped < SLOTS:
        taken = next((i for i in range(count) if (base + i) % SLOTS in used), None)
        if taken is None:
            return base
        base = (base + taken + 1) % SLOTS
        skipped += taken + 1
    raise ValueError(f"no {count} consecutive free slots")


class ConnectMaps:
    """The two maps, and which slots each Service port holds (Python's side of the truth)."""

    def __init__(self, capacity: int = 65536, backend_capacity: int | None = None) -> None:
        self.services = HashMap(SERVICE_KEY_SIZE, SERVICE_VALUE_SIZE, capacity, "kubeport_svc")
        try:
            # A Service port's new range is written before its old one is freed: room for both.
            self.backends = HashMap(BACKEND_KEY_SIZE, BACKEND_VALUE_SIZE, backend_capacity or 2 * capacity,
                                    "kubeport_be")
        except OSError:
            self.services.close()
            raise
        self._ranges: dict[bytes, tuple[int, int]] = {}  # service key -> (base, count)
        self._used: set[int] = set()
        self._next = 0

    def set_service(self, address: Address, port: int, protocol: int,
                    backends: Iterable[tuple[Address, int]]) -> None:
        """The endpoints this node may use for a Service port; none: its connects are refused."""
        key = service_key(address, port, protocol)
        backends = list(backends)
        base = allocate_slots(self._used, len(backends), self._next)
        for i, (backend_address, backend_port) in enumerate(backends):
            self.backends.update(backend_key(base + i), backend_value(backend_address, backend_port))
        self._used.update((base + i) % SLOTS for i in range(len(backends)))
        self._next = (base + len(backends)) % SLOTS
        self.services.update(key, service_value(len(backends), base))
        self._free(self._ranges.pop(key, None))
        self._ranges[key] = (base, len(backends))

    def remove_service(self, address: Address, port: int, protocol: int) -> None:
        """The Service port's connects go where they are addressed again."""
        key = service_key(address, port, protocol)
        self.services.delete(key)
        self._free(self._ranges.pop(key, None))

    def _free(self, held: tuple[int, int] | None) -> None:
        if held is None:
            return
        base, count = held
        for i in range(count):
            slot = (base + i) % SLOTS
            self.backends.delete(backend_key(slot))
            self._used.discard(slot)

    def close(self) -> None:
        self.services.close()
        self.backends.close()

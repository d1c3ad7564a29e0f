"""The maps of connect-time load balancing: what Python decided, in the form the programs read.

BPF maps created and written with bpf(2); where a key holds an address there is one map per
family (suffix 4 or 6). Addresses and ports are in network byte order, as ``struct
bpf_sock_addr`` holds ``user_ip4``/``user_ip6`` and ``user_port`` (include/uapi/linux/bpf.h);
counts, slots, ids and times in host order. ``A`` is 4 (IPv4) or 16 (IPv6) bytes.

* ``services4``/``services6`` (hash): (address A, port 2, protocol 1, padding 1) -> (count u32,
  slot base u32, affinity timeout seconds u32, service-port id u32). The protocol is the
  socket's (IPPROTO_TCP, IPPROTO_UDP). A count of 0 is a Service port with no usable endpoint:
  its connects are refused. The id is unique among the service ports of both families and
  never reused by this process, nor by a successor that adopts the maps (it continues after
  the largest): it names the service port in ``affinity`` and ``members4``/``members6``.
* ``backends4``/``backends6`` (hash): slot u32 -> (address A, port 2, padding 2). A service
  port's endpoints are its ``count`` consecutive slots (modulo 2**32) from its base.
* ``members4``/``members6`` (hash): (id u32, port 2, padding 2, address A) -> u32 1: the endpoints
  a service port may use now. ClientIP affinity checks a remembered endpoint here, so an
  endpoint change keeps the affinity of the endpoints that stay and drops that of those gone.
* ``affinity`` (LRU hash): (netns cookie u64, id u32, padding u32) -> (last use u64 in
  ``bpf_ktime_get_ns`` nanoseconds, address 16 (IPv4 in the first 4, the rest 0), port 2,
  padding 6). A pod is one network namespace, and at connect() the client's address is not
  chosen yet: Cilium's socket LB keys its affinity by ``bpf_get_netns_cookie`` too.
* ``revnat4``/``revnat6`` (LRU hash): (socket cookie u64, endpoint address A, endpoint port 2,
  padding 2) -> (service address A, service port 2, padding 2), written by connect/sendmsg,
  read by recvmsg/getpeername. Nothing removes an entry when its socket closes: the LRU
  evicts it in time, and a cookie is never given to another socket before reboot
  (``sock_gen_cookie``, net/core/sock_diag.c), so a stale entry translates nothing.
* ``connects4``/``connects6`` (hash): the services key -> connects balanced u64, added
  atomically by the connect programs; the entry is made by ``set_service`` and kept across
  its calls, so the program only adds.

Cilium's ``bpf/bpf_sock.c`` keeps the same split (``lb4_key`` with a ``backend_slot``,
``lb4_backend`` per id, ``cilium_lb4_reverse_sk``, ``cilium_lb_affinity_match``); here the
slots of a Service port are a range of their own, so an update writes the new range first and
then switches the service entry to it in one map update: a connect sees the old endpoints or
the new ones, never a mix.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import os
import socket
import struct
from collections.abc import Iterable, Iterator, Mapping
from typing import NamedTuple

from kubeport.proxy.relay.sockmap import (
    BPF_MAP_CREATE,
    BPF_MAP_DELETE_ELEM,
    BPF_MAP_LOOKUP_ELEM,
    BPF_MAP_TYPE_HASH,
    BPF_MAP_UPDATE_ELEM,
    bpf,
)

BPF_ANY, BPF_NOEXIST = 0, 1  # BPF_MAP_UPDATE_ELEM flags: create or replace; create only
BPF_MAP_GET_NEXT_KEY = 4
BPF_MAP_UPDATE_BATCH, BPF_MAP_DELETE_BATCH = 26, 27
BPF_F_NO_PREALLOC = 1
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_MAP_TYPE_LRU_HASH = 9

SLOTS = 1 << 32
IDS = 1 << 32

#: Service protocol names -> the socket's protocol number as ``bpf_sock_addr.protocol`` has it.
PROTOCOLS = {"TCP": 6, "UDP": 17, "SCTP": 132}

Address = str | ipaddress.IPv4Address | ipaddress.IPv6Address


class Layout(NamedTuple):
    map_type: int
    key_size: int
    value_size: int


def _layouts() -> dict[str, Layout]:
    found = {"affinity": Layout(BPF_MAP_TYPE_LRU_HASH, 16, 32)}
    for family, size in ((4, 4), (6, 16)):
        found[f"services{family}"] = Layout(BPF_MAP_TYPE_HASH, size + 4, 16)
        found[f"backends{family}"] = Layout(BPF_MAP_TYPE_HASH, 4, size + 4)
        found[f"members{family}"] = Layout(BPF_MAP_TYPE_HASH, size + 8, 4)
        found[f"revnat{family}"] = Layout(BPF_MAP_TYPE_LRU_HASH, size + 12, size + 4)
        found[f"connects{family}"] = Layout(BPF_MAP_TYPE_HASH, size + 4, 8)
    return found


#: map name -> (type, key size, value size): what ``fds`` names and ``adopt`` checks.
LAYOUTS = _layouts()
SERVICE_VALUE_SIZE = 16
AFFINITY_KEY_SIZE, AFFINITY_VALUE_SIZE = 16, 32


# --- encoding (pure) ---------------------------------------------------------------------------


_MAPPED_PREFIX = bytes(10) + b"\xff\xff"


def _address(address: Address) -> bytes:
    """The packed address. inet_pton, not ipaddress: a cold start encodes every endpoint of every
    Service port (250,000 at the published scale), and ipaddress's parser cost ~6 us each where
    inet_pton costs well under one."""
    if not isinstance(address, str):
        address = str(address)
    if ":" not in address:
        try:
            return socket.inet_pton(socket.AF_INET, address)
        except OSError:
            raise ValueError(f"not an IPv4 address: {address!r}") from None
    if "%" in address:
        raise ValueError(f"IPv6 address with a zone: {address}")  # the maps' keys have none
    try:
        packed = socket.inet_pton(socket.AF_INET6, address)
    except OSError:
        raise ValueError(f"not an IPv6 address: {address!r}") from None
    if packed.startswith(_MAPPED_PREFIX):
        raise ValueError(f"IPv4-mapped IPv6 address: {address}")  # the programs do not translate them
    return packed


def family_of(address: Address) -> int:
    """4 or 6. An IPv4-mapped IPv6 address is refused: the programs do not translate them."""
    return 4 if len(_address(address)) == 4 else 6


def _canonical(address: Address) -> str:
    packed = _address(address)
    return socket.inet_ntop(socket.AF_INET if len(packed) == 4 else socket.AF_INET6, packed)


def _port(port: int) -> bytes:
    if not 0 < port < 1 << 16:
        raise ValueError(f"port out of range: {port}")
    return port.to_bytes(2, "big")


def _decode_address(packed: bytes) -> str:
    return socket.inet_ntop(socket.AF_INET if len(packed) == 4 else socket.AF_INET6, packed)


def service_key(address: Address, port: int, protocol: int) -> bytes:
    """address (4 or 16, network order), port (2, network order), protocol (1), padding (1)."""
    if not 0 <= protocol < 1 << 8:
        raise ValueError(f"protocol out of range: {protocol}")
    return _address(address) + _port(port) + bytes([protocol, 0])


def decode_service_key(key: bytes) -> tuple[str, int, int]:
    size = len(key) - 4
    return _decode_address(key[:size]), int.from_bytes(key[size:size + 2], "big"), key[size + 2]


class ServiceValue(NamedTuple):
    count: int
    slot_base: int
    affinity_timeout: int = 0
    id: int = 0


def service_value(count: int, slot_base: int, affinity_timeout: int = 0, id_: int = 0) -> bytes:
    """count of backends, the first slot, the affinity timeout in seconds (0: none), the
    service port's id; u32 each in host order."""
    for name, value in (("count", count), ("slot base", slot_base), ("affinity timeout", affinity_timeout),
                        ("id", id_)):
        if not 0 <= value < 1 << 32:
            raise ValueError(f"{name} out of range: {value}")
    return struct.pack("=IIII", count, slot_base, affinity_timeout, id_)


def decode_service_value(value: bytes) -> ServiceValue:
    return ServiceValue(*struct.unpack("=IIII", value))


def backend_key(slot: int) -> bytes:
    return struct.pack("=I", slot % SLOTS)


def backend_value(address: Address, port: int) -> bytes:
    """address (4 or 16, network order), port (2, network order), padding (2)."""
    return _address(address) + _port(port) + b"\0\0"


def decode_backend_value(value: bytes) -> tuple[str, int]:
    size = len(value) - 4
    return _decode_address(value[:size]), int.from_bytes(value[size:size + 2], "big")


def member_key(id_: int, address: Address, port: int) -> bytes:
    """id (u32, host order), port (2, network order), padding (2), address (4 or 16)."""
    return struct.pack("=I", id_) + _port(port) + b"\0\0" + _address(address)


def affinity_key(netns_cookie: int, id_: int) -> bytes:
    return struct.pack("=QII", netns_cookie, id_, 0)


def decode_affinity_value(value: bytes) -> tuple[int, str, int]:
    """(last use in ns, endpoint address, endpoint port); an IPv4 endpoint has 12 zero bytes."""
    (last,) = struct.unpack("=Q", value[:8])
    address = value[8:24]
    packed = address[:4] if address[4:] == bytes(12) and address[:4] != bytes(4) else address
    return last, _decode_address(packed), int.from_bytes(value[24:26], "big")


def revnat_key(cookie: int, address: Address, port: int) -> bytes:
    return struct.pack("=Q", cookie) + _address(address) + _port(port) + b"\0\0"


def decode_revnat_value(value: bytes) -> tuple[str, int]:
    return decode_backend_value(value)


# --- maps --------------------------------------------------------------------------------------


def map_info(fd: int) -> Layout:
    """BPF_OBJ_GET_INFO_BY_FD of a map: its type, key and value sizes (struct bpf_map_info:
    type u32 at 0, id 4, key_size 8, value_size 12, include/uapi/linux/bpf.h)."""
    info = ctypes.create_string_buffer(88)
    bpf(BPF_OBJ_GET_INFO_BY_FD, struct.pack("<IIQ", fd, len(info), ctypes.addressof(info)))
    map_type, _id, key_size, value_size = struct.unpack_from("<IIII", info.raw)
    return Layout(map_type, key_size, value_size)


class HashMap:
    """A BPF hash map (or LRU hash) of fixed key and value sizes, owned by this process (its fd)."""

    def __init__(self, key_size: int, value_size: int, capacity: int, name: str = "",
                 map_type: int = BPF_MAP_TYPE_HASH, fd: int | None = None, flags: int = 0) -> None:
        self.key_size, self.value_size = key_size, value_size
        if fd is None:
            attr = struct.pack("<IIIIIII16s", map_type, key_size, value_size, capacity, flags, 0, 0,
                               name.encode()[:15])
            fd = bpf(BPF_MAP_CREATE, attr)
        self.fd = fd

    def _attr(self, key: bytes | None, value: ctypes.Array | None, flags: int = 0) -> tuple[bytes, ctypes.Array]:
        if key is not None and len(key) != self.key_size:
            raise ValueError(f"key of {len(key)} bytes, the map's are {self.key_size}")
        key_buf = ctypes.create_string_buffer(key or b"", self.key_size)
        key_p = ctypes.addressof(key_buf) if key is not None else 0
        value_p = ctypes.addressof(value) if value is not None else 0
        return struct.pack("<IIQQQ", self.fd, 0, key_p, value_p, flags), key_buf

    def update(self, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
        if len(value) != self.value_size:
            raise ValueError(f"value of {len(value)} bytes, the map's are {self.value_size}")
        value_buf = ctypes.create_string_buffer(value, self.value_size)
        attr, _key_buf = self._attr(key, value_buf, flags)
        bpf(BPF_MAP_UPDATE_ELEM, attr)

    def update_many(self, items: list[tuple[bytes, bytes]], flags: int = BPF_ANY) -> None:
        """BPF_MAP_UPDATE_BATCH: every item in one system call (kernel/bpf/syscall.c
        generic_map_update_batch), where one BPF_MAP_UPDATE_ELEM each cost a call apiece."""
        if not items:
            return
        keys = b"".join(key for key, _ in items)
        values = b"".join(value for _, value in items)
        if len(keys) != len(items) * self.key_size or len(values) != len(items) * self.value_size:
            raise ValueError(f"keys of {self.key_size} bytes and values of {self.value_size} bytes expected")
        self._batch(BPF_MAP_UPDATE_BATCH, keys, values, len(items), flags)

    def delete_many(self, keys: list[bytes]) -> None:
        """BPF_MAP_DELETE_BATCH; keys not there are passed over (the kernel stops at the first,
        ENOENT, and the rest are then deleted one by one)."""
        if not keys:
            return
        joined = b"".join(keys)
        if len(joined) != len(keys) * self.key_size:
            raise ValueError(f"keys of {self.key_size} bytes expected")
        try:
            self._batch(BPF_MAP_DELETE_BATCH, joined, None, len(keys), 0)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
            for key in keys:  # one was gone (a range a predecessor left short): the rest one by one
                self.delete(key)

    def _batch(self, command: int, keys: bytes, values: bytes | None, count: int, elem_flags: int) -> None:
        key_buf = ctypes.create_string_buffer(keys, len(keys))
        value_buf = ctypes.create_string_buffer(values, len(values)) if values is not None else None
        # struct batch: in_batch, out_batch, keys, values (u64 each), count, map_fd (u32), elem_flags, flags
        attr = struct.pack("<QQQQIIQQ", 0, 0, ctypes.addressof(key_buf),
                           ctypes.addressof(value_buf) if value_buf is not None else 0, count, self.fd,
                           elem_flags, 0)
        bpf(command, attr)

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

    def keys(self) -> Iterator[bytes]:
        """BPF_MAP_GET_NEXT_KEY from no key (the first) on. A key deleted meanwhile restarts the
        walk in the kernel (htab_map_get_next_key): a key may come twice, callers dedupe."""
        key: bytes | None = None
        while True:
            next_buf = ctypes.create_string_buffer(self.key_size)
            attr, _key_buf = self._attr(key, next_buf)
            try:
                bpf(BPF_MAP_GET_NEXT_KEY, attr)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    return
                raise
            key = next_buf.raw
            yield key

    def items(self) -> dict[bytes, bytes]:
        found = {}
        for key in self.keys():
            if (value := self.lookup(key)) is not None:
                found[key] = value
        return found

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


class Held(NamedTuple):
    """What a service port holds in the maps: its slot range, id, endpoints (packed address, port
    in network order), and whether its endpoints are in the members map (with affinity only)."""
    base: int
    id: int
    backends: tuple[tuple[bytes, bytes], ...]
    affinity: bool = False


def _member_key(id_: int, packed: bytes, port: bytes) -> bytes:
    return struct.pack("=I", id_) + port + b"\0\0" + packed


class _Family:
    """One family's slot bookkeeping."""

    def __init__(self) -> None:
        self.held: dict[bytes, Held] = {}  # service key -> what it holds
        self.used: set[int] = set()
        self.next = 0


class ConnectMaps:
    """The maps (``LAYOUTS``), and which slots and ids each Service port holds (Python's side of
    the truth, rebuilt from the maps by ``adopt``)."""

    def __init__(self, capacity: int = 65536, backend_capacity: int | None = None, *,
                 _maps: Mapping[str, HashMap] | None = None) -> None:
        if _maps is None:
            _maps = _create(capacity, backend_capacity or max(2 * capacity, 1 << 20))
        self.maps: dict[str, HashMap] = dict(_maps)
        self._families = {4: _Family(), 6: _Family()}
        self._next_id = 1
        self._ids: set[int] = set()  # ids held by a service port of either family (or kept for one)
        self._seeds: dict[bytes, int] = {}  # service key -> the id a predecessor gave it (succeed)

    @classmethod
    def create(cls, capacity: int = 65536, backend_capacity: int | None = None) -> ConnectMaps:
        """New maps: ``capacity`` service ports per family; endpoint slots twice that by default
        (a Service port's new range is written before its old one is freed: room for both)."""
        return cls(capacity, backend_capacity)

    @classmethod
    def adopt(cls, fds: Mapping[str, int]) -> ConnectMaps:
        """Maps a predecessor made (the fds become this object's, closed by ``close``, also when
        refused). Raises ValueError naming a map missing or of another layout."""
        owned = {name: HashMap(layout.key_size, layout.value_size, 0, fd=fd)
                 for name, fd in fds.items() if (layout := LAYOUTS.get(name))}
        try:
            for fd in (fd for name, fd in fds.items() if name not in LAYOUTS):
                os.close(fd)
            for name, layout in LAYOUTS.items():
                if name not in owned:
                    raise ValueError(f"map {name} missing")
                found = map_info(owned[name].fd)
                if found != layout:
                    raise ValueError(f"map {name}: type, key and value size {tuple(found)}, expected {tuple(layout)}")
            self = cls(_maps=owned)
            self._rebuild()
        except BaseException:
            for map_ in owned.values():
                map_.close()
            raise
        return self

    #: the maps the programs write and Python only reads: a successor takes them over as they are
    PROGRAM_WRITTEN = ("affinity", "revnat4", "revnat6")

    @classmethod
    def succeed(cls, fds: Mapping[str, int], capacity: int = 65536, backend_capacity: int | None = None
                ) -> ConnectMaps:
        """Maps for the successor of the instance whose maps ``fds`` are (the fds become this
        object's; those not taken over are closed here).

        The maps the programs write (affinity, reverse translation) are taken over, so replies to
        sockets connected before and ClientIP affinity carry on; the predecessor's service-port
        ids are kept for the same ports (affinity entries name them). Everything Python writes is
        new: the predecessor may still write its own maps until it has handed over, and two
        writers of one slot range would corrupt it. Its programs keep reading its maps until
        the links are switched to programs over these (balancing.py)."""
        taken: dict[str, HashMap] = {}
        seeds: dict[bytes, int] = {}
        try:
            for name, fd in fds.items():
                layout = LAYOUTS.get(name)
                if name in cls.PROGRAM_WRITTEN and layout is not None and map_info(fd) == layout:
                    taken[name] = HashMap(layout.key_size, layout.value_size, 0, fd=fd)
                    continue
                if name in ("services4", "services6") and layout is not None and map_info(fd) == layout:
                    reading = HashMap(layout.key_size, layout.value_size, 0, fd=fd)
                    seeds.update((key, decode_service_value(value).id) for key, value in reading.items().items())
                os.close(fd)
            made = _create(capacity, backend_capacity or max(2 * capacity, 1 << 20), skip=taken.keys())
        except BaseException:
            for map_ in taken.values():
                map_.close()
            raise
        self = cls(_maps={**made, **taken})
        self._seeds = seeds
        self._ids.update(seeds.values())
        self._next_id = (max(seeds.values(), default=0) + 1) % IDS or 1
        return self

    def _rebuild(self) -> None:
        largest = 0
        for family, state in self._families.items():
            services, backends = self.maps[f"services{family}"], self.maps[f"backends{family}"]
            # Every slot with an entry stays in use, also one no service port names (a predecessor
            # stopped between writing a new range and switching to it): it is never reused.
            state.used = {struct.unpack("=I", key)[0] for key in backends.keys()}
            end = 0
            for key, value in services.items().items():
                found = decode_service_value(value)
                endpoints = []
                size = 4 if family == 4 else 16
                for i in range(found.count):
                    slot = (found.slot_base + i) % SLOTS
                    state.used.add(slot)
                    if (backend := backends.lookup(backend_key(slot))) is not None:
                        endpoints.append((backend[:size], backend[size:size + 2]))
                # members are written for the service ports with affinity only (set_service)
                state.held[key] = Held(found.slot_base, found.id, tuple(endpoints), found.affinity_timeout > 0)
                self._ids.add(found.id)
                end = max(end, found.slot_base + found.count)
                largest = max(largest, found.id)
            state.next = end % SLOTS
        self._next_id = (largest + 1) % IDS or 1

    def fds(self) -> dict[str, int]:
        """Map name -> descriptor (still this object's): what gets pinned."""
        return {name: map_.fd for name, map_ in self.maps.items()}

    # Attributes the connect4-only callers used.
    @property
    def services(self) -> HashMap:
        return self.maps["services4"]

    @property
    def backends(self) -> HashMap:
        return self.maps["backends4"]

    def set_service(self, address: Address, port: int, protocol: int,
                    backends: Iterable[tuple[Address, int]], affinity_timeout: int = 0) -> None:
        """The endpoints this node may use for a Service port; none: its connects are refused.
        ``affinity_timeout`` seconds > 0: ClientIP affinity per network namespace."""
        key = service_key(address, port, protocol)
        family, size = (4, 4) if len(key) == 8 else (6, 16)
        # Each endpoint encoded once (a cold start writes every endpoint of every Service port).
        packed = []
        for backend_address, backend_port in backends:
            raw = _address(backend_address)
            if len(raw) != size:
                raise ValueError(f"endpoint {backend_address} of another family than {address}")
            packed.append((raw, _port(backend_port)))
        endpoints = tuple(packed)
        state = self._families[family]
        old = state.held.get(key)
        id_ = old.id if old is not None else self._seeds.pop(key, None) or self._take_id()
        backends_map, members = self.maps[f"backends{family}"], self.maps[f"members{family}"]
        base = allocate_slots(state.used, len(endpoints), state.next)
        backends_map.update_many([(struct.pack("=I", (base + i) % SLOTS), raw + port_bytes + b"\0\0")
                                  for i, (raw, port_bytes) in enumerate(endpoints)])
        state.used.update((base + i) % SLOTS for i in range(len(endpoints)))
        state.next = (base + len(endpoints)) % SLOTS
        # Only affinity reads the members map: a port without affinity (most) writes none.
        affinity = affinity_timeout > 0
        had = set(old.backends) if old is not None and old.affinity else set()
        if affinity:
            one = struct.pack("=I", 1)
            members.update_many([(_member_key(id_, raw, port_bytes), one) for raw, port_bytes in set(endpoints) - had])
        if old is None:
            try:
                self.maps[f"connects{family}"].update(key, bytes(8), BPF_NOEXIST)
            except OSError as exc:
                if exc.errno != errno.EEXIST:
                    raise
        self.maps[f"services{family}"].update(key, service_value(len(endpoints), base, affinity_timeout, id_))
        state.held[key] = Held(base, id_, endpoints, affinity)
        if old is not None:
            members.delete_many([_member_key(id_, raw, port_bytes)
                                 for raw, port_bytes in had - (set(endpoints) if affinity else set())])
            self._free(family, old.base, len(old.backends))

    def remove_service(self, address: Address, port: int, protocol: int) -> None:
        """The Service port's connects go where they are addressed again."""
        family = family_of(address)
        key = service_key(address, port, protocol)
        self.maps[f"services{family}"].delete(key)
        self.maps[f"connects{family}"].delete(key)
        old = self._families[family].held.pop(key, None)
        if old is not None:
            self._ids.discard(old.id)
            if old.affinity:
                self.maps[f"members{family}"].delete_many([_member_key(old.id, raw, port_bytes)
                                                           for raw, port_bytes in set(old.backends)])
            self._free(family, old.base, len(old.backends))

    def _take_id(self) -> int:
        while self._next_id in self._ids or self._next_id == 0:
            self._next_id = (self._next_id + 1) % IDS
        id_, self._next_id = self._next_id, (self._next_id + 1) % IDS
        self._ids.add(id_)
        return id_

    def _free(self, family: int, base: int, count: int) -> None:
        state = self._families[family]
        slots = [(base + i) % SLOTS for i in range(count)]
        self.maps[f"backends{family}"].delete_many([backend_key(slot) for slot in slots])
        state.used.difference_update(slots)

    def service_ports(self) -> set[tuple[str, int, int]]:
        """(address, port, protocol) of every service port the maps hold."""
        return {decode_service_key(key) for family in (4, 6) for key in self.maps[f"services{family}"].keys()}

    def backends_of(self, address: Address, port: int, protocol: int) -> list[tuple[str, int]] | None:
        """The endpoints the maps hold for a service port, in slot order; None: not a service port."""
        family = family_of(address)
        value = self.maps[f"services{family}"].lookup(service_key(address, port, protocol))
        if value is None:
            return None
        found = decode_service_value(value)
        backends = self.maps[f"backends{family}"]
        return [decode_backend_value(v) for i in range(found.count)
                if (v := backends.lookup(backend_key(found.slot_base + i))) is not None]

    def service_id(self, address: Address, port: int, protocol: int) -> int | None:
        value = self.maps[f"services{family_of(address)}"].lookup(service_key(address, port, protocol))
        return None if value is None else decode_service_value(value).id

    def connects(self) -> dict[tuple[str, int, int], int]:
        """Per service port: the connects the programs balanced so far."""
        found = {}
        for family in (4, 6):
            for key, value in self.maps[f"connects{family}"].items().items():
                found[decode_service_key(key)] = struct.unpack("=Q", value)[0]
        return found

    def close(self) -> None:
        for map_ in self.maps.values():
            map_.close()


def _create(capacity: int, backend_capacity: int, skip: Iterable[str] = ()) -> dict[str, HashMap]:
    # LRU maps keep per-CPU free lists (kernel/bpf/bpf_lru_list.c): a small one evicts early.
    lru = max(capacity, 4096)
    sizes = {"affinity": lru}
    for family in (4, 6):
        sizes |= {f"services{family}": capacity, f"backends{family}": backend_capacity,
                  f"members{family}": backend_capacity, f"revnat{family}": lru, f"connects{family}": capacity}
    made: dict[str, HashMap] = {}
    try:
        for name, layout in LAYOUTS.items():
            if name in skip:
                continue
            # Hash maps allocate an entry when written, not all at creation: the capacity is a
            # ceiling, paid for only by the Services and endpoints a cluster has (an LRU map is
            # always preallocated).
            flags = BPF_F_NO_PREALLOC if layout.map_type == BPF_MAP_TYPE_HASH else 0
            made[name] = HashMap(layout.key_size, layout.value_size, sizes[name], f"kp_{name}", layout.map_type,
                                 flags=flags)
    except BaseException:
        for map_ in made.values():
            map_.close()
        raise
    return made

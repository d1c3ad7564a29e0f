"""Where connect-time balancing lives outside the process: bpffs pins, BPF links, the cgroup.

The programs are attached with BPF links (BPF_LINK_CREATE on the cgroup) and the links and
maps are pinned in a bpffs, under ``<bpf root>/kubeport/<node name>/``: ``link_<hook>`` per
program, ``map_<name>`` per map (a bpffs refuses names with a dot, kernel/bpf/inode.c
bpf_lookup). A pinned link keeps its program attached after the last descriptor closes
(kernel/bpf/cgroup.c ``bpf_cgroup_link_release`` runs only when the link's last reference
goes), so the node's pods keep reaching their Services while no daemon runs; the
next daemon opens the pins (BPF_OBJ_GET), swaps its own programs into the links
(BPF_LINK_UPDATE, atomic per hook) and carries on with the maps as its predecessor left them.
Cilium keeps its socket-LB state the same way, under ``/sys/fs/bpf/tc/globals``.

Both filesystems are found in ``/proc/self/mountinfo``; where one is missing (``ip netns exec``
mounts a fresh sysfs, hiding the host's ``/sys/fs/cgroup`` and ``/sys/fs/bpf``; a container
without the host paths) it is mounted, as Cilium mounts ``/run/cilium/cgroupv2`` and
``/sys/fs/bpf``. A bpffs mounted in a private mount namespace is a filesystem of its own and
goes with that namespace: pins survive the daemon only in a bpffs the host (or a hostPath) keeps.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import shutil
import struct
from pathlib import Path

from kubeport.proxy.relay.sockmap import bpf

# bpf(2) commands (include/uapi/linux/bpf.h enum bpf_cmd).
BPF_OBJ_PIN, BPF_OBJ_GET = 6, 7
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_LINK_CREATE, BPF_LINK_UPDATE = 28, 29

#: where the cgroup v2 hierarchy is mounted when this process sees none (Cilium's is
#: /run/cilium/cgroupv2)
CGROUP2_FALLBACK = Path("/run/kubeport/cgroup2")
#: the directory of this project's pins under the bpffs root
PIN_DIRECTORY = "kubeport"

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]


class PinError(OSError):
    """A pin, link or mount the kernel refused; the message names the path."""


# --- mounts (pure parsing) ---------------------------------------------------------------------


def mounts_of(mountinfo: str, fstype: str) -> list[Path]:
    """Mount points of ``fstype`` in /proc/self/mountinfo's text, in its order. Pure.

    A line: ``id parent major:minor root mount-point options [optional...] - fstype source super``;
    the mount point escapes space, tab, newline and backslash as octal."""
    found = []
    for line in mountinfo.splitlines():
        fields, _, tail = line.partition(" - ")
        if tail.split(" ", 1)[0] == fstype:
            point = fields.split(" ")[4]
            found.append(Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point)))
    return found


def _mountinfo() -> str:
    return Path("/proc/self/mountinfo").read_text()


def _mount(fstype: str, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    if _libc.mount(fstype.encode(), str(target).encode(), fstype.encode(), 0, None) != 0:
        err = ctypes.get_errno()
        raise PinError(err, f"mounting {fstype} at {target}: {os.strerror(err)}")


def cgroup2_root() -> Path:
    """Where this process sees the cgroup v2 hierarchy: CGROUP2_FALLBACK when the host's is
    mounted there (a pod's ``hostPath``: a container's own /sys/fs/cgroup shows only its own
    cgroup namespace), else the first mount; mounted at CGROUP2_FALLBACK if nowhere."""
    mounts = mounts_of(_mountinfo(), "cgroup2")
    if CGROUP2_FALLBACK in mounts:
        return CGROUP2_FALLBACK
    for mount in mounts:
        if (mount / "cgroup.procs").exists():  # not hidden by a later mount (a fresh sysfs)
            return mount
    _mount("cgroup2", CGROUP2_FALLBACK)
    return CGROUP2_FALLBACK


def bpffs_at(root: Path) -> Path:
    """``root`` as a bpffs: as found, or mounted there when it is not one yet."""
    root = Path(root)
    if root not in mounts_of(_mountinfo(), "bpf"):
        _mount("bpf", root)
    return root


def cgroup_path(root: Path, hierarchy_path: str) -> Path:
    """The directory of cgroup ``hierarchy_path`` ("/", "/kubepods.slice") under the mount ``root``."""
    relative = hierarchy_path.strip("/")
    return root / relative if relative else root


# --- objects and links -------------------------------------------------------------------------


def pin(fd: int, path: Path) -> None:
    """BPF_OBJ_PIN: ``path`` (in a bpffs) refers to the object of ``fd`` until unlinked."""
    name = ctypes.create_string_buffer(str(path).encode())
    try:
        bpf(BPF_OBJ_PIN, struct.pack("<QII", ctypes.addressof(name), fd, 0))
    except OSError as exc:
        raise PinError(exc.errno, f"pinning {path}: {exc.strerror}") from None


def open_pinned(path: Path) -> int:
    """BPF_OBJ_GET: a new descriptor of the object pinned at ``path``."""
    name = ctypes.create_string_buffer(str(path).encode())
    try:
        return bpf(BPF_OBJ_GET, struct.pack("<QII", ctypes.addressof(name), 0, 0))
    except OSError as exc:
        raise PinError(exc.errno, f"opening {path}: {exc.strerror}") from None


def link_create(prog_fd: int, target_fd: int, attach_type: int) -> int:
    """BPF_LINK_CREATE: ``prog_fd`` attached to the cgroup ``target_fd`` for ``attach_type``.
    Cgroup links always attach as BPF_F_ALLOW_MULTI (kernel/bpf/cgroup.c cgroup_bpf_link_attach),
    beside other owners' programs."""
    return bpf(BPF_LINK_CREATE, struct.pack("<IIII", prog_fd, target_fd, attach_type, 0))


def link_update(link_fd: int, prog_fd: int) -> None:
    """BPF_LINK_UPDATE: the link runs ``prog_fd`` from now on; no moment without a program."""
    bpf(BPF_LINK_UPDATE, struct.pack("<IIII", link_fd, prog_fd, 0, 0))


def link_cgroup_id(link_fd: int) -> int:
    """The id of the cgroup a cgroup link is attached to (struct bpf_link_info: type, id,
    prog_id, then at offset 16 the union whose cgroup member starts with cgroup_id)."""
    info = ctypes.create_string_buffer(64)
    attr = struct.pack("<IIQ", link_fd, len(info), ctypes.addressof(info))
    bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    return struct.unpack_from("=Q", info.raw, 16)[0]


def cgroup_id(path: Path) -> int:
    """A cgroup v2 directory's id: its inode number (kernfs ids are the inode numbers on
    64-bit, kernel/cgroup/cgroup.c cgroup_id, fs/kernfs ``kernfs_id_ino``)."""
    return os.stat(path).st_ino


def open_cgroup(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


# --- the pin directory -------------------------------------------------------------------------


class Pins:
    """The pins of one node's connect-time balancing: ``<root>/kubeport/<node>/{map,link}_<name>``."""

    def __init__(self, root: Path, node: str) -> None:
        if not node or "/" in node or node in (".", ".."):
            raise ValueError(f"node name unusable as a directory: {node!r}")
        self.root = Path(root)
        self.directory = self.root / PIN_DIRECTORY / node

    def map_path(self, name: str) -> Path:
        return self.directory / f"map_{name}"

    def link_path(self, hook: str) -> Path:
        return self.directory / f"link_{hook}"

    def present(self) -> bool:
        return self.directory.is_dir() and any(self.directory.iterdir())

    def names(self, kind: str) -> list[str]:
        prefix = f"{kind}_"
        if not self.directory.is_dir():
            return []
        return sorted(p.name[len(prefix):] for p in self.directory.iterdir() if p.name.startswith(prefix))

    def open_maps(self) -> dict[str, int]:
        return self._open("map")

    def open_links(self) -> dict[str, int]:
        return self._open("link")

    def _open(self, kind: str) -> dict[str, int]:
        opened: dict[str, int] = {}
        try:
            for name in self.names(kind):
                opened[name] = open_pinned(self.directory / f"{kind}_{name}")
        except OSError:
            for fd in opened.values():
                os.close(fd)
            raise
        return opened

    def pin_map(self, name: str, fd: int) -> None:
        self._pin(self.map_path(name), fd)

    def pin_link(self, hook: str, fd: int) -> None:
        self._pin(self.link_path(hook), fd)

    def _pin(self, path: Path, fd: int) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # an older object of the same name: this one replaces it
        pin(fd, path)

    def remove(self) -> bool:
        """Unpin everything of this node: its links detach once no process holds them. False: none."""
        return remove_pins(self.directory)


def remove_pins(directory: Path) -> bool:
    """Unlink the pins under ``directory`` and the directory itself (bpffs unlink = unpin)."""
    if not directory.exists():
        return False
    try:
        shutil.rmtree(directory)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise PinError(exc.errno, f"removing {directory}: {exc.strerror}") from None
    return True

"""Which file systems a manifest read may hang on, by device number.

A read from a local disk or from memory returns; one from a network or FUSE file system may
wait for a server that does not answer, for as long as it likes. The source reads a file
where it may hang in a thread with a deadline (:class:`~kubeport.endpoints.manifests.batch.Disk`),
and every other file on the event loop: the hand-over to a thread per file more than doubled
a first load of many small files from a local disk (bench/RESULTS.md, "Measurements behind
the design").

The device of a file (``st_dev``, in the listing's stat) is looked up in
``/proc/self/mountinfo``, whose fields give each mount's ``major:minor`` and its file system
type (proc(5)). A device not found there, or of a type not known to be local, may hang.
"""

from __future__ import annotations

import os

#: file systems whose reads do not wait for another machine or a user-space server
LOCAL_TYPES = frozenset({
    "ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "jfs", "reiserfs", "vfat", "exfat", "ntfs3",
    "zfs", "bcachefs", "tmpfs", "ramfs", "devtmpfs", "overlay", "squashfs", "erofs", "iso9660",
    "udf", "hugetlbfs",
})


def mount_types(mountinfo: str) -> dict[int, str]:
    """Device number -> file system type, from the text of /proc/self/mountinfo."""
    found: dict[int, str] = {}
    for line in mountinfo.splitlines():
        fields, separator, rest = line.partition(" - ")
        parts = fields.split()
        if not separator or len(parts) < 3 or not rest:
            continue
        major, _, minor = parts[2].partition(":")
        try:
            device = os.makedev(int(major), int(minor))
        except ValueError:
            continue
        found.setdefault(device, rest.split()[0])
    return found


class FileSystems:
    """:meth:`may_hang` by device, from the mount table, read again when a device is new."""

    def __init__(self, mountinfo: str = "/proc/self/mountinfo") -> None:
        self._mountinfo = mountinfo
        self._types: dict[int, str] = {}

    def may_hang(self, device: int | None) -> bool:
        if device is None:
            return True
        fs_type = self._types.get(device)
        if fs_type is None:
            self._types = self._read()  # a mount since the last look
            # Not in the table (a btrfs subvolume's own device, a file of a lower layer): may
            # hang, and not looked up again.
            fs_type = self._types.setdefault(device, "")
        return fs_type not in LOCAL_TYPES

    def _read(self) -> dict[int, str]:
        try:
            with open(self._mountinfo, encoding="utf-8", errors="replace") as table:
                return mount_types(table.read())
        except OSError:
            return {}

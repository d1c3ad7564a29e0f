"""Which manifest reads go to a thread with a deadline: those on file systems that may hang
(network, FUSE), known by the file's device in /proc/self/mountinfo (proc(5))."""

from __future__ import annotations

import os

import pytest

from kubeport.endpoints.manifests.filesystems import FileSystems, mount_types

# Shaped as Linux 6.1 prints /proc/self/mountinfo (fields of proc(5); optional fields before " - ").
MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
24 22 0:24 / /tmp rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,size=4096k
25 22 0:45 / /etc/kubeport/manifests rw,relatime shared:30 - nfs4 10.0.0.5:/export rw,vers=4.2
26 22 0:46 / /mnt/sshfs rw,nosuid,nodev,relatime shared:31 - fuse.sshfs user@host:/ rw,user_id=0
27 22 0:47 / /var/lib/kubelet/pods/x/volumes/kubernetes.io~configmap/m rw,relatime - tmpfs tmpfs rw
28 22 0:48 / /merged rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
malformed line
"""


def test_mount_types_by_device():
    types = mount_types(MOUNTINFO)
    assert types[os.makedev(254, 0)] == "ext4"
    assert types[os.makedev(0, 45)] == "nfs4"
    assert types[os.makedev(0, 46)] == "fuse.sshfs"
    assert len(types) == 7


@pytest.mark.parametrize("device, hangs", [
    pytest.param(os.makedev(254, 0), False, id="ext4"),
    pytest.param(os.makedev(0, 24), False, id="tmpfs"),
    pytest.param(os.makedev(0, 47), False, id="configmap_volume_tmpfs"),
    pytest.param(os.makedev(0, 48), False, id="overlay"),
    pytest.param(os.makedev(0, 45), True, id="nfs4"),
    pytest.param(os.makedev(0, 46), True, id="fuse"),
    pytest.param(os.makedev(0, 21), True, id="not_known_to_be_local"),
    pytest.param(os.makedev(9, 9), True, id="not_in_the_table"),
    pytest.param(None, True, id="device_not_known"),
])
def test_may_hang(tmp_path, device, hangs):
    table = tmp_path / "mountinfo"
    table.write_text(MOUNTINFO)
    assert FileSystems(str(table)).may_hang(device) is hangs


def test_a_mount_made_later_is_found(tmp_path):
    table = tmp_path / "mountinfo"
    table.write_text(MOUNTINFO)
    filesystems = FileSystems(str(table))
    assert filesystems.may_hang(os.makedev(254, 0)) is False
    table.write_text(MOUNTINFO + "29 22 0:60 / /new rw - nfs 10.0.0.6:/e rw\n")
    assert filesystems.may_hang(os.makedev(0, 60)) is True

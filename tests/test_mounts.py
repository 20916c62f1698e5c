"""Mount discovery on captured /proc/self/mountinfo text: which filesystems a user expects to be watched."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainguard.records import MountKind
from trainguard.sources.mounts import (
    classify,
    containing_mount,
    parse_mountinfo,
    read_mounts,
    select,
    unescape,
)

DATA = Path(__file__).parent / "data"
HOST = parse_mountinfo((DATA / "mountinfo_gpu_host.txt").read_text())
CONTAINER = parse_mountinfo((DATA / "mountinfo_container.txt").read_text())


def watched(mounts, **kw) -> dict[str, str]:
    return {m.mount_point: m.fstype for m in select(mounts, **kw)}


def test_parse_reads_every_line_with_devices_roots_and_optional_fields():
    by_mp = {m.mount_point: m for m in HOST}
    assert len(HOST) == len((DATA / "mountinfo_gpu_host.txt").read_text().splitlines())
    root = by_mp["/"]
    assert (root.fstype, root.source, root.major, root.minor, root.root) == ("ext4", "/dev/nvme0n1p2", 259, 2, "/")
    assert by_mp["/mnt/ckpt"].root == "/ckpt"
    assert by_mp["/mnt/nfs/datasets"].source == "10.0.0.5:/export/datasets"
    assert by_mp["/mnt/ro-image"].options.split(",")[0] == "ro"


def test_octal_escapes_in_mount_points_are_decoded():
    assert unescape(r"/mnt/my\040disk\011tab\134back") == "/mnt/my disk\ttab\\back"
    assert "/mnt/my disk" in {m.mount_point for m in HOST}


@pytest.mark.parametrize("fstype, kind", [
    ("ext4", MountKind.LOCAL), ("xfs", MountKind.LOCAL), ("btrfs", MountKind.LOCAL), ("zfs", MountKind.LOCAL),
    ("tmpfs", MountKind.LOCAL), ("overlay", MountKind.LOCAL), ("fuseblk", MountKind.LOCAL),
    ("nfs", MountKind.NETWORK), ("nfs4", MountKind.NETWORK), ("cifs", MountKind.NETWORK),
    ("smb3", MountKind.NETWORK), ("ceph", MountKind.NETWORK), ("lustre", MountKind.NETWORK),
    ("fuse.juicefs", MountKind.FUSE), ("fuse.s3fs", MountKind.FUSE), ("fuse.sshfs", MountKind.FUSE),
    ("fuse.rclone", MountKind.FUSE), ("fuse", MountKind.FUSE), ("fuse.ceph-fuse", MountKind.FUSE),
    ("proc", None), ("sysfs", None), ("cgroup", None), ("cgroup2", None), ("devpts", None), ("mqueue", None),
    ("squashfs", None), ("fuse.lxcfs", None), ("fuse.gvfsd-fuse", None), ("nsfs", None), ("autofs", None),
    ("vboxsf", None),
])
def test_classify(fstype, kind):
    assert classify(fstype) is kind


def test_gpu_host_watches_real_filesystems_once_each():
    assert watched(HOST) == {
        "/": "ext4", "/boot/efi": "vfat", "/data": "xfs", "/home": "ext4",
        "/dev/shm": "tmpfs", "/run": "tmpfs", "/run/lock": "tmpfs", "/run/user/1000": "tmpfs",
        "/mnt/nfs/datasets": "nfs4", "/mnt/team": "cifs", "/mnt/ceph": "ceph", "/lustre": "lustre",
        "/jfs": "fuse.juicefs", "/mnt/s3": "fuse.s3fs", "/mnt/remote": "fuse.sshfs", "/mnt/gdrive": "fuse.rclone",
        "/mnt/autodl": "fuse", "/tank": "zfs", "/tank/ckpt": "zfs",
        "/scratch": "btrfs",  # and not /var/cache/big: another subvolume of the same btrfs
        "/mnt/my disk": "ext4", "/mnt/stacked": "xfs",  # the mount on top, not the one it hides
        "/mnt/usb": "fuseblk",
    }


def test_skipped_on_the_gpu_host_and_why():
    chosen = watched(HOST)
    for mp in ("/proc", "/sys", "/sys/fs/cgroup", "/dev", "/dev/pts", "/dev/mqueue", "/dev/hugepages",
               "/snap/core20/2015",                   # squashfs snap
               "/var/lib/docker/overlay2/3f2a9c/merged",  # a container's overlay, seen from the host
               "/var/lib/kubelet/pods/abc/volumes/kubernetes.io~empty-dir/cache",
               "/run/user/1000/gvfs", "/var/lib/lxcfs", "/run/docker/netns/1a2b3c",
               "/mnt/ro-image",  # read-only: nothing here can fill it
               "/mnt/ckpt",      # bind mount of /data/ckpt: same device as /data
               "/mnt/weird"):    # unknown type (vboxsf)
        assert mp not in chosen, mp


def test_kinds_reach_the_selected_mounts():
    kinds = {m.mount_point: m.kind for m in select(HOST)}
    assert kinds["/mnt/nfs/datasets"] is MountKind.NETWORK
    assert kinds["/jfs"] is MountKind.FUSE and kinds["/mnt/autodl"] is MountKind.FUSE
    assert kinds["/data"] is MountKind.LOCAL


def test_container_watches_overlay_root_and_volumes_not_runtime_files():
    # /etc/hosts, /etc/hostname and /etc/resolv.conf are single files the runtime binds in from its own
    # disk; the container's root overlay already reports that disk.
    assert watched(CONTAINER) == {
        "/": "overlay", "/dev/shm": "tmpfs", "/root/autodl-tmp": "xfs", "/root/autodl-fs": "fuse.juicefs",
    }


def test_configured_paths_are_always_watched_whatever_their_mount():
    chosen = watched(HOST, paths=["/mnt/ro-image/ckpt", "/mnt/weird/out", "/mnt/ckpt/run1",
                                  "/var/lib/docker/overlay2/3f2a9c/merged/x"])
    assert chosen["/mnt/ro-image"] == "ext4"
    assert chosen["/mnt/weird"] == "vboxsf"
    assert chosen["/var/lib/docker/overlay2/3f2a9c/merged"] == "overlay"
    # The bind mount the user named wins over the device's other mount point.
    assert "/mnt/ckpt" in chosen and "/data" not in chosen


def test_exclude_globs_and_extra_fstypes():
    chosen = watched(HOST, exclude=["/run*", "/mnt/*"], include_fstypes=["vboxsf"])
    assert not any(mp.startswith(("/run", "/mnt/")) for mp in chosen)
    assert "/data" in chosen
    assert watched(HOST, include_fstypes=["vboxsf"])["/mnt/weird"] == "vboxsf"
    # A path the user named beats an exclude glob.
    assert "/mnt/team" in watched(HOST, exclude=["/mnt/*"], paths=["/mnt/team/ckpt"])


def test_containing_mount_is_the_longest_prefix():
    assert containing_mount("/tank/ckpt/run1/model.pt", HOST).mount_point == "/tank/ckpt"
    assert containing_mount("/tank/other", HOST).mount_point == "/tank"
    assert containing_mount("/tankard", HOST).mount_point == "/", "a prefix must end at a path separator"
    assert containing_mount("/mnt/stacked/x", HOST).fstype == "xfs", "the later, visible mount"
    assert containing_mount("/data/../jfs/x", HOST).mount_point == "/jfs"


def test_garbage_lines_are_skipped_not_fatal():
    text = (DATA / "mountinfo_container.txt").read_text()
    noisy = "not a mountinfo line\n12 1 x:y / /bad rw - ext4 /dev/x rw\n\n" + text + "13 1 0:1 / /short\n"
    assert [m.mount_point for m in parse_mountinfo(noisy)] == [m.mount_point for m in CONTAINER]


def test_reads_this_machines_mount_table(tmp_path):
    mounts = read_mounts("/proc")
    assert any(m.mount_point == "/" for m in mounts)
    fake = tmp_path / "self"
    fake.mkdir()
    (fake / "mountinfo").write_text((DATA / "mountinfo_container.txt").read_text())
    assert read_mounts(str(tmp_path)) == CONTAINER, "the proc root is a parameter (a sidecar reads /host/proc)"


def test_the_mount_table_is_read_again_when_the_kernel_says_it_changed(tmp_path, monkeypatch):
    """The daemon asks for the table every cycle; it is read once and then only after a mount or unmount
    (the kernel's POLLPRI on mountinfo), not after a minute of waiting."""
    from tests.support.mounts import root_reason, tmpfs
    from trainguard.sources import mounts as mountinfo

    if reason := root_reason():
        pytest.skip(reason)
    table = mountinfo.MountTable()
    reads = []
    real_parse = mountinfo.parse_mountinfo
    monkeypatch.setattr(mountinfo, "parse_mountinfo", lambda text: reads.append(1) or real_parse(text))
    try:
        before = table()
        assert table() is before and len(reads) == 1  # unchanged: not read again
        with tmpfs(1 << 20) as mnt:
            during = table()
            assert str(mnt) in {m.mount_point for m in during} and len(reads) == 2
            assert table() is during
        after = table()
        assert str(mnt) not in {m.mount_point for m in after} and len(reads) == 3
    finally:
        table.close()

"""Mount discovery from /proc/<pid>/mountinfo: which filesystems are worth watching.

Pure parsing plus classification; no statvfs here (that can hang, see fs.py).
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import time
from select import POLLERR, POLLPRI, poll  # `select` here is the mount selection below
from typing import Iterable, Sequence

from trainguard.records import Mount, MountKind

# Kernel and virtual filesystems: never hold user data.
PSEUDO = frozenset({
    "proc", "sysfs", "cgroup", "cgroup2", "devpts", "devtmpfs", "mqueue", "debugfs", "tracefs", "securityfs",
    "pstore", "bpf", "configfs", "fusectl", "hugetlbfs", "autofs", "binfmt_misc", "rpc_pipefs", "nsfs",
    "efivarfs", "selinuxfs", "nfsd", "ramfs", "squashfs", "iso9660", "udf", "cramfs", "erofs",
    "fuse.lxcfs", "fuse.gvfsd-fuse", "fuse.portal", "fuse.snapfuse", "fuse.xdg-document-portal",
})
NETWORK = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "gpfs", "beegfs", "afs", "9p",
    "ocfs2", "gfs2", "orangefs", "pvfs2", "davfs", "virtiofs",
})
LOCAL = frozenset({
    "ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "tmpfs", "overlay", "f2fs", "vfat", "exfat", "ntfs", "ntfs3",
    "jfs", "reiserfs", "bcachefs", "nilfs2", "hfsplus", "fuseblk",
})
# Mount points that belong to container runtimes or the kernel, like node_exporter's default exclusion.
EXCLUDED_MOUNT_POINTS = (
    "/proc", "/proc/*", "/sys", "/sys/*", "/dev", "/dev/pts", "/dev/mqueue", "/dev/hugepages",
    "/run/credentials/*", "/var/lib/docker/*", "/var/lib/containers/storage/*", "/run/containerd/*",
    "/var/lib/containerd/*", "/var/lib/kubelet/pods/*", "/run/k3s/*", "/snap/*", "/var/snap/*",
    # Single files a container runtime binds in from its own disk; the container's root already shows that disk.
    "/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/dev/termination-log",
)

_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\040 \\011 \\012 \\134."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def classify(fstype: str) -> MountKind | None:
    """local / network / fuse, or None for pseudo and unknown filesystems."""
    if fstype in PSEUDO:
        return None
    if fstype.startswith("fuse.") or fstype == "fuse":
        return MountKind.FUSE
    if fstype in NETWORK or fstype.startswith("nfs"):
        return MountKind.NETWORK
    if fstype in LOCAL:
        return MountKind.LOCAL
    return None


def parse_mountinfo(text: str) -> list[Mount]:
    """Every line of mountinfo as a Mount; kind is classify(fstype) or LOCAL for unknown (filtered later).
    The table rarely changes between cycles: the same text is parsed once."""
    return list(_parsed(text))


@functools.lru_cache(maxsize=4)
def _parsed(text: str) -> tuple[Mount, ...]:
    return tuple(_parse(text))


def _parse(text: str) -> list[Mount]:
    mounts: list[Mount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        tail = right.split()
        if len(fields) < 6 or len(tail) < 2:
            continue
        try:
            major, minor = (int(x) for x in fields[2].split(":"))
        except ValueError:
            continue
        fstype = tail[0]
        mounts.append(Mount(
            mount_point=unescape(fields[4]), fstype=fstype, source=unescape(tail[1]), major=major, minor=minor,
            kind=classify(fstype) or MountKind.LOCAL, root=unescape(fields[3]), options=fields[5],
            mount_id=int(fields[0]) if fields[0].isdigit() else 0,
        ))
    return mounts


def _excluded(mount_point: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(mount_point, p) for p in patterns)


def containing_mount(path: str, mounts: Sequence[Mount]) -> Mount | None:
    """The mount a path lives on: the longest mount point prefix (later mounts shadow earlier ones)."""
    path = os.path.normpath(os.path.abspath(path))
    best: Mount | None = None
    for m in mounts:
        mp = m.mount_point
        if path == mp or path.startswith(mp.rstrip("/") + "/"):
            if best is None or len(mp) >= len(best.mount_point):
                best = m
    return best


def select(mounts: Sequence[Mount], *, exclude: Sequence[str] = (), include_fstypes: Sequence[str] = (),
           paths: Sequence[str] = ()) -> list[Mount]:
    """The mounts to watch: real filesystems, one entry per device (bind mounts deduped), plus the
    mounts holding each configured path, whatever their type."""
    forced = {m.mount_point for p in paths if (m := containing_mount(p, mounts))}

    def wanted(m: Mount) -> bool:
        if m.mount_point in forced:
            return True
        if classify(m.fstype) is None and m.fstype not in include_fstypes:
            return False
        if _excluded(m.mount_point, EXCLUDED_MOUNT_POINTS) and m.mount_point != "/dev/shm":
            return False
        if "ro" in m.options.split(","):
            return False  # nothing on this host can fill a read-only mount
        return not _excluded(m.mount_point, exclude)

    def rank(m: Mount) -> tuple[bool, bool, int]:
        # A bind mount shows the same device again: prefer the path the user named, then the
        # mount of the filesystem's root, then the shortest mount point.
        return (m.mount_point in forced, m.root == "/", -len(m.mount_point))

    # A mount point mounted over again: only the last (visible) mount counts.
    visible = {m.mount_point: m for m in mounts}
    chosen: dict[tuple[int, int], Mount] = {}
    for m in visible.values():
        if wanted(m):
            current = chosen.get((m.major, m.minor))
            if current is None or rank(m) > rank(current):
                chosen[(m.major, m.minor)] = m
    return sorted(chosen.values(), key=lambda m: m.mount_point)


def mountinfo_path(proc_root: str = "/proc") -> str:
    """The mount table to read under proc_root.

    Our own /proc: /proc/self/mountinfo. A host /proc mounted into a container
    (/host/proc): its "self" is the container's own mount namespace (or nothing,
    without the host PID namespace), so read the host's init, <proc_root>/1/mountinfo.
    """
    if os.path.normpath(proc_root) != "/proc":
        host_init = os.path.join(proc_root, "1", "mountinfo")
        if os.path.exists(host_init):
            return host_init
    return os.path.join(proc_root, "self", "mountinfo")


def read_mounts(proc_root: str = "/proc", *, own: bool = False) -> list[Mount]:
    """The mount table (see mountinfo_path); own=True: this process's own mount namespace,
    <proc_root>/self/mountinfo, for paths this process opens itself."""
    path = os.path.join(proc_root, "self", "mountinfo") if own else mountinfo_path(proc_root)
    with open(path, encoding="utf-8", errors="surrogateescape") as fh:
        return parse_mountinfo(fh.read())


class MountTable:
    """read_mounts for a caller that asks every cycle: the table is read again only when it changed.

    An open mountinfo polls POLLPRI once a mount, unmount or remount happened in its namespace (what
    systemd and util-linux's monitor wait on); reading it makes the kernel print every mount, a twentieth
    of a cycle beside 30 mounts and more on a node with hundreds. It is still read once a minute, for a
    /proc that never signals (gVisor's, say)."""

    REREAD_S = 60.0

    def __init__(self) -> None:
        self._fh = None
        self._path = ""
        self._mounts: tuple[Mount, ...] = ()
        self._read_at = float("-inf")

    def __call__(self, proc_root: str = "/proc") -> tuple[Mount, ...]:
        """The table, the same tuple while nothing changed (the caller may compare by identity)."""
        path = mountinfo_path(proc_root)
        if self._fh is None or path != self._path or self._changed():
            self._read(path)
        return self._mounts

    def _changed(self) -> bool:
        if time.monotonic() - self._read_at >= self.REREAD_S:
            return True
        poller = poll()
        poller.register(self._fh, POLLPRI | POLLERR)
        return bool(poller.poll(0))

    def _read(self, path: str) -> None:
        if self._fh is None or path != self._path:
            self.close()
            # Opened before it is read: a change from here on is signalled, and the read below sees it.
            self._fh = open(path, encoding="utf-8", errors="surrogateescape")
            self._path = path
        self._fh.seek(0)
        self._read_at = time.monotonic()
        self._mounts = tuple(parse_mountinfo(self._fh.read()))

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def host_path(host_root: str, path: str) -> str:
    """A host path as reachable here: "/data" under host_root "/host/root" is "/host/root/data"."""
    if os.path.normpath(host_root) == "/":
        return path
    return os.path.join(host_root, path.lstrip("/"))

"""The rules that decide whether trainguard may touch a path at all (which roots: roots.py).

- which files a process has open or mapped right now (/proc/*/fd and /proc/*/maps,
  keyed by (st_dev, st_ino) so container path differences do not matter);
- the grace period for files that may still be being written.
"""

from __future__ import annotations

import logging
import os
import time
from array import array
from typing import Callable, Iterable

from trainguard.actions.cleanup.uninspected import HoldBack, Uninspected, read_uninspected
from trainguard.rootcheck import home_dirs  # noqa: F401  (the runner finds the homes here)

log = logging.getLogger(__name__)

class OpenFiles:
    """Which (st_dev, st_ino) any process has open (fd) or mapped (mmap), from /proc.

    Built without touching the filesystems the files live on, so a file open on a hung
    FUSE/NFS mount cannot wedge the sweep: the fd's inode and mount come from
    /proc/PID/fdinfo/N (ino, mnt_id), the mount's device from /proc/PID/mountinfo
    (read once per mount namespace), mappings from /proc/PID/maps. readlink of
    /proc/PID/fd/N only names the file and skips sockets, pipes and anon inodes.
    Refreshed when older than max_age seconds, so the check just before a delete is
    never staler than that. Processes whose fds cannot be read (another user's, when
    not root) are kept in .uninspected; then .hold_back(lstat) says whether one of them
    could have an entry open (uninspected.py), so the engine keeps it (None: all inspected).
    """

    def __init__(self, proc_root: str = "/proc", *, max_age: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.proc_root = proc_root
        self.max_age = max_age
        self.clock = clock
        self._keys: dict[tuple[int, int], int] = {}  # (dev, ino) -> a PID holding it
        self._loose = False  # some key is (_ANY_DEV, ino): see LOOSE_DEVS
        self._sorted: dict[int, bytes] = {}  # inodes_on(dev), per refresh
        self._built_at: float | None = None
        self.uninspected: tuple[Uninspected, ...] = ()
        self.hold_back: HoldBack | None = None

    def refresh(self) -> None:
        keys: dict[tuple[int, int], int] = {}
        uninspected: list[Uninspected] = []
        self_pid = str(os.getpid())
        devs_by_ns: dict[str, dict[int, int]] = {}
        try:
            pids = [p for p in os.listdir(self.proc_root) if p.isdigit()]
        except OSError as exc:
            log.warning("cleanup: cannot list %s (%s); open-file checks are blind", self.proc_root, exc.strerror)
            pids = []
        for pid in pids:
            if pid == self_pid:
                continue  # our own directory fds are not users of the files
            try:
                self._add_fds(pid, keys, devs_by_ns)
            except FileNotFoundError:
                continue  # exited
            except OSError:
                proc = read_uninspected(self.proc_root, pid)
                if proc is not None:
                    uninspected.append(proc)
                continue  # its maps are unreadable too
            self._add_maps(pid, keys)
        self._keys = keys
        self._sorted = {}
        self._loose = any(dev == _ANY_DEV for dev, _ino in keys)
        if tuple(uninspected) != self.uninspected:
            self.uninspected = tuple(uninspected)
            self.hold_back = HoldBack(uninspected) if uninspected else None
        self._built_at = self.clock()

    def _add_fds(self, pid: str, keys: dict[tuple[int, int], int], devs_by_ns: dict[str, dict[int, int]]) -> None:
        base = os.path.join(self.proc_root, pid)
        fds = os.listdir(os.path.join(base, "fd"))
        devs: dict[int, int] | None = None
        for fd in fds:
            try:
                target = os.readlink(os.path.join(base, "fd", fd))
                if not target.startswith("/"):
                    continue  # socket:[..], pipe:[..], anon_inode:..
                mnt, ino, _flags = fd_info(os.path.join(base, "fdinfo", fd))
            except OSError:
                continue
            if devs is None:
                devs = mount_devs(base, devs_by_ns)
            dev = devs.get(mnt)
            if dev is not None and ino is not None:
                keys.setdefault((dev, ino), int(pid))
                if dev in LOOSE_DEVS:  # see mount_devs
                    keys.setdefault((_ANY_DEV, ino), int(pid))

    def _add_maps(self, pid: str, keys: dict[tuple[int, int], int]) -> None:
        # A safetensors/np.memmap user may close its fd and keep only the mapping.
        try:
            with open(os.path.join(self.proc_root, pid, "maps"), encoding="ascii", errors="replace") as fh:
                for line in fh:
                    parts = line.split(None, 5)
                    if len(parts) < 5 or parts[4] == "0":
                        continue
                    major, _, minor = parts[3].partition(":")
                    try:
                        keys.setdefault((os.makedev(int(major, 16), int(minor, 16)), int(parts[4])), int(pid))
                    except ValueError:
                        continue
        except OSError:
            return

    def _fresh(self) -> None:
        if self._built_at is None or self.clock() - self._built_at > self.max_age:
            self.refresh()

    def unverifiable(self, st: os.stat_result) -> bool:
        """Whether a process this index could not inspect could have the entry (lstat st) open."""
        return self.hold_back is not None and self.hold_back(st)

    def keys(self):
        """The (dev, ino) index itself, for a hot loop's first look (then is_open or holder)."""
        self._fresh()
        return _AnyDevKeys(self._keys) if self._loose else self._keys

    def inodes_on(self, dev: int) -> bytes:
        """The inodes open on device dev (and, loose devices, on any), sorted, as native uint64s:
        the form the compiled age loop searches (see age_fast.py)."""
        self._fresh()
        cached = self._sorted.get(dev)
        if cached is None:
            inos = sorted({ino for d, ino in self._keys if d in (dev, _ANY_DEV)})
            cached = self._sorted[dev] = array("Q", inos).tobytes()
        return cached

    def is_open(self, dev: int, ino: int) -> bool:
        self._fresh()
        return (dev, ino) in self._keys or (_ANY_DEV, ino) in self._keys

    def any_open(self, inodes: Iterable[tuple[int, int]]) -> bool:
        self._fresh()
        return self.holder(inodes) is not None

    def holder(self, inodes: Iterable[tuple[int, int]]) -> int | None:
        """A PID that has one of inodes open or mapped (from the last refresh), or None."""
        keys = self._keys
        for dev, ino in inodes:
            pid = keys.get((dev, ino))
            if pid is None:
                pid = keys.get((_ANY_DEV, ino))
            if pid is not None:
                return pid
        return None

    def describe(self, pid: int) -> str:
        """'PID 812 (python train.py)' for reports."""
        try:
            with open(os.path.join(self.proc_root, str(pid), "cmdline"), "rb") as fh:
                cmd = fh.read(4096).replace(b"\0", b" ").strip().decode("utf-8", "backslashreplace")
        except OSError:
            cmd = ""
        if len(cmd) > 60:
            cmd = cmd[:57] + "..."
        return f"PID {pid} ({cmd})" if cmd else f"PID {pid}"


class _AnyDevKeys:
    """`key in` on the index, counting an inode open on a loose-device filesystem as open anywhere."""

    __slots__ = ("_keys",)

    def __init__(self, keys: dict[tuple[int, int], int]):
        self._keys = keys

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self._keys or (_ANY_DEV, key[1]) in self._keys


def fd_info(path: str) -> tuple[int | None, int | None, int | None]:
    """(mnt_id, ino, open flags) of an open fd from its fdinfo: no access to the file's filesystem."""
    mnt = ino = flags = None
    with open(path, "rb") as fh:
        for line in fh:
            if line.startswith(b"mnt_id:"):
                mnt = int(line[7:])
            elif line.startswith(b"ino:"):
                ino = int(line[4:])
            elif line.startswith(b"flags:"):
                flags = int(line[6:], 8)
    return mnt, ino, flags


# Filesystems whose st_dev is not the device mountinfo shows (btrfs subvolumes, overlayfs
# with xino): an open inode there counts as open on any device (the safe side).
_LOOSE_TYPES = (b"btrfs", b"overlay", b"bcachefs")
LOOSE_DEVS: set[int] = set()  # devices of such filesystems, found by mount_devs
_ANY_DEV = -1


def mount_devs(base: str, cache: dict[str, dict[int, int]]) -> dict[int, int]:
    """mnt_id -> st_dev for the mount namespace of the process at base (cached per namespace)."""
    try:
        ns = os.readlink(os.path.join(base, "ns", "mnt"))
    except OSError:
        ns = base  # no namespace link: read this process's own table
    found = cache.get(ns)
    if found is not None:
        return found
    found = {}
    try:
        with open(os.path.join(base, "mountinfo"), "rb") as fh:
            for line in fh:
                parts = line.split(None, 3)
                if len(parts) < 3:
                    continue
                major, _, minor = parts[2].partition(b":")
                try:
                    dev = found[int(parts[0])] = os.makedev(int(major), int(minor))
                except ValueError:
                    continue
                fstype = line.partition(b" - ")[2].split(b" ", 1)[0]
                if fstype in _LOOSE_TYPES:
                    LOOSE_DEVS.add(dev)
    except OSError:
        pass
    cache[ns] = found
    return found


def last_change(st: os.stat_result) -> float:
    """When the file was last written or renamed into place (atomic saves bump ctime)."""
    return max(st.st_mtime, st.st_ctime)


def in_grace(st: os.stat_result, now: float, grace: float) -> bool:
    return now - last_change(st) < grace

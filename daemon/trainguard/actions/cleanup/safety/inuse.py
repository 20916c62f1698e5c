"""The rules that decide whether trainguard may touch a path at all (which roots: roots.py).

- what is in use right now, keyed by (st_dev, st_ino) so container path differences do not
  matter: files a process has open (/proc/*/fd) or mapped (/proc/*/maps), and files the kernel
  holds (kernel_holders.py: loop devices' backing files, active swap files);
- the grace period for files that may still be being written.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from array import array
from typing import Callable, Iterable, Union

from trainguard.actions.cleanup.safety.kernel_holders import KernelHolders, Unknowns
from trainguard.actions.cleanup.safety.uninspected import HoldBack, Uninspected, read_uninspected

log = logging.getLogger(__name__)

# Who holds a file: a PID, or what the kernel holds it as ("backing file of /dev/loop1 (mounted on /mnt)").
Holder = Union[int, str]


class _Index:
    """One reading of /proc and the kernel's holders: never changed once built, so a thread that
    took it reads one consistent state while another builds the next."""

    __slots__ = ("keys", "loose", "sorted", "built_at", "unknown")

    def __init__(self, keys: dict[tuple[int, int], Holder], built_at: float, unknown: Unknowns):
        self.keys = keys
        self.loose = any(dev == _ANY_DEV for dev, _ino in keys)  # some key is (_ANY_DEV, ino): see LOOSE_DEVS
        self.sorted: dict[int, bytes] = {}  # inodes_on(dev), computed from these keys only
        self.built_at = built_at
        self.unknown = unknown


class OpenFiles:
    """Which (st_dev, st_ino) are in use: open (fd) or mapped (mmap) by a process, from /proc, or
    held by the kernel (a loop device's backing file, an active swap file: kernel_holders.py).

    Built without touching the filesystems the files live on, so a file open on a hung
    FUSE/NFS mount cannot wedge the sweep: the fd's inode and mount come from
    /proc/PID/fdinfo/N (ino, mnt_id), the mount's device from /proc/PID/mountinfo
    (read once per mount namespace), mappings from /proc/PID/maps. readlink of
    /proc/PID/fd/N only names the file and skips sockets, pipes and anon inodes.
    Every holder is keyed the same way (hold()): on a filesystem whose st_dev is not the device
    /proc shows (LOOSE_DEVS), an inode counts as in use on any device.
    Refreshed when older than max_age seconds, so the check just before a delete is
    never staler than that; one refresh at a time (worker threads judge too), each replacing
    the whole index at once. Processes whose fds cannot be read (another user's, when
    not root) are kept in .uninspected; then .hold_back(lstat) says whether one of them
    could have an entry open (uninspected.py), so the engine keeps it (None: all inspected).
    """

    def __init__(self, proc_root: str = "/proc", *, max_age: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 sys_root: str = "/sys", dev_root: str = "/dev"):
        self.proc_root = proc_root
        self.max_age = max_age
        self.clock = clock
        self.kernel = KernelHolders(proc_root, sys_root, dev_root)
        self._index = _Index({}, float("-inf"), Unknowns({}))
        self._lock = threading.RLock()  # one refresh at a time
        self.uninspected: tuple[Uninspected, ...] = ()
        self.hold_back: HoldBack | None = None

    def refresh(self) -> None:
        with self._lock:
            self._index = self._read()

    def _read(self) -> _Index:
        started = self.clock()  # the index is as old as the moment its reading began
        keys: dict[tuple[int, int], Holder] = {}
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
            self._add_maps(pid, keys, devs_by_ns)
        held, unknown = self.kernel.read()
        for h in held:
            hold(keys, h.dev, h.ino, h.what)
        if tuple(uninspected) != self.uninspected:
            self.uninspected = tuple(uninspected)
            self.hold_back = HoldBack(uninspected) if uninspected else None
        return _Index(keys, started, unknown)

    def _add_fds(self, pid: str, keys: dict[tuple[int, int], Holder], devs_by_ns: dict[str, dict[int, int]]) -> None:
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
                hold(keys, dev, ino, int(pid))

    def _add_maps(self, pid: str, keys: dict[tuple[int, int], Holder], devs_by_ns: dict[str, dict[int, int]]) -> None:
        # A safetensors/np.memmap user may close its fd and keep only the mapping. maps shows the device
        # of the mount (as mountinfo does), so its namespace's loose devices must be known (mount_devs).
        base = os.path.join(self.proc_root, pid)
        try:
            with open(os.path.join(base, "maps"), encoding="ascii", errors="replace") as fh:
                lines = [parts for parts in map(str.split, fh) if len(parts) >= 5 and parts[4] != "0"]
        except OSError:
            return
        if lines:
            mount_devs(base, devs_by_ns)
        for parts in lines:
            major, _, minor = parts[3].partition(":")
            try:
                hold(keys, os.makedev(int(major, 16), int(minor, 16)), int(parts[4]), int(pid))
            except ValueError:
                continue

    def _fresh(self) -> _Index:
        index = self._index
        if self.clock() - index.built_at > self.max_age:
            with self._lock:
                if self._index is index:  # else another thread refreshed while this one waited
                    self.refresh()
                index = self._index
        return index

    def unverifiable(self, st: os.stat_result) -> bool:
        """Whether a process this index could not inspect could have the entry (lstat st) open."""
        return self.hold_back is not None and self.hold_back(st)

    def unknown(self, dev: int, path: str, mnt: int | None) -> str | None:
        """What the kernel holds that could not be identified and could be under the root at path (on
        device dev, on mount mnt): on a filesystem that did not answer, a loop device whose backing file
        cannot be told from here (anywhere), or whose path, hidden by permissions, is under the root."""
        return self._fresh().unknown.about(dev, path, mnt)

    def keys(self):
        """The (dev, ino) index itself, for a hot loop's first look (then is_open or holder)."""
        index = self._fresh()
        return _AnyDevKeys(index.keys) if index.loose else index.keys

    def inodes_on(self, dev: int) -> bytes:
        """The inodes in use on device dev (and, loose devices, on any), sorted, as native uint64s:
        the form the compiled age loop searches (see engine/agepass.py)."""
        index = self._fresh()
        cached = index.sorted.get(dev)
        if cached is None:
            inos = sorted({ino for d, ino in index.keys if d in (dev, _ANY_DEV)})
            cached = index.sorted[dev] = array("Q", inos).tobytes()
        return cached

    def is_open(self, dev: int, ino: int) -> bool:
        keys = self._fresh().keys
        return (dev, ino) in keys or (_ANY_DEV, ino) in keys

    def any_open(self, inodes: Iterable[tuple[int, int]]) -> bool:
        self._fresh()
        return self.holder(inodes) is not None

    def holder(self, inodes: Iterable[tuple[int, int]]) -> Holder | None:
        """Who holds one of inodes (from the last refresh): a PID, what the kernel holds it as, or None."""
        keys = self._index.keys
        for dev, ino in inodes:
            found = keys.get((dev, ino))
            if found is None:
                found = keys.get((_ANY_DEV, ino))
            if found is not None:
                return found
        return None

    def describe(self, holder: Holder) -> str:
        """'PID 812 (python train.py)' for reports; a kernel holder says what it is."""
        if isinstance(holder, str):
            return holder
        pid = holder
        try:
            with open(os.path.join(self.proc_root, str(pid), "cmdline"), "rb") as fh:
                cmd = fh.read(4096).replace(b"\0", b" ").strip().decode("utf-8", "backslashreplace")
        except OSError:
            cmd = ""
        if len(cmd) > 60:
            cmd = cmd[:57] + "..."
        return f"PID {pid} ({cmd})" if cmd else f"PID {pid}"


def hold(keys: dict[tuple[int, int], Holder], dev: int, ino: int, holder: Holder) -> None:
    """Key one holder of (dev, ino): on a loose device (LOOSE_DEVS), the inode on any device too."""
    keys.setdefault((dev, ino), holder)
    if dev in LOOSE_DEVS:
        keys.setdefault((_ANY_DEV, ino), holder)


class _AnyDevKeys:
    """`key in` on the index, counting an inode open on a loose-device filesystem as open anywhere."""

    __slots__ = ("_keys",)

    def __init__(self, keys: dict[tuple[int, int], Holder]):
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

"""The rules that decide whether trainguard may touch a path at all.

- which roots are acceptable (never /, a system directory, a home directory itself,
  a symlink, or something that is not a directory);
- which mount points lie below a root (never crossed, even bind mounts of the same
  filesystem, which share st_dev);
- which files a process has open or mapped right now (/proc/*/fd and /proc/*/maps,
  keyed by (st_dev, st_ino) so container path differences do not matter);
- the grace period for files that may still be being written.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from trainguard.actions.walker import mount_id
from trainguard.rootcheck import (  # noqa: F401
    FORBIDDEN_TREES,
    SYSTEM_DIRS,
    UnsafeRoot,
    check_root_text,
    home_dirs,
)
from trainguard.sources.mounts import read_mounts

log = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class OpenedRoot:
    path: str  # the real, normalised path
    fd: int
    dev: int
    ino: int
    mnt: int | None = None  # its mount (walker.mount_id): the walk never enters another one


def open_checked_root(root: str, homes: frozenset[str] | None = None) -> OpenedRoot:
    """Runtime checks: exists, is a real directory reached without symlinks, passes the static checks.

    The caller closes .fd. A root reached through a symlink anywhere in its path is
    refused (the real path must be configured), so the path judged is the path cleaned.
    """
    norm = check_root_text(root, homes)
    real = os.path.realpath(norm)
    if real != norm:
        raise UnsafeRoot(f"root {norm!r} is reached through a symlink (it resolves to {real!r}); configure the real path")
    try:
        fd = os.open(norm, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UnsafeRoot(f"root {norm!r} does not exist") from None
    except NotADirectoryError:
        raise UnsafeRoot(f"root {norm!r} is not a directory") from None
    except OSError as exc:
        raise UnsafeRoot(f"root {norm!r} cannot be opened: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):  # pragma: no cover - O_DIRECTORY already ensures it
        os.close(fd)
        raise UnsafeRoot(f"root {norm!r} is not a directory")
    # The path may have been swapped between realpath and open: confirm it is still the same object.
    try:
        again = os.stat(norm, follow_symlinks=False)
    except OSError:
        again = None
    if again is None or (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) or os.path.realpath(norm) != norm:
        os.close(fd)
        raise UnsafeRoot(f"root {norm!r} changed while it was being opened")
    return OpenedRoot(norm, fd, st.st_dev, st.st_ino, mount_id(fd))


def mount_points(proc_root: str = "/proc") -> list[str]:
    """Mount points in this process's mount namespace, from <proc_root>/self/mountinfo."""
    return [m.mount_point for m in read_mounts(proc_root, own=True)]


def mounts_below(root: str, proc_root: str = "/proc") -> frozenset[str]:
    """Relative paths (to root) of mount points strictly below root: bind mounts included."""
    prefix = root.rstrip("/") + "/"
    return frozenset(p[len(prefix):] for p in mount_points(proc_root) if p.startswith(prefix) and p != prefix)


def mount_point_of(path: str) -> str:
    """The mount point holding path (walk up until st_dev changes), for reports."""
    path = os.path.realpath(path)
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return path
    while path != "/":
        parent = os.path.dirname(path)
        try:
            if os.stat(parent).st_dev != dev:
                return path
        except OSError:
            return path
        path = parent
    return "/"


class OpenFiles:
    """Which (st_dev, st_ino) any process has open (fd) or mapped (mmap), from /proc.

    Built in one sweep and refreshed when older than max_age seconds, so the check
    just before a delete is never staler than that. Processes whose fds cannot be
    read (another user's, when not root) are counted in .unreadable.
    """

    def __init__(self, proc_root: str = "/proc", *, max_age: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.proc_root = proc_root
        self.max_age = max_age
        self.clock = clock
        self._keys: set[tuple[int, int]] = set()
        self._built_at: float | None = None
        self.unreadable = 0

    def refresh(self) -> None:
        keys: set[tuple[int, int]] = set()
        unreadable = 0
        self_pid = str(os.getpid())
        try:
            pids = [p for p in os.listdir(self.proc_root) if p.isdigit()]
        except OSError as exc:
            log.warning("cleanup: cannot list %s (%s); open-file checks are blind", self.proc_root, exc.strerror)
            pids = []
        for pid in pids:
            fd_dir = os.path.join(self.proc_root, pid, "fd")
            try:
                fds = os.listdir(fd_dir)
            except FileNotFoundError:
                continue  # exited
            except OSError:
                unreadable += 1
                fds = []
            for fd in fds:
                if pid == self_pid:
                    continue  # our own directory fds are not users of the files
                try:
                    st = os.stat(os.path.join(fd_dir, fd))  # follows the magic link to the open file
                except OSError:
                    continue
                keys.add((st.st_dev, st.st_ino))
            self._add_maps(pid, keys)
        self._keys = keys
        self.unreadable = unreadable
        self._built_at = self.clock()

    def _add_maps(self, pid: str, keys: set[tuple[int, int]]) -> None:
        # A safetensors/np.memmap user may close its fd and keep only the mapping.
        try:
            with open(os.path.join(self.proc_root, pid, "maps"), encoding="ascii", errors="replace") as fh:
                for line in fh:
                    parts = line.split(None, 5)
                    if len(parts) < 5 or parts[4] == "0":
                        continue
                    major, _, minor = parts[3].partition(":")
                    try:
                        keys.add((os.makedev(int(major, 16), int(minor, 16)), int(parts[4])))
                    except ValueError:
                        continue
        except OSError:
            return

    def is_open(self, dev: int, ino: int) -> bool:
        if self._built_at is None or self.clock() - self._built_at > self.max_age:
            self.refresh()
        return (dev, ino) in self._keys

    def any_open(self, inodes: Iterable[tuple[int, int]]) -> bool:
        if self._built_at is None or self.clock() - self._built_at > self.max_age:
            self.refresh()
        return any(key in self._keys for key in inodes)


def last_change(st: os.stat_result) -> float:
    """When the file was last written or renamed into place (atomic saves bump ctime)."""
    return max(st.st_mtime, st.st_ctime)


def in_grace(st: os.stat_result, now: float, grace: float) -> bool:
    return now - last_change(st) < grace

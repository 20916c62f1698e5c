"""Directories deleted as one unit (a checkpoint-* directory, a cache entry): measured and removed
relative to their parent's fd, never through a symlink, never across a mount point (checked by
mount id, so a bind mount of the same filesystem is seen), never past another filesystem."""

from __future__ import annotations

import errno
import os
import stat
from typing import NamedTuple

from trainguard.actions.cleanup.engine.walker import Hook, WalkProblem, open_dir_at, walk


class UnitStats(NamedTuple):
    bytes: int  # freed by deleting it (multi-linked files count 0)
    files: int
    newest_change: float  # newest mtime/ctime inside: is it still being written?
    newest_access: float  # newest atime or mtime of a regular file inside: when it was last used
    inodes: list[tuple[int, int]]
    multi_linked: bool  # some file also lives elsewhere (e.g. a conda package linked into an env)
    problems: int
    mounts: int = 0  # mount points inside (a bind mount): such a unit is never deleted
    inside_change: float = 0.0  # newest mtime/ctime below the directory (its own ctime aside: a rename sets it)


def measure_unit(parent_fd: int, name: str, dev: int, mnt: int | None, hook: Hook | None = None) -> UnitStats:
    """Measure a directory deleted as one unit (a checkpoint-* directory, a cache entry).

    A unit that is itself a mount point raises EXDEV; mount points inside it are not
    entered and counted in .mounts (the unit must then stay: deleting it would fail
    halfway, or worse, reach into what is mounted there). dev and mnt: the root's, which
    parent_fd is on.
    """
    fd = open_dir_at(parent_fd, name, dev, mnt)
    try:
        dst = os.fstat(fd)
        total = files = problems = 0
        newest = max(dst.st_mtime, dst.st_ctime)
        accessed = 0.0
        inodes: list[tuple[int, int]] = []
        multi = False

        mounts = 0
        inside = 0.0

        def count(p: WalkProblem) -> None:
            nonlocal problems, mounts
            if p.reason == "mount-point":
                mounts += 1
            problems += 1

        for entry in walk(fd, dev=dev, on_problem=count, hook=hook, mnt=mnt):
            st = entry.st
            inside = max(inside, st.st_mtime, st.st_ctime)
            newest = max(newest, inside)
            if not entry.is_dir:
                if stat.S_ISREG(st.st_mode):  # a symlink's own times are not a use of the data
                    accessed = max(accessed, st.st_atime, st.st_mtime)
                files += 1
                if st.st_nlink > 1:
                    multi = True
                else:
                    total += st.st_blocks * 512
                inodes.append((st.st_dev, st.st_ino))
        return UnitStats(total, files, newest, accessed or newest, inodes, multi, problems, mounts,
                         max(inside, dst.st_mtime))
    finally:
        os.close(fd)


def remove_tree_at(parent_fd: int, name: str, dev: int, mnt: int | None, expect_ino: int) -> int:
    """Delete a directory unit relative to parent_fd without following symlinks; returns files removed.

    The directory must still be the inode that was judged (expect_ino). Symlinks
    inside are unlinked, never followed; a subdirectory on another filesystem or
    another mount (a bind mount of the same filesystem) stops the removal with EXDEV
    before anything in it is touched (nothing outside the unit is). dev and mnt: as measure_unit's.
    """
    fd = open_dir_at(parent_fd, name, dev, mnt)
    removed = 0
    try:
        if os.fstat(fd).st_ino != expect_ino:
            raise OSError(errno.ENOENT, "directory was replaced since it was judged", name)
        for entry in walk(fd, dev=dev, post_order=True, on_problem=_refuse, mnt=mnt):
            if entry.post:
                os.rmdir(entry.name, dir_fd=entry.dir_fd)
            elif not entry.is_dir:
                os.unlink(entry.name, dir_fd=entry.dir_fd)
                removed += 1
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)
    return removed


_ERRNO = {"permission": errno.EACCES, "read-only": errno.EROFS, "vanished": errno.ENOENT, "symlink": errno.ELOOP,
          "mount-point": errno.EXDEV, "other-filesystem": errno.EXDEV, "moved": errno.ENOENT}


def _refuse(p: WalkProblem) -> None:
    """Anything the walk would skip stops a removal there (a mount point, a swapped directory)."""
    raise OSError(_ERRNO.get(p.reason, errno.EIO), f"{p.path}: {p.detail}" if p.reason != "mount-point" else
                  "is a mount point (another mount is attached there)")

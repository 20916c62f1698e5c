"""Deleting a judged name without deleting anything else: quarantine, check, unlink.

A judge decides from an lstat; a plain unlink of the name a moment later deletes whatever stands
there then, such as a file an atomic save renamed over the judged one. So both judges (agerules.py
here, _agescan.c the same in C) delete in three steps, relative to the directory's fd:

1. rename the name to a private name in the same directory, never replacing anything
   (renameat2 RENAME_NOREPLACE): from now on no one else reaches the entry under a name;
2. lstat the private name and compare it with the judged lstat (same): device, inode, type,
   size, link count, mtime (and atime when the policy ages by it); not the ctime, which the
   rename itself sets;
3. unlink the private name, or, when it holds something else, rename it back (never replacing)
   and keep it. The unlink is the next candidate's rename onto the same private name (a rename
   replaces, and so unlinks, its target: one operation where a new private name per file and an
   unlink took two, and on ext4 about twice a plain unlink's time), the last one of a batch a real
   unlink.

A filesystem without RENAME_NOREPLACE (NFS, CIFS, FUSE servers that lack it: EINVAL) gets the
placeholder way, without hard links: the target name is first created empty with O_EXCL, so no
one else's entry can be there, and a plain rename replaces that placeholder. The one window left
is a rename onto the original name between its placeholder and the put-back, during a put-back
only: a file renamed over the judged name and then over again within microseconds.

Private names are PREFIX + pid + counter; a checkpoint's or cache unit's (aside.py) also carries the
name it had, when that fits in a name (engine/leftover.py puts it back). One that outlives its run (a crash between two steps;
a put-back that found the name taken, which is logged) is an ordinary candidate of the next run
whatever the patterns say: it is judged by the same rules (its ctime is the rename's, so it waits
out the grace period first) and deleted when due.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
from typing import Callable

PREFIX = ".trainguard-deleting."  # _agescan.c's PRIVATE_PREFIX
_seq = itertools.count()
_libc: tuple[Callable | None, Callable[[], int]] | None = None  # (renameat2 or None, ctypes.get_errno)


class Changed(Exception):
    """Under the private name stood something other than the entry judged; errno: 0 when it was put
    back, else why it is left under the private name."""

    def __init__(self, err: int):
        super().__init__(err)
        self.errno = err


def private_name(name: str = "") -> str:
    """A new private name; with name, ending in ".<name>" when the whole fits in a name (255 bytes)."""
    private = f"{PREFIX}{os.getpid():x}.{next(_seq):x}"
    return f"{private}.{name}" if name and len(os.fsencode(f"{private}.{name}")) <= 255 else private


def same(judged: os.stat_result, now: os.stat_result, atime: bool) -> bool:
    return (judged.st_dev == now.st_dev and judged.st_ino == now.st_ino
            and stat.S_IFMT(judged.st_mode) == stat.S_IFMT(now.st_mode) and judged.st_size == now.st_size
            and judged.st_nlink == now.st_nlink and judged.st_mtime_ns == now.st_mtime_ns
            and (not atime or judged.st_atime_ns == now.st_atime_ns))


class Quarantine:
    """Deletes judged names of one directory (dir_fd) in the three steps above. The entry verified last
    stays under the private name until the next rename onto that name replaces it or release() unlinks it."""

    def __init__(self, dir_fd: int, atime: bool, named: bool = False):
        self.dir_fd, self.atime = dir_fd, atime
        self.named = named  # private names carry the name (one entry per Quarantine: aside.py)
        self.plain = False  # the filesystem refused RENAME_NOREPLACE: placeholders
        self.private = ""
        self.held: tuple[str, os.stat_result] | None = None  # (its name, lstat) of what private holds, verified
        self.failed: list[tuple[str, int, int]] = []  # (name, errno, inode): verified, but its unlink failed

    def holds(self, st: os.stat_result) -> bool:
        """Whether private holds the inode of st (a hard link judged under another name)."""
        return self.held is not None and (self.held[1].st_dev, self.held[1].st_ino) == (st.st_dev, st.st_ino)

    def release(self) -> None:
        """Unlink the entry private holds (verified and counted already; else it goes to failed)."""
        if self.held is None:
            return
        (name, st), self.held = self.held, None
        try:
            os.unlink(self.private, dir_fd=self.dir_fd)
        except OSError as exc:
            self.failed.append((name, exc.errno or errno.EIO, st.st_ino))

    def restore(self) -> int:
        """Put what private holds back under its name, never replacing: 0, or why it stays private."""
        if self.held is None:
            return 0
        (name, _st), self.held = self.held, None
        return self._put_back(self.private, name)

    def forget(self) -> None:
        """Hand what private holds to the caller (a directory unit it removes as a tree)."""
        self.held = None

    def unlink(self, name: str, judged: os.stat_result) -> None:
        """Delete name if it is still the entry judged (gone once this returns: it is counted; private holds
        it until the next call or release()); raise Changed (put back) or OSError (kept)."""
        held = self.held
        if held is not None:
            os.rename(name, self.private, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)  # unlinks what it held
        else:
            for _try in range(4):  # EEXIST: a leftover of a crashed run holds that private name
                self.private = private_name(name if self.named else "")
                try:
                    self.rename(name, self.private)
                    break
                except FileExistsError:
                    continue
            else:
                raise OSError(errno.EEXIST, os.strerror(errno.EEXIST), name)
        try:
            now = os.stat(self.private, dir_fd=self.dir_fd, follow_symlinks=False)
        except OSError:
            now = None
        if now is not None and same(judged, now, self.atime):
            self.held = name, now
            return
        if held is not None and now is not None and (now.st_dev, now.st_ino) == (held[1].st_dev, held[1].st_ino):
            raise Changed(0)  # name had become another link of what private holds: nothing moved
        self.held = None
        raise Changed(self._put_back(self.private, name))

    def _put_back(self, private: str, name: str) -> int:
        try:
            self.rename(private, name)
            return 0
        except OSError as exc:
            return exc.errno or errno.EIO

    def rename(self, src: str, dst: str) -> None:
        """Rename src to dst in the directory, never replacing an entry at dst."""
        if not self.plain:
            try:
                _rename_noreplace(self.dir_fd, src, dst)
                return
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                    raise
                self.plain = True
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=self.dir_fd)
        try:
            mine = os.fstat(fd)
        finally:
            os.close(fd)
        try:
            os.rename(src, dst, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except OSError:
            try:
                now = os.stat(dst, dir_fd=self.dir_fd, follow_symlinks=False)
                if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                    os.unlink(dst, dir_fd=self.dir_fd)  # the placeholder, still ours
            except OSError:
                pass
            raise


def _rename_noreplace(dir_fd: int, src: str, dst: str) -> None:
    global _libc
    if _libc is None:
        import ctypes  # the Python judge only (no compiled loop): loaded on its first deletion

        _libc = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None), ctypes.get_errno
    renameat2, get_errno = _libc
    if renameat2 is None:  # a C library without renameat2: as a kernel without it
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), src)
    if renameat2(dir_fd, os.fsencode(src), dir_fd, os.fsencode(dst), 1) != 0:  # 1: RENAME_NOREPLACE
        err = get_errno()
        raise OSError(err, os.strerror(err), src)

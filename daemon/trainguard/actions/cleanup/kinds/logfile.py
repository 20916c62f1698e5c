"""One log file rotated in place: copied into a compressed generation, then the copied part removed
from the live file (fallocate COLLAPSE_RANGE where the filesystem can, else a truncate), and who
writes it (a writer without O_APPEND is left alone). logs.py runs the `logs` policy over its roots."""

from __future__ import annotations

import ctypes
import errno
import gzip
import os
import re
import stat
import time
from dataclasses import dataclass

from trainguard.actions.cleanup.safety.inuse import LOOSE_DEVS, fd_info, mount_devs
from trainguard.config import LogsPolicy

FALLOC_FL_KEEP_SIZE, FALLOC_FL_COLLAPSE_RANGE = 0x01, 0x08
O_APPEND, O_ACCMODE = 0o2000, 0o3
SNIFF = 8192  # bytes looked at for a NUL (binary) byte
CHUNK = 1 << 20
_GENERATION = re.compile(r"^(?P<base>.+)\.(?P<n>\d+)\.gz$")
_libc = None


@dataclass(frozen=True, slots=True)
class Rotated:
    relpath: str
    before: int  # bytes the log took on disk
    after: int  # what it takes now
    generation: int  # the new compressed copy's size on disk (0 with keep = 0)
    dropped: int  # bytes of old generations deleted
    method: str  # "collapse" or "truncate"
    lines_window_s: float = 0.0  # truncate only: last read to truncate, the window logrotate also has

    @property
    def saved(self) -> int:
        return self.before - self.after - self.generation + self.dropped


def _fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    if _libc.fallocate(fd, mode, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def writers(keys: set[tuple[int, int]], proc_root: str = "/proc") -> dict[tuple[int, int], list[tuple[int, int]]]:
    """(dev, ino) -> [(pid, open flags)] of every fd open for writing on one of keys.

    Like the open-file index (safety/inuse.OpenFiles), built from readlink, fdinfo and mountinfo only: an fd
    open on a hung share cannot wedge the rotation."""
    found: dict[tuple[int, int], list[tuple[int, int]]] = {}
    by_ino = {ino: (dev, ino) for dev, ino in keys}  # btrfs/overlay: st_dev is not mountinfo's device
    devs_by_ns: dict[str, dict[int, int]] = {}
    try:
        pids = [p for p in os.listdir(proc_root) if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        base = os.path.join(proc_root, pid)
        try:
            fds = os.listdir(os.path.join(base, "fd"))
        except OSError:
            continue
        devs: dict[int, int] | None = None
        for fd in fds:
            try:
                if not os.readlink(os.path.join(base, "fd", fd)).startswith("/"):
                    continue  # socket:[..], pipe:[..], anon_inode:..
                mnt, ino, flags = fd_info(os.path.join(base, "fdinfo", fd))
            except (OSError, ValueError):
                continue
            if devs is None:
                devs = mount_devs(base, devs_by_ns)
            dev = devs.get(mnt)
            key = (dev, ino) if (dev, ino) in keys else by_ino.get(ino) if dev in LOOSE_DEVS else None
            if key is None:
                continue
            flags = O_ACCMODE if flags is None else flags  # unknown: a writer without O_APPEND, left alone
            if flags & O_ACCMODE:
                found.setdefault(key, []).append((int(pid), flags))
    return found


def is_binary(fd: int) -> bool:
    try:
        start = os.lseek(fd, 0, os.SEEK_DATA)  # a sparse head (a writer's hole) is not content
    except OSError:
        start = 0
    return b"\0" in os.pread(fd, SNIFF, start)


def _copy(fd: int, out, start: int, end: int | None) -> int:
    """Copy [start, end) -- or to end of file, re-reading until it stops growing -- into out."""
    off = start
    while end is None or off < end:
        data = os.pread(fd, CHUNK if end is None else min(CHUNK, end - off), off)
        if not data:
            break
        if out is not None:
            out.write(data)
        off += len(data)
    return off


def _copy_and_truncate(fd: int, out, off: int) -> float:
    """The last reads and the truncate, as close together as userspace can put them: a fresh time
    slice first (a preemption in between is what loses lines), nothing compressed in between.
    Returns the seconds from the last read to the truncate."""
    os.sched_yield()
    pending = []
    while data := os.pread(fd, CHUNK, off):
        pending.append(data)
        off += len(data)
    last_read = time.perf_counter()
    os.ftruncate(fd, 0)
    window = time.perf_counter() - last_read
    if out is not None:
        for data in pending:
            out.write(data)
    return window


def _generations(dir_fd: int, name: str) -> dict[int, os.stat_result]:
    out = {}
    for entry in os.scandir(dir_fd):
        m = _GENERATION.match(entry.name)
        if m and m.group("base") == name:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                out[int(m.group("n"))] = st
    return out


def _shift_generations(dir_fd: int, name: str, keep: int) -> int:
    """Make room for name.1.gz: drop what falls beyond keep, rename the rest one up. Bytes dropped."""
    dropped = 0
    existing = _generations(dir_fd, name)
    for n, st in sorted(existing.items(), reverse=True):
        if n >= keep:
            os.unlink(f"{name}.{n}.gz", dir_fd=dir_fd)
            dropped += st.st_blocks * 512
        else:
            os.rename(f"{name}.{n}.gz", f"{name}.{n + 1}.gz", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    return dropped


def rotate_file(dir_fd: int, name: str, relpath: str, fd: int, policy: LogsPolicy) -> Rotated:
    """Copy the log into a compressed generation and remove what was copied from the live file."""
    st = os.fstat(fd)
    block = max(st.st_blksize, 512)
    cut = ((st.st_size - 1) // block) * block  # COLLAPSE_RANGE must leave at least one byte
    temp = f".{name}.rotating-{os.getpid()}.gz"
    out = raw = None
    if policy.keep:
        raw_fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dir_fd)
        if os.geteuid() == 0:  # the generations stay the log owner's, readable as the log was
            os.fchown(raw_fd, st.st_uid, st.st_gid)
        os.fchmod(raw_fd, st.st_mode & 0o666)
        raw = os.fdopen(raw_fd, "wb")
        out = gzip.GzipFile(filename=name, mode="wb", fileobj=raw, compresslevel=6)
    try:
        method, window = "collapse", 0.0
        copied = _copy(fd, out, 0, cut) if policy.method == "auto" and cut > 0 else 0
        try:
            if not copied:
                raise OSError(errno.EOPNOTSUPP, "collapse not tried")
            _fallocate(fd, FALLOC_FL_COLLAPSE_RANGE, 0, copied)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
            method = "truncate"
            window = _copy_and_truncate(fd, out, _copy(fd, out, copied, None))
        if out is not None:
            out.close()
            raw.flush()
            os.fsync(raw.fileno())
            raw.close()
            generation = os.stat(temp, dir_fd=dir_fd, follow_symlinks=False).st_blocks * 512
            dropped = _shift_generations(dir_fd, name, policy.keep)
            os.rename(temp, f"{name}.1.gz", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.fsync(dir_fd)
        else:
            generation, dropped = 0, sum(s.st_blocks * 512 for s in _generations(dir_fd, name).values())
            _shift_generations(dir_fd, name, 0)
    except BaseException:
        if out is not None:
            raw.close()
            try:
                os.unlink(temp, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
        raise
    after = os.fstat(fd).st_blocks * 512
    return Rotated(relpath, st.st_blocks * 512, after, generation, dropped, method, window)

"""Readers for /proc/<pid>: state, threads and their wait channels, I/O counters, open files,
container id, PID namespaces.

Everything takes proc_root ("/proc", or "/host/proc" in a sidecar) so tests and
containers can point it elsewhere. A process can vanish between two reads: every
reader returns None/empty for a process that is gone or unreadable instead of raising.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import Callable

from trainguard.records import Mount
from trainguard.sources.mounts import parse_mountinfo
from trainguard.sources.owner import Owner, read_owner
from trainguard.sources.owner import read_environ as _read_environ

# Kernel wait channels that mean "waiting on a filesystem", even in S state: a write to a
# hung FUSE mount sleeps interruptibly in request_wait_answer, NFS/SMB in rpc_/nfs_/cifs_.
_FS_WCHAN_PREFIXES = (
    "request_wait_answer", "fuse_", "__fuse", "rpc_", "nfs", "__nfs", "cifs_", "smb2_", "wait_for_response",
    "p9_", "ceph_", "ll_", "cl_sync", "osc_", "lnet", "gfs2_", "ocfs2_",
    "io_schedule", "bit_wait_io", "folio_wait", "wait_on_page", "__lock_page", "__folio_lock",
    "jbd2_", "wait_on_buffer", "__wait_on_buffer", "blk_mq_get_tag", "rq_qos_wait", "balance_dirty_pages",
    "xfs_", "ext4_", "btrfs_", "__filemap_fdatawait", "filemap_fdatawait", "wb_wait", "writeback_",
    "do_fsync", "vfs_fsync",
)

# Syscall numbers whose first argument is a file descriptor, per architecture.
_FD_SYSCALLS = {
    "x86_64": {0: "read", 1: "write", 3: "close", 5: "fstat", 17: "pread64", 18: "pwrite64", 19: "readv",
               20: "writev", 74: "fsync", 75: "fdatasync", 77: "ftruncate", 138: "fstatfs", 285: "fallocate",
               295: "preadv", 296: "pwritev", 187: "readahead", 40: "sendfile", 326: "copy_file_range"},
    "aarch64": {63: "read", 64: "write", 57: "close", 80: "fstat", 67: "pread64", 68: "pwrite64", 65: "readv",
                66: "writev", 82: "fsync", 83: "fdatasync", 46: "ftruncate", 44: "fstatfs", 47: "fallocate",
                69: "preadv", 70: "pwritev", 213: "readahead", 71: "sendfile", 285: "copy_file_range"},
}
_PATH_SYSCALLS = {
    "x86_64": {2: "open", 4: "stat", 6: "lstat", 21: "access", 82: "rename", 87: "unlink", 137: "statfs",
               257: "openat", 262: "newfstatat", 332: "statx", 83: "mkdir", 84: "rmdir", 76: "truncate"},
    "aarch64": {56: "openat", 79: "newfstatat", 291: "statx", 43: "statfs", 35: "unlinkat", 38: "renameat",
                34: "mkdirat", 45: "truncate", 48: "faccessat"},
}

PROC_PID_INIT_INO = 0xEFFFFFFC  # inode of the initial PID namespace, fixed in the kernel


@dataclass(frozen=True, slots=True)
class IoCounters:
    rchar: int
    wchar: int
    read_bytes: int
    write_bytes: int


@dataclass(frozen=True, slots=True)
class ThreadInfo:
    tid: int
    name: str  # OS thread name (comm)
    state: str  # "R", "S", "D", ...
    wchan: str  # kernel function it sleeps in; "" when running or hidden
    syscall: str = ""  # syscall it is blocked in ("write"), when readable
    syscall_fd: int | None = None  # its fd argument, for fd-taking syscalls

    @property
    def blocked(self) -> bool:
        return is_blocked(self.state, self.wchan)


@dataclass(frozen=True, slots=True)
class OpenFd:
    fd: int
    target: str  # readlink of /proc/PID/fd/N: a path, "socket:[..]", "pipe:[..]", "anon_inode:..."


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    pid: int
    name: str
    state: str
    cmdline: tuple[str, ...]
    threads: tuple[ThreadInfo, ...]
    io: IoCounters | None
    fds: tuple[OpenFd, ...]
    mounts: tuple[Mount, ...]  # the process's own mount namespace view
    owner: Owner = Owner()  # container, pod, Slurm job, user (sources.owner)

    @property
    def container_id(self) -> str | None:
        """The container, by sources.owner's one rule (what the owner line says too)."""
        return self.owner.container_id


def is_blocked(state: str, wchan: str) -> bool:
    """D state, or asleep in a filesystem wait channel (a hung FUSE write sleeps in S)."""
    if state == "D":
        return True
    if state != "S" or not wchan or wchan == "0":
        return False
    return wchan.startswith(_FS_WCHAN_PREFIXES)


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None


def read_small(path: str, limit: int = 4096) -> str | None:
    """A small /proc file in one read (stat: a few hundred bytes), without a buffered file object."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, limit).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def read_text(proc_root: str, pid: int, name: str) -> str | None:
    """/proc/PID/<name> as text; None when the process is gone or the file cannot be read."""
    return _read(f"{proc_root}/{pid}/{name}")


def parse_status(text: str, keys: frozenset[str] | None = None) -> dict[str, str]:
    """The fields of /proc/PID/status; with `keys`, only those, read until all are found (they come
    in the first lines, and the rest of the file is most of the work)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and (keys is None or key in keys):
            fields[key] = value.strip()
            if keys is not None and len(fields) == len(keys):
                break
    return fields


_RESOLVE_KEYS = frozenset(("NSpid",))


def parse_io(text: str) -> IoCounters | None:
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            try:
                values[key.strip()] = int(value)
            except ValueError:
                pass
    try:
        return IoCounters(values["rchar"], values["wchar"], values["read_bytes"], values["write_bytes"])
    except KeyError:
        return None


def parse_syscall(text: str, machine: str | None = None) -> tuple[str, int | None]:
    """/proc/PID/task/TID/syscall -> ("write", 5). ("", None) when running or unknown."""
    parts = text.split()
    if not parts or not parts[0].lstrip("-").isdigit():
        return "", None
    number = int(parts[0])
    arch = machine or platform.machine()
    if number in _FD_SYSCALLS.get(arch, {}) and len(parts) > 1:
        try:
            return _FD_SYSCALLS[arch][number], int(parts[1], 16)
        except ValueError:
            return _FD_SYSCALLS[arch][number], None
    return _PATH_SYSCALLS.get(arch, {}).get(number, f"syscall {number}" if number >= 0 else ""), None


def read_state(proc_root: str, pid: int) -> str | None:
    text = _read(f"{proc_root}/{pid}/stat")
    if text is None:
        return None
    # comm may contain spaces and parentheses: the state follows the last ')'.
    tail = text[text.rfind(")") + 1:].split()
    return tail[0] if tail else None


def read_start(proc_root: str, pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of a process; None when it is gone. The start time tells
    a process from a later one that reuses its PID."""
    text = _read(f"{proc_root}/{pid}/stat")
    tail = text[text.rfind(")") + 1:].split() if text else []
    if len(tail) < 20 or not tail[19].isdigit():
        return None
    return tail[0], int(tail[19])


def read_io(proc_root: str, pid: int) -> IoCounters | None:
    text = _read(f"{proc_root}/{pid}/io")
    return parse_io(text) if text is not None else None


def read_cmdline(proc_root: str, pid: int) -> tuple[str, ...]:
    text = _read(f"{proc_root}/{pid}/cmdline")
    return tuple(part for part in (text or "").split("\0") if part)


def read_threads(proc_root: str, pid: int, machine: str | None = None) -> tuple[ThreadInfo, ...]:
    try:
        tids = sorted(int(t) for t in os.listdir(f"{proc_root}/{pid}/task") if t.isdigit())
    except OSError:
        return ()
    threads = []
    for tid in tids:
        base = f"{proc_root}/{pid}/task/{tid}"
        state = read_state(f"{proc_root}/{pid}/task", tid)
        if state is None:
            continue  # exited meanwhile
        name = (_read(f"{base}/comm") or "").strip()
        wchan = (_read(f"{base}/wchan") or "").strip()
        syscall, fd = ("", None)
        if state in ("D", "S"):
            syscall, fd = parse_syscall(_read(f"{base}/syscall") or "", machine)
        threads.append(ThreadInfo(tid, name, state, "" if wchan == "0" else wchan, syscall, fd))
    return tuple(threads)


def read_fds(proc_root: str, pid: int) -> tuple[OpenFd, ...]:
    base = f"{proc_root}/{pid}/fd"
    try:
        names = os.listdir(base)
    except OSError:
        return ()
    fds = []
    for name in names:
        if not name.isdigit():
            continue
        try:
            fds.append(OpenFd(int(name), os.readlink(f"{base}/{name}")))
        except OSError:
            continue  # closed meanwhile
    return tuple(sorted(fds, key=lambda f: f.fd))


def list_pids(proc_root: str) -> list[int]:
    """Every process visible in proc_root, in PID order ([] when it cannot be listed)."""
    try:
        return sorted(int(name) for name in os.listdir(proc_root) if name.isdigit())
    except OSError:
        return []


def read_fd_flags(proc_root: str, pid: int, fd: int) -> int | None:
    """The open flags of one fd (fdinfo "flags:", octal), or None when gone or unreadable."""
    text = _read(f"{proc_root}/{pid}/fdinfo/{fd}")
    for line in (text or "").splitlines():
        key, _, value = line.partition(":")
        if key == "flags":
            try:
                return int(value.strip(), 8)
            except ValueError:
                return None
    return None


def open_for_writing(flags: int | None) -> bool:
    return flags is not None and flags & (os.O_WRONLY | os.O_RDWR) != 0


def read_environ(proc_root: str, pid: int, names: tuple[str, ...]) -> dict[str, str]:
    """The named variables from the environment the process started with (not later changes), resolved
    as getenv(3) does and bounded as the owner's are (sources/owner.py)."""
    return _read_environ(proc_root, pid, names)[0]


def mapped_files(proc_root: str, pid: int, wanted: Callable[[str], bool]) -> tuple[str, ...]:
    """Paths mapped into the process that `wanted` accepts (/proc/PID/maps), each once, in map order."""
    text = _read(f"{proc_root}/{pid}/maps") or ""
    seen: dict[str, None] = {}
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/") and wanted(parts[5]):
            seen.setdefault(parts[5], None)
    return tuple(seen)


def inspect_process(proc_root: str, pid: int, machine: str | None = None) -> ProcessInfo | None:
    """Everything the stall diagnosis needs about one process; None when it does not exist."""
    status_text = _read(f"{proc_root}/{pid}/status")
    if status_text is None:
        return None
    status = parse_status(status_text)
    cgroup_text = _read(f"{proc_root}/{pid}/cgroup") or ""
    return ProcessInfo(
        pid=pid,
        name=status.get("Name", ""),
        state=(status.get("State", "?") or "?")[:1],
        cmdline=read_cmdline(proc_root, pid),
        threads=read_threads(proc_root, pid, machine),
        io=read_io(proc_root, pid),
        fds=read_fds(proc_root, pid),
        mounts=tuple(parse_mountinfo(_read(f"{proc_root}/{pid}/mountinfo") or "")),
        owner=read_owner(proc_root, pid, cgroup_text, status_text),
    )


def is_host_pid_view(proc_root: str) -> bool:
    """Does proc_root show the host (initial) PID namespace, the one NVML reports PIDs in?"""
    try:
        link = os.readlink(f"{proc_root}/self/ns/pid")
        if link == f"pid:[{PROC_PID_INIT_INO}]":
            return True
    except OSError:
        pass
    # Kernel threads are only visible from the initial namespace (kthreadd is PID 2).
    return (_read(f"{proc_root}/2/comm") or "").strip() == "kthreadd"


@dataclass(frozen=True, slots=True)
class PidResolution:
    host_pid: int
    pid: int | None  # valid in proc_root; None when unresolved
    exists: bool | None  # False only when we can see the host namespace and it is not there
    state: str | None
    ns_pid: int | None
    name: str
    note: str


class PidResolver:
    """Maps NVML's host PIDs to PIDs in proc_root.

    host_view None: detect. When proc_root is the host namespace, the PID is the same
    and NSpid's last entry is the PID inside the process's container. Otherwise a host
    PID that happens to exist here is probably another process: it is reported as
    unresolved and never acted on.
    """

    def __init__(self, proc_root: str = "/proc", host_view: bool | None = None):
        self.proc_root = proc_root
        self.host_view = is_host_pid_view(proc_root) if host_view is None else host_view
        # (PID, start time) -> its PID in its own namespace: fixed for the life of a process, so the
        # long status file is read once per process, and each cycle reads only the short stat line.
        # Bounded: emptied when it outgrows any plausible number of GPU processes.
        self._ns_pids: dict[tuple[int, str], int | None] = {}

    def resolve(self, host_pids: list[int] | tuple[int, ...]) -> dict[int, PidResolution]:
        result: dict[int, PidResolution] = {}
        if len(self._ns_pids) > 4096:
            self._ns_pids.clear()
        for host_pid in host_pids:
            if self.host_view:
                result[host_pid] = self._local(host_pid)
            else:
                # NSpid lists PIDs from the procfs's own namespace inward, never the host's:
                # a host PID cannot be mapped from here, and a same-numbered PID is someone else.
                result[host_pid] = PidResolution(
                    host_pid, None, None, None, None, "",
                    f"host PID {host_pid} cannot be resolved: {self.proc_root} is not the host PID namespace "
                    "(run with the host PID namespace, or set general.proc_root to the host's /proc)",
                )
        return result

    def _local(self, host_pid: int) -> PidResolution:
        stat = read_small(f"{self.proc_root}/{host_pid}/stat")
        close = stat.rfind(")") if stat is not None else -1
        tail = stat[close + 2:].split(" ", 20) if close >= 0 else []
        if len(tail) < 20:
            return PidResolution(host_pid, None, False, None, None, "", f"PID {host_pid} no longer exists")
        state, key = tail[0], (host_pid, tail[19])
        if key in self._ns_pids:
            ns_pid = self._ns_pids[key]
        else:
            status = parse_status(_read(f"{self.proc_root}/{host_pid}/status") or "", _RESOLVE_KEYS)
            ns = [int(v) for v in status.get("NSpid", "").split() if v.isdigit()]
            ns_pid = self._ns_pids[key] = ns[-1] if len(ns) > 1 else None
        return PidResolution(host_pid, host_pid, True, state, ns_pid, stat[stat.find("(") + 1:close],
                             "zombie (exited, not reaped)" if state == "Z" else "")

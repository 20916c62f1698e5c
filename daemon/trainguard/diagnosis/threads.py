"""One process seen from /proc: its blocked threads, the files they are stuck on, its open files on
network/FUSE mounts, whether its I/O counters move; Python thread names from py-spy when installed."""

from __future__ import annotations

import json
import os
import shutil
from typing import Mapping, Sequence

from trainguard.diagnosis.model import (
    CATEGORY_RANK,
    FileView,
    ProcessView,
    ThreadView,
    file_category,
)
from trainguard.diagnosis.worker import Children
from trainguard.records import FsSample, MountKind
from trainguard.sources import procs
from trainguard.sources.mounts import containing_mount
from trainguard.sources.procs import IoCounters, ProcessInfo

IO_FIELDS = ("rchar", "wchar", "read_bytes", "write_bytes")


def unresponsive_for(mount_point: str, source: str, fstype: str, probes: Sequence[FsSample],
                     now: float) -> float | None:
    for probe in probes:
        m = probe.mount
        if m.mount_point == mount_point or (m.source == source and m.fstype == fstype and source):
            if not probe.responsive:
                return now - probe.unresponsive_since if probe.unresponsive_since is not None else 0.0
            return None
    return None


def remote_files(info: ProcessInfo, probes: Sequence[FsSample], now: float,
                 flags: Mapping[int, int | None] | None = None) -> tuple[FileView, ...]:
    """Open files on network/FUSE mounts, tfevents first, then checkpoints, logs, the rest."""
    flags = flags or {}
    files = []
    for fd in info.fds:
        if not fd.target.startswith("/"):
            continue  # sockets, pipes, anon inodes
        mount = containing_mount(fd.target, info.mounts)
        if mount is None or mount.kind is MountKind.LOCAL:
            continue
        writing = procs.open_for_writing(flags[fd.fd]) if fd.fd in flags else None
        files.append(FileView(fd.fd, fd.target, file_category(fd.target), mount.mount_point, mount.fstype,
                              mount.kind.value,
                              unresponsive_for(mount.mount_point, mount.source, mount.fstype, probes, now),
                              writing))
    files.sort(key=lambda f: (CATEGORY_RANK[f.category], f.unresponsive_for_s is None, f.path))
    return tuple(files)


def blocked_threads(info: ProcessInfo, python_threads: Mapping[int, tuple[str, str]]) -> tuple[ThreadView, ...]:
    fd_paths = {fd.fd: fd.target for fd in info.fds}
    out = []
    for t in info.threads:
        if not t.blocked:
            continue
        py_name, frame = python_threads.get(t.tid, ("", ""))
        target = fd_paths.get(t.syscall_fd) if t.syscall_fd is not None else None
        mount = containing_mount(target, info.mounts) if target and target.startswith("/") else None
        out.append(ThreadView(t.tid, py_name or t.name, t.name, t.state, t.wchan, t.syscall, target, frame,
                              mount.mount_point if mount is not None else None))
    return tuple(out)


def io_change(before: IoCounters | None, after: IoCounters | None) -> tuple[bool | None, dict[str, int]]:
    if before is None or after is None:
        return None, {}
    delta = {f: getattr(after, f) - getattr(before, f) for f in IO_FIELDS}
    return any(v > 0 for v in delta.values()), delta


def view_process(host_pid: int | None, pid: int | None, note: str, used_memory: int | None,
                 info: ProcessInfo | None, io_before: IoCounters | None, probes: Sequence[FsSample], now: float,
                 python_threads: Mapping[int, tuple[str, str]] | None = None, *,
                 flags: Mapping[int, int | None] | None = None, inferred_from: str = "") -> ProcessView:
    if info is None:
        return ProcessView(host_pid, pid, False, note or "process not readable", "", None, "?", used_memory,
                           (), 0, None, {}, (), inferred_from)
    moved, delta = io_change(io_before, info.io)
    return ProcessView(host_pid, pid, True, note, " ".join(info.cmdline) or info.name, info.container_id,
                       info.state, used_memory, blocked_threads(info, python_threads or {}), len(info.threads),
                       moved, delta, remote_files(info, probes, now, flags), inferred_from, info.owner.to_dict())


def remote_fd_flags(proc_root: str, info: ProcessInfo) -> dict[int, int | None]:
    """fdinfo flags of the fds on network/FUSE mounts (fdinfo is procfs: it never touches the mount)."""
    out = {}
    for fd in info.fds:
        if fd.target.startswith("/"):
            mount = containing_mount(fd.target, info.mounts)
            if mount is not None and mount.kind is not MountKind.LOCAL:
                out[fd.fd] = procs.read_fd_flags(proc_root, info.pid, fd.fd)
    return out


# --- py-spy ----------------------------------------------------------------------------------

def py_spy_threads(text: str) -> list[dict]:
    """The threads of a `py-spy dump --json`, each a dict with os_thread_id, thread_name and frames
    (innermost first); [] when the text is not such a dump."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return []
    threads = data if isinstance(data, list) else data.get("threads", []) if isinstance(data, dict) else []
    # Newer py-spy wraps the dump per process: [{"pid":..., "threads": [...]}]
    if threads and isinstance(threads[0], dict) and "threads" in threads[0]:
        threads = [t for proc in threads for t in proc.get("threads", [])]
    return [t for t in threads if isinstance(t, dict) and (t.get("os_thread_id") or t.get("native_thread_id"))]


def parse_py_spy_dump(text: str) -> dict[int, tuple[str, str]]:
    """`py-spy dump --json` -> {os thread id: (Python thread name, innermost frame)}."""
    names: dict[int, tuple[str, str]] = {}
    for t in py_spy_threads(text):
        frames = t.get("frames") or []
        frame = ""
        if frames:
            f0 = frames[0]
            frame = f"{os.path.basename(str(f0.get('filename', '')))}:{f0.get('line', '?')} {f0.get('name', '')}"
        names[int(t.get("os_thread_id") or t.get("native_thread_id"))] = (str(t.get("thread_name") or ""), frame)
    return names


def py_spy_dump(pid: int, timeout: float, py_spy: str | None = None, children: Children | None = None) -> str | None:
    """The text of `py-spy dump --json --nonblocking` (the target is never paused: a ptrace stop would wait
    forever on a thread in D state); None when py-spy is missing, fails or runs past the timeout."""
    exe = py_spy or shutil.which("py-spy")
    if not exe or timeout <= 0:
        return None
    result = (children or Children()).run([exe, "dump", "--pid", str(pid), "--json", "--nonblocking"], timeout)
    return result[1] if result is not None and result[0] == 0 else None


def python_thread_names(pid: int, timeout: float = 5.0, py_spy: str | None = None,
                        children: Children | None = None) -> dict[int, tuple[str, str]]:
    """Python thread names via py-spy when installed; {} otherwise. Never pauses the target.

    A py-spy still running at the timeout is killed and reaped."""
    text = py_spy_dump(pid, timeout, py_spy, children)
    return parse_py_spy_dump(text) if text is not None else {}

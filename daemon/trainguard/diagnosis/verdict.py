"""From the process views to one verdict line and the remedy (pure)."""

from __future__ import annotations

import os
from typing import Iterable, Sequence

from trainguard.diagnosis.model import CATEGORY_RANK, Diagnosis, FileView, ProcessView, ThreadView, file_category
from trainguard.records import FsSample, GpuSample, LogMatch
from trainguard.units import format_duration

_VERBS = {"write": "writing", "pwrite64": "writing", "writev": "writing", "pwritev": "writing",
          "read": "reading", "pread64": "reading", "readv": "reading", "preadv": "reading",
          "fsync": "syncing", "fdatasync": "syncing", "close": "closing", "ftruncate": "truncating",
          "fstat": "stat-ing", "fstatfs": "statfs-ing", "fallocate": "allocating", "statfs": "statfs-ing",
          "openat": "opening a file", "open": "opening a file", "newfstatat": "stat-ing", "statx": "stat-ing"}
MIRROR = "mirror it to the share with trainguard's [[mirror]]"
MIRROR_HINT = f"write locally and {MIRROR}"


def short_command(cmdline: str, limit: int = 48) -> str:
    """"python train.py" from "/usr/bin/python3 /root/code/train.py --lr 3e-4"."""
    words = [os.path.basename(w) for w in cmdline.split()[:2]]
    return " ".join(words)[:limit]


def who(v: ProcessView, t: ThreadView | None = None) -> str:
    text = v.label.replace(" (inferred", f" [{short_command(v.cmdline)}] (inferred", 1) if v.inferred_from \
        else f"{v.label} [{short_command(v.cmdline)}]" if v.cmdline else v.label
    if t is not None:
        text += f" thread {t.name}" + (f" ({t.os_name})" if t.os_name != t.name else "")
    return text


def _file_view(path: str, views: Iterable[ProcessView]) -> FileView | None:
    for v in views:
        for f in v.remote_files:
            if f.path == path:
                return f
    return None


def remedy_for(category: str, kind: str, mount_point: str, unresponsive: bool) -> str:
    if category == "tfevents":
        text = ("TensorBoard's event writer is stuck on the shared filesystem: log to local disk "
                f"(e.g. SummaryWriter('/tmp/runs')) and {MIRROR} (or rsync it in the background); "
                "if it must stay there, raise flush_secs and lower max_queue")
    elif category == "checkpoint":
        text = f"save checkpoints to local disk first and {MIRROR}, so a slow share cannot stall training"
    else:
        text = f"move this file off {mount_point} to local disk and {MIRROR}"
    if unresponsive:
        text += (f". {mount_point} is not answering: check its {'FUSE daemon' if kind == 'fuse' else 'server/network'}; "
                 "the job continues by itself if the mount recovers")
    return text


def _on(f: FileView) -> str:
    text = f" on {f.fstype} at {f.mount_point}"
    if f.unresponsive_for_s is not None:
        text += f", mount unresponsive {format_duration(f.unresponsive_for_s)}"
    return text


def _blocked_on_file(views: Sequence[ProcessView]) -> tuple[str, str] | None:
    """1. a thread blocked in a syscall on a file we can name."""
    candidates = []
    for v in views:
        for t in v.blocked_threads:
            if t.file:
                f = _file_view(t.file, [v])
                candidates.append((0 if f and f.kind != "local" else 1, CATEGORY_RANK[file_category(t.file)], v, t, f))
    if not candidates:
        return None
    candidates.sort(key=lambda c: (c[0], c[1]))
    _, _, v, t, f = candidates[0]
    verb = _VERBS.get(t.syscall, f"in {t.syscall}() on")
    text = f"{who(v, t)} blocked {verb} {t.file}"
    if f is not None:
        return text + _on(f), remedy_for(f.category, f.kind, f.mount_point, f.unresponsive_for_s is not None)
    where = f" at {t.mount_point}" if t.mount_point else ""
    return (text + f" (local disk{where})",
            "check that disk's health and load (iostat -x); the write is not progressing")


def _blocked_without_file(views: Sequence[ProcessView]) -> tuple[str, str] | None:
    """2. a thread in a filesystem wait, and the process has files on a network/FUSE mount."""
    for v in views:
        for t in v.blocked_threads:
            if v.remote_files:
                f = v.remote_files[0]
                text = f"{who(v, t)} blocked in {t.wchan or t.state} (filesystem wait); it has {f.path} open{_on(f)}"
                return text, remedy_for(f.category, f.kind, f.mount_point, f.unresponsive_for_s is not None)
    for v in views:
        for t in v.blocked_threads:
            return (f"{who(v, t)} blocked in {t.wchan or 'uninterruptible I/O'} ({t.state} state)",
                    "find the file it waits on (ls -l /proc/PID/fd, cat /proc/PID/task/TID/stack) and the mount under it")
    return None


def verdict_and_remedy(views: Sequence[ProcessView], log_lines: Sequence[LogMatch]) -> tuple[str, str]:
    found = _blocked_on_file(views) or _blocked_without_file(views)
    if found is not None:
        return found
    unresolved = [v for v in views if not v.resolved]
    log_part = f"; log: {log_lines[-1].line.strip()[:160]}" if log_lines else ""
    if not views:
        return ("no process on this GPU that trainguard can see: NVML reported none, and no process here holds "
                "an NVIDIA device" + log_part,
                "run trainguard in the trainer's container (or with the host PID namespace) to attribute the stall")
    if len(unresolved) == len(views):
        return ("cannot inspect the GPU's processes: " + unresolved[0].note
                + "; no process in this PID namespace holds an NVIDIA device" + log_part,
                "run trainguard in the host PID namespace (container: pid: host) or in the trainer's container "
                "to attribute the stall")
    moving = [v for v in views if v.io_moved]
    if moving:
        return (f"no thread blocked on I/O; {who(moving[0])} is still reading/writing (I/O counters moved)"
                + log_part, "it may be loading data or saving slowly: check the data loader and the storage throughput")
    if log_lines:
        return (f"no thread blocked on I/O; log: {log_lines[-1].line.strip()[:200]}",
                "the training loop likely died or waits after this error: check the log and restart the job")
    return ("no thread blocked on I/O and no I/O progress",
            "dump the Python stacks (py-spy dump --pid PID) to see what it waits on: a data loader, an NCCL "
            "collective waiting for another rank, or a lock")


def attribution_of(views: Sequence[ProcessView]) -> str:
    if any(v.inferred_from for v in views):
        return "inferred"
    return "nvml" if any(v.resolved for v in views) else "none"


def build_diagnosis(gpu: GpuSample, views: Sequence[ProcessView], log_lines: Sequence[LogMatch],
                    util_recent: Sequence[float] = (), stalled_for_s: float | None = None) -> Diagnosis:
    verdict, remedy = verdict_and_remedy(views, log_lines)
    return Diagnosis(gpu.index, gpu.name, gpu.memory_used_bytes, gpu.memory_total_bytes, tuple(util_recent),
                     stalled_for_s, tuple(views), tuple(log_lines[-10:]), verdict, remedy, attribution_of(views))


def timed_out(gpu: GpuSample, probes: Sequence[FsSample], log_lines: Sequence[LogMatch], deadline: float,
              util_recent: Sequence[float] = (), stalled_for_s: float | None = None) -> Diagnosis:
    """What is known without /proc when the diagnosis did not finish in time: NVML's view, stuck mounts, logs."""
    views = tuple(ProcessView(p.host_pid, p.pid, False, p.note or "not inspected in time", p.name, None,
                              p.state or "?", p.used_memory_bytes, (), 0, None, {}, ()) for p in gpu.processes)
    stuck = [s.mount.mount_point for s in probes if not s.responsive]
    text = (f"diagnosis timed out after {format_duration(deadline)} "
            "(reading /proc or py-spy is slow; it goes on in the background)")
    if stuck:
        text += f"; unresponsive mount{'s' if len(stuck) > 1 else ''}: {', '.join(stuck[:4])}"
    if log_lines:
        text += f"; log: {log_lines[-1].line.strip()[:160]}"
    return Diagnosis(gpu.index, gpu.name, gpu.memory_used_bytes, gpu.memory_total_bytes, tuple(util_recent),
                     stalled_for_s, views, tuple(log_lines[-10:]), text,
                     "the alert is sent again with the full diagnosis once it is in; or run `trainguard diagnose`",
                     "none", True)

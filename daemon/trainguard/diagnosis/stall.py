"""Why is this GPU stalled? The diagnosis attached to a gpu.stall alert.

build_diagnosis() is pure: from a GPU sample, what /proc said about its processes,
earlier I/O counters, the mounts' probe results and recent log matches, it names the
blocked thread, the file it is stuck on, the filesystem and whether that mount answers,
then gives a one-line verdict and the remedy. StallDiagnoser gathers those inputs
(/proc reads, optional py-spy) and attaches the result to the finding.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from trainguard.records import (
    Finding,
    FsSample,
    GpuSample,
    LogMatch,
    MountKind,
    Snapshot,
)
from trainguard.sources import procs
from trainguard.sources.mounts import containing_mount
from trainguard.sources.procs import IoCounters, ProcessInfo
from trainguard.units import format_bytes, format_duration

_CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".safetensors", ".bin", ".h5", ".pkl", ".npz", ".tar")
_VERBS = {"write": "writing", "pwrite64": "writing", "writev": "writing", "pwritev": "writing",
          "read": "reading", "pread64": "reading", "readv": "reading", "preadv": "reading",
          "fsync": "syncing", "fdatasync": "syncing", "close": "closing", "ftruncate": "truncating",
          "fstat": "stat-ing", "fstatfs": "statfs-ing", "fallocate": "allocating", "statfs": "statfs-ing",
          "openat": "opening a file", "open": "opening a file", "newfstatat": "stat-ing", "statx": "stat-ing"}


def file_category(path: str) -> str:
    base = os.path.basename(path)
    if base.startswith("events.out.tfevents"):
        return "tfevents"
    lowered = path.lower()
    if base.endswith(_CHECKPOINT_SUFFIXES) or "checkpoint" in lowered or "ckpt" in lowered:
        return "checkpoint"
    return "other"


_CATEGORY_RANK = {"tfevents": 0, "checkpoint": 1, "other": 2}


@dataclass(frozen=True, slots=True)
class ThreadView:
    tid: int
    name: str  # Python thread name when known, else the OS name
    os_name: str
    state: str
    wchan: str
    syscall: str
    file: str | None  # the file its blocked syscall is on, when the fd resolves
    python_frame: str = ""  # innermost Python frame, from py-spy


@dataclass(frozen=True, slots=True)
class FileView:
    fd: int
    path: str
    category: str  # tfevents / checkpoint / other
    mount_point: str
    fstype: str
    kind: str  # fuse / network / local
    unresponsive_for_s: float | None  # None: responsive or not probed


@dataclass(frozen=True, slots=True)
class ProcessView:
    host_pid: int
    pid: int | None
    resolved: bool
    note: str
    cmdline: str
    container_id: str | None
    state: str
    used_memory_bytes: int | None
    blocked_threads: tuple[ThreadView, ...]
    thread_count: int
    io_moved: bool | None  # None: no earlier reading in the window
    io_delta: Mapping[str, int]
    remote_files: tuple[FileView, ...]  # on network/FUSE mounts, tfevents and checkpoints first


@dataclass(frozen=True, slots=True)
class Diagnosis:
    gpu: int
    gpu_name: str
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    util_recent: tuple[float, ...]
    stalled_for_s: float | None
    processes: tuple[ProcessView, ...]
    log_lines: tuple[LogMatch, ...]
    verdict: str
    remedy: str

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))


# --- pure part -----------------------------------------------------------------------------

def _unresponsive_for(mount_point: str, source: str, fstype: str, probes: Sequence[FsSample], now: float) -> float | None:
    for probe in probes:
        m = probe.mount
        if m.mount_point == mount_point or (m.source == source and m.fstype == fstype and source):
            if not probe.responsive:
                return now - probe.unresponsive_since if probe.unresponsive_since is not None else 0.0
            return None
    return None


def view_process(host_pid: int, pid: int | None, note: str, used_memory: int | None, info: ProcessInfo | None,
                 io_before: IoCounters | None, probes: Sequence[FsSample], now: float,
                 python_threads: Mapping[int, tuple[str, str]] | None = None) -> ProcessView:
    if info is None:
        return ProcessView(host_pid, pid, False, note or "process not readable", "", None, "?", used_memory,
                           (), 0, None, {}, ())
    fd_paths = {fd.fd: fd.target for fd in info.fds}
    python_threads = python_threads or {}
    files = []
    for fd in info.fds:
        if not fd.target.startswith("/"):
            continue  # sockets, pipes, anon inodes
        mount = containing_mount(fd.target, info.mounts)
        if mount is None or mount.kind is MountKind.LOCAL:
            continue
        kind = mount.kind.value
        files.append(FileView(fd.fd, fd.target, file_category(fd.target), mount.mount_point, mount.fstype, kind,
                              _unresponsive_for(mount.mount_point, mount.source, mount.fstype, probes, now)))
    files.sort(key=lambda f: (_CATEGORY_RANK[f.category], f.unresponsive_for_s is None, f.path))
    blocked = []
    for t in info.threads:
        if not t.blocked:
            continue
        py_name, frame = python_threads.get(t.tid, ("", ""))
        target = fd_paths.get(t.syscall_fd) if t.syscall_fd is not None else None
        blocked.append(ThreadView(t.tid, py_name or t.name, t.name, t.state, t.wchan, t.syscall, target, frame))
    io_delta: dict[str, int] = {}
    moved = None
    if io_before is not None and info.io is not None:
        io_delta = {f: getattr(info.io, f) - getattr(io_before, f) for f in ("rchar", "wchar", "read_bytes",
                                                                            "write_bytes")}
        moved = any(v > 0 for v in io_delta.values())
    return ProcessView(host_pid, pid, True, note, " ".join(info.cmdline) or info.name, info.container_id,
                       info.state, used_memory, tuple(blocked), len(info.threads), moved, io_delta, tuple(files))


def _file_view(path: str, views: Iterable[ProcessView]) -> FileView | None:
    for v in views:
        for f in v.remote_files:
            if f.path == path:
                return f
    return None


def _remedy_for(category: str, kind: str, mount_point: str, unresponsive: bool) -> str:
    if category == "tfevents":
        text = ("TensorBoard's event writer is stuck on the shared filesystem: log to local disk "
                "(e.g. SummaryWriter('/tmp/runs')) and sync to the share in the background (rsync); "
                "if it must stay there, raise flush_secs and lower max_queue")
    elif category == "checkpoint":
        text = ("save checkpoints to local disk first and copy them to the share in the background "
                "(rsync / a separate process), so a slow share cannot stall training")
    else:
        text = f"move this file off {mount_point} to local disk and sync it in the background"
    if unresponsive:
        text += (f". {mount_point} is not answering: check its {'FUSE daemon' if kind == 'fuse' else 'server/network'}; "
                 "the job continues by itself if the mount recovers")
    return text


def verdict_and_remedy(views: Sequence[ProcessView], log_lines: Sequence[LogMatch]) -> tuple[str, str]:
    def who(v: ProcessView, t: ThreadView) -> str:
        return f"PID {v.host_pid} thread {t.name}" + (f" ({t.os_name})" if t.os_name != t.name else "")

    # 1. a thread blocked in a syscall on a file we can name
    candidates = []
    for v in views:
        for t in v.blocked_threads:
            if t.file:
                f = _file_view(t.file, [v])
                candidates.append((0 if f and f.kind != "local" else 1,
                                   _CATEGORY_RANK[file_category(t.file)], v, t, f))
    if candidates:
        candidates.sort(key=lambda c: (c[0], c[1]))
        _, _, v, t, f = candidates[0]
        verb = _VERBS.get(t.syscall, f"in {t.syscall}() on")
        text = f"{who(v, t)} blocked {verb} {t.file}"
        if f is not None:
            text += f" on {f.fstype}"
            if f.unresponsive_for_s is not None:
                text += f", mount unresponsive {format_duration(f.unresponsive_for_s)}"
            return text, _remedy_for(f.category, f.kind, f.mount_point, f.unresponsive_for_s is not None)
        return text + " (local disk)", "check that disk's health and load (iostat -x); the write is not progressing"
    # 2. a thread in a filesystem wait, and the process has files on a network/FUSE mount
    for v in views:
        for t in v.blocked_threads:
            if v.remote_files:
                f = v.remote_files[0]
                text = (f"{who(v, t)} blocked in {t.wchan or t.state} (filesystem wait); "
                        f"it has {f.path} open on {f.fstype}")
                if f.unresponsive_for_s is not None:
                    text += f", mount unresponsive {format_duration(f.unresponsive_for_s)}"
                return text, _remedy_for(f.category, f.kind, f.mount_point, f.unresponsive_for_s is not None)
    for v in views:
        for t in v.blocked_threads:
            return (f"{who(v, t)} blocked in {t.wchan or 'uninterruptible I/O'} ({t.state} state)",
                    "find the file it waits on (ls -l /proc/PID/fd, cat /proc/PID/task/TID/stack) and the mount under it")
    unresolved = [v for v in views if not v.resolved]
    log_part = f"; log: {log_lines[-1].line.strip()[:160]}" if log_lines else ""
    if views and len(unresolved) == len(views):
        return ("cannot inspect the GPU's processes: " + unresolved[0].note + log_part,
                "run trainguard in the host PID namespace (container: pid: host) to attribute the stall")
    moving = [v for v in views if v.io_moved]
    if moving:
        return (f"no thread blocked on I/O; PID {moving[0].host_pid} is still reading/writing (I/O counters moved)"
                + log_part, "it may be loading data or saving slowly: check the data loader and the storage throughput")
    if log_lines:
        return (f"no thread blocked on I/O; log: {log_lines[-1].line.strip()[:200]}",
                "the training loop likely died or waits after this error: check the log and restart the job")
    return ("no thread blocked on I/O and no I/O progress",
            "dump the Python stacks (py-spy dump --pid PID) to see what it waits on: a data loader, an NCCL "
            "collective waiting for another rank, or a lock")


def build_diagnosis(gpu: GpuSample, views: Sequence[ProcessView], log_lines: Sequence[LogMatch],
                    util_recent: Sequence[float] = (), stalled_for_s: float | None = None) -> Diagnosis:
    verdict, remedy = verdict_and_remedy(views, log_lines)
    return Diagnosis(gpu.index, gpu.name, gpu.memory_used_bytes, gpu.memory_total_bytes, tuple(util_recent),
                     stalled_for_s, tuple(views), tuple(log_lines[-10:]), verdict, remedy)


def render(d: Diagnosis) -> str:
    """The diagnosis as a screen of text (trainguard diagnose / status)."""
    lines = [f"GPU {d.gpu} {d.gpu_name}: VRAM {format_bytes(d.memory_used_bytes)}/{format_bytes(d.memory_total_bytes)}"
             + (f", stalled {format_duration(d.stalled_for_s)}" if d.stalled_for_s else "")]
    if d.util_recent:
        lines.append("  utilisation: " + " ".join(f"{u:.0%}" for u in d.util_recent[-20:]))
    for v in d.processes:
        head = f"  PID {v.host_pid}"
        if v.pid is not None and v.pid != v.host_pid:
            head += f" (here {v.pid})"
        if not v.resolved:
            lines.append(f"{head}: {v.note}")
            continue
        head += f" [{v.state}] {' '.join(v.cmdline.split())[:120]}"
        if v.container_id:
            head += f" container {v.container_id[:12]}"
        if v.used_memory_bytes is not None:
            head += f", {format_bytes(v.used_memory_bytes)} VRAM"
        lines.append(head)
        if v.io_moved is not None:
            lines.append("    I/O counters " + ("moved: " + ", ".join(f"{k}+{format_bytes(n)}" for k, n in v.io_delta.items() if n)
                                               if v.io_moved else "did not move"))
        for t in v.blocked_threads:
            lines.append(f"    thread {t.tid} {t.name}: {t.state} in {t.wchan or '?'}"
                         + (f", {t.syscall}({t.file})" if t.file else f", {t.syscall}()" if t.syscall else "")
                         + (f"  [{t.python_frame}]" if t.python_frame else ""))
        if not v.blocked_threads:
            lines.append(f"    no blocked threads ({v.thread_count} threads)")
        for f in v.remote_files[:8]:
            state = f", UNRESPONSIVE {format_duration(f.unresponsive_for_s)}" if f.unresponsive_for_s is not None else ""
            lines.append(f"    open: {f.path} ({f.fstype} at {f.mount_point}{state})")
    for m in d.log_lines[-5:]:
        lines.append(f"  log {m.path}: {m.line.strip()[:160]}")
    lines.append(f"  verdict: {d.verdict}")
    lines.append(f"  remedy: {d.remedy}")
    return "\n".join(lines)


# --- gathering -------------------------------------------------------------------------------

def parse_py_spy_dump(text: str) -> dict[int, tuple[str, str]]:
    """`py-spy dump --json` -> {os thread id: (Python thread name, innermost frame)}."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return {}
    threads = data if isinstance(data, list) else data.get("threads", []) if isinstance(data, dict) else []
    # Newer py-spy wraps the dump per process: [{"pid":..., "threads": [...]}]
    if threads and isinstance(threads[0], dict) and "threads" in threads[0]:
        threads = [t for proc in threads for t in proc.get("threads", [])]
    names: dict[int, tuple[str, str]] = {}
    for t in threads:
        tid = t.get("os_thread_id") or t.get("native_thread_id")
        if not tid:
            continue
        frames = t.get("frames") or []
        frame = ""
        if frames:
            f0 = frames[0]
            frame = f"{os.path.basename(str(f0.get('filename', '')))}:{f0.get('line', '?')} {f0.get('name', '')}"
        names[int(tid)] = (str(t.get("thread_name") or ""), frame)
    return names


def python_thread_names(pid: int, timeout: float = 5.0, py_spy: str | None = None) -> dict[int, tuple[str, str]]:
    """Python thread names via py-spy when installed; {} otherwise. Never pauses the target."""
    exe = py_spy or shutil.which("py-spy")
    if not exe:
        return {}
    try:
        out = subprocess.run([exe, "dump", "--pid", str(pid), "--json", "--nonblocking"], capture_output=True,
                             text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_py_spy_dump(out.stdout) if out.returncode == 0 else {}


class StallDiagnoser:
    """Keeps I/O counters of GPU processes across cycles and diagnoses stalls on demand."""

    def __init__(self, proc_root: str = "/proc", *, window: float = 300.0, py_spy: bool = True,
                 clock: Callable[[], float] = time.time, machine: str | None = None):
        self.proc_root = proc_root
        self.window = window
        self.py_spy = py_spy
        self.clock = clock
        self.machine = machine
        self._io: dict[int, collections.deque[tuple[float, IoCounters]]] = {}
        # A firing stall is re-diagnosed at most this often (thread scans and py-spy are not free).
        self.refresh = 60.0
        self._cache: dict[int, tuple[float, Diagnosis]] = {}

    def observe(self, snapshot: Snapshot) -> None:
        """Record I/O counters of every resolved GPU process (one small read each)."""
        seen = set()
        for g in snapshot.gpus:
            for p in g.processes:
                if p.pid is None or p.pid in seen:
                    continue
                seen.add(p.pid)
                io = procs.read_io(self.proc_root, p.pid)
                if io is None:
                    continue
                ring = self._io.setdefault(p.pid, collections.deque())
                ring.append((snapshot.ts, io))
                while len(ring) > 1 and ring[1][0] <= snapshot.ts - self.window:
                    ring.popleft()
        for pid in list(self._io):
            if pid not in seen:
                del self._io[pid]

    def io_before(self, pid: int) -> IoCounters | None:
        ring = self._io.get(pid)
        return ring[0][1] if ring else None

    def diagnose(self, gpu: GpuSample, snapshot: Snapshot, now: float | None = None,
                 util_recent: Sequence[float] = (), stalled_for_s: float | None = None) -> Diagnosis:
        now = self.clock() if now is None else now
        views = []
        for p in gpu.processes:
            info = procs.inspect_process(self.proc_root, p.pid, self.machine) if p.pid is not None else None
            py_names = {}
            if info is not None and self.py_spy and any(t.blocked for t in info.threads):
                py_names = python_thread_names(p.pid)  # type: ignore[arg-type]
            views.append(view_process(p.host_pid, p.pid, p.note, p.used_memory_bytes, info,
                                      self.io_before(p.pid) if p.pid is not None else None,
                                      snapshot.filesystems, now, py_names))
        return build_diagnosis(gpu, views, snapshot.log_matches, util_recent, stalled_for_s)

    def enrich(self, findings: Sequence[Finding], snapshot: Snapshot, now: float | None = None) -> list[Finding]:
        """Attach a diagnosis to every gpu.stall finding: details, verdict in summary, remedy as hint."""
        out = []
        gpus = {g.index: g for g in snapshot.gpus}
        stalled = {int(f.details.get("gpu", -1)) for f in findings if f.kind == "gpu.stall"}
        for index in list(self._cache):
            if index not in stalled:
                del self._cache[index]  # a new stall gets a fresh diagnosis
        for finding in findings:
            if finding.kind != "gpu.stall":
                out.append(finding)
                continue
            gpu = gpus.get(int(finding.details.get("gpu", -1)))
            if gpu is None:
                out.append(finding)
                continue
            when = self.clock() if now is None else now
            cached = self._cache.get(gpu.index)
            if cached is not None and when - cached[0] < self.refresh:
                d = dataclasses.replace(cached[1], util_recent=tuple(finding.details.get("util_recent", ())),
                                        stalled_for_s=finding.details.get("stalled_for_s"))
            else:
                d = self.diagnose(gpu, snapshot, when, finding.details.get("util_recent", ()),
                                  finding.details.get("stalled_for_s"))
                self._cache[gpu.index] = (when, d)
            details = dict(finding.details)
            details["diagnosis"] = d.to_dict()
            details["verdict"] = d.verdict
            out.append(dataclasses.replace(finding, summary=f"{finding.summary} — {d.verdict}",
                                           details=details, hint=d.remedy))
        return out

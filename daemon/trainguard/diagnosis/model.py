"""The records a stall diagnosis is made of: per thread, per open file, per process, per GPU."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from trainguard.records import LogMatch

_CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".safetensors", ".bin", ".h5", ".pkl", ".npz", ".tar")
_LOG_SUFFIXES = (".log", ".out", ".err", ".txt", ".jsonl", ".csv")
CATEGORY_RANK = {"tfevents": 0, "checkpoint": 1, "log": 2, "other": 3}
MAX_OWNERS = 8  # distinct owners one stall names (a DDP job's ranks share one): bounds the metric's series


def distinct_owners(owners: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each non-empty owner once, in order, at most MAX_OWNERS."""
    out: list[dict[str, Any]] = []
    for o in owners:
        if o and dict(o) not in out and len(out) < MAX_OWNERS:
            out.append(dict(o))
    return out


def file_category(path: str) -> str:
    """tfevents / checkpoint / log / other, from the file's name."""
    base = os.path.basename(path)
    if base.startswith("events.out.tfevents"):
        return "tfevents"
    lowered = path.lower()
    if base.endswith(_CHECKPOINT_SUFFIXES) or "checkpoint" in lowered or "ckpt" in lowered:
        return "checkpoint"
    if base.lower().endswith(_LOG_SUFFIXES) or "/logs/" in lowered or "/runs/" in lowered:
        return "log"
    return "other"


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
    mount_point: str | None = None  # the mount that file lives on


@dataclass(frozen=True, slots=True)
class FileView:
    fd: int
    path: str
    category: str  # tfevents / checkpoint / log / other
    mount_point: str
    fstype: str
    kind: str  # fuse / network / local
    unresponsive_for_s: float | None  # None: responsive or not probed
    writing: bool | None = None  # opened for writing (fdinfo flags); None: unknown


@dataclass(frozen=True, slots=True)
class ProcessView:
    host_pid: int | None  # NVML's PID; None for a process inferred in our namespace without a pairing
    pid: int | None  # valid in our /proc
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
    inferred_from: str = ""  # non-empty: NVML did not name this PID; what it holds made us pick it
    owner: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # sources.owner.Owner's known fields

    @property
    def label(self) -> str:
        """"PID 1234", or "PID 56 (inferred: holds /dev/nvidia0 open)": the first piece of evidence."""
        if self.inferred_from:
            return f"PID {self.pid} (inferred: {self.inferred_from.split(';')[0]})"
        return f"PID {self.host_pid}"


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
    attribution: str = "nvml"  # nvml / inferred / none
    timed_out: bool = False  # the enrichment did not finish within its deadline: this is what was known
    # The verdict as facts (case, process, file, mount, ...): what diagnosis.words renders in a language.
    facts: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def owners(self) -> list[dict[str, Any]]:
        """The distinct owners of its processes (what a stall alert names and routes on), at most MAX_OWNERS."""
        return distinct_owners(v.owner for v in self.processes)

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))

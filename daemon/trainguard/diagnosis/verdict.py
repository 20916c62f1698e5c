"""From the process views to the verdict's facts, and its line and remedy in English (pure).

The facts (Diagnosis.facts) are what alerts and `trainguard diagnose` render in the reader's
language (diagnosis.words)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable, Sequence

from trainguard.diagnosis.model import (
    CATEGORY_RANK,
    Diagnosis,
    FileView,
    ProcessView,
    ThreadView,
    file_category,
)
from trainguard.diagnosis.words import (
    mirror_text,
    remedy_text,
    verdict_text,
    who_text,
)
from trainguard.i18n import tr
from trainguard.records import FsSample, GpuSample, LogMatch
from trainguard.redact import scrub

EN = tr("en")
MIRROR = mirror_text(EN)
MIRROR_HINT = f"write locally and {MIRROR}"


def short_command(cmdline: str, limit: int = 48) -> str:
    """"python train.py" from "/usr/bin/python3 /root/code/train.py --lr 3e-4"."""
    words = [os.path.basename(w) for w in cmdline.split()[:2]]
    return " ".join(words)[:limit]


def process_facts(v: ProcessView, t: ThreadView | None = None) -> dict[str, Any]:
    """Who: the PID (ours for an inferred process, else NVML's), its short command, the evidence and the thread."""
    out: dict[str, Any] = {"pid": v.pid if v.inferred_from else v.host_pid, "command": short_command(v.cmdline)}
    if v.inferred_from:
        out["inferred"] = v.inferred_from.split(";")[0]
    if v.owner:
        out["owner"] = dict(v.owner)
    if t is not None:
        out.update(thread=t.name, thread_os=t.os_name)
    return out


def who(v: ProcessView, t: ThreadView | None = None) -> str:
    return who_text(process_facts(v, t), EN)


def _file_view(path: str, views: Iterable[ProcessView]) -> FileView | None:
    for v in views:
        for f in v.remote_files:
            if f.path == path:
                return f
    return None


def _remote(f: FileView) -> dict[str, Any]:
    return {"file": f.path, "fstype": f.fstype, "mount": f.mount_point, "kind": f.kind, "category": f.category,
            "unresponsive_s": f.unresponsive_for_s}


def _blocked_on_file(views: Sequence[ProcessView]) -> dict[str, Any] | None:
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
    facts = {"case": "blocked_on_file", "process": process_facts(v, t), "syscall": t.syscall}
    if f is not None:
        return {**facts, **_remote(f), "file": t.file}
    return {**facts, "file": t.file, "mount": t.mount_point}


def _blocked_without_file(views: Sequence[ProcessView]) -> dict[str, Any] | None:
    """2. a thread in a filesystem wait, and the process has files on a network/FUSE mount."""
    for v in views:
        for t in v.blocked_threads:
            if v.remote_files:
                return {"case": "blocked_with_remote_file", "process": process_facts(v, t),
                        "wait": t.wchan or t.state, **_remote(v.remote_files[0])}
    for v in views:
        for t in v.blocked_threads:
            return {"case": "blocked", "process": process_facts(v, t), "wait": t.wchan, "state": t.state}
    return None


def _scrubbed(log_lines: Sequence[LogMatch]) -> tuple[LogMatch, ...]:
    """The last ten log lines as the diagnosis keeps them (it goes out in the alert's JSON): no credentials."""
    return tuple(dataclasses.replace(m, line=scrub(m.line)) for m in log_lines[-10:])


def _log_line(log_lines: Sequence[LogMatch], limit: int) -> str:
    """The newest matching log line, short and without credentials."""
    return scrub(log_lines[-1].line.strip()[:limit]) if log_lines else ""


def verdict_facts(views: Sequence[ProcessView], log_lines: Sequence[LogMatch]) -> dict[str, Any]:
    """What the GPU's processes are stuck on, as facts (words.verdict_text says it in a language)."""
    found = _blocked_on_file(views) or _blocked_without_file(views)
    if found is not None:
        return found
    unresolved = [v for v in views if not v.resolved]
    log = {"log": _log_line(log_lines, 160)} if log_lines else {}
    if not views:
        return {"case": "no_process", **log}
    if len(unresolved) == len(views):
        return {"case": "not_inspectable", "why": unresolved[0].note, **log}
    moving = [v for v in views if v.io_moved]
    if moving:
        return {"case": "io_moving", "process": process_facts(moving[0]), **log}
    if log_lines:
        return {"case": "log_error", "log": _log_line(log_lines, 200)}
    return {"case": "idle"}


def verdict_and_remedy(views: Sequence[ProcessView], log_lines: Sequence[LogMatch]) -> tuple[str, str]:
    facts = verdict_facts(views, log_lines)
    return verdict_text(facts, EN), remedy_text(facts, EN)


def attribution_of(views: Sequence[ProcessView]) -> str:
    if any(v.inferred_from for v in views):
        return "inferred"
    return "nvml" if any(v.resolved for v in views) else "none"


def build_diagnosis(gpu: GpuSample, views: Sequence[ProcessView], log_lines: Sequence[LogMatch],
                    util_recent: Sequence[float] = (), stalled_for_s: float | None = None) -> Diagnosis:
    facts = verdict_facts(views, log_lines)
    return Diagnosis(gpu.index, gpu.name, gpu.memory_used_bytes, gpu.memory_total_bytes, tuple(util_recent),
                     stalled_for_s, tuple(views), _scrubbed(log_lines), verdict_text(facts, EN),
                     remedy_text(facts, EN), attribution_of(views), facts=facts)


def timed_out(gpu: GpuSample, probes: Sequence[FsSample], log_lines: Sequence[LogMatch], deadline: float,
              util_recent: Sequence[float] = (), stalled_for_s: float | None = None) -> Diagnosis:
    """What is known without /proc when the diagnosis did not finish in time: NVML's view, stuck mounts, logs."""
    views = tuple(ProcessView(p.host_pid, p.pid, False, p.note or "not inspected in time", p.name, None,
                              p.state or "?", p.used_memory_bytes, (), 0, None, {}, ()) for p in gpu.processes)
    facts = {"case": "timed_out", "deadline_s": deadline,
             "unresponsive_mounts": [s.mount.mount_point for s in probes if not s.responsive]}
    if log_lines:
        facts["log"] = _log_line(log_lines, 160)
    return Diagnosis(gpu.index, gpu.name, gpu.memory_used_bytes, gpu.memory_total_bytes, tuple(util_recent),
                     stalled_for_s, views, _scrubbed(log_lines), verdict_text(facts, EN), remedy_text(facts, EN),
                     "none", True, facts)

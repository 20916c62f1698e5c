"""The diagnosis as a screen of text (trainguard diagnose, the alert details)."""

from __future__ import annotations

from trainguard.diagnosis.model import Diagnosis, ProcessView
from trainguard.units import format_bytes, format_duration


def _process_head(v: ProcessView) -> str:
    if v.inferred_from:
        head = f"  PID {v.pid} here"
        if v.host_pid is not None:
            head += f" (NVML PID {v.host_pid})"
    else:
        head = f"  PID {v.host_pid}"
        if v.pid is not None and v.pid != v.host_pid:
            head += f" (here {v.pid})"
    return head


def _process_lines(v: ProcessView) -> list[str]:
    head = _process_head(v)
    if not v.resolved:
        return [f"{head}: {v.note}"]
    head += f" [{v.state}] {' '.join(v.cmdline.split())[:120]}"
    if v.container_id:
        head += f" container {v.container_id[:12]}"
    if v.used_memory_bytes is not None:
        head += f", {format_bytes(v.used_memory_bytes)} VRAM"
    lines = [head]
    if v.inferred_from:
        lines.append(f"    attribution INFERRED (NVML's PIDs do not resolve here): {v.inferred_from}")
    if v.io_moved is not None:
        lines.append("    I/O counters " + ("moved: " + ", ".join(f"{k}+{format_bytes(n)}" for k, n in v.io_delta.items() if n)
                                           if v.io_moved else "did not move"))
    for t in v.blocked_threads:
        lines.append(f"    thread {t.tid} {t.name}: {t.state} in {t.wchan or '?'}"
                     + (f", {t.syscall}({t.file})" if t.file else f", {t.syscall}()" if t.syscall else "")
                     + (f" on {t.mount_point}" if t.file and t.mount_point else "")
                     + (f"  [{t.python_frame}]" if t.python_frame else ""))
    if not v.blocked_threads:
        lines.append(f"    no blocked threads ({v.thread_count} threads)")
    for f in v.remote_files[:8]:
        state = f", UNRESPONSIVE {format_duration(f.unresponsive_for_s)}" if f.unresponsive_for_s is not None else ""
        mode = ", open for writing" if f.writing else ""
        lines.append(f"    open: {f.path} ({f.fstype} at {f.mount_point}{mode}{state})")
    return lines


def render(d: Diagnosis) -> str:
    lines = [f"GPU {d.gpu} {d.gpu_name}: VRAM {format_bytes(d.memory_used_bytes)}/{format_bytes(d.memory_total_bytes)}"
             + (f", stalled {format_duration(d.stalled_for_s)}" if d.stalled_for_s else "")]
    if d.util_recent:
        lines.append("  utilisation: " + " ".join(f"{u:.0%}" for u in d.util_recent[-20:]))
    for v in d.processes:
        lines.extend(_process_lines(v))
    for m in d.log_lines[-5:]:
        lines.append(f"  log {m.path}: {m.line.strip()[:160]}")
    lines.append(f"  verdict: {d.verdict}")
    lines.append(f"  remedy: {d.remedy}")
    return "\n".join(lines)

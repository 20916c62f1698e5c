"""The diagnosis as a screen of text (trainguard diagnose, the alert details), in a language."""

from __future__ import annotations

from trainguard.diagnosis.model import Diagnosis, ProcessView
from trainguard.diagnosis.words import owner_text, remedy_text, verdict_text
from trainguard.i18n import Gettext, tr
from trainguard.redact import scrub
from trainguard.units import format_bytes, format_duration

DETAIL_KEYS = ("runtime", "container_id", "pod_uid", "slurm_step", "slurm_user", "uid")  # the rest, for a person


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


def _process_lines(v: ProcessView, _: Gettext) -> list[str]:
    head = _process_head(v)
    if not v.resolved:
        return [f"{head}: {v.note}"]
    head += f" [{v.state}] {' '.join(v.cmdline.split())[:120]}"
    if v.container_id:
        head += _(" container {id}").format(id=v.container_id[:12])
    if v.used_memory_bytes is not None:
        head += _(", {used} VRAM").format(used=format_bytes(v.used_memory_bytes))
    lines = [head]
    if v.owner:
        extra = [f"{k}={str(v.owner[k])[:36]}" for k in DETAIL_KEYS if k in v.owner]
        lines.append(_("    owner: {owner}").format(owner=owner_text(v.owner, _))
                     + (f" [{', '.join(extra)}]" if extra else ""))
    if v.inferred_from:
        lines.append(_("    attribution INFERRED (NVML's PIDs do not resolve here): {evidence}").format(
            evidence=v.inferred_from))
    if v.io_moved is not None:
        lines.append(_("    I/O counters moved: {delta}").format(
            delta=", ".join(f"{k}+{format_bytes(n)}" for k, n in v.io_delta.items() if n)) if v.io_moved
            else _("    I/O counters did not move"))
    for t in v.blocked_threads:
        lines.append(_("    thread {tid} {name}: {state} in {wchan}").format(
            tid=t.tid, name=t.name, state=t.state, wchan=t.wchan or "?")
                     + (f", {t.syscall}({t.file})" if t.file else f", {t.syscall}()" if t.syscall else "")
                     + (_(" on {mount}").format(mount=t.mount_point) if t.file and t.mount_point else "")
                     + (f"  [{t.python_frame}]" if t.python_frame else ""))
    if not v.blocked_threads:
        lines.append(_("    no blocked threads ({count} threads)").format(count=v.thread_count))
    for f in v.remote_files[:8]:
        state = _(", UNRESPONSIVE {stuck}").format(stuck=format_duration(f.unresponsive_for_s)) \
            if f.unresponsive_for_s is not None else ""
        mode = _(", open for writing") if f.writing else ""
        lines.append(_("    open: {file} ({fstype} at {mount}{mode}{state})").format(
            file=f.path, fstype=f.fstype, mount=f.mount_point, mode=mode, state=state))
    return lines


def render(d: Diagnosis, lang: str = "en") -> str:
    """The screen of `trainguard diagnose`; the verdict and remedy said from the facts in the language."""
    _ = tr(lang)
    lines = [_("GPU {gpu} {name}: VRAM {used}/{total}").format(
        gpu=d.gpu, name=d.gpu_name, used=format_bytes(d.memory_used_bytes), total=format_bytes(d.memory_total_bytes))
        + (_(", stalled {stalled}").format(stalled=format_duration(d.stalled_for_s)) if d.stalled_for_s else "")]
    if d.util_recent:
        lines.append(_("  utilisation: {values}").format(values=" ".join(f"{u:.0%}" for u in d.util_recent[-20:])))
    for v in d.processes:
        lines.extend(_process_lines(v, _))
    for m in d.log_lines[-5:]:
        lines.append(_("  log {file}: {line}").format(file=m.path, line=scrub(m.line.strip()[:160])))
    verdict, remedy = (verdict_text(d.facts, _), remedy_text(d.facts, _)) if d.facts else (d.verdict, d.remedy)
    lines.append(_("  verdict: {verdict}").format(verdict=verdict))
    lines.append(_("  remedy: {remedy}").format(remedy=remedy))
    return "\n".join(lines)

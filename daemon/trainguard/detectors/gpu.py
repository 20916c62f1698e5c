"""GPU detectors: stall (VRAM full, GPU idle), memory held by dead processes, XID errors,
sustained thermal/power throttling; and findings from watched training logs.

Pure functions of (GPU config, history points, snapshot, now, active keys). History
series they read are written by the service each cycle from `gpu_series(snapshot)`:
gpu.util:<i> (busy ratio 0..1), gpu.throttle:<i> (reason
bitmask), gpu.xid:<i> (XID code, only in cycles that saw one).
"""

from __future__ import annotations

import fnmatch
from typing import Any, Callable, Iterable, Sequence

from trainguard.config import Gpu as GpuConfig
from trainguard.config import LogWatch
from trainguard.detectors.xids import CRITICAL_XIDS, XID_MEANINGS
from trainguard.records import Finding, GpuSample, LogMatch, Severity, Snapshot
from trainguard.redact import scrub
from trainguard.units import format_bytes, format_duration

Points = Callable[[str, float], Sequence[tuple[float, float]]]

_THROTTLE_BITS = {"sw_power_cap": 0x4, "hw_slowdown": 0x8, "sw_thermal": 0x20, "hw_thermal": 0x40,
                  "hw_power_brake": 0x80}


def _label(g: GpuSample) -> str:
    return f"GPU {g.index} ({g.name})" if g.name else f"GPU {g.index}"


def _covered(points: Sequence[tuple[float, float]], start: float, interval: float) -> bool:
    """Do the points reach back to the start of the window (allowing one sample interval of slack)?"""
    return bool(points) and points[0][0] <= start + 1.5 * interval


def stalled_since(points: Sequence[tuple[float, float]], floor: float) -> float | None:
    """When the trailing run of samples at or below the floor began.

    Each sample averages the interval before it, so the stall began at the last busy
    sample; without one in view, at the first idle sample seen.
    """
    since = None
    for ts, value in reversed(points):
        if value > floor:
            return ts
        since = ts
    return since


def detect_stall(cfg: GpuConfig, points: Points, snapshot: Snapshot, now: float,
                 active: frozenset[str], interval: float) -> list[Finding]:
    """VRAM >= vram_ratio and mean utilisation <= util_floor over `for`, with a compute process.

    Averaging over the whole window is what keeps a 30 s evaluation or a 2 min
    checkpoint save from firing. Once firing, it clears as soon as the latest sample
    is above the floor again (utilisation is back), not after another full window.
    """
    findings = []
    for g in snapshot.gpus:
        if g.lost or not g.processes:
            continue
        rule = cfg.rule_for(g.index, g.uuid, g.name)
        mem_ratio = g.memory_used_ratio
        if rule.ignore or mem_ratio is None or mem_ratio < rule.vram_ratio:
            continue
        key = f"gpu.stall:{g.index}"
        start = now - rule.for_
        lookback = now - (rule.for_ * 6 if key in active else rule.for_ + 2 * interval)
        history = [p for p in points(f"gpu.util:{g.index}", lookback) if p[0] <= now]
        window = [p for p in history if p[0] > start]
        if not window:
            continue
        if key in active:
            if window[-1][1] > rule.util_floor:
                continue
        else:
            if not _covered([p for p in history if p[0] > start - interval], start, interval):
                continue
            if sum(v for _, v in window) / len(window) > rule.util_floor:
                continue
        mean = sum(v for _, v in window) / len(window)
        since = stalled_since(history, rule.util_floor) or window[0][0]
        findings.append(Finding(
            key=key,
            severity=Severity.CRITICAL,
            summary=(f"{_label(g)} stalled: VRAM {format_bytes(g.memory_used_bytes)}/"
                     f"{format_bytes(g.memory_total_bytes)} full, utilisation {mean:.0%} "
                     f"for {format_duration(now - since)}"),
            details={
                "gpu": g.index, "uuid": g.uuid, "name": g.name,
                "memory_used_bytes": g.memory_used_bytes, "memory_total_bytes": g.memory_total_bytes,
                "util_mean_ratio": round(mean, 4), "util_recent": [round(v, 3) for _, v in window[-30:]],
                "stalled_since": since, "stalled_for_s": round(now - since, 1),
                "processes": [{"host_pid": p.host_pid, "pid": p.pid, "used_memory_bytes": p.used_memory_bytes,
                               "note": p.note} for p in g.processes],
            },
            labels={"gpu": str(g.index), "uuid": g.uuid},
            value=mean,
            threshold=rule.util_floor,
            hint=f"run `trainguard diagnose {g.index}` to see what its processes are blocked on",
        ))
    return findings


def detect_orphans(cfg: GpuConfig, snapshot: Snapshot) -> list[Finding]:
    """GPU memory held by a process that no longer exists or is a zombie. Never acts."""
    findings = []
    for g in snapshot.gpus:
        for p in g.processes:
            if p.exists is False:
                what = f"PID {p.host_pid}, which no longer exists"
                hint = ("the driver has not released the memory of an exited process; if it stays, "
                        "drain the GPU and reset it (nvidia-smi -r)")
            elif p.state == "Z":
                what = f"PID {p.host_pid} ({p.name}), a zombie (exited, its parent has not reaped it)"
                hint = "restart or signal the zombie's parent process so it reaps it; the memory is freed then"
            else:
                continue
            held = format_bytes(p.used_memory_bytes) if p.used_memory_bytes is not None else "memory"
            findings.append(Finding(
                key=f"gpu.orphan:{g.index}:{p.host_pid}",
                severity=Severity.WARNING,
                summary=f"{_label(g)}: {held} held by {what}",
                details={"gpu": g.index, "host_pid": p.host_pid, "pid": p.pid, "state": p.state,
                         "used_memory_bytes": p.used_memory_bytes},
                labels={"gpu": str(g.index), "pid": str(p.host_pid)},
                value=float(p.used_memory_bytes) if p.used_memory_bytes is not None else None,
                for_s=cfg.orphan_for,
                hint=hint,
            ))
    return findings


def detect_xid(cfg: GpuConfig, points: Points, snapshot: Snapshot, now: float) -> list[Finding]:
    """An XID alert stays up for xid_hold after the last event (events are one-shot)."""
    findings = []
    for g in snapshot.gpus:
        seen = [(ts, int(v)) for ts, v in points(f"gpu.xid:{g.index}", now - cfg.xid_hold)]
        seen += [(e.ts, e.xid) for e in g.xid_events if (e.ts, e.xid) not in seen]
        if not seen:
            continue
        seen.sort()
        last_ts, last = seen[-1]
        worst = next((x for _, x in reversed(seen) if x in CRITICAL_XIDS), last)
        meaning, step = XID_MEANINGS.get(worst, ("see NVIDIA's XID catalogue", "check `dmesg` for NVRM lines"))
        findings.append(Finding(
            key=f"gpu.xid:{g.index}",
            severity=Severity.CRITICAL if worst in CRITICAL_XIDS else Severity.WARNING,
            summary=f"{_label(g)}: XID {worst} — {meaning}",
            details={"gpu": g.index, "uuid": g.uuid, "xids": [x for _, x in seen], "last_ts": last_ts},
            labels={"gpu": str(g.index), "uuid": g.uuid},
            value=float(worst),
            hint=step,
        ))
    return findings


def detect_throttle(cfg: GpuConfig, points: Points, snapshot: Snapshot, now: float, interval: float) -> list[Finding]:
    """Thermal/power slowdown present in >= 90 % of the samples over throttle_for."""
    mask = 0
    for name in cfg.throttle_reasons:
        mask |= _THROTTLE_BITS[name]
    findings = []
    start = now - cfg.throttle_for
    for g in snapshot.gpus:
        if g.lost or g.throttle_reasons is None:
            continue
        history = [p for p in points(f"gpu.throttle:{g.index}", start - interval) if p[0] <= now]
        window = [p for p in history if p[0] > start]
        if not window or not _covered(history, start, interval):
            continue
        hits = [int(v) & mask for _, v in window]
        share = sum(1 for h in hits if h) / len(hits)
        if share < 0.9:
            continue
        reasons = sorted({n for h in hits for n, bit in _THROTTLE_BITS.items() if h & bit})
        facts = []
        if g.temperature_c is not None:
            facts.append(f"{g.temperature_c:.0f}°C")
        if g.power_w is not None and g.power_limit_w:
            facts.append(f"{g.power_w:.0f}/{g.power_limit_w:.0f} W")
        findings.append(Finding(
            key=f"gpu.throttle:{g.index}",
            severity=Severity.WARNING,
            summary=(f"{_label(g)} throttled ({', '.join(reasons)}) {share:.0%} of the last "
                     f"{format_duration(cfg.throttle_for)}" + (f"; {', '.join(facts)}" if facts else "")),
            details={"gpu": g.index, "reasons": reasons, "share": round(share, 3),
                     "temperature_c": g.temperature_c, "power_w": g.power_w, "power_limit_w": g.power_limit_w},
            labels={"gpu": str(g.index), "uuid": g.uuid},
            value=share,
            threshold=0.9,
            hint="check cooling and airflow (thermal) or the power supply/cap (power); training runs slower meanwhile",
        ))
    return findings


def detect_log_matches(logs: Iterable[LogWatch], snapshot: Snapshot) -> list[Finding]:
    """One finding per (log file, pattern) with recent matching lines (the watcher keeps them for `hold`).

    Keyed per pattern, not per file: while an out-of-memory alert from train.log is active, a
    "No space left on device" in the same file is a new fact and gets its own alert."""
    by_key: dict[tuple[str, str], list[LogMatch]] = {}
    for match in snapshot.log_matches:
        by_key.setdefault((match.path, match.pattern), []).append(match)
    rules = list(logs)
    findings = []
    for (path, pattern), matches in sorted(by_key.items()):
        severity = Severity.WARNING
        for rule in rules:
            if any(fnmatch.fnmatchcase(path, glob) for glob in rule.paths) and rule.severity == "critical":
                severity = Severity.CRITICAL
        last = matches[-1]
        findings.append(Finding(
            key=log_match_key(path, pattern),
            severity=severity,
            summary=f"{path}: {scrub(last.line.strip()[:200])}",  # a watched line may carry a token
            details={"file": path, "pattern": pattern, "count": len(matches),
                     "lines": [{"line": scrub(m.line[:500]), "pattern": m.pattern, "ts": m.ts} for m in matches[-10:]]},
            labels={"file": path, "pattern": pattern},
            value=float(len(matches)),
            hint=_log_hint(pattern),
        ))
    return findings


def log_match_key(path: str, pattern: str) -> str:
    """The alert key of one pattern's matches in one file."""
    return f"log.match:{path}#{pattern}"


def _log_hint(pattern: str) -> str:
    if "No space" in pattern:
        return "a write failed because a filesystem is full: free space (trainguard cleanup --dry-run) and resume"
    if "tfevents" in pattern:
        return "TensorBoard's writer lost its event file: log to local disk and sync to the share in the background"
    if "out of memory" in pattern:
        return "lower the batch size or enable gradient checkpointing; check for other processes on the GPU"
    if "NCCL" in pattern:
        return "a collective timed out: one rank is stuck or dead; check the other ranks and the network"
    return "see the log around this line"


# --- adaptors for the DETECTORS registry (DetectorInput: config, history, snapshot, now, active) ---

def _interval(config: Any) -> float:
    return config.gpu.interval or config.general.interval


def gpu_stall(inp: Any) -> list[Finding]:
    if not inp.config.gpu.enabled:
        return []
    return detect_stall(inp.config.gpu, inp.history.points, inp.snapshot, inp.now, inp.active, _interval(inp.config))


def gpu_orphan(inp: Any) -> list[Finding]:
    return detect_orphans(inp.config.gpu, inp.snapshot) if inp.config.gpu.enabled else []


def gpu_xid(inp: Any) -> list[Finding]:
    return detect_xid(inp.config.gpu, inp.history.points, inp.snapshot, inp.now) if inp.config.gpu.enabled else []


def gpu_throttle(inp: Any) -> list[Finding]:
    if not inp.config.gpu.enabled:
        return []
    return detect_throttle(inp.config.gpu, inp.history.points, inp.snapshot, inp.now, _interval(inp.config))


def log_match(inp: Any) -> list[Finding]:
    return detect_log_matches(inp.config.logs, inp.snapshot)


GPU_DETECTORS = {
    "gpu.stall": gpu_stall,
    "gpu.orphan": gpu_orphan,
    "gpu.xid": gpu_xid,
    "gpu.throttle": gpu_throttle,
    "log.match": log_match,
}

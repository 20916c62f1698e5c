"""The progress watchdog: a training run that has stopped making progress (train.hang), and one that
ended with an error (train.exit).

Pure functions of ([progress] config, the runs and their learned cadences, the GPUs, now). The rule:
a run is silent for longer than max(min_silence, factor x its longest normal gap), or, before its first
progress event, than startup_grace. A silence with spinning GPUs is judged by the spinning silences the
run has had (store.progress learns gaps per mode), not by its long evaluations. Silence alone
is not the verdict. A rank whose main thread is blocked in I/O agrees, whatever the GPU shows (a
checkpoint write to a hung share). Else the GPUs must: "spinning" (busy with power far below the GPU's own
training level: a collective that waits), "idle". A GPU that computes at its training power means a long evaluation that
logs nothing: not hung. Without GPU data, a rank blocked in I/O ("blocked") or no CPU time used by
any rank ("no_cpu") agrees. The alert resolves when progress resumes, the GPUs compute again, or the
run ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trainguard.config import Progress
from trainguard.records import Finding, GpuSample, RunEnd, RunSample, Severity
from trainguard.store.progress import ALL, Cadence, run_gpu_states
from trainguard.units import format_duration

HANG_PREFIX = "train.hang:"  # the hang's key prefix, for those who pick its findings out (the diagnosis)
OWNER_LABELS = {"container_id": "container", "namespace": "namespace", "pod": "pod", "slurm_job": "slurm_job"}
HANG_HINT = ("find the rank that holds the others (its stack: py-spy dump --pid PID); check its mount or disk; "
             "rerun with NCCL_DEBUG=WARN and TORCH_NCCL_TRACE_BUFFER_SIZE set for the flight recorder")


def hang_key(run: str) -> str:
    return f"train.hang:{run}"  # HANG_PREFIX + run, spelled out where the kind is read from the code


def exit_key(run: str) -> str:
    return f"train.exit:{run}"


def timeout_of(cfg: Progress, c: Cadence, mode: str = ALL) -> tuple[float, float]:
    """(timeout, the time silence is counted from): the learned rule for the mode the silence is in
    (ALL without GPU data), or the start-up grace before the first progress."""
    if c.last_progress is None:
        return cfg.startup_grace, c.first_seen
    return max(cfg.min_silence, cfg.factor * c.normal_gap(mode)), c.last_progress


def mode_of(verdict: str) -> str:
    """The learned gaps a silence is judged by: a spin by past spins alone (a collective waiting minutes is
    never routine, and long evaluations must not hide it); anything else by every gap (an idle silence
    may be a save or data loading that the run has had in any mode)."""
    return "spinning" if verdict == "spinning" else ALL


def evidence(run: RunSample, c: Cadence, gpus: Mapping[int, GpuSample]) -> str | None:
    """What corroborates the silence ("spinning", "idle", "blocked", "no_cpu"), or None: not hung.
    A rank whose main thread is blocked in I/O queues no GPU work, whatever its GPU shows."""
    states = run_gpu_states(run, c, gpus)
    if states and "computing" not in states:
        return "spinning" if "spinning" in states else "idle"
    if any(r.main_blocked for r in run.ranks):
        return "blocked"
    if states:
        return None  # computing at its training level: a long evaluation that logs nothing
    if any(r.blocked_threads for r in run.ranks):
        return "blocked"
    return None if c.cpu_moved else "no_cpu"


def _gpus_of(run: RunSample) -> list[int]:
    return sorted({i for r in run.ranks for i in r.gpus})


def owner_labels(owner: Mapping[str, Any]) -> dict[str, str]:
    """The owner facts a fleet groups alerts and series by (as for the stall's)."""
    return {label: str(owner[key])[:12] if key == "container_id" else str(owner[key])
            for key, label in OWNER_LABELS.items() if owner.get(key)}


def _ranks(run: RunSample, c: Cadence) -> list[dict[str, Any]]:
    marks = {r.pid: r for r in c.ranks}
    out = []
    for r in sorted(run.ranks, key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.pid)):
        mark = marks.get(r.pid)
        out.append({"rank": r.rank, "pid": r.pid, "gpu": r.gpus[0] if r.gpus else None,
                    "last_progress_ts": mark.last_progress if mark else None, "cpu_s": round(r.cpu_s, 2),
                    "blocked_threads": r.blocked_threads, "main_blocked": r.main_blocked})
    return out


def detect_hangs(cfg: Progress, runs: Sequence[RunSample], cadences: Mapping[str, Cadence],
                 gpus: Iterable[GpuSample], now: float) -> list[Finding]:
    by_index = {g.index: g for g in gpus}
    findings = []
    for run in runs:
        c = cadences.get(run.run_id)
        if c is None:
            continue
        verdict = evidence(run, c, by_index)
        if verdict is None:
            continue
        timeout, since = timeout_of(cfg, c, mode_of(verdict))
        silent = now - since
        if silent > timeout:
            findings.append(hang_finding(run, c, verdict, silent, timeout))
    return findings


def hang_finding(run: RunSample, c: Cadence, verdict: str, silent: float, timeout: float) -> Finding:
    gpus = _gpus_of(run)
    return Finding(
        key=hang_key(run.name),
        severity=Severity.CRITICAL,
        summary=(f"training run {run.name} has made no progress for {format_duration(silent)} "
                 f"(timeout {format_duration(timeout)}; GPUs {verdict})"),
        details={"run": run.name, "run_id": run.run_id, "ranks": _ranks(run, c), "gpu_evidence": verdict,
                 "silent_for_s": round(silent, 1), "timeout_s": round(timeout, 1),
                 "last_progress_ts": c.last_progress, "normal_gap_s": round(c.normal_gap(mode_of(verdict)), 1), "gpus": gpus,
                 "owners": [dict(run.owner)] if run.owner else []},
        labels={"run": run.name, **owner_labels(run.owner)},
        value=silent,
        threshold=timeout,
        hint=HANG_HINT,
    )


def detect_exits(ended: Iterable[RunEnd]) -> list[Finding]:
    """A run that ended with an error it printed: not a hang, but worth a look."""
    return [Finding(
        key=exit_key(e.name),
        severity=Severity.WARNING,
        summary=f"training run {e.name} {'was killed' if e.how == 'killed' else 'ended with an error'}: {e.error}",
        details={"run": e.name, "run_id": e.run_id, "ended_ts": e.ts, "error": e.error, "how": e.how,
                 "owners": [dict(e.owner)] if e.owner else []},
        labels={"run": e.name, **owner_labels(e.owner)},
        hint="read the end of the run's output; restart it from its last checkpoint",
    ) for e in ended if e.error]


def fold_stalls(findings: Sequence[Finding]) -> list[Finding]:
    """A hang whose GPUs also stall is one alert: the hang carries the stalls' facts and the stall
    alerts of those GPUs are left out while it fires. The one place that rule lives."""
    hangs = [f for f in findings if f.key.startswith(HANG_PREFIX)]
    held = {g: h.key for h in hangs for g in h.details.get("gpus", ())}
    if not held:
        return list(findings)
    folded: dict[str, list[dict[str, Any]]] = {}
    out = []
    for f in findings:
        gpu = f.details.get("gpu") if f.kind == "gpu.stall" else None
        if gpu in held:
            folded.setdefault(held[gpu], []).append(
                {k: f.details.get(k) for k in ("gpu", "name", "memory_used_bytes", "memory_total_bytes",
                                               "util_mean_ratio", "stalled_for_s")})
        else:
            out.append(f)
    return [_with_stalls(f, folded[f.key]) if f.key in folded else f for f in out]


def _with_stalls(hang: Finding, stalls: list[dict[str, Any]]) -> Finding:
    from dataclasses import replace

    return replace(hang, details={**hang.details, "stalls": stalls})


# --- adaptor for the DETECTORS registry ---

def train_progress(inp: Any) -> list[Finding]:
    cfg = inp.config.progress
    if not cfg.enabled:
        return []
    snap = inp.snapshot
    return (detect_hangs(cfg, snap.runs, inp.progress, snap.gpus, inp.now)
            + detect_exits(snap.ended_runs))


PROGRESS_DETECTORS = {"progress": train_progress}  # makes train.hang and train.exit

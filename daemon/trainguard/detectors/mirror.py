"""mirror.lag: a change on local disk has waited longer than lag_warning to reach the share."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainguard.records import Finding, MirrorState, Severity
from trainguard.units import format_duration

if TYPE_CHECKING:
    from trainguard.detectors import DetectorInput

HINTS = {
    "unresponsive": "the share hangs: check its mount (network, FUSE daemon); training is safe on local disk, "
                    "and the copy resumes by itself when the share answers",
    "full": "free space or quota on the share; until then the copies stay on local disk only",
    "permission": "make the dest writable for trainguard's user (or fix a read-only mount)",
    "changing": "the file is rewritten while it is copied; write it under a temporary name and rename it",
    "error": "see `trainguard mirror` for the failing file",
}


def detect(inp: DetectorInput) -> list[Finding]:
    limits = {m.name: m.lag_warning for m in inp.config.mirror if m.enabled}
    findings = []
    for state in inp.snapshot.mirrors:
        limit = limits.get(state.name)
        lag = state.lag(inp.now)
        if limit is None or lag <= limit:
            continue
        reason = state.reason or "still copying"
        findings.append(Finding(
            key=f"mirror.lag:{state.name}", severity=Severity.WARNING,
            summary=f"mirror {state.name}: changes not on {state.dest} for {format_duration(lag)} ({reason})",
            details={"mirror": state.name, "dest": state.dest, "lag_s": round(lag, 1),
                     "pending_files": state.pending_files, "pending_bytes": state.pending_bytes,
                     "reason": reason, "reason_kind": state.reason_kind or "copying", **_stuck(state)},
            labels={"mirror": state.name},
            value=lag, threshold=limit,
            hint=HINTS.get(state.reason_kind, "a large first copy takes time; see `trainguard status`")))
    return findings


def _stuck(state: MirrorState) -> dict:
    """The copier the kernel keeps in a request the share never answers (it cannot be killed), if any."""
    if state.stuck_pid is None:
        return {}
    return {"stuck_pid": state.stuck_pid, "stuck_op": state.stuck_op, "stuck_path": state.stuck_path}

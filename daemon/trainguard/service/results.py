"""What one cycle leaves behind, and the figures derived from it for systemd and the exporter."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from trainguard.detectors import DetectorInput
from trainguard.records import AlertEvent, Finding, Snapshot


def fill_etas(inp: DetectorInput) -> dict[str, float]:
    """Seconds to full per filling mount: the forecast detector's own fits, not fitted again."""
    etas: dict[str, float] = {}
    if not inp.config.forecast.enabled:
        return etas
    for s in inp.snapshot.filesystems:
        trend = inp.trend(s)
        if trend is not None and trend.eta is not None:
            etas[s.mount.mount_point] = trend.eta
    return etas


def status_line(snapshot: Snapshot, firing: int) -> str:
    """The one line systemctl status shows: "3 mounts, 2 GPUs, 1 firing"."""
    mounts = len(snapshot.filesystems)
    parts = [f"{mounts} mount{'s' if mounts != 1 else ''}"]
    stuck = sum(1 for s in snapshot.filesystems if not s.responsive)
    if stuck:
        parts[0] += f" ({stuck} unresponsive)"
    gpus = len(snapshot.gpus)
    parts.append(f"{gpus} GPU{'s' if gpus != 1 else ''}")
    parts.append(f"{firing} firing")
    return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class CycleResult:
    snapshot: Snapshot
    findings: tuple[Finding, ...]
    events: tuple[AlertEvent, ...]
    duration_s: float
    fill_eta: Mapping[str, float] = field(default_factory=dict)  # mount point -> seconds to full

"""The numbers of each snapshot that the detectors read back from history (the store's input)."""

from __future__ import annotations

from trainguard.detectors.gpu import CRITICAL_XIDS
from trainguard.records import Snapshot


def series_of(snapshot: Snapshot) -> dict[str, float | None]:
    """The numbers of a snapshot that detectors read back from history."""
    values: dict[str, float | None] = {}
    for s in snapshot.filesystems:
        mp = s.mount.mount_point
        values[f"fs.responsive:{mp}"] = 1.0 if s.responsive else 0.0
        if s.usage is not None and s.responsive:
            values[f"fs.avail_bytes:{mp}"] = s.usage.avail_bytes
            values[f"fs.used_ratio:{mp}"] = s.usage.used_ratio
            values[f"fs.inodes_used_ratio:{mp}"] = s.usage.inodes_used_ratio
    for d in snapshot.disks:
        values[f"disk.util:{d.name}"] = d.util_ratio
        values[f"disk.write_bps:{d.name}"] = d.write_bytes_per_s
        values[f"disk.read_bps:{d.name}"] = d.read_bytes_per_s
    values.update(gpu_series(snapshot))
    return values


def gpu_series(snapshot: Snapshot) -> dict[str, float]:
    """The history series one cycle adds for its GPUs."""
    values: dict[str, float] = {}
    for g in snapshot.gpus:
        if g.lost:
            continue
        if g.util_ratio is not None:
            values[f"gpu.util:{g.index}"] = g.util_ratio
        if g.memory_used_bytes is not None:
            values[f"gpu.mem_used:{g.index}"] = float(g.memory_used_bytes)
        if g.throttle_reasons is not None:
            values[f"gpu.throttle:{g.index}"] = float(g.throttle_reasons)
        if g.xid_events:
            worst = max(g.xid_events, key=lambda e: (e.xid in CRITICAL_XIDS, e.ts))
            values[f"gpu.xid:{g.index}"] = float(worst.xid)
        if g.temperature_c is not None:
            values[f"gpu.temperature:{g.index}"] = g.temperature_c
        if g.power_w is not None:
            values[f"gpu.power_w:{g.index}"] = g.power_w
    return values

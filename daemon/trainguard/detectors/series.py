"""The numbers of each snapshot that are read back from history (the store's input).

Only those: every series costs each cycle an in-memory point and a row in the state database, and
temperatures, power, throughput or inode ratios are on /metrics for whoever wants them over time.
Readers: fs.avail_bytes (the fill forecast), fs.used_ratio (status' 24 h sparkline), disk.util (I/O
saturation), gpu.util (stall), gpu.throttle (throttling), gpu.xid (XID hold).
"""

from __future__ import annotations

from trainguard.detectors.xids import CRITICAL_XIDS
from trainguard.records import Snapshot


def series_of(snapshot: Snapshot) -> dict[str, float | None]:
    """The numbers of a snapshot that are read back from history."""
    values: dict[str, float | None] = {}
    for s in snapshot.filesystems:
        if s.usage is not None and s.responsive:
            mp = s.mount.mount_point
            values[f"fs.avail_bytes:{mp}"] = s.usage.avail_bytes
            values[f"fs.used_ratio:{mp}"] = s.usage.used_ratio
    for d in snapshot.disks:
        values[f"disk.util:{d.name}"] = d.util_ratio
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
        if g.throttle_reasons is not None:
            values[f"gpu.throttle:{g.index}"] = float(g.throttle_reasons)
        if g.xid_events:
            worst = max(g.xid_events, key=lambda e: (e.xid in CRITICAL_XIDS, e.ts))
            values[f"gpu.xid:{g.index}"] = float(worst.xid)
    return values

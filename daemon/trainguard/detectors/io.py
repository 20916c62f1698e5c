"""I/O saturation: a block device busy >= util_threshold on average over `for`."""

from __future__ import annotations

import math

from trainguard.records import Finding, Severity
from trainguard.units import format_bytes, format_duration, format_ratio

HINT = ("the disk is the bottleneck: check which process writes (iotop, trainguard diagnose), "
        "move data loading or checkpoints to a faster volume")


def detect(inp) -> list[Finding]:
    cfg = inp.config.io
    findings: list[Finding] = []
    mounts_by_dev: dict[tuple[int, int], list[str]] = {}
    for sample in inp.snapshot.filesystems:
        mounts_by_dev.setdefault((sample.mount.major, sample.mount.minor), []).append(sample.mount.mount_point)
    for disk in inp.snapshot.disks:
        mounts = mounts_by_dev.get((disk.major, disk.minor))
        if not mounts:
            continue  # only devices behind a watched filesystem: no alerts for idle raw disks
        points = inp.history.points(f"disk.util:{disk.name}", inp.now - cfg.for_)
        # The window must be (nearly) covered, so one busy sample right after start-up cannot fire.
        if len(points) < 2 or points[-1][0] - points[0][0] < 0.9 * cfg.for_ - 1e-9:
            continue
        mean = math.fsum(v for _, v in points) / len(points)  # fsum: a disk at exactly 90 % must count
        if mean < cfg.util_threshold:
            continue
        findings.append(Finding(
            key=f"disk.saturated:{disk.name}", severity=Severity.WARNING,
            summary=(f"{disk.name} I/O {format_ratio(mean)} busy for {format_duration(cfg.for_)} "
                     f"({', '.join(mounts)}), write {format_bytes(disk.write_bytes_per_s)}/s, "
                     f"await {disk.await_ms if disk.await_ms is not None else '-'} ms"),
            details={"device": disk.name, "mountpoints": mounts, "util_ratio": round(mean, 3),
                     "read_bytes_per_s": round(disk.read_bytes_per_s), "write_bytes_per_s": round(disk.write_bytes_per_s),
                     "await_ms": disk.await_ms},
            labels={"device": disk.name}, value=mean, threshold=cfg.util_threshold, hint=HINT,
        ))
    return findings

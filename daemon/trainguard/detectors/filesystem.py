"""Filesystem usage and inode thresholds, unresponsive mounts, missing paths."""

from __future__ import annotations

import fnmatch

from trainguard.records import Finding, FsSample, Severity
from trainguard.units import format_bytes, format_duration, format_ratio

HINT_FULL = ("free space: remove old checkpoints and caches (trainguard cleanup --dry-run shows candidates), "
             "or move output to a larger volume")
HINT_INODES = "too many small files: remove caches, temporary files or extracted datasets"
HINT_UNRESPONSIVE = ("I/O to this mount hangs; processes writing to it will stall. Check the network/FUSE "
                     "daemon; keep training logs and checkpoints on local disk and sync them in the background")


def _level(value: float, warning: float, critical: float, hysteresis: float, active: Severity | None) -> Severity | None:
    """Threshold level with hysteresis: an active alert clears `hysteresis` below its threshold."""
    crit_at = critical - hysteresis if active is Severity.CRITICAL else critical
    warn_at = warning - hysteresis if active is not None else warning
    if value >= crit_at:
        return Severity.CRITICAL
    if value >= warn_at:
        return Severity.WARNING
    return None


def ignored(cfg, mount_point: str) -> bool:
    """An override with ignore = true matches. (Not `exclude`: a mount watched despite an exclude glob is
    one holding a path the user named in `paths`, and its alerts are wanted.)"""
    return any(o.ignore and fnmatch.fnmatchcase(mount_point, o.match) for o in cfg.overrides)


def labels_for(sample: FsSample) -> dict[str, str]:
    m = sample.mount
    return {"mountpoint": m.mount_point, "fstype": m.fstype, "device": m.source}


def detect(inp) -> list[Finding]:
    cfg = inp.config.filesystems
    findings: list[Finding] = []
    for path in inp.snapshot.missing_paths:
        findings.append(Finding(
            key=f"fs.path_missing:{path}", severity=Severity.WARNING,
            summary=f"watched path {path} does not exist",
            details={"path": path}, labels={"path": path},
            hint="create it, or fix filesystems.paths in the config",
        ))
    for sample in inp.snapshot.filesystems:
        if ignored(cfg, sample.mount.mount_point):
            continue  # an override with ignore = true: the user wants no alerts for this mount
        labels = labels_for(sample)
        unreadable = _unreadable(sample, inp.now, labels)
        if unreadable is not None:
            findings.append(unreadable)
        elif sample.responsive and not sample.permission_denied and not sample.error and sample.usage is not None:
            findings.extend(_usage(sample, inp, labels))
    return findings


def _unreadable(sample: FsSample, now: float, labels: dict[str, str]) -> Finding | None:
    """A mount whose statfs hangs (critical) or fails (warning); a permission denied is said once in the
    log by the sampler, never alerted."""
    mp = sample.mount.mount_point
    if not sample.responsive:
        stuck = max(now, sample.ts) - sample.unresponsive_since if sample.unresponsive_since else 0.0
        return Finding(
            key=f"fs.unresponsive:{mp}", severity=Severity.CRITICAL,
            summary=f"{mp} ({sample.mount.fstype}) is unresponsive: statfs has not returned for {format_duration(stuck)}",
            details={"mountpoint": mp, "fstype": sample.mount.fstype, "source": sample.mount.source,
                     "kind": sample.mount.kind.value, "stuck_seconds": round(stuck, 1)},
            labels=labels, value=stuck, hint=HINT_UNRESPONSIVE,
        )
    if sample.error and not sample.permission_denied:
        return Finding(
            key=f"fs.error:{mp}", severity=Severity.WARNING,
            summary=f"{mp}: cannot read usage: {sample.error}",
            details={"mountpoint": mp, "error": sample.error}, labels=labels,
        )
    return None


def _usage(sample: FsSample, inp, labels: dict[str, str]) -> list[Finding]:
    """Space and inode thresholds of one readable mount, with hysteresis against the active alerts."""
    cfg = inp.config.filesystems
    mp, usage = sample.mount.mount_point, sample.usage
    t = cfg.thresholds_for(mp)
    findings = []
    key = f"fs.usage:{mp}"
    level = _level(usage.used_ratio, t.warning, t.critical, cfg.hysteresis, inp.active.get(key))
    if level is not None:
        threshold = t.critical if level is Severity.CRITICAL else t.warning
        findings.append(Finding(
            key=key, severity=level,
            summary=f"{mp} {format_ratio(usage.used_ratio)} full, {format_bytes(usage.avail_bytes)} free",
            details={"mountpoint": mp, "fstype": sample.mount.fstype, "used_bytes": usage.used_bytes,
                     "avail_bytes": usage.avail_bytes, "size_bytes": usage.size_bytes,
                     "used_ratio": round(usage.used_ratio, 4)},
            labels=labels, value=usage.used_ratio, threshold=threshold, for_s=cfg.for_, hint=HINT_FULL,
        ))
    inode_ratio = usage.inodes_used_ratio
    key = f"fs.inodes:{mp}"
    if inode_ratio is not None:
        level = _level(inode_ratio, t.inodes_warning, t.inodes_critical, cfg.hysteresis, inp.active.get(key))
        if level is not None:
            threshold = t.inodes_critical if level is Severity.CRITICAL else t.inodes_warning
            findings.append(Finding(
                key=key, severity=level,
                summary=f"{mp} inodes {format_ratio(inode_ratio)} used, {usage.inodes_free} free",
                details={"mountpoint": mp, "inodes_used": usage.inodes_used, "inodes_free": usage.inodes_free,
                         "inodes_total": usage.inodes_total},
                labels=labels, value=inode_ratio, threshold=threshold, for_s=cfg.for_, hint=HINT_INODES,
            ))
    return findings

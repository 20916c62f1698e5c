"""`trainguard status`: sample now, add the daemon's history if there is one, report.

The JSON document is a stable interface (documented in the README); the table is
for people and may change.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any, Sequence

from trainguard import alerts, config as configmod, state
from trainguard.clock import Clock, SystemClock
from trainguard.detectors import DetectorInput, evaluate
from trainguard.detectors.forecast import fill_trend
from trainguard.history import History
from trainguard.records import Finding, FsSample, Severity, Snapshot
from trainguard.service import Samplers, series_of
from trainguard.units import format_bytes, format_duration, format_ratio

SCHEMA_VERSION = 1
DISK_SAMPLE_GAP = 0.5  # seconds between the two diskstats readings a rate needs


def _iso(ts: float | None) -> str | None:
    return None if ts is None else dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds")


def finding_doc(f: Finding) -> dict[str, Any]:
    return {"key": f.key, "severity": f.severity.value, "summary": f.summary, "details": dict(f.details),
            "labels": dict(f.labels), "value": f.value, "threshold": f.threshold, "hint": f.hint}


def _mount_state(sample: FsSample, findings: Sequence[Finding]) -> str:
    if not sample.responsive:
        return "unresponsive"
    mine = [f for f in findings if f.labels.get("mountpoint") == sample.mount.mount_point]
    if any(f.severity is Severity.CRITICAL for f in mine):
        return "critical"
    if any(f.severity is Severity.WARNING for f in mine):
        return "warning"
    return "ok"


def filesystem_doc(sample: FsSample, snapshot: Snapshot, history: History, cfg: configmod.Config,
                   findings: Sequence[Finding], now: float) -> dict[str, Any]:
    m, u = sample.mount, sample.usage
    disk = snapshot.disk_for(m)
    trend = None
    if u is not None and sample.responsive and u.size_bytes > 0:
        points = history.points(f"fs.avail_bytes:{m.mount_point}", now - cfg.forecast.window)
        trend = fill_trend(points, u.size_bytes, now, cfg.forecast.window, cfg.forecast.min_span)
    return {
        "mountpoint": m.mount_point, "fstype": m.fstype, "device": m.source, "kind": m.kind.value,
        "size_bytes": u.size_bytes if u else None, "used_bytes": u.used_bytes if u else None,
        "avail_bytes": u.avail_bytes if u else None, "used_ratio": round(u.used_ratio, 4) if u else None,
        "inodes_total": u.inodes_total if u else None, "inodes_used": u.inodes_used if u else None,
        "inodes_free": u.inodes_free if u else None,
        "inodes_used_ratio": round(u.inodes_used_ratio, 4) if u and u.inodes_used_ratio is not None else None,
        "io_device": disk.name if disk else None,
        "io_util_ratio": round(disk.util_ratio, 4) if disk else None,
        "read_bytes_per_s": round(disk.read_bytes_per_s) if disk else None,
        "write_bytes_per_s": round(disk.write_bytes_per_s) if disk else None,
        "await_ms": disk.await_ms if disk else None,
        "fill_bytes_per_s": round(trend.slope, 1) if trend else None,
        "eta_seconds": round(trend.eta) if trend and trend.eta is not None else None,
        "state": _mount_state(sample, findings),
        "responsive": sample.responsive,
        "unresponsive_seconds": round(now - sample.unresponsive_since, 1) if sample.unresponsive_since else None,
        "error": sample.error,
    }


def build(cfg: configmod.Config, *, state_dir: str | None = None, clock: Clock | None = None) -> dict[str, Any]:
    clock = clock or SystemClock()
    state_dir = state_dir or cfg.general.state_dir
    conn = state.read_only(state_dir)
    if conn is None and state_dir == cfg.general.state_dir:
        conn = state.read_only(state.fallback_state_dir())
    now = clock.time()
    history = History.from_config(None, cfg, now)
    alert_states: list[alerts.AlertState] = []
    if conn is not None:
        history.load(conn, now)
        alert_states = alerts.load_states(conn)
    samplers = Samplers.from_config(cfg, clock)
    samplers.fs.wait = cfg.filesystems.probe_timeout  # a one-off may wait for slow mounts, up to the timeout
    samplers.disks.sample()
    time.sleep(DISK_SAMPLE_GAP)
    now = clock.time()
    snapshot = samplers.sample(now)
    history.record(now, series_of(snapshot))
    active = {s.key: s.severity for s in alert_states}
    findings = evaluate(DetectorInput(cfg, history, snapshot, now, active))
    doc: dict[str, Any] = {
        "version": SCHEMA_VERSION,
        "host": cfg.general.host,
        "generated_at": _iso(now),
        "daemon_state": conn is not None,
        "filesystems": [filesystem_doc(s, snapshot, history, cfg, findings, now) for s in snapshot.filesystems],
        "missing_paths": list(snapshot.missing_paths),
        "findings": [finding_doc(f) for f in sorted(findings, key=lambda f: (-f.severity.rank, f.key))],
        "alerts": [
            {"key": s.key, "state": s.state, "severity": s.severity.value, "summary": s.finding.summary,
             "pending_since": _iso(s.pending_since), "firing_since": _iso(s.firing_since)}
            for s in sorted(alert_states, key=lambda s: s.key)
        ],
    }
    if conn is not None:
        conn.close()
    return doc


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def render(doc: dict[str, Any]) -> str:
    rows = [["MOUNT", "FSTYPE", "DEVICE", "SIZE", "USED", "INODES", "IO", "ETA FULL", "STATE"]]
    for fs in doc["filesystems"]:
        rows.append([
            fs["mountpoint"], fs["fstype"], fs["device"], format_bytes(fs["size_bytes"]),
            format_ratio(fs["used_ratio"]), format_ratio(fs["inodes_used_ratio"]), format_ratio(fs["io_util_ratio"]),
            format_duration(fs["eta_seconds"]),
            fs["state"] if fs["state"] != "unresponsive" else f"unresponsive {format_duration(fs['unresponsive_seconds'])}",
        ])
    out = [f"trainguard on {doc['host']} at {doc['generated_at']}"
           + ("" if doc["daemon_state"] else " (no daemon history: trends need `trainguard run`)"), "", _table(rows)]
    out.append("")
    if doc["findings"]:
        out.append("Findings:")
        out.extend(f"  [{f['severity'].upper()}] {f['summary']}" for f in doc["findings"])
    else:
        out.append("Findings: none")
    firing = [a for a in doc["alerts"] if a["state"] == "firing"]
    if firing:
        out.append("Alerts firing (daemon):")
        out.extend(f"  [{a['severity'].upper()}] {a['summary']} since {a['firing_since']}" for a in firing)
    return "\n".join(out)

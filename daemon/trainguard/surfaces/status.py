"""`trainguard status`: sample now, add the daemon's history if there is one, report.

The JSON document is a stable interface (documented in docs/status-json.md); the table is
for people and may change.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from typing import Any, Sequence

from trainguard import config as configmod
from trainguard.actions.cleanup.engine.compiled import loop_doc
from trainguard.actions.cleanup.record.audit import read_freed
from trainguard.alerts import lifecycle as alerts
from trainguard.clock import Clock, SystemClock
from trainguard.detectors import DetectorInput, evaluate
from trainguard.detectors.follow import seeded
from trainguard.detectors.series import series_of
from trainguard.diagnosis.stall import StallDiagnoser
from trainguard.records import Finding, FsSample, GpuSample, Severity, Snapshot
from trainguard.sources.diskstats import DiskstatsSampler
from trainguard.sources.run_end import END_HOLD
from trainguard.sources.samplers import Samplers
from trainguard.store import cycles, heartbeat, progress, state
from trainguard.store.history import History
from trainguard.store.progress import Cadence
from trainguard.surfaces.readings import RunProgress, run_progress
from trainguard.units import format_iso_utc

SCHEMA_VERSION = 1


def finding_doc(f: Finding) -> dict[str, Any]:
    return {"key": f.key, "severity": f.severity.value, "summary": f.summary, "details": dict(f.details),
            "labels": dict(f.labels), "value": f.value, "threshold": f.threshold, "hint": f.hint}


def _severity_state(findings: Sequence[Finding]) -> str:
    """"critical", "warning" or "ok": the worst of an object's findings."""
    if any(f.severity is Severity.CRITICAL for f in findings):
        return "critical"
    if any(f.severity is Severity.WARNING for f in findings):
        return "warning"
    return "ok"


def _mount_state(sample: FsSample, findings: Sequence[Finding]) -> str:
    if not sample.responsive:
        return "unresponsive"
    return _severity_state([f for f in findings if f.labels.get("mountpoint") == sample.mount.mount_point])


HISTORY_SPAN = 24 * 3600.0  # the use history `status` shows per mount ...
HISTORY_STEPS = 48  # ... in this many steps (30 min each)


USED_SQL = """
SELECT s.name, CAST((x.ts - ?1) / ?2 AS INTEGER) AS step, AVG(x.value)
FROM (SELECT series_id, ts, value FROM samples WHERE ts >= ?1
      UNION ALL SELECT series_id, ts, value FROM rollups WHERE ts >= ?1) AS x
JOIN series AS s ON s.id = x.series_id
WHERE s.name LIKE 'fs.used_ratio:%' GROUP BY s.name, step
"""


def used_history(conn: sqlite3.Connection | None, now: float) -> dict[str, list[float | None]]:
    """Each mount's used ratio over the last 24 h from the daemon's database, one mean per step,
    oldest first; None for a step without a sample. (Read from the database: the daemon keeps only
    the forecast window in memory.)"""
    if conn is None:
        return {}
    step = HISTORY_SPAN / HISTORY_STEPS
    out: dict[str, list[float | None]] = {}
    try:
        rows = conn.execute(USED_SQL, (now - HISTORY_SPAN, step)).fetchall()
    except sqlite3.OperationalError:  # a database without history tables
        return {}
    for name, index, value in rows:
        if 0 <= index < HISTORY_STEPS:
            out.setdefault(name.split(":", 1)[1], [None] * HISTORY_STEPS)[index] = round(value, 4)
    return out


def filesystem_doc(sample: FsSample, inp: DetectorInput, findings: Sequence[Finding],
                   used: dict[str, list[float | None]] | None = None) -> dict[str, Any]:
    m, u = sample.mount, sample.usage
    disk = inp.snapshot.disk_for(m)
    trend = inp.trend(sample)
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
        "forecast_learning": bool(trend and trend.learning),
        "state": _mount_state(sample, findings),
        "responsive": sample.responsive,
        "unresponsive_seconds": (round(max(inp.now, sample.ts) - sample.unresponsive_since, 1)
                                 if sample.unresponsive_since else None),
        "error": sample.error,
        "used_ratio_24h": (used or {}).get(m.mount_point, [None] * HISTORY_STEPS),
    }


def gpu_doc(g: GpuSample, findings: Sequence[Finding]) -> dict[str, Any]:
    mine = [f for f in findings if f.labels.get("gpu") == str(g.index)]
    stall = next((f for f in mine if f.kind == "gpu.stall"), None)
    state = "lost" if g.lost else "stalled" if stall else _severity_state(mine)
    return {
        "index": g.index, "uuid": g.uuid, "name": g.name, "state": state,
        "util_ratio": round(g.util_ratio, 4) if g.util_ratio is not None else None,
        "util_max_ratio": round(g.util_max_ratio, 4) if g.util_max_ratio is not None else None,
        "memory_used_bytes": g.memory_used_bytes, "memory_total_bytes": g.memory_total_bytes,
        "temperature_c": g.temperature_c, "power_w": g.power_w, "power_limit_w": g.power_limit_w,
        "throttle_reasons": g.throttle_reasons,
        "processes": [{"host_pid": p.host_pid, "pid": p.pid, "ns_pid": p.ns_pid, "name": p.name, "state": p.state,
                       "used_memory_bytes": p.used_memory_bytes, "note": p.note} for p in g.processes],
        "ecc_uncorrected": g.ecc_uncorrected, "retired_pages": g.retired_pages,
        "errors": dict(g.errors),
        "diagnosis": stall.details.get("diagnosis") if stall else None,
        "verdict": stall.details.get("verdict") if stall else None,
    }


def gpu_status_doc(snapshot: Snapshot) -> dict[str, Any] | None:
    st = snapshot.gpu_status
    if st is None:
        return None
    return {"state": st.state.value, "message": st.message, "since": format_iso_utc(st.since),
            "next_retry": format_iso_utc(st.next_retry), "driver_version": st.driver_version,
            "device_count": st.device_count, "lost": list(st.lost)}


def alert_doc(s: alerts.AlertState) -> dict[str, Any]:
    return {"key": s.key, "state": s.state, "severity": s.severity.value, "summary": s.finding.summary,
            "pending_since": format_iso_utc(s.pending_since), "firing_since": format_iso_utc(s.firing_since)}


def page_doc(cfg: configmod.Config, state_dir: str, snapshot: Snapshot | None, fill_eta: dict[str, float],
             now: float) -> dict[str, Any]:
    """What the daemon's /status page draws: the last cycle's mounts, their 24 h of use and forecast,
    and the alerts, from a read-only connection of its own (safe from the HTTP thread)."""
    conn = state.read_only(state_dir)
    try:
        used = used_history(conn, now)
        alert_states = alerts.load_states(conn) if conn is not None else []
    finally:
        if conn is not None:
            conn.close()
    mounts = []
    for s in snapshot.filesystems if snapshot else ():
        mp, u = s.mount.mount_point, s.usage
        mounts.append({"mountpoint": mp, "used_ratio": round(u.used_ratio, 4) if u else None,
                       "avail_bytes": u.avail_bytes if u else None, "eta_seconds": fill_eta.get(mp),
                       "used_ratio_24h": used.get(mp, [None] * HISTORY_STEPS)})
    return {"host": cfg.general.host, "generated_ts": now, "history_step_seconds": HISTORY_SPAN / HISTORY_STEPS,
            "thresholds": {m["mountpoint"]: _thresholds(cfg, m["mountpoint"]) for m in mounts},
            "filesystems": mounts, "alerts": [alert_doc(a) for a in alert_states]}


def _thresholds(cfg: configmod.Config, mount_point: str) -> dict[str, float]:
    t = cfg.filesystems.thresholds_for(mount_point)
    return {"warning": t.warning, "critical": t.critical}


def _detector_input(cfg: configmod.Config, conn: sqlite3.Connection | None, history: History, snapshot: Snapshot,
                    now: float, active: dict) -> DetectorInput:
    """What the detectors read, with what the daemon learned, counted on here as the daemon does: the
    cleanup rhythms of the filesystem each mount shows now, and each run's cadence."""
    learned = cycles.same_filesystem(cycles.read_learned(conn, now), snapshot.filesystems) if conn is not None else {}
    return DetectorInput(cfg, history, snapshot, now, active, fits={mp: seeded(rows) for mp, rows in learned.items()},
                         progress=run_cadences(conn, snapshot, now))


def build(cfg: configmod.Config, *, state_dir: str | None = None, clock: Clock | None = None,
          nvml: Any = None, disks: DiskstatsSampler | None = None) -> dict[str, Any]:
    """Sample now and report. I/O rates need two diskstats readings: `disks` is a sampler the caller
    read once already (before its imports); without one the first reading is taken here, before the
    state is loaded and the mounts probed. The work in between is the window; nothing sleeps for it."""
    clock = clock or SystemClock()
    if disks is None:
        disks = DiskstatsSampler(clock=clock, proc_root=cfg.general.proc_root)
        disks.sample()
    state_dir = state_dir or cfg.general.state_dir
    conn = state.read_only(state_dir)
    if conn is None and state_dir == cfg.general.state_dir and state.read_only(state.fallback_state_dir()):
        state_dir = state.fallback_state_dir()  # where a daemon without access to the configured dir writes
        conn = state.read_only(state_dir)
    now = clock.time()
    daemon = daemon_doc(heartbeat.read(state_dir, conn), state_dir, now)
    history = History.from_config(None, cfg, now)
    alert_states: list[alerts.AlertState] = []
    if conn is not None:
        history.load(conn, now)
        alert_states = alerts.load_states(conn)
    samplers = Samplers.from_config(cfg, clock, nvml=nvml)
    samplers.fs.wait = cfg.filesystems.probe_timeout  # a one-off may wait for slow mounts, up to the timeout
    samplers.disks = disks
    now = clock.time()
    snapshot = with_mirrors(samplers.sample(now), cfg, conn)
    history.record(now, series_of(snapshot))
    active = {s.key: s.severity for s in alert_states}
    used = used_history(conn, now)
    inp = _detector_input(cfg, conn, history, snapshot, now, active)
    findings = evaluate(inp)
    diagnoser = StallDiagnoser(cfg.general.proc_root, py_spy=cfg.gpu.py_spy, clock=clock.time)
    findings = diagnoser.enrich(findings, snapshot, now)  # waits at most the diagnosis deadline
    diagnoser.close()  # a py-spy still running is not left behind
    samplers.close()
    doc: dict[str, Any] = {
        "version": SCHEMA_VERSION,
        "host": cfg.general.host,
        "generated_at": format_iso_utc(now),
        "generated_ts": now,
        "history_step_seconds": HISTORY_SPAN / HISTORY_STEPS,
        "thresholds": {fs.mount.mount_point: _thresholds(cfg, fs.mount.mount_point) for fs in snapshot.filesystems},
        "daemon_state": conn is not None,
        "daemon": daemon,
        "filesystems": [filesystem_doc(s, inp, findings, used) for s in snapshot.filesystems],
        "missing_paths": list(snapshot.missing_paths),
        "gpu_status": gpu_status_doc(snapshot),
        "gpus": [gpu_doc(g, findings) for g in snapshot.gpus],
        "findings": [finding_doc(f) for f in sorted(findings, key=lambda f: (-f.severity.rank, f.key))],
        "alerts": [alert_doc(s) for s in sorted(alert_states, key=lambda s: s.key)],
    }
    doc["cleanup"] = cleanup_doc(conn, now)
    doc["cleanup_loop"] = loop_doc()
    doc["outbox"] = outbox_doc(conn, cfg, now)
    doc["mirrors"], doc["runs"] = mirrors_doc(snapshot, cfg, now), runs_doc(inp, findings)
    if conn is not None:
        conn.close()
    return doc


def run_cadences(conn: sqlite3.Connection | None, snapshot: Snapshot, now: float) -> dict[str, Cadence]:
    """Each run's cadence as the daemon saved it, with this sample's marks against its last ones."""
    saved = progress.read(conn, now) if conn is not None else {}
    gpus = {g.index: g for g in snapshot.gpus}
    # max_step 0: a one-off sample learns no gap, it only says whether the marks moved since the daemon's.
    out = {r.run_id: progress.advance(saved.get(r.run_id), r, gpus, now, max_step=0.0) for r in snapshot.runs}
    # The runs the daemon saw end within the hour, and how: shown as ended rather than gone.
    out.update({k: c for k, c in saved.items()
                if k not in out and c.ended_ts is not None and now - c.ended_ts < END_HOLD})
    return out


def runs_doc(inp: DetectorInput, findings: Sequence[Finding]) -> list[dict[str, Any]]:
    hung = [f.details.get("run") for f in findings if f.kind == "train.hang"]
    runs = run_progress(inp.snapshot.runs, inp.progress, inp.config.progress, inp.now, hung)
    live = {r.run_id for r in inp.snapshot.runs}
    ended = sorted((c for c in inp.progress.values() if c.run_id not in live and c.ended_ts is not None),
                   key=lambda c: -(c.ended_ts or 0.0))
    return [run_doc(r, inp.now) for r in runs] + [ended_doc(c) for c in ended]


def run_doc(r: RunProgress, now: float) -> dict[str, Any]:
    return {"run": r.run, "train_job": r.job, "verdict": r.verdict, "timeout_s": round(r.timeout_s, 1),
            "normal_gap_s": round(r.normal_gap_s, 1), "last_progress_at": format_iso_utc(r.since),
            "silent_for_s": round(now - r.since, 1), "owner": dict(r.owner),
            "ranks": [{"rank": rank, "pid": pid, "last_progress_at": format_iso_utc(ts)} for rank, pid, ts in r.ranks],
            "ended_at": None, "how": None, "error": None}


def ended_doc(c: Cadence) -> dict[str, Any]:
    """A run that ended within the hour: how (finished, error, killed, unknown) and its error line."""
    return {"run": c.name, "train_job": c.name, "verdict": "ended", "timeout_s": None,
            "normal_gap_s": round(c.normal_gap(), 1), "last_progress_at": format_iso_utc(c.last_progress or c.first_seen),
            "silent_for_s": None, "owner": {},
            "ranks": [{"rank": None, "pid": m.pid, "last_progress_at": format_iso_utc(m.last_progress)} for m in c.ranks],
            "ended_at": format_iso_utc(c.ended_ts), "how": c.how or "unknown", "error": c.error}


def cleanup_doc(conn: sqlite3.Connection | None, now: float) -> list[dict[str, Any]]:
    """What each cleanup policy freed, from its audit log."""
    return [
        {"policy": f.policy, "freed_bytes_24h": f.bytes_24h, "freed_files_24h": f.files_24h,
         "freed_bytes_total": f.bytes_total, "freed_files_total": f.files_total, "last_run": format_iso_utc(f.last_run)}
        for f in (read_freed(conn, now) if conn is not None else [])
    ]


def daemon_doc(info: heartbeat.DaemonInfo, state_dir: str, now: float) -> dict[str, Any]:
    """Whether a daemon runs on this state directory (its lock), its PID and how old its last cycle is."""
    return {"running": info.running, "pid": info.pid, "state_dir": state_dir,
            "last_cycle_at": format_iso_utc(info.last_cycle),
            "last_cycle_age_seconds": round(now - info.last_cycle, 1) if info.last_cycle is not None else None,
            "status": info.status}


def outbox_doc(conn, cfg: configmod.Config, now: float) -> dict[str, Any]:
    """Undelivered and recently delivered alerts, per notify target (times as ISO, no URLs)."""
    from trainguard.notify.outbox import summary

    s = summary(conn, now)
    configured = [t.name for t in cfg.notify.targets]
    per_target = {**{n: summary_target_zero() for n in configured}, **s["targets"]}
    targets = [{"name": name, "configured": name in configured, **{k: v for k, v in t.items() if k != "next_try"},
                "next_try_at": format_iso_utc(t["next_try"])} for name, t in sorted(per_target.items())]
    return {
        "pending": s["pending"], "failed_24h": s["failed_24h"], "delivered_24h": s["delivered_24h"],
        "dropped": s["dropped"],
        "retrying": [{"target": r["target"], "alerts": r["alerts"], "attempts": r["attempts"],
                      "next_try_at": format_iso_utc(r["next_try"]), "oldest_at": format_iso_utc(r["oldest"]),
                      "last_error": r["last_error"]} for r in s["retrying"]],
        "targets": targets,
    }


def with_mirrors(snapshot: Snapshot, cfg: configmod.Config, conn) -> Snapshot:
    """The mirrors' states as the daemon last stored them, so mirror.lag is evaluated here too."""
    names = [m.name for m in cfg.mirror if m.enabled]
    if conn is None or not names:
        return snapshot
    from trainguard.actions.mirror.record import read_states

    return replace(snapshot, mirrors=tuple(read_states(conn, names)))


def mirrors_doc(snapshot: Snapshot, cfg: configmod.Config, now: float) -> list[dict[str, Any]]:
    states = {s.name: s for s in snapshot.mirrors}
    out = []
    for m in (m for m in cfg.mirror if m.enabled):
        s = states.get(m.name)
        out.append({
            "name": m.name, "source": m.source, "dest": m.dest, "ran": s is not None,
            "lag_seconds": round(s.lag(now), 1) if s else None,
            "pending_files": s.pending_files if s else None, "pending_bytes": s.pending_bytes if s else None,
            "bytes_total": s.bytes_total if s else 0, "errors_total": s.errors_total if s else 0,
            "last_ok": format_iso_utc(s.last_ok) if s else None, "reason": s.reason if s else "",
            "stuck_copier": ({"pid": s.stuck_pid, "op": s.stuck_op, "path": s.stuck_path,
                              "since": format_iso_utc(s.stuck_since) if s.stuck_since else None}
                             if s and s.stuck_pid is not None else None),
        })
    return out


def summary_target_zero() -> dict[str, Any]:
    return {"pending": 0, "retrying": 0, "failed_24h": 0, "delivered_24h": 0, "next_try": None}


def render(doc: dict[str, Any], lang: str = "en") -> str:
    """The table for people (surfaces/status_text.py), in the [notify] language."""
    from trainguard.surfaces.status_text import render_text

    return render_text(doc, lang)

"""`trainguard status`: sample now, add the daemon's history if there is one, report.

The JSON document is a stable interface (documented in the README); the table is
for people and may change.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from trainguard import config as configmod
from trainguard.actions.audit import read_freed
from trainguard.alerts import lifecycle as alerts
from trainguard.clock import Clock, SystemClock
from trainguard.detectors import DetectorInput, evaluate
from trainguard.detectors.series import series_of
from trainguard.diagnosis.stall import StallDiagnoser
from trainguard.records import Finding, FsSample, GpuSample, Severity, Snapshot
from trainguard.sources.samplers import Samplers
from trainguard.store import state
from trainguard.store.history import History
from trainguard.units import format_bytes, format_duration, format_iso_utc, format_ratio

SCHEMA_VERSION = 1
DISK_SAMPLE_GAP = 0.5  # seconds between the two diskstats readings a rate needs


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


def filesystem_doc(sample: FsSample, inp: DetectorInput, findings: Sequence[Finding]) -> dict[str, Any]:
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
        "state": _mount_state(sample, findings),
        "responsive": sample.responsive,
        "unresponsive_seconds": (round(max(inp.now, sample.ts) - sample.unresponsive_since, 1)
                                 if sample.unresponsive_since else None),
        "error": sample.error,
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


def build(cfg: configmod.Config, *, state_dir: str | None = None, clock: Clock | None = None,
          nvml: Any = None) -> dict[str, Any]:
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
    samplers = Samplers.from_config(cfg, clock, nvml=nvml)
    samplers.fs.wait = cfg.filesystems.probe_timeout  # a one-off may wait for slow mounts, up to the timeout
    samplers.disks.sample()
    time.sleep(DISK_SAMPLE_GAP)
    now = clock.time()
    snapshot = samplers.sample(now)
    history.record(now, series_of(snapshot))
    active = {s.key: s.severity for s in alert_states}
    inp = DetectorInput(cfg, history, snapshot, now, active)
    findings = evaluate(inp)
    diagnoser = StallDiagnoser(cfg.general.proc_root, py_spy=cfg.gpu.py_spy, clock=clock.time)
    findings = diagnoser.enrich(findings, snapshot, now)  # waits at most the diagnosis deadline
    diagnoser.close()  # a py-spy still running is not left behind
    samplers.close()
    doc: dict[str, Any] = {
        "version": SCHEMA_VERSION,
        "host": cfg.general.host,
        "generated_at": format_iso_utc(now),
        "daemon_state": conn is not None,
        "filesystems": [filesystem_doc(s, inp, findings) for s in snapshot.filesystems],
        "missing_paths": list(snapshot.missing_paths),
        "gpu_status": gpu_status_doc(snapshot),
        "gpus": [gpu_doc(g, findings) for g in snapshot.gpus],
        "findings": [finding_doc(f) for f in sorted(findings, key=lambda f: (-f.severity.rank, f.key))],
        "alerts": [
            {"key": s.key, "state": s.state, "severity": s.severity.value, "summary": s.finding.summary,
             "pending_since": format_iso_utc(s.pending_since), "firing_since": format_iso_utc(s.firing_since)}
            for s in sorted(alert_states, key=lambda s: s.key)
        ],
    }
    doc["cleanup"] = [
        {"policy": f.policy, "freed_bytes_24h": f.bytes_24h, "freed_files_24h": f.files_24h,
         "freed_bytes_total": f.bytes_total, "freed_files_total": f.files_total, "last_run": format_iso_utc(f.last_run)}
        for f in (read_freed(conn, now) if conn is not None else [])
    ]
    doc["outbox"] = outbox_doc(conn, cfg, now)
    if conn is not None:
        conn.close()
    return doc


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


def summary_target_zero() -> dict[str, Any]:
    return {"pending": 0, "retrying": 0, "failed_24h": 0, "delivered_24h": 0, "next_try": None}


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
    gst = doc.get("gpu_status")
    if doc.get("gpus"):
        grows = [["GPU", "NAME", "UTIL", "VRAM", "TEMP", "POWER", "PROCS", "STATE"]]
        for g in doc["gpus"]:
            vram = (f"{format_bytes(g['memory_used_bytes'])}/{format_bytes(g['memory_total_bytes'])}"
                    if g["memory_total_bytes"] else "-")
            grows.append([str(g["index"]), g["name"], format_ratio(g["util_ratio"]), vram,
                          f"{g['temperature_c']:.0f}C" if g["temperature_c"] is not None else "-",
                          f"{g['power_w']:.0f}W" if g["power_w"] is not None else "-",
                          str(len(g["processes"])), g["state"]])
        out += ["", _table(grows)]
        for g in doc["gpus"]:
            if g["verdict"]:
                out.append(f"  GPU {g['index']} stall: {g['verdict']}")
    if gst and gst["state"] not in ("ok",):
        out += ["", f"GPU: {gst['message'] or gst['state']}"]
    out.append("")
    if doc["findings"]:
        out.append("Findings:")
        out.extend(f"  [{f['severity'].upper()}] {f['summary']}" for f in doc["findings"])
    else:
        out.append("Findings: none")
    if doc.get("cleanup"):
        out.append("Cleanup freed (last 24h / total):")
        out.extend(f"  {c['policy']}: {format_bytes(c['freed_bytes_24h'])} / {format_bytes(c['freed_bytes_total'])}"
                   f" ({c['freed_files_total']} files, last run {c['last_run']})" for c in doc["cleanup"])
    firing = [a for a in doc["alerts"] if a["state"] == "firing"]
    if firing:
        out.append("Alerts firing (daemon):")
        out.extend(f"  [{a['severity'].upper()}] {a['summary']} since {a['firing_since']}" for a in firing)
    box = doc.get("outbox")
    if box and (box["targets"] or box["pending"] or box["dropped"]):
        out += ["", f"Notifications: {box['pending']} pending, {len(box['retrying'])} target(s) retrying, "
                    f"{box['failed_24h']} failed and {box['delivered_24h']} delivered in the last 24 h"
                    + (f", {box['dropped']} dropped (outbox full)" if box["dropped"] else "")]
        rows = [["TARGET", "PENDING", "RETRYING", "NEXT TRY", "FAILED 24H", "DELIVERED 24H"]]
        for t in box["targets"]:
            rows.append([t["name"] + ("" if t["configured"] else " (removed)"), str(t["pending"]),
                         str(t["retrying"]), t["next_try_at"] or "-", str(t["failed_24h"]), str(t["delivered_24h"])])
        out.append(_table(rows))
        for r in box["retrying"]:
            out.append(f"  {r['target']}: attempt {r['attempts']} failed: {r['last_error']}")
    return "\n".join(out)

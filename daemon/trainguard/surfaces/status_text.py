"""`trainguard status` for people: tables, each mount's last 24 h as a sparkline, the forecast,
findings and alerts, in the [notify] language. (The JSON document is the stable interface.)"""

from __future__ import annotations

import datetime as dt
from typing import Any, Sequence

from trainguard.actions.cleanup.engine.compiled import loop_line
from trainguard.i18n import N_, Gettext, format_when, tr
from trainguard.notify.messages import SEVERITY_WORDS
from trainguard.notify.texts import Texts, texts_for
from trainguard.records import Finding, Severity
from trainguard.units import format_bytes, format_duration, format_ratio

BLOCKS = "▁▂▃▄▅▆▇█"
MIN_SPAN = 0.05  # a sparkline spans at least 5 points of use, so noise does not look like a cliff


def sparkline(values: Sequence[float | None], width: int = 24) -> str:
    """Use over time in unicode blocks, oldest left; a space where there was no sample. The scale runs
    from the window's lowest to its highest use (at least MIN_SPAN wide)."""
    if not values:
        return ""
    per = max(len(values) // width, 1)
    cells = [next((v for v in reversed(values[i:i + per]) if v is not None), None)
             for i in range(0, len(values), per)][-width:]
    known = [v for v in cells if v is not None]
    if not known:
        return " " * len(cells)
    low, high = min(known), max(known)
    if high - low < MIN_SPAN:  # nearly flat: drawn in the middle of a MIN_SPAN band
        low = (low + high - MIN_SPAN) / 2
        high = low + MIN_SPAN
    top = len(BLOCKS) - 1
    return "".join(" " if v is None else BLOCKS[round((v - low) / (high - low) * top)] for v in cells)


def _range(values: Sequence[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    low, high = min(known), max(known)
    return f"{low * 100:.0f}–{high * 100:.0f}%"


def _table(rows: list[list[str]]) -> str:
    widths = [max(_width(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c + " " * (w - _width(c)) for c, w in zip(r, widths)).rstrip() for r in rows)


def _width(text: str) -> int:
    """Terminal columns: CJK characters take two."""
    return sum(2 if "\u2e80" <= ch <= "\uffef" and ch not in BLOCKS else 1 for ch in text)


STATES = {"ok": N_("ok"), "warning": N_("warning"), "critical": N_("critical"),
          "unresponsive": N_("unresponsive"), "stalled": N_("stalled"), "lost": N_("lost")}


def _state(word: str, _: Gettext) -> str:
    return _(STATES[word]) if word in STATES else word


def _mounts(doc: dict[str, Any], _: Gettext) -> list[str]:
    rows = [[_("MOUNT"), _("FSTYPE"), _("DEVICE"), _("SIZE"), _("USED"), _("LAST 24H"), _("24H RANGE"), _("INODES"), _("IO"),
             _("ETA FULL"), _("STATE")]]
    for fs in doc["filesystems"]:
        state = _state(fs["state"], _)
        if fs["state"] == "unresponsive":
            state = f"{state} {format_duration(fs['unresponsive_seconds'])}"
        history = fs.get("used_ratio_24h") or []
        rows.append([
            fs["mountpoint"], fs["fstype"], fs["device"], format_bytes(fs["size_bytes"]), format_ratio(fs["used_ratio"]),
            sparkline(history) or "-", _range(history), format_ratio(fs["inodes_used_ratio"]),
            format_ratio(fs["io_util_ratio"]), _eta(fs, _), state,
        ])
    return [_table(rows)]


def _eta(fs: dict[str, Any], _: Gettext) -> str:
    """Time to full; while the history covers less than a forecast window, that the forecast is learning."""
    if not fs.get("forecast_learning"):
        return format_duration(fs["eta_seconds"])
    if fs["eta_seconds"] is None:
        return _("learning")
    return _("{eta} (learning)").format(eta=format_duration(fs["eta_seconds"]))


def _gpus(doc: dict[str, Any], _: Gettext) -> list[str]:
    out: list[str] = []
    if doc.get("gpus"):
        rows = [[_("GPU"), _("NAME"), _("UTIL"), _("VRAM"), _("TEMP"), _("POWER"), _("PROCS"), _("STATE")]]
        for g in doc["gpus"]:
            vram = (f"{format_bytes(g['memory_used_bytes'])}/{format_bytes(g['memory_total_bytes'])}"
                    if g["memory_total_bytes"] else "-")
            rows.append([str(g["index"]), g["name"], format_ratio(g["util_ratio"]), vram,
                         f"{g['temperature_c']:.0f} °C" if g["temperature_c"] is not None else "-",
                         f"{g['power_w']:.0f} W" if g["power_w"] is not None else "-",
                         str(len(g["processes"])), _state(g["state"], _)])
        out += ["", _table(rows)]
        out += [_("  GPU {gpu} stall: {verdict}").format(gpu=g["index"], verdict=_verdict(g, _))
                for g in doc["gpus"] if g["verdict"]]
    gst = doc.get("gpu_status")
    if gst and gst["state"] not in ("ok",):
        out += ["", _("GPU: {message}").format(message=_(gst["message"]) if gst["message"] else gst["state"])]
    return out


RUN_VERDICTS = {"progressing": N_("progressing"), "starting": N_("starting"), "silent": N_("silent"),
                "hung": N_("hung")}
RUN_ENDINGS = {"finished": N_("ended: finished, no error in its output"), "error": N_("ended: exited with an error"),
               "killed": N_("ended: killed"), "unknown": N_("ended")}


def _runs(doc: dict[str, Any], _: Gettext) -> list[str]:
    """Each training run: its ranks, when it last progressed, its normal gap, timeout and verdict; a run
    that ended within the hour says how, and the line of its output that says so."""
    if not doc.get("runs"):
        return []
    rows = [[_("RUN"), _("RANKS"), _("LAST PROGRESS"), _("NORMAL GAP"), _("TIMEOUT"), _("VERDICT")]]
    errors = []
    for r in doc["runs"]:
        ranks = ",".join(str(k["rank"]) for k in r["ranks"] if k["rank"] is not None) or str(len(r["ranks"]))
        gap = format_duration(r["normal_gap_s"]) if r["normal_gap_s"] else "-"
        if r["verdict"] == "ended":
            age = doc["generated_ts"] - dt.datetime.fromisoformat(r["last_progress_at"]).timestamp()
            rows.append([r["run"], ranks, _("{age} ago").format(age=format_duration(age)), gap, "-",
                         _(RUN_ENDINGS.get(r["how"], RUN_ENDINGS["unknown"]))])
            if r["error"]:
                errors.append(f"  {r['run']}: {r['error']}")
            continue
        rows.append([r["run"], ranks, _("{age} ago").format(age=format_duration(r["silent_for_s"])), gap,
                     format_duration(r["timeout_s"]), _(RUN_VERDICTS.get(r["verdict"], r["verdict"]))])
    return ["", _table(rows), *errors]


def _verdict(g: dict[str, Any], _: Gettext) -> str:
    """The stall verdict said from the diagnosis facts in the reader's language (the English line without them)."""
    facts = (g.get("diagnosis") or {}).get("facts")
    if not facts:
        return g["verdict"]
    from trainguard.diagnosis.words import verdict_text

    return verdict_text(facts, _)


def _what(f: dict[str, Any], _: Gettext) -> Texts:
    """A finding of the status document as the person reads it in their language (notify/texts.py)."""
    return texts_for(Finding(f["key"], Severity(f["severity"]), f["summary"], details=f["details"],
                             labels=f["labels"], value=f["value"], threshold=f["threshold"], hint=f["hint"] or ""), _)


def _findings(doc: dict[str, Any], _: Gettext, lang: str) -> list[str]:
    if not doc["findings"]:
        return [_("Findings: none")]
    out = [_("Findings:")]
    for f in doc["findings"]:
        t = _what(f, _)
        out.append(f"  [{_(SEVERITY_WORDS[f['severity']])}] {t.what}")
        if t.step:
            out.append("      " + _("Next step:") + ("" if lang == "zh" else " ") + t.step)
    return out


def _outbox(box: dict[str, Any] | None, _: Gettext) -> list[str]:
    if not box or not (box["targets"] or box["pending"] or box["dropped"]):
        return []
    line = _("Notifications: {pending} pending, {retrying} target(s) retrying, {failed} failed and {delivered} "
             "delivered in the last 24 h").format(pending=box["pending"], retrying=len(box["retrying"]),
                                                   failed=box["failed_24h"], delivered=box["delivered_24h"])
    if box["dropped"]:
        line += _(", {dropped} dropped (outbox full)").format(dropped=box["dropped"])
    rows = [[_("TARGET"), _("PENDING"), _("RETRYING"), _("NEXT TRY"), _("FAILED 24H"), _("DELIVERED 24H")]]
    for t in box["targets"]:
        rows.append([t["name"] + ("" if t["configured"] else _(" (removed)")), str(t["pending"]),
                     str(t["retrying"]), t["next_try_at"] or "-", str(t["failed_24h"]), str(t["delivered_24h"])])
    out = ["", line, _table(rows)]
    out += [_("  {target}: attempt {attempts} failed: {error}").format(
        target=r["target"], attempts=r["attempts"], error=r["last_error"]) for r in box["retrying"]]
    return out


def _local(iso: str | None) -> str:
    return format_when(dt.datetime.fromisoformat(iso).timestamp()) if iso else "-"


def render_text(doc: dict[str, Any], lang: str = "en") -> str:
    _ = tr(lang)
    head = _("trainguard on {host} at {at}").format(host=doc["host"], at=_local(doc["generated_at"]))
    if not doc["daemon_state"]:
        head += _(" (no daemon history: trends need trainguard run)")
    out = [head, ""] + _mounts(doc, _) + _gpus(doc, _) + _runs(doc, _) + [""] + _findings(doc, _, lang)
    if doc.get("cleanup"):
        out.append(_("Cleanup freed (last 24 h / total):"))
        out.extend(_("  {policy}: {day} / {total} ({files} files, last run {last})").format(
            policy=c["policy"], day=format_bytes(c["freed_bytes_24h"]), total=format_bytes(c["freed_bytes_total"]),
            files=c["freed_files_total"], last=c["last_run"]) for c in doc["cleanup"])
    if doc.get("cleanup_loop"):
        out.append(loop_line(doc["cleanup_loop"], _))
    out += _alerts(doc, _)
    if doc.get("mirrors"):
        out.append(_("Mirrors:"))
        out.extend(_mirror_line(m, _) for m in doc["mirrors"])
    return "\n".join(out + _outbox(doc.get("outbox"), _))


def _alerts(doc: dict[str, Any], _: Gettext) -> list[str]:
    """The daemon's state, then its firing alerts: a stopped daemon's alerts are marked as old."""
    d = doc["daemon"]
    out = [daemon_line(d, _)]
    firing = [a for a in doc["alerts"] if a["state"] == "firing"]
    if not firing:
        return out
    if d["running"]:
        out.append(_("Alerts firing (daemon, PID {pid}):").format(pid=d["pid"]))
    elif d["last_cycle_at"] is not None:
        out.append(_("Alerts that were firing when the daemon stopped (its last cycle: {at}):").format(
            at=_local(d["last_cycle_at"])))
    else:
        out.append(_("Alerts recorded by a one-shot run (run --once; no daemon has run here):"))
    seen_now = {f["key"]: f for f in doc["findings"]}
    out.extend(_("  [{severity}] {summary} since {since}").format(
        severity=_(SEVERITY_WORDS[a["severity"]]), since=_local(a["firing_since"]),
        summary=_what(seen_now[a["key"]], _).what.rstrip("。.") if a["key"] in seen_now else a["summary"])
        for a in firing)
    return out


def daemon_line(d: dict[str, Any], _: Gettext) -> str:
    age = format_duration(d["last_cycle_age_seconds"]) if d["last_cycle_age_seconds"] is not None else None
    if d["running"] is None:
        return _("Daemon: unknown (this user may not read {dir}; run trainguard status as its owner)").format(
            dir=d["state_dir"])
    if d["running"]:
        if age:
            return _("Daemon: running, PID {pid}, last cycle {age} ago").format(pid=d["pid"], age=age)
        return _("Daemon: running, PID {pid}, no cycle completed yet").format(pid=d["pid"])
    if d["last_cycle_at"] is not None:
        return _("Daemon: not running (PID {pid} stopped; its last cycle was {age} ago, at {at})").format(
            pid=d["pid"], age=age, at=_local(d["last_cycle_at"]))
    return _("Daemon: not running (start it with: trainguard run)")


def _mirror_line(m: dict[str, Any], _: Gettext) -> str:
    head = f"  {m['name']}: {m['source']} -> {m['dest']}: "
    if not m["ran"]:
        return head + _("not run yet (the daemon or trainguard mirror copies it)")
    if not m["pending_files"] and not m["reason"]:
        return head + _("up to date (lag 0s, {copied} copied in all)").format(copied=format_bytes(m["bytes_total"]))
    line = head + _("lag {lag}, {files} files ({size}) waiting").format(
        lag=format_duration(m["lag_seconds"]), files=m["pending_files"], size=format_bytes(m["pending_bytes"]))
    return line + (f": {m['reason']}" if m["reason"] else "")

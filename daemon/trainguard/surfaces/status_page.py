"""A self-contained status page: per mount, use over the last 24 h, the forecast line to full,
the warning/critical thresholds, and alerts as marks. Inline SVG and CSS, no script, no
external asset, so it opens from a file or behind any proxy. Built from the `status` document."""

from __future__ import annotations

import datetime as dt
from html import escape
from typing import Any

from trainguard.i18n import Gettext, format_when, tr
from trainguard.units import format_bytes, format_duration, format_ratio

W, H = 640, 180  # chart size in px
LEFT, RIGHT, TOP, BOTTOM = 44, 12, 26, 24
HORIZON = 12 * 3600.0  # the forecast is drawn up to this far ahead
PAST = 24 * 3600.0

CSS = """body{font:14px system-ui,'Noto Sans CJK SC','PingFang SC',sans-serif;margin:16px;color:#1f2328}
h1{font-size:18px}section{margin:0 0 18px}svg{background:#fafbfc;border:1px solid #d0d7de;border-radius:6px}
.use{fill:none;stroke:#0969da;stroke-width:2}.fc{fill:none;stroke:#cf222e;stroke-width:2;stroke-dasharray:6 4}
.thr{stroke:#9a6700;stroke-dasharray:2 3}.crit{stroke:#cf222e;stroke-dasharray:2 3}.grid{stroke:#eaeef2}
.mark{fill:#cf222e}.warn{fill:#bf8700}.lbl{font-size:11px;fill:#57606a}.mp{font-size:13px;font-weight:600}"""


def _ts(iso: str | None) -> float | None:
    return dt.datetime.fromisoformat(iso).timestamp() if iso else None


def _x(ts: float, now: float) -> float:
    return LEFT + (ts - (now - PAST)) / (PAST + HORIZON) * (W - LEFT - RIGHT)


def _y(ratio: float) -> float:
    return TOP + (1.0 - max(0.0, min(ratio, 1.0))) * (H - TOP - BOTTOM)


def _axes(now: float, _: Gettext) -> list[str]:
    out = []
    for r in (0.0, 0.5, 1.0):
        out.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{_y(r):.1f}" y2="{_y(r):.1f}"/>'
                   f'<text class="lbl" x="4" y="{_y(r) + 4:.1f}">{r * 100:.0f}%</text>')
    for hours, label in ((-23.5, _("-24 h")), (-12, _("-12 h")), (0, _("now")), (12, _("+12 h"))):
        x = _x(now + hours * 3600, now)
        out.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{H - BOTTOM}"/>'
                   f'<text class="lbl" x="{x:.1f}" y="{H - 6}" text-anchor="{"end" if hours == 12 else "middle"}">'
                   f'{escape(label)}</text>')
    return out


def _chart(fs: dict[str, Any], doc: dict[str, Any], _: Gettext) -> str:
    now, step, mp = doc["generated_ts"], doc["history_step_seconds"], fs["mountpoint"]
    eta = fs.get("eta_seconds")
    full_in = _("full in {eta}").format(eta=format_duration(eta)) if eta is not None else ""
    words = {"use": _("use"), "free": _("free"), "warning": _("warning"), "critical": _("critical")}
    values = fs.get("used_ratio_24h") or []
    points = [(now - PAST + (i + 1) * step, v) for i, v in enumerate(values) if v is not None]
    if fs["used_ratio"] is not None:
        points.append((now, fs["used_ratio"]))
    parts = _axes(now, _)
    for name, ratio in (doc.get("thresholds") or {}).get(mp, {}).items():
        parts.append(f'<line class="{"crit" if name == "critical" else "thr"}" x1="{LEFT}" x2="{W - RIGHT}" '
                     f'y1="{_y(ratio):.1f}" y2="{_y(ratio):.1f}"><title>{escape(words[name])} {ratio:.0%}</title></line>')
    if points:
        path = " ".join(f"{_x(t, now):.1f},{_y(v):.1f}" for t, v in points)
        parts.append(f'<polyline class="use" points="{path}"><title>{escape(words["use"])}</title></polyline>')
    if eta is not None and fs["used_ratio"] is not None:
        end = min(eta, HORIZON)
        used = fs["used_ratio"] + (1.0 - fs["used_ratio"]) * end / max(eta, 1.0)
        parts.append(f'<polyline class="fc" points="{_x(now, now):.1f},{_y(fs["used_ratio"]):.1f} '
                     f'{_x(now + end, now):.1f},{_y(used):.1f}"><title>'
                     f'{escape(full_in)}</title></polyline>')
    for a in doc.get("alerts", []):
        since = _ts(a.get("firing_since") or a.get("pending_since"))
        if a["key"].endswith(f":{mp}") and since is not None and since >= now - PAST:
            cls = "mark" if a["severity"] == "critical" else "warn"
            parts.append(f'<circle class="{cls}" cx="{_x(since, now):.1f}" cy="{TOP - 8}" r="5"><title>'
                         f'{escape(a["summary"])} · {escape(format_when(since))}</title></circle>')
    head = f'{format_ratio(fs["used_ratio"])} · {format_bytes(fs["avail_bytes"])} {words["free"]}'
    head += f" · {full_in}" if full_in else ""
    parts.append(f'<text class="mp" x="{LEFT}" y="16">{escape(mp)}</text>'
                 f'<text class="lbl" x="{W - RIGHT}" y="16" text-anchor="end">{escape(head)}</text>')
    return (f'<section><svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
            f'role="img" aria-label="{escape(mp)}">{"".join(parts)}</svg></section>')


def render_page(doc: dict[str, Any], lang: str = "en") -> str:
    _ = tr(lang)
    title = _("trainguard on {host} at {at}").format(host=doc["host"], at=format_when(doc["generated_ts"]))
    charts = "".join(_chart(fs, doc, _) for fs in doc["filesystems"])
    legend = _("Blue: use over the last 24 h. Red dashes: the forecast to full. Dotted: warning and critical "
               "thresholds. Dots: alerts, when they started.")
    return (f'<!doctype html><html lang="{"zh-CN" if lang == "zh" else "en"}"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1"><title>{escape(title)}</title>'
            f'<style>{CSS}</style></head><body><h1>{escape(title)}</h1><p class="lbl">{escape(legend)}</p>'
            f'{charts}</body></html>')

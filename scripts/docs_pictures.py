#!/usr/bin/env python3
"""Draw the pictures in docs/img from the real renderers (needs chromium and playwright, the test extra):

  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 python3 scripts/docs_pictures.py

- dingtalk-zh.png: a zh alert as a DingTalk robot message shows it (the markdown DingTalk renders:
  headings, bold, quotes, line breaks; drawn here by a small renderer of that subset);
- status-zh.png: `trainguard status` with the 24 h sparklines;
- status-page.png: the daemon's /status page.
"""

from __future__ import annotations

import html
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "daemon"))
os.environ["TZ"] = "Asia/Shanghai"
time.tzset()

from trainguard.notify.messages import compose  # noqa: E402
from trainguard.records import AlertEvent, AlertStatus, Finding, Severity  # noqa: E402
from trainguard.surfaces.status_page import render_page  # noqa: E402
from trainguard.surfaces.status_text import _width, render_text  # noqa: E402

OUT = ROOT / "docs" / "img"
NOW = 1_796_277_900.0  # 2026-12-03 14:05 +08:00
GiB = 2**30
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def dingtalk_html(title: str, markdown: str) -> str:
    """DingTalk's markdown subset to HTML: the sender prefixes "# title"; #-headings, **bold**, > quotes,
    - lists, blank-line paragraphs."""
    out = []
    for line in f"# {title}\n{markdown}".splitlines():
        text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(line))
        if m := re.match(r"(#{1,6}) (.*)", text):
            out.append(f"<h{len(m[1])}>{m[2]}</h{len(m[1])}>")
        elif text.startswith("&gt; "):
            out.append(f"<blockquote>{text[5:]}</blockquote>")
        elif text.startswith("- "):
            out.append(f"<li>{text[2:]}</li>")
        elif text:
            out.append(f"<p>{text}</p>")
    return f"""<!doctype html><meta charset="utf-8"><style>
body{{margin:0;background:#f2f3f5;font:15px 'Noto Sans CJK SC',sans-serif;color:#171a1d}}
.bar{{background:#fff;padding:12px;text-align:center;font-weight:600;border-bottom:1px solid #e5e6eb}}
.row{{display:flex;gap:8px;padding:14px 12px}}.av{{width:36px;height:36px;border-radius:8px;background:#3370ff;
color:#fff;font-size:12px;display:flex;align-items:center;justify-content:center;flex:none}}
.name{{font-size:12px;color:#86909c;margin-bottom:4px}}.card{{background:#fff;border-radius:8px;padding:12px 14px;
max-width:300px;line-height:1.55}}h1{{font-size:17px;margin:0 0 8px}}h4{{font-size:15px;margin:10px 0 4px}}
p{{margin:0 0 8px}}blockquote{{margin:8px 0;padding-left:8px;border-left:3px solid #dee0e3;color:#646a73;
font-size:13px}}</style><div class="bar">训练机告警群</div><div class="row"><div class="av">机器人</div><div>
<div class="name">trainguard</div><div class="card">{''.join(out)}</div></div></div>"""


def cells(text: str) -> str:
    """Text on a terminal's grid: each character in a cell one column wide, CJK two (as a terminal draws it)."""
    return "\n".join("".join(f'<span style="display:inline-block;width:{_width(ch)}ch;text-align:center">'
                               f"{html.escape(ch)}</span>" for ch in line) for line in text.splitlines())


def alert() -> tuple[str, str]:
    f = Finding("fs.forecast:/root/autodl-tmp", Severity.CRITICAL, "", details={
        "mountpoint": "/root/autodl-tmp", "eta_seconds": 7200, "fill_bytes_per_second": 12 * GiB / 3600,
        "avail_bytes": 24 * GiB, "used_ratio": 0.961, "fitted_span_seconds": 6 * 3600})
    m = compose("gpu3", [AlertEvent(AlertStatus.FIRING, f, started_at=NOW, ts=NOW)], "zh")
    return m.title, m.markdown


def status_doc() -> dict:
    def climb(start: float, end: float) -> list[float]:
        return [round(start + (end - start) * i / 47, 4) for i in range(48)]
    mounts = [("/root/autodl-tmp", "overlay", 0.961, 24 * GiB, 7200, climb(0.62, 0.961), "critical"),
              ("/data", "xfs", 0.41, 2100 * GiB, None, [0.41] * 48, "ok"),
              ("/mnt/juicefs", "fuse.juicefs", 0.73, 900 * GiB, 40 * 3600, [None] * 10 + climb(0.66, 0.73)[10:], "ok")]
    fss = [{"mountpoint": mp, "fstype": t, "device": "-", "size_bytes": round(avail / (1 - used)), "used_ratio": used,
            "avail_bytes": avail, "inodes_used_ratio": 0.08, "io_util_ratio": 0.12, "eta_seconds": eta, "state": st,
            "unresponsive_seconds": None, "used_ratio_24h": hist} for mp, t, used, avail, eta, hist, st in mounts]
    alert = {"key": "fs.forecast:/root/autodl-tmp", "state": "firing", "severity": "critical",
             "summary": "/root/autodl-tmp 96.1% full, ~2h left", "pending_since": None,
             "firing_since": "2026-12-03T05:20:00+00:00"}
    return {"host": "gpu3", "generated_at": "2026-12-03T06:05:00+00:00", "generated_ts": NOW, "daemon_state": True,
            "history_step_seconds": 1800, "thresholds": {m[0]: {"warning": 0.85, "critical": 0.95} for m in mounts},
            "filesystems": fss, "gpus": [], "gpu_status": None, "findings": [], "cleanup": [], "outbox": None,
            "alerts": [alert]}


def main() -> None:
    from playwright.sync_api import sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    terminal = ("<!doctype html><meta charset='utf-8'><body style='margin:0;background:#1e1e1e'><pre style='"
                "margin:0;padding:14px;color:#d4d4d4;font:14px \"DejaVu Sans Mono\",\"Noto Sans Mono CJK SC\",monospace;"
                f"display:inline-block'>{cells('$ trainguard status')}\n{cells(render_text(status_doc(), 'zh'))}</pre>")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 390, "height": 500}, device_scale_factor=2)
        page.set_content(dingtalk_html(*alert()))
        page.screenshot(path=str(OUT / "dingtalk-zh.png"), full_page=True)
        page = browser.new_page(viewport={"width": 1100, "height": 200})
        page.set_content(terminal)
        page.locator("pre").screenshot(path=str(OUT / "status-zh.png"))
        page = browser.new_page(viewport={"width": 690, "height": 700})
        page.set_content(render_page(status_doc(), "zh"))
        page.screenshot(path=str(OUT / "status-page.png"), full_page=True)
        browser.close()
    print(f"pictures written to {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

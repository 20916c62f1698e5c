"""`status` you can look at: a 24 h sparkline per mount in the table, and the daemon's /status page with
use over time, the forecast and the alerts, checked in a real headless Chromium."""

from __future__ import annotations

import os
import time
import urllib.request
from pathlib import Path

import pytest
from trainguard.store.history import History
from trainguard.store.state import StateDb
from trainguard.surfaces.status import HISTORY_STEPS, used_history
from trainguard.surfaces.status_page import render_page
from trainguard.surfaces.status_text import render_text, sparkline

from tests.support import NOT_INSTALLED
from tests.support.daemon_proc import DaemonProcess, wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
NOW = 1_800_000_000.0


def test_sparkline_shows_the_climb_and_the_gaps():
    line = sparkline([0.50 + 0.01 * i for i in range(48)])
    assert len(line) == 24 and line[0] == "▁" and line[-1] == "█"
    assert list(line) == sorted(line, key="▁▂▃▄▅▆▇█".index)  # a steady climb never dips
    line = sparkline([None] * 24 + [0.9] * 24)
    assert line == " " * 12 + "▅" * 12  # no samples in the first 12 h, then flat (mid-height, not "full")
    assert sparkline([None] * 48) == " " * 24


def seed_history(state_dir: Path, mount_point: str, now: float) -> None:
    """24 h of a disk filling from 60 % to 90 %, as a daemon would have recorded it."""
    state_dir.mkdir(parents=True, exist_ok=True)
    db = StateDb(str(state_dir))
    conn = db.connect()
    history = History(conn, now=now - 24 * 3600)
    for i in range(0, 24 * 3600, 300):
        history.record(now - 24 * 3600 + i, {f"fs.used_ratio:{mount_point}": 0.6 + 0.3 * i / (24 * 3600)})
    conn.close()


def test_status_table_in_chinese_has_the_sparkline_and_forecast(tmp_path):
    seed_history(tmp_path, "/data", NOW)
    from trainguard.store.state import read_only

    used = used_history(read_only(str(tmp_path)), NOW)
    assert len(used["/data"]) == HISTORY_STEPS and used["/data"][0] == pytest.approx(0.6, abs=0.01)
    doc = {"host": "gpu3", "generated_at": "2027-01-15T08:00:00+00:00", "daemon_state": True, "findings": [],
           "alerts": [], "gpus": [], "gpu_status": None, "cleanup": [], "outbox": None,
           "daemon": {"running": True, "pid": 812, "state_dir": str(tmp_path), "last_cycle_age_seconds": 8,
                      "last_cycle_at": "2027-01-15T07:59:52+00:00", "status": ""},
           "filesystems": [{"mountpoint": "/data", "fstype": "xfs", "device": "/dev/md0", "size_bytes": 2**40,
                            "used_ratio": 0.9, "inodes_used_ratio": 0.1, "io_util_ratio": 0.2, "eta_seconds": 7200,
                            "state": "warning", "unresponsive_seconds": None, "used_ratio_24h": used["/data"]}]}
    text = render_text(doc, "zh")
    header, row = text.splitlines()[2:4]
    assert header.split()[:5] == ["挂载点", "类型", "设备", "容量", "已用"] and "预计写满" in header
    assert sparkline(used["/data"]) in row and sparkline(used["/data"]).startswith("▁▁")
    assert "60–90%" in row and "2h" in row and "警告" in row
    assert "守护进程：运行中，PID 812" in text
    assert "LAST 24H" in render_text(doc, "en")


def test_page_is_self_contained():
    doc = {"host": "gpu3", "generated_ts": NOW, "history_step_seconds": 1800, "thresholds": {},
           "filesystems": [{"mountpoint": "/data", "used_ratio": 0.9, "avail_bytes": 10 * 2**30,
                            "eta_seconds": 3600, "used_ratio_24h": [0.8] * 48}], "alerts": []}
    page = render_page(doc, "zh")
    assert "<svg" in page and "/data" in page and "约 1h 后写满" in page
    for external in ("http://", "https://", "<script", "src=", "@import"):
        assert external not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def _browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} missing: apt-get install chromium")
    os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"
    sync_api = pytest.importorskip("playwright.sync_api", reason=f"playwright {NOT_INSTALLED}")
    return sync_api.sync_playwright()


@pytest.mark.root
def test_daemon_status_page_renders_in_a_browser(tmp_path, tmpfs_mount):
    mp = str(tmpfs_mount)
    (tmpfs_mount / "ckpt.bin").write_bytes(b"\0" * (12 * 2**20))  # 75 % of 16 MiB: a warning alert
    state = tmp_path / "state"
    seed_history(state, mp, time.time())
    cfg = f"""
[general]
state_dir = "{state}"
interval = "0.3s"
[filesystems]
paths = ["{mp}"]
exclude = ["*"]
warning = "50%"
critical = "95%"
[metrics]
listen = "127.0.0.1:0"
[notify]
language = "zh"
"""
    with DaemonProcess(tmp_path, cfg) as daemon:
        url = daemon.metrics_url().replace("/metrics", "/status")

        def alert_on_page():
            with urllib.request.urlopen(url, timeout=5) as response:
                page = response.read().decode()
            return page if 'class="warn"' in page else None
        wait_until(alert_on_page, 15, what="the warning alert drawn on /status")
        with _browser() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 700, "height": 400})
                page.goto(url)
                chart = page.locator(f'svg[aria-label="{mp}"]')
                assert chart.is_visible()
                box = chart.bounding_box()
                assert box["width"] > 600 and box["height"] > 150  # laid out at its size
                assert chart.locator("text.mp").text_content() == mp
                assert len(chart.locator("polyline.use").get_attribute("points").split()) > 40  # 24 h of use
                assert chart.locator("circle.warn").count() >= 1  # the alert, as a mark
                assert page.locator("h1").inner_text().startswith("trainguard @ ")
                shot = tmp_path / "status.png"
                page.screenshot(path=str(shot))
            finally:
                browser.close()
        assert daemon.metrics_url()  # /metrics still answers next to the page
        with urllib.request.urlopen(daemon.metrics_url(), timeout=5) as response:
            assert b"trainguard_filesystem_avail_bytes" in response.read()
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000


def test_status_says_the_stall_verdict_from_the_facts_in_chinese():
    from tests.test_notify_phone import STALL_FACTS, VERDICT

    gpu = {"index": 3, "name": "H100", "util_ratio": 0.0, "memory_used_bytes": 78 * 2**30,
           "memory_total_bytes": 80 * 2**30, "temperature_c": 40.0, "power_w": 90.0, "processes": [],
           "state": "stalled", "verdict": VERDICT, "diagnosis": {"verdict": VERDICT, "facts": STALL_FACTS}}
    doc = {"host": "gpu3", "generated_at": "2027-01-15T08:00:00+00:00", "daemon_state": True, "findings": [],
           "alerts": [], "gpus": [gpu], "gpu_status": None, "cleanup": [], "outbox": None, "filesystems": [],
           "daemon": {"running": True, "pid": 812, "state_dir": "/var/lib/trainguard", "last_cycle_age_seconds": 8,
                      "last_cycle_at": "2027-01-15T07:59:52+00:00", "status": ""}}
    zh = render_text(doc, "zh")
    assert "在写入 /mnt/juicefs/team/runs/llama-70b/events.out.tfevents" in zh and "挂载点 /mnt/juicefs" in zh
    assert "blocked writing" not in zh
    assert VERDICT in render_text(doc, "en")
    old = {**gpu, "diagnosis": {"verdict": VERDICT}}  # a heartbeat from before the facts: the English line
    assert VERDICT in render_text({**doc, "gpus": [old]}, "zh")

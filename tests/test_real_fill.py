"""Real filesystems filling up under a real `trainguard run`: thresholds, forecast ETA, ENOSPC, recovery.

Needs root (tmpfs and loop-mounted ext4). The daemon runs as a child process with a short interval and a
short forecast window, so a fill that takes seconds is a trend it can see.
"""

from __future__ import annotations

import errno
import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

from tests.support.cli import Daemon, trainguard

pytestmark = pytest.mark.root

MiB = 2**20
RATE = 4 * MiB  # bytes per second the writer adds
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


class RateWriter(threading.Thread):
    """Writes at RATE (fsynced, on a monotonic schedule) until ENOSPC or stop()."""

    def __init__(self, path: Path, rate: float = RATE, chunk: int = 128 * 1024):
        super().__init__(daemon=True)
        self.path, self.rate, self.chunk = path, rate, chunk
        self.written = 0
        self.enospc = threading.Event()
        self._halt = threading.Event()
        self.started_at = 0.0

    def run(self) -> None:
        data = b"\x5a" * self.chunk
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.started_at = time.monotonic()
            while not self._halt.is_set():
                due = self.started_at + (self.written + self.chunk) / self.rate
                if (wait := due - time.monotonic()) > 0 and self._halt.wait(wait):
                    break
                try:
                    self.written += os.write(fd, data)
                    os.fsync(fd)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    self.enospc.set()
                    break
        finally:
            os.close(fd)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def config_for(tmp_path: Path, mountpoint: Path) -> Path:
    path = tmp_path / "trainguard.toml"
    path.write_text(f"""
[general]
interval = "200ms"
[filesystems]
exclude = ["*"]
paths = ["{mountpoint}"]
[forecast]
window = "4s"
min_span = "2s"
warning = "10s"
critical = "3s"
min_samples = 10       # 2 s of samples: the field's evidence rule, scaled like the window
evidence_ratio = 3     # a 10 s warning from a 4 s window (the field default: 6 h from 6 h)
[alerts]
keep_firing_for = "1s"
""")
    return path


def status(config: Path, state: Path) -> dict:
    result = trainguard("status", "--json", "--config", str(config), "--state-dir", str(state))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def fs_doc(doc: dict, mountpoint: Path) -> dict:
    (fs,) = [f for f in doc["filesystems"] if f["mountpoint"] == str(mountpoint)]
    return fs


def check_fill(tmp_path: Path, mountpoint: Path, fstype: str) -> None:
    config, state = config_for(tmp_path, mountpoint), tmp_path / "state"
    mp = re.escape(str(mountpoint))
    with Daemon("--config", str(config), "--state-dir", str(state)) as d:
        d.wait_for(r"started: ")
        writer = RateWriter(mountpoint / "checkpoint.bin")
        writer.start()
        try:
            # The forecast sees the fill within seconds, and its rate and ETA are the real ones.
            m = d.wait_for(rf"FIRING \[(warning|critical)\] {mp} [\d.]+% full, ~\d+s left at ([\d.]+) (\w+)/h "
                           rf"\(fs\.forecast:", timeout=20)
            logged_rate = float(m.group(2)) * UNITS[m.group(3)] / 3600
            assert logged_rate == pytest.approx(RATE, rel=0.3)
            while time.monotonic() - writer.started_at < 3.0:  # a window's worth of filling
                time.sleep(0.1)
            doc = status(config, state)
            fs = fs_doc(doc, mountpoint)
            assert doc["daemon_state"] is True and fs["fstype"] == fstype and fs["kind"] == "local"
            assert fs["fill_bytes_per_s"] == pytest.approx(RATE, rel=0.3)
            real_eta = fs["avail_bytes"] / RATE
            assert fs["eta_seconds"] == pytest.approx(real_eta, rel=0.3, abs=1.5)

            # Thresholds: warning at 85 %, critical at 90 %, in that order.
            warning = d.wait_for(rf"FIRING \[warning\] {mp} 8[5-9]\.\d% full, .* \(fs\.usage:", timeout=20)
            critical = d.wait_for(rf"FIRING \[critical\] {mp} (9\d|100)\.\d% full, .* \(fs\.usage:", timeout=20)
            lines = d.lines
            assert lines.index(warning.string) < lines.index(critical.string)
            assert writer.enospc.wait(30), "the filesystem really filled up"
        finally:
            writer.stop()

        # Full: one cycle reports it critical and exits 1.
        once = trainguard("run", "--once", "--config", str(config), "--state-dir", str(tmp_path / "once"))
        assert once.returncode == 1, once.stdout + once.stderr
        assert re.search(rf"^\[CRITICAL\] {mp} (99\.\d|100\.0)% full, [\d.]+ (B|KiB) free \(fs\.usage:", once.stdout,
                         re.MULTILINE), once.stdout
        fs = fs_doc(status(config, state), mountpoint)
        assert fs["used_ratio"] >= 0.99 and fs["state"] == "critical"
        assert fs["avail_bytes"] < 256 * 1024

        # Cleaned up: the alerts resolve.
        mark = len(d.lines)
        (mountpoint / "checkpoint.bin").unlink()
        d.wait_for(rf"RESOLVED \[critical\] {mp} .* \(after \d+s; fs\.usage:", timeout=20, after=mark)
        assert d.stop() == 0


@pytest.mark.parametrize("tmpfs_mount", [32 * MiB], indirect=True)
def test_tmpfs_fills_to_enospc_under_the_daemon(tmp_path, tmpfs_mount):
    check_fill(tmp_path, tmpfs_mount, "tmpfs")


@pytest.mark.parametrize("ext4_mount", [40 * MiB], indirect=True)
def test_loop_ext4_fills_to_enospc_under_the_daemon(tmp_path, ext4_mount):
    check_fill(tmp_path, ext4_mount, "ext4")


@pytest.mark.parametrize("ext4_mount", [16 * MiB], indirect=True)
def test_loop_ext4_reports_its_loop_device_io(tmp_path, ext4_mount):
    """The ext4 mount is mapped to its loop device through major:minor, and its writes show as I/O."""
    config = config_for(tmp_path, ext4_mount)
    writer = RateWriter(ext4_mount / "data.bin", rate=8 * MiB)
    writer.start()
    try:
        time.sleep(0.2)
        doc = status(config, tmp_path / "state")
    finally:
        writer.stop()
    fs = fs_doc(doc, ext4_mount)
    assert fs["io_device"] and fs["io_device"].startswith("loop")
    assert fs["write_bytes_per_s"] > 0 and 0.0 <= fs["io_util_ratio"] <= 1.0

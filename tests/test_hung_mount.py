"""A FUSE mount whose statfs blocks (a dead JuiceFS/NFS server): the daemon keeps its cycle, reports the
mount unresponsive with how long, never piles up probes, and reports the recovery.

Uses the real SlowFs FUSE filesystem (needs /dev/fuse and mfusepy); skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
from trainguard import config as configmod
from trainguard.clock import SystemClock
from trainguard.records import AlertStatus
from trainguard.service.daemon import Daemon

from tests.support.cli import Daemon as DaemonProcess
from tests.support.cli import trainguard

pytestmark = pytest.mark.fuse

JUICEFS = {"name": "juicefs", "source": "JuiceFS:ckpt", "size": 64 * 2**20}


class CycleCounter:
    """A notifier: called once per cycle, it records when, and the events."""

    def __init__(self):
        self.cycles: list[float] = []
        self.events = []
        self._cond = threading.Condition()

    def notify(self, events):
        with self._cond:
            self.cycles.append(time.monotonic())
            self.events.extend(events)
            self._cond.notify_all()

    def close(self):
        pass

    def wait_event(self, predicate, timeout=15.0):
        deadline = time.monotonic() + timeout
        with self._cond:
            while not any(predicate(e) for e in self.events):
                left = deadline - time.monotonic()
                assert left > 0, f"no matching event within {timeout}s: {self.events}"
                self._cond.wait(left)
            return next(e for e in self.events if predicate(e))


def in_process_daemon(tmp_path, mountpoint, counter, interval="200ms", timeout="1s"):
    cfg = configmod.parse({"general": {"interval": interval},
                           "filesystems": {"exclude": ["*"], "paths": [str(mountpoint), str(tmp_path)],
                                           "probe_timeout": timeout},
                           "alerts": {"keep_firing_for": "0s"}}, "test")
    return Daemon(configmod.Loaded(cfg, "test"), clock=SystemClock(), state_dir=str(tmp_path / "state"),
                  notifiers=[counter])


@pytest.mark.parametrize("slowfs", [JUICEFS], indirect=True)
def test_daemon_keeps_its_cycle_and_reports_the_hung_mount(tmp_path, slowfs):
    counter = CycleCounter()
    d = in_process_daemon(tmp_path, slowfs.mountpoint, counter)
    runner = threading.Thread(target=d.run, daemon=True)
    runner.start()
    try:
        while len(counter.cycles) < 3:
            time.sleep(0.05)
        slowfs.block("statfs")
        blocked_at = time.monotonic()
        slowfs.wait_blocked("statfs", timeout=5)
        fired = counter.wait_event(lambda e: e.finding.key == f"fs.unresponsive:{slowfs.mountpoint}")
        took = time.monotonic() - blocked_at
        assert fired.status is AlertStatus.FIRING and fired.finding.severity.value == "critical"
        assert 1.0 <= took < 3.0, "reported once the probe is older than probe_timeout"
        assert "fuse.juicefs" in fired.finding.summary and "unresponsive" in fired.finding.summary

        # Two more seconds of the hang: cycles keep their 200 ms cadence and no second probe is started.
        mark = len(counter.cycles)
        time.sleep(2.0)
        gaps = [b - a for a, b in zip(counter.cycles[mark:], counter.cycles[mark + 1:])]
        assert len(gaps) >= 7 and max(gaps) < 0.45, gaps
        assert slowfs.stats()["waiting"] == {"statfs": 1}, "exactly one probe stuck in the kernel"
        assert d.latest.duration_s < 0.15, "a cycle does not wait for the stuck probe"
        stuck = next(s for s in d.latest.snapshot.filesystems if s.mount.mount_point == str(slowfs.mountpoint))
        assert not stuck.responsive and time.time() - stuck.unresponsive_since >= 3.0
        other = [s for s in d.latest.snapshot.filesystems if s.mount.mount_point != str(slowfs.mountpoint)]
        assert other and all(s.responsive and s.usage for s in other), "the other mounts are still sampled"

        slowfs.unblock("statfs")
        resolved = counter.wait_event(lambda e: e.status is AlertStatus.RESOLVED
                                      and e.finding.key == f"fs.unresponsive:{slowfs.mountpoint}")
        assert resolved.duration_s >= 2.0
        fresh = next(s for s in d.latest.snapshot.filesystems if s.mount.mount_point == str(slowfs.mountpoint))
        assert fresh.responsive and fresh.usage is not None
    finally:
        d.stop_event.set()
        slowfs.reset()
        runner.join(10)
    assert not runner.is_alive()


@pytest.mark.parametrize("slowfs", [JUICEFS], indirect=True)
def test_a_killed_fuse_server_is_reported_as_an_error(tmp_path, slowfs):
    counter = CycleCounter()
    d = in_process_daemon(tmp_path, slowfs.mountpoint, counter)
    d.cycle()
    slowfs.kill()  # the FUSE daemon crashed: "Transport endpoint is not connected"
    result = d.cycle()
    (f,) = [f for f in result.findings if f.labels.get("mountpoint") == str(slowfs.mountpoint)]
    assert f.key.startswith("fs.error:") and "not connected" in f.summary


@pytest.mark.parametrize("slowfs", [JUICEFS], indirect=True)
def test_the_command_reports_the_hung_mount_and_its_recovery(tmp_path, slowfs):
    toggled = tmp_path / "logs"
    config = tmp_path / "trainguard.toml"
    config.write_text(f"""
[general]
interval = "250ms"
[filesystems]
exclude = ["*"]
paths = ["{slowfs.mountpoint}", "{toggled}"]
probe_timeout = "1s"
[alerts]
keep_firing_for = "0s"
""")
    state = tmp_path / "state"
    mp = re.escape(str(slowfs.mountpoint))
    with DaemonProcess("--config", str(config), "--state-dir", str(state)) as d:
        d.wait_for(r"FIRING \[warning\] watched path .*/logs does not exist")
        slowfs.block("statfs")
        d.wait_for(rf"FIRING \[critical\] {mp} \(fuse\.juicefs\) is unresponsive: statfs has not returned for \d+s "
                   rf"\(fs\.unresponsive:{mp}\)", timeout=15)
        # Still cycling: it notices a path appearing elsewhere while the mount hangs.
        toggled.mkdir()
        d.wait_for(r"RESOLVED \[warning\] watched path .*/logs does not exist", timeout=10)

        started = time.monotonic()
        result = trainguard("status", "--json", "--config", str(config), "--state-dir", str(state))
        assert time.monotonic() - started < 8, "status waits for a hung mount at most probe_timeout"
        (fs,) = [f for f in json.loads(result.stdout)["filesystems"] if f["mountpoint"] == str(slowfs.mountpoint)]
        assert fs["state"] == "unresponsive" and fs["responsive"] is False and fs["unresponsive_seconds"] >= 1.0
        assert fs["kind"] == "fuse" and fs["device"] == "JuiceFS:ckpt"

        once = trainguard("run", "--once", "--config", str(config), "--state-dir", str(tmp_path / "once"))
        assert once.returncode == 1, once.stdout + once.stderr
        assert re.search(rf"^\[CRITICAL\] {mp} \(fuse\.juicefs\) is unresponsive", once.stdout, re.MULTILINE)

        slowfs.unblock("statfs")
        d.wait_for(rf"RESOLVED \[critical\] {mp} \(fuse\.juicefs\) is unresponsive: .* \(after \d+s;", timeout=10)

        # Hung again, and the daemon is asked to stop: it exits at once (the stuck statfs is not its own).
        slowfs.block("statfs")
        slowfs.wait_blocked("statfs", timeout=5)
        started = time.monotonic()
        assert d.stop(timeout=10) == 0
        assert time.monotonic() - started < 5
        slowfs.unblock("statfs")

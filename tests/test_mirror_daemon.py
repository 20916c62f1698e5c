"""The daemon with a mirror whose share hangs: cycle and /metrics stay prompt, mirror.lag fires in time and
resolves when the share recovers, and the copy resumes. The share is the real SlowFs FUSE mount."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from trainguard import config as configmod
from trainguard.actions.mirror.worker import dest_problem
from trainguard.records import AlertStatus, FsSample, Mount, MountKind, Snapshot
from trainguard.service.daemon import Daemon
from trainguard.store.state import read_only
from trainguard.surfaces.status import mirrors_doc, with_mirrors

from tests.support.cli import cli_env
from tests.support.clock import FakeClock
from tests.support.fake_daemon import Recorder

INTERVAL, EVERY, LAG, FILE_TIMEOUT = 10.0, 60.0, 300.0, 120.0


def of(recorder: Recorder, key: str, status: AlertStatus) -> list:
    return [e for e in recorder.events if e.finding.key == key and e.status is status]


def metrics(daemon: Daemon) -> dict[tuple[str, str], float]:
    started = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{daemon.metrics.port}/metrics", timeout=5) as response:
        text = response.read().decode()
    assert time.monotonic() - started < 2.0, "a scrape never waits on the share"
    return {(s.name, s.labels.get("mirror", "")): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def timed_cycle(daemon: Daemon):
    started = time.monotonic()
    result = daemon.cycle()
    assert time.monotonic() - started < 1.0, "the cycle never waits on the share"
    return result


@pytest.mark.parametrize("slowfs", [{"name": "autodlfs", "source": "autodl-fs"}], indirect=True)
def test_hung_share_keeps_the_daemon_responsive_and_lag_fires_then_resolves(tmp_path, slowfs):
    src, share = tmp_path / "autodl-tmp" / "runs", Path(slowfs.mountpoint) / "runs"
    events_file = src / "run1" / "events.out.tfevents.1.host"
    events_file.parent.mkdir(parents=True)
    events_file.write_bytes(b"\x00" * 50_000)
    clock = FakeClock(wall=time.time(), mono=1000.0)
    cfg = configmod.parse({
        "general": {"interval": f"{INTERVAL}s"}, "gpu": {"enabled": False},
        "filesystems": {"exclude": ["*"], "paths": [str(tmp_path)]},
        "alerts": {"keep_firing_for": "0s"}, "metrics": {"listen": "127.0.0.1:0"},
        "mirror": [{"name": "runs", "source": str(src), "dest": str(share), "every": f"{EVERY}s",
                    "lag_warning": f"{LAG}s", "file_timeout": f"{FILE_TIMEOUT}s"}],
    }, "test")
    slowfs.block("all")  # the share hangs before the first copy
    notes = Recorder()
    daemon = Daemon(configmod.Loaded(cfg, "test"), clock=clock, state_dir=str(tmp_path / "state"), notifiers=[notes])
    daemon.start_metrics()
    worker = daemon.mirror
    try:
        changed_at = clock.time()
        slowfs.wait_blocked("all", timeout=10)  # the copier sits in the kernel, on the share
        deadline = time.monotonic() + 10
        while worker.activity("runs")[0] != "mkdir" and time.monotonic() < deadline:
            time.sleep(0.01)  # its last report line ("about to mkdir on the share") is on its way
        assert worker.activity("runs")[0] == "mkdir"
        conn = read_only(str(tmp_path / "state"))  # what `trainguard status` reads while the first round hangs
        [doc] = mirrors_doc(with_mirrors(Snapshot(ts=clock.time()), cfg, conn), cfg, clock.time())
        conn.close()
        assert doc["pending_files"] == 1 and doc["pending_bytes"] == 50_000
        key = "mirror.lag:runs"
        fired_at = None
        while fired_at is None:
            timed_cycle(daemon)
            assert metrics(daemon)[("trainguard_mirror_lag_seconds", "runs")] == pytest.approx(
                clock.time() - changed_at, abs=1.0)
            if of(notes, key, AlertStatus.FIRING):
                fired_at = clock.time()
                break
            assert clock.time() - changed_at <= LAG + INTERVAL, "mirror.lag fires within its threshold + one interval"
            clock.advance(INTERVAL)
            if clock.time() - changed_at >= FILE_TIMEOUT and worker.rounds("runs") == 0:
                assert worker.wait_rounds("runs", 1, timeout=10), "the stuck copy is given up after file_timeout"
        assert fired_at - changed_at > LAG
        finding = of(notes, key, AlertStatus.FIRING)[0].finding
        # mkdir answers at once from a live share: it is given up after meta_timeout (20s), not file_timeout,
        # and the copier the kernel keeps in it is named.
        assert "dest unresponsive" in finding.summary and "stuck in the kernel in mkdir" in finding.summary
        assert finding.details["pending_files"] == 1
        assert finding.details["stuck_op"] == "mkdir" and finding.details["stuck_pid"] > 0
        assert metrics(daemon)[("trainguard_mirror_errors_total", "runs")] >= 1

        slowfs.reset()  # the share answers again
        done = worker.rounds("runs")
        clock.advance(EVERY)
        assert worker.wait_rounds("runs", done + 1, timeout=15)
        timed_cycle(daemon)
        assert of(notes, key, AlertStatus.RESOLVED), "resolved once the copy caught up"
        assert (share / "run1" / events_file.name).read_bytes() == events_file.read_bytes()
        scraped = metrics(daemon)
        assert scraped[("trainguard_mirror_lag_seconds", "runs")] == 0
        assert scraped[("trainguard_mirror_bytes_total", "runs")] == 50_000
    finally:
        slowfs.reset()
        daemon.stop_event.set()
        daemon.close()


def test_dest_whose_mount_probe_hangs_is_not_copied_to():
    share = Mount("/root/autodl-fs", "fuse.juicefs", "JuiceFS:share", 0, 50, MountKind.FUSE)
    root = Mount("/", "ext4", "/dev/vda", 253, 0, MountKind.LOCAL)
    hung = Snapshot(ts=1000.0, filesystems=(FsSample(root, 1000.0, None),
                                            FsSample(share, 1000.0, None, responsive=False, unresponsive_since=880.0)))
    reason = dest_problem(hung, "/root/autodl-fs/runs", 1000.0)
    assert reason == "dest unresponsive: /root/autodl-fs (fuse.juicefs) does not answer statfs for 2m"
    assert dest_problem(hung, "/root/autodl-tmp/runs", 1000.0) == "", "a local dest is not affected"
    assert dest_problem(None, "/root/autodl-fs/runs", 1000.0) == ""


def test_a_daemon_without_mirrors_does_not_load_the_mirror(tmp_path):
    code = ("import sys; from trainguard import config as c; from trainguard.service.daemon import Daemon; "
            f"d = Daemon(c.Loaded(c.parse({{'gpu': {{'enabled': False}}}}, 't'), 't'), state_dir={str(tmp_path)!r}); "
            "d.cycle(); d.close(); print(sorted(m for m in sys.modules if m.startswith('trainguard.actions.mirror')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert os.path.exists(tmp_path / "state.db")

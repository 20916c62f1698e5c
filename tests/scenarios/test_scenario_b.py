"""Scenario B, the silent hang on shared storage: VRAM full, GPU at 0 %, nobody knows why.

A training-like process holds a (fake) GPU whose utilisation follows the
process's own heartbeat, and writes TensorBoard event files from an
``EventFileWriter`` thread to a real FUSE mount (``fuse.autodl-fs``). The test
then hangs the mount. trainguard must report the mount as unresponsive, fire the
stall within ``for`` + one interval of the GPU going idle, and say why: the PID,
the blocked writer thread, the tfevents file, the mount, and "log to local disk".
When the mount recovers, the stall resolves by itself. With the log directory on
local disk the same hang does not stall the GPU, and no stall alert fires.

Only NVML is fake (scripted, read by the daemon's process); the mount, the
blocked syscall, the threads, /proc and the webhook receiver are real.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scenarios import webhook
from tests.scenarios.runs import (
    B_DELIVERY_SLACK_S,
    B_HEARTBEAT_FRESH_S,
    B_INTERVAL_S,
    B_KEEP_FIRING_S,
    B_PROBE_TIMEOUT_S,
    B_STALL_FOR_S,
    SHARE_NAME,
    run_share_hang,
)
from tests.support.slowfs import SlowFs, fuse_available

pytestmark = [pytest.mark.fuse, pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
def share(tmp_path):
    """A real FUSE mount that looks like the cloud share of the field report (fuse.autodl-fs)."""
    if reason := fuse_available():
        pytest.skip(reason)
    mountpoint = tmp_path / SHARE_NAME
    mountpoint.mkdir()
    with SlowFs(mountpoint, name=SHARE_NAME, source=SHARE_NAME, size=256 * 2**20) as fs:
        yield fs


def test_hung_share_stalls_the_gpu_and_the_alert_says_why(share, tmp_path, http_receiver):
    run = run_share_hang(tmp_path, share, http_receiver, logs_on_share=True)
    alerts = run.alerts

    # The hang stalls the training loop (alive, GPU memory held, computing nothing) ...
    assert run.computing_stopped_at is not None, "the trainer never blocked: the hang did not reach it"
    assert run.steps_during_hang < 20
    # ... the share is reported unresponsive, and the stall fires within `for` + one interval.
    unresponsive = run.first("fs.unresponsive")
    stall = run.first("gpu.stall")
    assert unresponsive is not None and stall is not None, webhook.describe(alerts)
    assert unresponsive.details["mountpoint"] == str(share.mountpoint)
    assert unresponsive.details["fstype"] == f"fuse.{SHARE_NAME}"
    assert unresponsive.arrived_at - run.hung_at <= B_PROBE_TIMEOUT_S + B_INTERVAL_S + B_DELIVERY_SLACK_S + 1
    # Each utilisation point averages the interval before it, so the window can be all-idle up to
    # one interval early; that, and the driver's 1 s sample spacing, is the slack below `for`.
    late = stall.arrived_at - run.gpu_idle_from
    assert B_STALL_FOR_S - 2 * B_INTERVAL_S <= late <= B_STALL_FOR_S + B_INTERVAL_S + B_DELIVERY_SLACK_S, (
        f"stall alert {late:.1f}s after the GPU went idle")

    # It says why, on one screen: who, which thread, which file, which mount, what to do.
    assert Path(run.event_file).name.startswith("events.out.tfevents.")
    verdict = stall.details["verdict"]
    assert f"PID {run.trainer_pid}" in verdict
    assert "EventFileWriter" in verdict
    assert run.event_file in verdict
    assert f"fuse.{SHARE_NAME}" in verdict and "unresponsive" in verdict
    [process] = stall.details["diagnosis"]["processes"]
    assert process["host_pid"] == run.trainer_pid
    [writer] = [t for t in process["blocked_threads"] if t["name"] == "EventFileWriter"]
    assert writer["file"] == run.event_file
    assert any(f["path"] == run.event_file and f["mount_point"] == str(share.mountpoint)
               for f in process["remote_files"])
    assert "local disk" in stall.hint
    assert "GPU 0 stalled for" in stall.title and len(stall.title) <= 60  # what the phone shows first
    first, why = stall.text.splitlines()[:2]  # then what happened, and why: the verdict
    assert first.startswith("GPU 0 ") and why.startswith("Why: Diagnosis: ") and "EventFileWriter" in why
    assert "local disk" in stall.text

    # The share comes back: training resumes and both alerts resolve on their own, promptly.
    assert run.resumed, run.trainer_output[-2000:]
    stall_resolved = run.first("gpu.stall", "resolved")
    assert stall_resolved is not None and run.first("fs.unresponsive", "resolved") is not None, (
        webhook.describe(alerts))
    assert stall_resolved.arrived_at - run.recovered_at <= (
        B_HEARTBEAT_FRESH_S + B_KEEP_FIRING_S + 2 * B_INTERVAL_S + B_DELIVERY_SLACK_S + 1)

    # Before anything hung, the risky placement was pointed out (info): events written on the share.
    risky = run.first("gpu.risky_write")
    assert risky is not None and risky.arrived_at < run.hung_at, webhook.describe(alerts)
    assert risky.details["pid"] == run.trainer_pid and risky.details["files"] == [run.event_file]
    assert risky.details["mountpoint"] == str(share.mountpoint) and "[[mirror]]" in risky.hint

    # Each message once: firing and resolved of the two alerts, the placement note, nothing else.
    assert webhook.duplicates(alerts) == [], webhook.describe(alerts)
    assert sorted((a.kind, a.status) for a in alerts) == [
        ("fs.unresponsive", "firing"), ("fs.unresponsive", "resolved"), ("gpu.risky_write", "firing"),
        ("gpu.stall", "firing"), ("gpu.stall", "resolved")], webhook.describe(alerts)


def test_same_hang_with_logs_on_local_disk_does_not_stall(share, tmp_path, http_receiver):
    run = run_share_hang(tmp_path, share, http_receiver, logs_on_share=False)  # SummaryWriter('/tmp/runs')
    alerts = run.alerts

    # The hang was real and seen ...
    assert run.first("fs.unresponsive") is not None, webhook.describe(alerts)
    # ... but training went on through it, trainguard saw the GPU busy, and no stall fired.
    assert run.computing_stopped_at is None
    assert run.steps_during_hang > 50
    assert len(run.util_during_hang) >= B_STALL_FOR_S / B_INTERVAL_S and min(run.util_during_hang) > 0.9
    assert webhook.find(alerts, "gpu.stall") == [], webhook.describe(alerts)
    assert webhook.find(alerts, "gpu.risky_write") == [], webhook.describe(alerts)  # nothing risky to say
    assert webhook.duplicates(alerts) == [], webhook.describe(alerts)

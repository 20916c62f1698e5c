"""Scenario B, the silent hang on shared storage: VRAM full, GPU at 0 %, nobody knows why.

A training-like process holds a (fake) GPU whose utilisation follows the
process's own heartbeat, and writes TensorBoard event files from an
``EventFileWriter`` thread to a real FUSE mount (``fuse.autodl-fs``). The test
then hangs the mount. trainguard must report the mount as unresponsive, fire the
stall within ``for`` + one interval of the GPU going idle, and say why: the PID,
the blocked writer thread, the tfevents file, the mount, and "log to local disk".
When the mount recovers, the stall resolves by itself. With the log directory on
local disk the same hang does not stall the GPU, and no stall alert fires.

Only NVML is fake (scripted, in the daemon's process); the mount, the blocked
syscall, the threads, /proc and the webhook receiver are real.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.scenarios import webhook
from tests.scenarios.harness import TB_TRAINER, Processes, missing_feature, recorded_points, wait_until
from tests.support.slowfs import SlowFs, fuse_available

pytestmark = [pytest.mark.fuse, pytest.mark.slow, pytest.mark.timeout(180)]

_MISSING = missing_feature("trainguard.notify.worker", "trainguard.diagnosis", "trainguard.samplers.gpu")
if _MISSING:
    pytestmark.append(pytest.mark.skip(reason=_MISSING))

GiB = 2**30
INTERVAL_S = 1.0
STALL_FOR_S = 5.0
HEARTBEAT_FRESH_S = 1.0  # the fake GPU reads 0 % once the heartbeat is this old
PROBE_TIMEOUT_S = 2.0
KEEP_FIRING_S = 2.0
DELIVERY_SLACK_S = 1.0  # outbox worker pick-up and the HTTP round trip
SHARE_NAME = "autodl-fs"


def nvml_script(pid: int, heartbeat: Path) -> dict:
    """One A100 with 76 of 80 GiB held by ``pid``; busy while the heartbeat is fresh, idle once it is stale."""
    return {"gpus": [{
        "name": "NVIDIA A100-SXM4-80GB", "memory_total": 80 * GiB,
        "heartbeat": {"path": str(heartbeat), "fresh_s": HEARTBEAT_FRESH_S, "busy": 97, "idle": 0},
        "timeline": [{"at": 0, "mem_used": 76 * GiB, "processes": [{"pid": pid, "used": 76 * GiB}]}],
    }]}


def config_text(share: Path, webhook_url: str) -> str:
    return f"""
[general]
interval = "{INTERVAL_S:g}s"

[filesystems]
paths = ["{share}"]
exclude = ["*"]            # only the share: other mounts on a CI host are not this test's business
probe_timeout = "{PROBE_TIMEOUT_S:g}s"

[forecast]
enabled = false

[alerts]
keep_firing_for = "{KEEP_FIRING_S:g}s"

[gpu]
for = "{STALL_FOR_S:g}s"
py_spy = false

[notify]
group_interval = "0s"
retry_initial = "1s"
retry_max = "2s"

[[notify.targets]]
name = "webhook"
url = "{webhook_url.replace("http://", "json://", 1)}/hook"

[metrics]
listen = ""
"""


class StallRun:
    """The trainer, its fake GPU and a real ``trainguard run``, set up and healthy."""

    def __init__(self, procs: Processes, tmp_path: Path, share: Path, logdir: Path, receiver) -> None:
        self.heartbeat = tmp_path / "heartbeat"
        self.status_file = tmp_path / "trainer-status.json"
        self.trainer = procs.python(TB_TRAINER, "--logdir", str(logdir), "--heartbeat", str(self.heartbeat),
                                    "--status", str(self.status_file), name="tb-trainer")
        wait_until(lambda: self.progress()["written"] >= 3, 15, "the trainer writing TensorBoard events",
                   abort=self.trainer.died)
        nvml = tmp_path / "nvml.json"
        nvml.write_text(json.dumps(nvml_script(self.trainer.pid, self.heartbeat)))
        self.daemon = procs.trainguard(config_text(share, receiver.url), env=procs.env(fake_nvml=nvml))
        self.receiver = receiver
        # Healthy first: trainguard must have seen the GPU busy for a whole `for` window, so a
        # stall alert later is about the hang, not about a daemon that just started.
        wait_until(lambda: sum(v > 0.9 for _, v in recorded_points(self.daemon.state_dir, "gpu.util:0"))
                   >= STALL_FOR_S / INTERVAL_S + 1, 30, "trainguard recording the busy GPU",
                   abort=self.daemon.died)
        assert webhook.received(receiver) == [], webhook.describe(webhook.received(receiver))

    def progress(self) -> dict:
        try:
            return json.loads(self.status_file.read_text())
        except (OSError, ValueError):
            return {"written": 0, "step": 0}

    def heartbeat_age(self) -> float:
        return time.time() - self.heartbeat.stat().st_mtime

    def alerts(self) -> list[webhook.ReceivedAlert]:
        return webhook.received(self.receiver)

    def wait_alert(self, kind: str, status: str, timeout: float) -> webhook.ReceivedAlert:
        found = wait_until(lambda: webhook.find(self.alerts(), kind, status), timeout,
                           f"a {status} {kind} message at the webhook", abort=self.daemon.died)
        return found[0]


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
    logdir = share.mountpoint / "runs" / "exp1"
    with Processes(tmp_path / "procs") as procs:
        run = StallRun(procs, tmp_path, share.mountpoint, logdir, http_receiver)

        share.block("all")  # the share stops answering: writes, statfs, everything
        share.wait_blocked("write", timeout=10)
        # The writer is stuck, its queue fills, add_scalar blocks: the heartbeat stops.
        wait_until(lambda: run.heartbeat_age() > HEARTBEAT_FRESH_S, 10, "the training loop blocking")
        computing_stopped = time.monotonic() - run.heartbeat_age()
        gpu_idle_from = computing_stopped + HEARTBEAT_FRESH_S  # when NVML starts reading 0 %

        unresponsive = run.wait_alert("fs.unresponsive", "firing", PROBE_TIMEOUT_S + 3 * INTERVAL_S + 5)
        stall = run.wait_alert("gpu.stall", "firing", STALL_FOR_S + 3 * INTERVAL_S + 10)
        assert run.trainer.running(), "the trainer hangs; it does not crash"

        # Timely: within `for` + one interval of the GPU going idle (plus delivery).
        assert stall.arrived_at - gpu_idle_from <= STALL_FOR_S + INTERVAL_S + DELIVERY_SLACK_S, (
            f"stall alert {stall.arrived_at - gpu_idle_from:.1f}s after the GPU went idle")
        assert stall.arrived_at - gpu_idle_from >= STALL_FOR_S - INTERVAL_S, "fired before `for` had passed"
        assert unresponsive.details["mountpoint"] == str(share.mountpoint)
        assert unresponsive.details["fstype"] == f"fuse.{SHARE_NAME}"

        # It says why, on one screen: who, which thread, which file, which mount, what to do.
        event_file = run.progress()["event_file"]
        diagnosis = stall.details["diagnosis"]
        verdict = stall.details["verdict"]
        assert f"PID {run.trainer.pid}" in verdict
        assert "EventFileWriter" in verdict
        assert event_file in verdict and Path(event_file).name.startswith("events.out.tfevents.")
        assert f"fuse.{SHARE_NAME}" in verdict and "unresponsive" in verdict
        [process] = diagnosis["processes"]
        assert process["host_pid"] == run.trainer.pid
        [writer] = [t for t in process["blocked_threads"] if t["name"] == "EventFileWriter"]
        assert writer["file"] == event_file
        assert any(f["path"] == event_file and f["mount_point"] == str(share.mountpoint)
                   for f in process["remote_files"])
        assert "local disk" in stall.hint
        for text in (stall.text, stall.title):  # what the person on the phone reads
            assert "EventFileWriter" in text and "stalled" in text
        assert "local disk" in stall.text

        # The share comes back: writes drain, training resumes, both alerts resolve on their own.
        share.reset()
        recovered_at = time.monotonic()
        wait_until(lambda: run.heartbeat_age() < HEARTBEAT_FRESH_S, 10, "the training loop resuming")
        stall_resolved = run.wait_alert("gpu.stall", "resolved", KEEP_FIRING_S + 3 * INTERVAL_S + 10)
        run.wait_alert("fs.unresponsive", "resolved", KEEP_FIRING_S + 3 * INTERVAL_S + 10)
        assert stall_resolved.arrived_at - recovered_at <= (
            HEARTBEAT_FRESH_S + KEEP_FIRING_S + 2 * INTERVAL_S + DELIVERY_SLACK_S + 1)
        written_before = run.progress()["written"]
        wait_until(lambda: run.progress()["written"] > written_before + 5, 10, "events being written again")

        # Each message once: firing and resolved of the two alerts, nothing else, no duplicates.
        alerts = run.alerts()
        assert webhook.duplicates(alerts) == [], webhook.describe(alerts)
        assert sorted((a.kind, a.status) for a in alerts) == [
            ("fs.unresponsive", "firing"), ("fs.unresponsive", "resolved"),
            ("gpu.stall", "firing"), ("gpu.stall", "resolved")], webhook.describe(alerts)


def test_same_hang_with_logs_on_local_disk_does_not_stall(share, tmp_path, http_receiver):
    logdir = tmp_path / "local-runs" / "exp1"  # the field report's fix: SummaryWriter('/tmp/runs')
    with Processes(tmp_path / "procs") as procs:
        run = StallRun(procs, tmp_path, share.mountpoint, logdir, http_receiver)

        share.block("all")
        hung_at = time.monotonic()
        # The hang is real and seen: the mount is reported unresponsive ...
        run.wait_alert("fs.unresponsive", "firing", PROBE_TIMEOUT_S + 3 * INTERVAL_S + 5)
        # ... but training goes on, so past the time a stall would have fired, none has.
        stall_deadline = hung_at + HEARTBEAT_FRESH_S + STALL_FOR_S + 2 * INTERVAL_S + DELIVERY_SLACK_S
        steps_before = run.progress()["step"]
        wait_until(lambda: time.monotonic() >= stall_deadline, stall_deadline - time.monotonic() + 5,
                   "the window in which a stall would have fired", abort=run.daemon.died)
        assert run.progress()["step"] > steps_before + 10, "the trainer kept computing"
        assert run.heartbeat_age() < HEARTBEAT_FRESH_S
        busy = [v for ts, v in recorded_points(run.daemon.state_dir, "gpu.util:0")]
        assert busy and min(busy[-int(STALL_FOR_S):]) > 0.9, "trainguard saw the GPU busy throughout"
        alerts = run.alerts()
        assert webhook.find(alerts, "gpu.stall") == [], webhook.describe(alerts)
        share.reset()

"""The field scenarios as runs that return what happened; the tests assert on it, ``bench/report`` prints it.

Each run starts real processes under a work directory and ends them by PID
before returning, whatever happens.  Waits are conditions with deadlines; a
condition that never comes true is recorded (``None``), not raised, so the
caller sees everything that did happen.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.scenarios import webhook
from tests.scenarios.harness import (
    TB_TRAINER,
    Processes,
    Trainguard,
    pending_messages,
    recorded_points,
    wait_until,
)
from tests.scenarios.workload import (
    DiskFillWorkload,
    disk_fill_config,
    read_manifest,
    webhook_config,
)
from tests.support.http_receiver import HttpReceiver
from tests.support.slowfs import SlowFs

# ----------------------------------------------------------------------------- scenario A


@dataclass
class DiskFillRun:
    """One run of the disk-filling trainer, with or without trainguard."""

    workload: DiskFillWorkload
    status: int | None  # the trainer's exit status
    output: str  # the trainer's stdout+stderr
    started_at: float  # monotonic: the trainer started writing
    ended_at: float  # monotonic: the trainer exited
    saved: list[dict]  # the manifest: every checkpoint it saved, with its sha256
    alerts: list[webhook.ReceivedAlert] = field(default_factory=list)
    avail: list[tuple[float, float]] = field(default_factory=list)  # the daemon's record of free bytes
    daemon_log: str = ""
    intact: dict[int, bool] = field(default_factory=dict)  # epoch -> checksum matches, for checkpoints still there

    @property
    def deleted(self) -> list[dict]:
        """Checkpoints the trainer saved that are gone (cleanup deleted them)."""
        return [s for s in self.saved if s["epoch"] not in self.intact]

    @property
    def newest_intact(self) -> int:
        """How many of the newest checkpoints, counting back from the last, exist with the right checksum."""
        count = 0
        for entry in reversed(self.saved):
            if not self.intact.get(entry["epoch"]):
                break
            count += 1
        return count

    @property
    def enospc(self) -> bool:
        return "[Errno 28] No space left on device" in self.output

    @property
    def epochs_done(self) -> int:
        return len(self.saved)


def run_disk_fill(workdir: Path, mountpoint: Path, *, workload: DiskFillWorkload = DiskFillWorkload(),
                  receiver: HttpReceiver | None = None, guarded: bool = True,
                  settle_timeout: float = 60.0, extra_config: str = "") -> DiskFillRun:
    """Run the scenario A trainer on ``mountpoint``; with ``guarded``, under a real ``trainguard run``
    (its config: the scenario's, then ``extra_config``).

    After the trainer exits, a guarded run waits (up to ``settle_timeout``) for the
    forecast alert to resolve and then two more cycles, so late or duplicate
    messages are seen too.
    """
    manifest = workdir / "manifest.jsonl"
    avail_series = f"fs.avail_bytes:{mountpoint}"
    with Processes(workdir / "procs") as procs:
        daemon: Trainguard | None = None
        if guarded:
            daemon = procs.trainguard(disk_fill_config(mountpoint, receiver.url if receiver else None) + extra_config)
            wait_until(lambda: len(recorded_points(daemon.state_dir, avail_series)) >= 2, 30,
                       "trainguard watching the disk", abort=daemon.died)
        trainer = procs.python(*workload.trainer_args(mountpoint, manifest), name="trainer")
        started_at = time.monotonic()
        status = trainer.wait(timeout=workload.epochs * workload.epoch_seconds + 60)
        ended_at = time.monotonic()
        if daemon is not None and receiver is not None and status == 0:
            try:
                wait_until(lambda: webhook.find(webhook.received(receiver), "fs.forecast", "resolved"),
                           settle_timeout, "the forecast alert resolving", abort=daemon.died)
            except TimeoutError:
                pass  # recorded by its absence in .alerts
            settle_cycles(daemon, avail_series)
    saved = read_manifest(manifest)
    intact = {s["epoch"]: sha256_of(Path(s["path"])) == s["sha256"] for s in saved if Path(s["path"]).exists()}
    return DiskFillRun(workload, status, trainer.output(), started_at, ended_at, saved,
                       webhook.received(receiver) if receiver else [],
                       recorded_points(daemon.state_dir, avail_series) if daemon else [],
                       daemon.output() if daemon else "", intact)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def settle_cycles(daemon: Trainguard, series: str, cycles: int = 2, interval: float = 1.0) -> None:
    """Wait until the daemon has run ``cycles`` more cycles and delivered everything they queued."""
    since = time.time()
    wait_until(lambda: (recorded_points(daemon.state_dir, series) or [(0.0, 0.0)])[-1][0] > since + cycles * interval
               and pending_messages(daemon.state_dir) == 0,
               15 + cycles * interval, f"{cycles} more daemon cycles and an empty outbox", abort=daemon.died)


# ----------------------------------------------------------------------------- scenario B

GiB = 2**30
B_INTERVAL_S = 1.0
B_STALL_FOR_S = 5.0
B_HEARTBEAT_FRESH_S = 1.0  # the fake GPU reads 0 % once the heartbeat is this old
B_PROBE_TIMEOUT_S = 2.0
B_KEEP_FIRING_S = 2.0
B_DELIVERY_SLACK_S = 1.0  # outbox pick-up and the HTTP round trip
SHARE_NAME = "autodl-fs"


def nvml_script(pid: int, heartbeat: Path) -> dict:
    """One A100 with 76 of 80 GiB held by ``pid``; busy while the heartbeat is fresh, idle once it is stale."""
    return {"gpus": [{
        "name": "NVIDIA A100-SXM4-80GB", "memory_total": 80 * GiB,
        "heartbeat": {"path": str(heartbeat), "fresh_s": B_HEARTBEAT_FRESH_S, "busy": 97, "idle": 0},
        "timeline": [{"at": 0, "mem_used": 76 * GiB, "processes": [{"pid": pid, "used": 76 * GiB}]}],
    }]}


def share_hang_config(share: Path, webhook_url: str) -> str:
    return f"""
[general]
interval = "{B_INTERVAL_S:g}s"

[filesystems]
paths = ["{share}"]
exclude = ["*"]            # only the share: other mounts on a CI host are not this test's business
probe_timeout = "{B_PROBE_TIMEOUT_S:g}s"

[forecast]
enabled = false

[alerts]
keep_firing_for = "{B_KEEP_FIRING_S:g}s"

[gpu]
for = "{B_STALL_FOR_S:g}s"
py_spy = false

[metrics]
listen = ""
""" + webhook_config(webhook_url)


@dataclass
class ShareHangRun:
    """The TensorBoard-style trainer through a hang of the share and its recovery."""

    logdir: Path
    trainer_pid: int
    event_file: str
    hung_at: float  # monotonic: the share stopped answering
    computing_stopped_at: float | None  # monotonic: the trainer's last step before it blocked (None: it never did)
    steps_during_hang: int  # steps the trainer computed while the share was hung
    recovered_at: float  # monotonic: the share answered again
    resumed: bool  # the trainer computed and wrote events again after the recovery
    alerts: list[webhook.ReceivedAlert]
    util_during_hang: list[float]  # what trainguard recorded as GPU utilisation while the share hung
    daemon_log: str
    trainer_output: str

    @property
    def gpu_idle_from(self) -> float | None:
        """When NVML started reading 0 %: the heartbeat's freshness after the last step."""
        return None if self.computing_stopped_at is None else self.computing_stopped_at + B_HEARTBEAT_FRESH_S

    def first(self, kind: str, status: str = "firing") -> webhook.ReceivedAlert | None:
        found = webhook.find(self.alerts, kind, status)
        return found[0] if found else None


def _progress(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"written": 0, "step": 0}


def run_share_hang(workdir: Path, share: SlowFs, receiver: HttpReceiver, *, logs_on_share: bool = True) -> ShareHangRun:
    """Train with TensorBoard logs on the share (or on local disk), hang the share, recover it.

    The hang lasts until the stall alert arrived, or, when none comes, until
    trainguard has run past the time by which it would have fired.
    """
    heartbeat, status_file = workdir / "heartbeat", workdir / "trainer-status.json"
    logdir = (share.mountpoint if logs_on_share else workdir / "local") / "runs" / "exp1"
    with Processes(workdir / "procs") as procs:
        trainer = procs.python(TB_TRAINER, "--logdir", str(logdir), "--heartbeat", str(heartbeat),
                               "--status", str(status_file), name="tb-trainer")
        wait_until(lambda: _progress(status_file)["written"] >= 3, 15, "the trainer writing TensorBoard events",
                   abort=trainer.died)
        nvml = workdir / "nvml.json"
        nvml.write_text(json.dumps(nvml_script(trainer.pid, heartbeat)))
        daemon = procs.trainguard(share_hang_config(share.mountpoint, receiver.url), env=procs.env(fake_nvml=nvml))
        # Healthy first: trainguard must have seen the GPU busy for a whole `for` window, so an
        # alert later is about the hang, not about a daemon that just started.
        wait_until(lambda: sum(v > 0.9 for _, v in recorded_points(daemon.state_dir, "gpu.util:0"))
                   >= B_STALL_FOR_S / B_INTERVAL_S + 1, 30, "trainguard recording the busy GPU", abort=daemon.died)

        def heartbeat_age() -> float:
            return time.time() - heartbeat.stat().st_mtime

        steps_at_hang = _progress(status_file)["step"]
        share.block("all")  # the share stops answering: writes, statfs, everything
        hung_at, hung_wall = time.monotonic(), time.time()
        stall_due = time.time() + B_HEARTBEAT_FRESH_S + B_STALL_FOR_S + 2 * B_INTERVAL_S + B_DELIVERY_SLACK_S
        stopped: list[float] = []

        def stall_seen_or_ruled_out() -> bool:
            age = heartbeat_age()
            if not stopped and age > B_HEARTBEAT_FRESH_S:
                # With logs on the share the writer sticks, its queue fills and add_scalar blocks.
                stopped.append(time.monotonic() - age)
            if webhook.find(webhook.received(receiver), "gpu.stall"):
                return True
            # No stall alert: done once trainguard has sampled past the time it was due, with the trainer
            # still computing (a blocked trainer keeps us waiting, up to the deadline).
            last_sample = (recorded_points(daemon.state_dir, "gpu.util:0") or [(0.0, 0.0)])[-1][0]
            return last_sample > stall_due and age <= B_HEARTBEAT_FRESH_S

        try:
            wait_until(stall_seen_or_ruled_out, stall_due - time.time() + 15,
                       "a stall alert, or the time by which it would have fired", abort=daemon.died)
        except TimeoutError:
            pass
        try:
            wait_until(lambda: webhook.find(webhook.received(receiver), "fs.unresponsive"), 10,
                       "the unresponsive-mount alert", abort=daemon.died)
        except TimeoutError:
            pass
        computing_stopped_at = stopped[0] if stopped else None
        steps_during_hang = _progress(status_file)["step"] - steps_at_hang

        share.reset()  # the share answers again
        recovered_at, recovered_wall = time.monotonic(), time.time()
        written_then = _progress(status_file)["written"]
        resumed = True
        try:
            wait_until(lambda: _progress(status_file)["written"] > written_then + 5, 15, "events being written again",
                       abort=trainer.died)
            fired = {a.kind for a in webhook.received(receiver) if a.status == "firing"}
            wait_until(lambda: fired <= {a.kind for a in webhook.received(receiver) if a.status == "resolved"},
                       B_KEEP_FIRING_S + 20, "every alert resolving", abort=daemon.died)
        except TimeoutError:
            resumed = _progress(status_file)["written"] > written_then + 5
        settle_cycles(daemon, "gpu.util:0")
        event_file = _progress(status_file).get("event_file", "")
    util = recorded_points(daemon.state_dir, "gpu.util:0")
    return ShareHangRun(logdir, trainer.pid, event_file, hung_at, computing_stopped_at, steps_during_hang,
                        recovered_at, resumed, webhook.received(receiver),
                        [v for ts, v in util if hung_wall < ts < recovered_wall], daemon.output(), trainer.output())

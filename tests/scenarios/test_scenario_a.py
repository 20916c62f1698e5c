"""Scenario A, "No space left on device" at hour 30, on a real loop-mounted ext4 disk.

Without trainguard the trainer dies with ``OSError: [Errno 28]``; with a real
``trainguard run`` watching the disk, the forecast warns first, the checkpoint
policy frees space before the disk is full, and the run finishes.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from tests.scenarios import webhook
from tests.scenarios.harness import Processes, missing_feature, recorded_points, wait_until
from tests.scenarios.workload import A_INTERVAL_S, A_KEEP_FIRING_S, DiskFillWorkload, disk_fill_config, read_manifest

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(180)]

WORKLOAD = DiskFillWorkload()


@pytest.mark.parametrize("ext4_mount", [WORKLOAD.fs_bytes], indirect=True)
def test_without_trainguard_the_run_dies_with_enospc(ext4_mount, tmp_path):
    manifest = tmp_path / "manifest.jsonl"
    with Processes(tmp_path) as procs:
        trainer = procs.python(*WORKLOAD.trainer_args(ext4_mount, manifest), name="trainer")
        status = trainer.wait(timeout=WORKLOAD.epochs * WORKLOAD.epoch_seconds + 30)

    assert status == 1
    output = trainer.output()
    assert "OSError: [Errno 28] No space left on device" in output
    assert "in save_checkpoint" in output  # it died saving a checkpoint, like the field report
    saved = read_manifest(manifest)
    assert 0 < len(saved) < WORKLOAD.epochs, "the disk must fill before the last epoch"


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.skipif(bool(missing_feature("trainguard.notify.worker", "trainguard.actions.cleanup")),
                    reason=str(missing_feature("trainguard.notify.worker", "trainguard.actions.cleanup")))
@pytest.mark.parametrize("ext4_mount", [WORKLOAD.fs_bytes], indirect=True)
def test_with_trainguard_the_run_finishes(ext4_mount, tmp_path, http_receiver):
    manifest = tmp_path / "manifest.jsonl"
    avail_series = f"fs.avail_bytes:{ext4_mount}"
    with Processes(tmp_path / "procs") as procs:
        daemon = procs.trainguard(disk_fill_config(ext4_mount, http_receiver.url))
        wait_until(lambda: len(recorded_points(daemon.state_dir, avail_series)) >= 2, 20,
                   "trainguard watching the disk", abort=daemon.died)
        trainer = procs.python(*WORKLOAD.trainer_args(ext4_mount, manifest), name="trainer")
        status = trainer.wait(timeout=WORKLOAD.epochs * WORKLOAD.epoch_seconds + 60)
        assert status == 0, trainer.output()[-3000:]
        finished_at = time.monotonic()
        # Writing stopped, the trend flattens: the forecast alert resolves on its own.
        resolved = wait_until(lambda: webhook.find(webhook.received(http_receiver), "fs.forecast", "resolved"),
                              A_KEEP_FIRING_S + 45, "the forecast alert resolving", abort=daemon.died)[0]
        # Two more cycles (and their deliveries), so a late duplicate would be seen.
        seen_at = time.time()
        wait_until(lambda: recorded_points(daemon.state_dir, avail_series)[-1][0] > seen_at + 2 * A_INTERVAL_S,
                   10, "two more cycles", abort=daemon.died)

    # The run finished every epoch; it never saw ENOSPC.
    assert f"finished {WORKLOAD.epochs} epochs" in trainer.output()
    assert "Errno 28" not in trainer.output()
    avail = [v for _, v in recorded_points(daemon.state_dir, avail_series)]
    assert min(avail) > 0, "the disk was full at some point"

    # The newest checkpoints are intact; whatever is left is exactly what was written.
    saved = read_manifest(manifest)
    assert [s["epoch"] for s in saved] == list(range(1, WORKLOAD.epochs + 1))
    for entry in saved[-3:]:
        assert Path(entry["path"]).exists(), f"newest checkpoint {entry['path']} was deleted"
    left = [s for s in saved if Path(s["path"]).exists()]
    for entry in left:
        assert sha256_of(Path(entry["path"])) == entry["sha256"], f"{entry['path']} is corrupt"
    assert len(left) < len(saved), "cleanup deleted nothing: the disk could not have filled"

    # The person on call got three messages, each once: the warning, what was done, the all-clear.
    alerts = webhook.received(http_receiver)
    assert webhook.duplicates(alerts) == [], webhook.describe(alerts)
    assert sorted((a.kind, a.status) for a in alerts) == sorted([
        ("fs.forecast", "firing"), ("cleanup.report", "firing"), ("fs.forecast", "resolved")]), (
        webhook.describe(alerts))
    [warning] = webhook.find(alerts, "fs.forecast", "firing")
    [report] = webhook.find(alerts, "cleanup.report", "firing")
    assert warning.severity == "warning"
    assert warning.details["mountpoint"] == str(ext4_mount)
    assert 0 < warning.details["eta_seconds"] <= 60
    # The warning came first, while there was still room; cleanup came before the disk was full.
    assert warning.arrived_at < report.arrived_at < finished_at
    assert warning.details["used_ratio"] < 0.75
    [root] = report.details["roots"]
    freed = root["bytes"]
    assert freed >= 3 * WORKLOAD.ckpt_bytes
    assert freed == sum(s["size"] for s in saved if not Path(s["path"]).exists())
    assert root["usage_before"] < 1.0 and root["usage_after"] < root["usage_before"]
    assert "freed" in report.summary and str(ext4_mount) in report.summary
    assert resolved.arrived_at > finished_at

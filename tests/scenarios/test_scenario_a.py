"""Scenario A, "No space left on device" at hour 30, on a real loop-mounted ext4 disk.

Without trainguard the trainer dies with ``OSError: [Errno 28]``; with a real
``trainguard run`` watching the disk, the forecast warns first, the checkpoint
policy frees space before the disk is full, the run finishes with its newest
checkpoints intact, and the on-call person gets three messages, each once.
"""

from __future__ import annotations

import pytest

from tests.scenarios import webhook
from tests.scenarios.runs import run_disk_fill
from tests.scenarios.workload import DiskFillWorkload

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(180)]

WORKLOAD = DiskFillWorkload()


@pytest.mark.parametrize("ext4_mount", [WORKLOAD.fs_bytes], indirect=True)
def test_without_trainguard_the_run_dies_with_enospc(ext4_mount, tmp_path):
    run = run_disk_fill(tmp_path, ext4_mount, workload=WORKLOAD, guarded=False)

    assert run.status == 1
    assert run.enospc, run.output[-3000:]
    assert "in save_checkpoint" in run.output  # it died saving a checkpoint, like the field report
    assert 0 < run.epochs_done < WORKLOAD.epochs, "the disk must fill before the last epoch"


@pytest.mark.parametrize("ext4_mount", [WORKLOAD.fs_bytes], indirect=True)
def test_with_trainguard_the_run_finishes(ext4_mount, tmp_path, http_receiver):
    run = run_disk_fill(tmp_path, ext4_mount, workload=WORKLOAD, receiver=http_receiver)

    # The run finished every epoch; the disk never filled.
    assert run.status == 0, run.output[-3000:]
    assert f"finished {WORKLOAD.epochs} epochs" in run.output and not run.enospc
    assert run.avail and min(v for _, v in run.avail) > 0, "the disk was full at some point"

    # The newest checkpoints are intact; whatever is left is exactly what was written.
    assert [s["epoch"] for s in run.saved] == list(range(1, WORKLOAD.epochs + 1))
    assert run.newest_intact >= 3, f"newest checkpoints missing or corrupt: {run.intact}"
    assert all(run.intact.values()), f"corrupt checkpoints: {run.intact}"
    assert run.deleted, "cleanup deleted nothing: then the disk could not have survived"

    # Three messages, each once: the warning, what was done about it, the all-clear.
    alerts = run.alerts
    assert webhook.duplicates(alerts) == [], webhook.describe(alerts)
    assert sorted((a.kind, a.status) for a in alerts) == sorted([
        ("fs.forecast", "firing"), ("cleanup.report", "firing"), ("fs.forecast", "resolved")]), (
        webhook.describe(alerts))
    [warning] = webhook.find(alerts, "fs.forecast", "firing")
    [report] = webhook.find(alerts, "cleanup.report", "firing")
    [resolved] = webhook.find(alerts, "fs.forecast", "resolved")
    assert warning.severity == "warning"
    assert warning.details["mountpoint"] == str(ext4_mount)
    assert 0 < warning.details["eta_seconds"] <= 60
    # The warning came first, while there was still room; cleanup came before the disk was full.
    assert warning.details["used_ratio"] < 0.75
    assert run.started_at < warning.arrived_at < report.arrived_at < run.ended_at < resolved.arrived_at
    [root] = report.details["roots"]
    assert root["bytes"] == sum(s["size"] for s in run.deleted) >= 3 * WORKLOAD.ckpt_bytes
    assert root["usage_before"] < 1.0 and root["usage_after"] < root["usage_before"]
    assert "freed" in report.summary and str(ext4_mount) in report.summary

"""Scenario A, "No space left on device" at hour 30, on a real loop-mounted ext4 disk.

Without trainguard the trainer dies with ``OSError: [Errno 28]``; with a real
``trainguard run`` watching the disk, the forecast warns first, the checkpoint
policy frees space before the disk is full, the run finishes with its newest
checkpoints intact, and the on-call person gets three messages, each once.

The variant with many small files: most of the disk is a cache of small old files (the shape of a
pip cache or /tmp), more of them than max_delete's default 10,000, and an age policy on it with the
scenario's watermark. Its run frees what reaching `low` needs, oldest first, and the trainer finishes
(it used to be refused whole, "would exceed max_delete", and the disk filled).
"""

from __future__ import annotations

import os
import time

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


SMALL = DiskFillWorkload(epochs=8)
SMALL_FILES = 10_300  # 40 MiB of 4 KiB files: 74 % of the disk, under `high` until the first checkpoint
# The scenario's watermark; every other setting at its default but what a tree built seconds ago needs
# (its ctimes are now): age_by = ["mtime"], grace = "0s". max_delete stays 10,000 files.
SMALL_POLICY = """
[[cleanup]]
name = "cache"
type = "age"
roots = ["{root}"]
watermark = true
high = "75%"
low = "20%"
age_by = ["mtime"]
grace = "0s"
"""


def small_old_files(root, count: int) -> list:
    """count 4 KiB files, 1,000 a directory, all a month old (written by one install, as a cache is)."""
    old = time.time() - 30 * 86400
    made = []
    for i in range(count):
        path = root / f"{i // 1000:02x}" / f"{i:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"c" * 4096)
        os.utime(path, (old, old))
        made.append(path)
    return made


@pytest.mark.parametrize("ext4_mount", [SMALL.fs_bytes], indirect=True)
def test_with_many_small_old_files_the_run_finishes(ext4_mount, tmp_path, http_receiver):
    cache = ext4_mount / "cache"
    made = small_old_files(cache, SMALL_FILES)
    run = run_disk_fill(tmp_path, ext4_mount, workload=SMALL, receiver=http_receiver,
                        extra_config=SMALL_POLICY.format(root=cache))

    assert run.status == 0 and not run.enospc, run.output[-3000:] + run.daemon_log[-3000:]
    assert f"finished {SMALL.epochs} epochs" in run.output
    assert all(run.intact.values()) and run.newest_intact >= 3
    gone = [p.exists() for p in made].count(False)
    assert 0 < gone < SMALL_FILES, "what reaching low needed, not every due file"
    keys = {a.key for a in run.alerts}
    assert "cleanup.report:cache" in keys and not {"cleanup.guard:cache", "cleanup.bounded:cache"} & keys, keys

"""Scenario A, "No space left on device" at hour 30, on a real loop-mounted ext4 disk.

Without trainguard the trainer dies with ``OSError: [Errno 28]``; with a real
``trainguard run`` watching the disk, the forecast warns first, the checkpoint
policy frees space before the disk is full, and the run finishes.
"""

from __future__ import annotations

import pytest

from tests.scenarios.harness import Processes
from tests.scenarios.workload import DiskFillWorkload, read_manifest

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

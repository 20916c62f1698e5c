"""only_if_mirrored: a checkpoint goes only when the mirror's share holds an identical copy."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from trainguard import config

from tests.test_cleanup import DAY, make, names, runner


def load(tmp_path: Path, dest: Path, mirror_name: str = "share"):
    cfg = config.parse({
        "mirror": [{"name": "share", "source": str(tmp_path / "runs"), "dest": str(dest)}],
        "cleanup": [{"name": "ckpt", "type": "checkpoints", "roots": [str(tmp_path / "runs")], "keep_last": 1,
                     "only_if_mirrored": mirror_name}],
    }, "test")
    return cfg.cleanup[0], cfg.mirror


def copy_tree(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)


def test_only_if_mirrored_must_name_a_mirror(tmp_path):
    with pytest.raises(config.ConfigError, match="only_if_mirrored = 'nope' names no \\[\\[mirror\\]\\]"):
        load(tmp_path, tmp_path / "share", "nope")


def test_only_checkpoints_with_an_identical_copy_are_deleted(tmp_path):
    runs, share = tmp_path / "runs", tmp_path / "share"
    for step, age in ((1, 9), (2, 8), (3, 7), (9, 1)):
        make(runs / "r" / f"step{step}.pt", 4096, age=age * DAY)
    for step, age in ((100, 6), (200, 5)):
        make(runs / "r" / f"checkpoint-{step}" / "model.safetensors", 4096, age=age * DAY)
        make(runs / "r" / f"checkpoint-{step}" / "sub" / "optim.bin", 2048, age=age * DAY)
    copy_tree(runs / "r" / "step1.pt", share / "r" / "step1.pt")  # identical
    copy_tree(runs / "r" / "step2.pt", share / "r" / "step2.pt")
    os.utime(share / "r" / "step2.pt", (time.time(), time.time()))  # same size, other mtime
    copy_tree(runs / "r" / "checkpoint-100", share / "r" / "checkpoint-100")  # every file
    copy_tree(runs / "r" / "checkpoint-200", share / "r" / "checkpoint-200")
    (share / "r" / "checkpoint-200" / "sub" / "optim.bin").unlink()  # one file short
    pol, mirrors = load(tmp_path, share)
    dry = runner(tmp_path, DAY, mirrors=mirrors).run(pol, dry_run=True)
    assert sorted(os.path.basename(i.path) for i in dry.items) == ["checkpoint-100", "step1.pt"]
    report = runner(tmp_path, DAY, mirrors=mirrors).run(pol)
    assert names(runs / "r") >= {"step2.pt", "step3.pt", "step9.pt", "checkpoint-200"}
    assert "step1.pt" not in names(runs / "r") and "checkpoint-100" not in names(runs / "r")
    assert report.files == 3 and report.skipped["not-mirrored"] == 3, report.skipped
    assert (share / "r" / "step1.pt").exists()  # nothing is ever deleted on the share


def test_a_hung_mirror_keeps_everything_and_the_run_finishes(tmp_path, slowfs):
    runs = tmp_path / "runs"
    for step, age in ((1, 9), (2, 8), (9, 1)):
        make(runs / "r" / f"step{step}.pt", 4096, age=age * DAY)
        copy_tree(runs / "r" / f"step{step}.pt", slowfs.mountpoint / "r" / f"step{step}.pt")
    pol, mirrors = load(tmp_path, slowfs.mountpoint)
    slowfs.block("getattr")
    try:
        started = time.monotonic()
        report = runner(tmp_path, DAY, mirrors=mirrors, mirror_timeout=1.0).run(pol)
        assert time.monotonic() - started < 10
    finally:
        slowfs.unblock("getattr")
    assert names(runs / "r") == {"step1.pt", "step2.pt", "step9.pt"}
    assert report.files == 0 and report.skipped["not-mirrored"] == 2

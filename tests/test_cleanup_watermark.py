"""A disk full of small old files (a pip cache, /tmp, a tokenizer cache) and an age policy with a
watermark, on a real 100 MiB tmpfs, through the real `trainguard` command: one cycle frees what
reaching `low` needs, oldest first, never "nothing deleted"; max_delete only bounds a run, which
says so, and the next cycle goes on.

The policies set, besides the issue's own high/low, only what a tree built seconds ago needs: every
file's ctime is its build time, so age_by = ["mtime"] and grace = "0s" (the defaults would keep every
file as young); max_delete stays at its default, 10,000 files.
"""

from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path

import pytest
from trainguard.actions.cleanup.guard import bytes_above
from trainguard.sources.fs import usage_from_statvfs

from tests.support.cli import Daemon, trainguard

pytestmark = [pytest.mark.root, pytest.mark.timeout(240)]

DAY = 86400.0
FILES = 22_000
PAGE = 4096
MIB_100 = 100 * 2**20


def build(cache: Path, files: int = FILES, distinct: bool = True) -> list[Path]:
    """`files` 4 KiB files, 1,000 a directory, a month old or more; with distinct ages file i is
    older than file i + 1 (an hour apart), else all share one age. Oldest first."""
    now = time.time()
    made = []
    for i in range(files):
        folder = cache / f"d{i // 1000:03d}"
        if i % 1000 == 0:
            folder.mkdir(parents=True)
        path = folder / f"f{i:06d}"
        path.write_bytes(b"x" * PAGE)
        t = now - 30 * DAY - ((files - i) * 3600.0 if distinct else 0.0)
        os.utime(path, (t, t))
        made.append(path)
    return made


def usage(mount: Path):
    return usage_from_statvfs(os.statvfs(mount))


def config(tmp_path: Path, mount: Path, low: str, interval: str = "10s", more: str = "") -> Path:
    path = tmp_path / "config.toml"
    path.write_text(f"""
[general]
interval = "{interval}"

[filesystems]
paths = ["{mount}"]
exclude = ["*"]

[gpu]
enabled = false

[metrics]
listen = ""

[[cleanup]]
name = "cache"
type = "age"
roots = ["{mount / 'cache'}"]
watermark = true
high = "85%"
low = "{low}"
age_by = ["mtime"]
grace = "0s"
{more}""")
    return path


def left(made: list[Path]) -> list[bool]:
    return [p.exists() for p in made]


@pytest.mark.parametrize("tmpfs_mount", [MIB_100], indirect=True)
@pytest.mark.parametrize("distinct", [True, False], ids=["distinct-ages", "one-age"])
def test_one_cycle_frees_what_low_needs_oldest_first(tmpfs_mount, tmp_path, distinct):
    made = build(tmpfs_mount / "cache", distinct=distinct)
    before = usage(tmpfs_mount)
    assert before.used_ratio >= 0.86 - 0.005, before
    needed = math.ceil(bytes_above(before, 0.80) / PAGE)

    once = trainguard("--config", str(config(tmp_path, tmpfs_mount, "80%")), "--state-dir", str(tmp_path / "state"),
                      "run", "--once")

    assert usage(tmpfs_mount).used_ratio <= 0.80, once.stdout + once.stderr
    still = left(made)
    assert still.count(False) == needed < FILES / 10, "it deletes what reaching low needs, not every due file"
    if distinct:  # the oldest went, and only they
        assert still == [False] * needed + [True] * (FILES - needed)
    assert f"(cache: {needed} files) (cleanup.report:cache)" in once.stdout, once.stdout
    assert "nothing deleted" not in once.stdout + once.stderr


@pytest.mark.parametrize("tmpfs_mount", [MIB_100], indirect=True)
def test_past_max_delete_a_run_deletes_up_to_the_bound_says_so_and_the_next_cycle_goes_on(tmpfs_mount, tmp_path):
    made = build(tmpfs_mount / "cache")
    needed = math.ceil(bytes_above(usage(tmpfs_mount), 0.30) / PAGE)
    assert needed > 10_000
    cfg = config(tmp_path, tmpfs_mount, "30%", interval="1s")

    now = f"a watermark run now takes 10000 files (39.1 MiB), oldest first, of about {needed} files"
    dry = trainguard("--config", str(cfg), "cleanup", "--dry-run")
    assert now in dry.stdout, dry.stdout
    (tmp_path / "s").mkdir()
    scheduled = config(tmp_path / "s", tmpfs_mount, "30%", more='schedule = "1d"')  # its dry run is the plain one
    dry = trainguard("--config", str(scheduled), "cleanup", "--dry-run")
    assert "stopped, nothing deleted: 22000 files" in dry.stdout and now in dry.stdout, dry.stdout
    assert all(left(made)), "a dry run deletes nothing"

    with Daemon("--config", str(cfg), "--state-dir", str(tmp_path / "state")) as daemon:
        first = daemon.wait_for(r"cleanup cache \(watermark\) freed .* \((\d+) files\)", timeout=60)
        assert first.group(1) == "10000"
        bounded = daemon.wait_for(r"WARNING .*FIRING \[warning\] cleanup cache: max_delete 10000 files reached: "
                                  r"10000 of about (\d+) files deleted, oldest first; .* more to free to reach 30%; "
                                  r"raise max_delete for this policy \(cleanup\.bounded:cache\)", timeout=20)
        assert int(bounded.group(1)) == needed
        at = daemon.lines.index(next(line for line in daemon.lines if first.group(0) in line))
        then = daemon.wait_for(r"cleanup cache \(watermark\) freed .* \((\d+) files\)", timeout=30, after=at + 1)
        assert int(then.group(1)) == needed - 10_000
        assert daemon.stop() == 0

    assert usage(tmpfs_mount).used_ratio <= 0.30
    assert left(made) == [False] * needed + [True] * (FILES - needed)  # oldest first, across both runs
    assert not re.search("nothing deleted", daemon.stderr)

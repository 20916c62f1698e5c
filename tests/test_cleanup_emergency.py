"""An emergency blocked by one big unit: a 200 MiB tmpfs at 88 % holding ten DeepSpeed-style
global_step* directories of 1,500 shards each, a checkpoints policy with keep_last 2, watermark
85 % -> 60 % and the default max_delete (1,000 files), through the real `trainguard` command.

Each unit alone is past max_delete. A watermark run (the disk is filling) still takes its oldest unit
whole, never half of it, and says so; the units after it go only within the bound, so the next
cycles go on one unit each until the disk is at `low`. A due watermark wins over a due schedule.
The expected units are worked out here from the tree itself: oldest step first, whole units,
until what they hold frees what reaching `low` needs.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from trainguard.actions.cleanup.runner import CleanupReport, RootReport, findings_for
from trainguard.i18n import tr
from trainguard.notify.texts import texts_for
from trainguard.sources.fs import usage_from_statvfs

from tests.support.cli import Daemon, trainguard

pytestmark = pytest.mark.timeout(300)

MIB_200 = 200 * 2**20
UNITS, SHARDS, SHARD = 10, 1500, 11 * 1024  # 12 KiB a shard on tmpfs: the ten fill it to 88 %


def build(runs: Path) -> list[Path]:
    """global_step100 .. global_step1000, a minute apart, oldest first."""
    now = time.time() - 3600
    made = []
    for i in range(UNITS):
        unit = runs / f"global_step{(i + 1) * 100}"
        unit.mkdir(parents=True)
        for j in range(SHARDS):
            (unit / f"zero_pp_rank_{j}_mp_rank_00_optim_states.pt").write_bytes(b"x" * SHARD)
        t = now + 60 * i
        os.utime(unit, (t, t))
        made.append(unit)
    return made


def used(mount: Path) -> float:
    return usage_from_statvfs(os.statvfs(mount)).used_ratio


def unit_bytes(unit: Path) -> int:
    return sum(os.lstat(p).st_blocks * 512 for p in unit.iterdir())


def expected_gone(mount: Path, made: list[Path], low: float, keep_last: int) -> int:
    """How many of the oldest units reaching low takes, whole units, oldest first (plain arithmetic)."""
    st = os.statvfs(mount)
    used_b, avail = (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_bavail * st.f_frsize
    need = used_b - low * (used_b + avail)
    freed = 0
    for count, unit in enumerate(made[:-keep_last], start=1):
        freed += unit_bytes(unit)
        if freed >= need:
            return count
    return len(made) - keep_last


def config(tmp_path: Path, mount: Path, interval: str = "10s", more: str = "") -> Path:
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
name = "ckpt"
type = "checkpoints"
roots = ["{mount / 'runs'}"]
keep_last = 2
watermark = true
high = "85%"
low = "60%"
grace = "0s"
{more}""")
    return path


def whole(unit: Path) -> bool:
    """A unit is there with every shard, or not there at all: never half a checkpoint."""
    if not unit.exists():
        return False
    assert len(os.listdir(unit)) == SHARDS, f"{unit.name} was cut"
    return True


@pytest.mark.root
@pytest.mark.parametrize("tmpfs_mount", [MIB_200], indirect=True)
def test_one_cycle_takes_the_oldest_unit_whole_and_says_so(tmpfs_mount, tmp_path):
    made = build(tmpfs_mount / "runs")
    before = used(tmpfs_mount)
    assert 0.87 <= before < 0.89, before
    dry = trainguard("--config", str(config(tmp_path, tmpfs_mount)), "cleanup", "--dry-run")
    assert "would take global_step100 whole (1,500 files) though max_delete is 1,000 files" in dry.stdout, dry.stdout
    assert all(whole(u) for u in made)

    once = trainguard("--config", str(config(tmp_path, tmpfs_mount)), "--state-dir", str(tmp_path / "state"),
                      "run", "--once")

    out = once.stdout + once.stderr
    assert [whole(u) for u in made] == [False] + [True] * (UNITS - 1), out
    assert used(tmpfs_mount) < before - 0.08
    said = (f"took global_step100 whole (1,500 files) though max_delete is 1,000 files: the disk was at "
            f"{before * 100:.1f}%")
    assert said in once.stdout, out
    assert "0 of about" not in out and "nothing deleted" not in out


@pytest.mark.root
@pytest.mark.parametrize("tmpfs_mount", [MIB_200], indirect=True)
def test_the_next_cycles_go_on_a_unit_each_down_to_low(tmpfs_mount, tmp_path):
    made = build(tmpfs_mount / "runs")
    gone = expected_gone(tmpfs_mount, made, 0.60, keep_last=2)
    assert 2 <= gone < UNITS - 2

    with Daemon("--config", str(config(tmp_path, tmpfs_mount, interval="1s")),
                "--state-dir", str(tmp_path / "state")) as daemon:
        for n in range(gone):
            daemon.wait_for(r"cleanup ckpt \(watermark\) freed .* \(1500 files\)", timeout=60,
                            after=_after_run(daemon, n))
        deadline = time.monotonic() + 30
        while used(tmpfs_mount) > 0.60 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert daemon.stop() == 0

    assert used(tmpfs_mount) <= 0.60, daemon.stderr[-3000:]
    assert [whole(u) for u in made] == [False] * gone + [True] * (UNITS - gone), daemon.stderr[-3000:]


def _after_run(daemon: Daemon, n: int) -> int:
    """The index just past the n-th watermark run's line (0: from the start)."""
    runs = [i for i, line in enumerate(daemon.lines) if re.search(r"cleanup ckpt \(watermark\) freed", line)]
    return runs[n - 1] + 1 if n else 0


@pytest.mark.root
@pytest.mark.parametrize("tmpfs_mount", [MIB_200], indirect=True)
def test_a_due_watermark_wins_over_a_due_schedule(tmpfs_mount, tmp_path):
    made = build(tmpfs_mount / "runs")
    cfg = config(tmp_path, tmpfs_mount, more='schedule = "1d"')

    once = trainguard("--config", str(cfg), "--state-dir", str(tmp_path / "state"), "run", "--once")

    out = once.stdout + once.stderr
    assert "cleanup ckpt (watermark) freed" in out, out
    assert "stopped, nothing deleted" not in out, "the plain, refusable run went first"
    assert [whole(u) for u in made] == [False] + [True] * (UNITS - 1), out


def test_the_alert_says_which_unit_went_whole_in_english_and_chinese():
    report = CleanupReport("ckpt", "checkpoints", "watermark", False, 0.0, 1.0,
                           (RootReport("/data/runs", "/data", 1500, 18 * 2**20, 0.879, 0.79),), 1500, 18 * 2**20,
                           bounded="took global_step3 whole", needed_files=6000, needed_bytes=70 * 2**20,
                           max_delete="1000 files", goal="low", goal_value=0.6, whole=("global_step3", 1500, 0.879))
    bounded = next(f for f in findings_for(report) if f.kind == "cleanup.bounded")
    en, zh = texts_for(bounded, tr("en")), texts_for(bounded, tr("zh"))
    assert en.fact == "cleanup ckpt took global_step3 whole (1,500 files) though max_delete is 1000 files"
    assert "The disk was at 87.9%" in en.what and "52.0 MiB more" in en.what
    assert "global_step3" in zh.fact and "1,500" in zh.fact and "整个删除" in zh.fact
    assert not en.fallback and not zh.fallback


@pytest.mark.root
@pytest.mark.parametrize("tmpfs_mount", [16 * 2**20], indirect=True)
def test_a_cache_unit_past_max_delete_goes_whole_in_an_emergency_and_only_the_first(tmpfs_mount):
    from trainguard import config
    from trainguard.actions.cleanup.runner import CleanupRunner

    cache, now = tmpfs_mount / "datasets", time.time()
    made = []
    for i in range(4):  # four prepared datasets of 300 arrow files, a day apart, the oldest first
        unit = cache / f"dataset_{i}"
        unit.mkdir(parents=True)
        for j in range(300):
            path = unit / f"data-{j:05d}.arrow"
            path.write_bytes(b"x" * SHARD)
            t = now - (10 - i) * 86400
            os.utime(path, (t, t))
        made.append(unit)
    assert used(tmpfs_mount) >= 0.85
    pol = config.parse({"cleanup": [{"name": "ds", "type": "huggingface-datasets-cache", "roots": [str(cache)],
                                     "watermark": True, "high": "85%", "low": "60%", "grace": "0s",
                                     "max_delete": 100}]}, "test").cleanup[0]

    report = CleanupRunner([pol], homes=frozenset()).run(pol, trigger="watermark")

    assert [u.exists() for u in made] == [False, True, True, True], report
    assert all(len(os.listdir(u)) == 300 for u in made[1:])
    assert report.files == 300 and report.whole is not None and report.whole[:2] == ("dataset_0", 300)
    assert report.bounded.startswith("took dataset_0 whole (300 files) though max_delete is 100 files")


@pytest.mark.root
@pytest.mark.parametrize("tmpfs_mount", [16 * 2**20], indirect=True)
def test_an_emergency_never_takes_a_unit_in_use_whole_it_takes_the_next(tmpfs_mount, tmp_path):
    from trainguard import config
    from trainguard.actions.cleanup.runner import CleanupRunner

    from tests.test_cleanup import holder

    runs, now = tmpfs_mount / "runs", time.time() - 3600
    made = []
    for i in range(4):
        unit = runs / f"global_step{(i + 1) * 100}"
        unit.mkdir(parents=True)
        for j in range(300):
            (unit / f"shard_{j}.pt").write_bytes(b"x" * SHARD)
        os.utime(unit, (now + 60 * i, now + 60 * i))
        made.append(unit)
    assert used(tmpfs_mount) >= 0.85
    pol = config.parse({"cleanup": [{"name": "ckpt", "type": "checkpoints", "roots": [str(runs)], "keep_last": 1,
                                     "watermark": True, "high": "85%", "low": "60%", "grace": "0s",
                                     "max_delete": 100}]}, "test").cleanup[0]
    with holder(made[0] / "shard_7.pt", "open"):
        report = CleanupRunner([pol], homes=frozenset()).run(pol, trigger="watermark")
        assert [u.exists() for u in made] == [True, False, True, True], report
        assert len(os.listdir(made[0])) == 300  # in use: not even a candidate, never cut
        assert report.whole is not None and report.whole[:2] == ("global_step200", 300)


@pytest.mark.root
@pytest.mark.parametrize("tmpfs_mount", [16 * 2**20], indirect=True)
def test_a_detached_hub_revision_past_max_delete_goes_whole_in_an_emergency(tmpfs_mount):
    from trainguard import config
    from trainguard.actions.cleanup.runner import CleanupRunner

    from tests.test_cleanup_hf import blob, hf_repo, snapshot

    hub = tmpfs_mount / "hub"
    repo = hf_repo(hub, "models--org--m", recent_days=0.5, old_days=30)
    own = {f"shard-{i:02d}.safetensors": f"w_old_{i:02d}" for i in range(50)}
    for name in own.values():
        blob(repo, name, 4096, 40)
    snapshot(repo, "cccc", own)  # a second detached revision, the oldest, of 50 shards of its own
    with open(tmpfs_mount / "filler", "wb") as fh:  # the rest of the disk: not the cache's
        fh.write(b"f" * int(14.2 * 2**20))
    assert used(tmpfs_mount) >= 0.85
    pol = config.parse({"cleanup": [{"name": "hub", "type": "huggingface-cache", "roots": [str(hub)],
                                     "watermark": True, "high": "85%", "low": "60%", "grace": "0s",
                                     "max_delete": 10}]}, "test").cleanup[0]

    report = CleanupRunner([pol], homes=frozenset()).run(pol, trigger="watermark")

    left = {p.name for p in (repo / "blobs").iterdir()}
    assert not (repo / "snapshots" / "cccc").exists() and not left & set(own.values()), report
    assert report.whole is not None and report.whole[:2] == ("models--org--m@cccc", 51), report
    assert (repo / "snapshots" / "bbbb").exists() and "w_old" in left  # within the bound: nothing after it
    assert (repo / "snapshots" / "aaaa").exists() and {"shared", "w_main"} <= left
    assert report.files == 51

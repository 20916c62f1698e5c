"""Runs that must free space (a watermark, a size cap), for every kind, on real filesystems: only what
the need takes, oldest first; max_delete bounds such a run and is never a reason to delete nothing.
The property: over generated files, ages and usages above `high`, a watermark run frees at least
min(need, what max_delete allows) and never deletes a newer file while an older eligible one stays."""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from trainguard import config
from trainguard.actions.cleanup.guard import bytes_above
from trainguard.actions.cleanup.runner import CleanupRunner, findings_for
from trainguard.sources.fs import usage_from_statvfs

DAY = 86400.0
PAGE = 4096


def policy(**kw):
    kw.setdefault("name", "p")
    return config.parse({"cleanup": [kw]}, "test").cleanup[0]


def runner(clock_offset: float = DAY) -> CleanupRunner:
    return CleanupRunner([], clock=lambda: time.time() + clock_offset, homes=frozenset({"/root"}))


def usage(path: Path):
    return usage_from_statvfs(os.statvfs(path))


def make(path: Path, pages: int, age: float, now: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * PAGE * pages)
    os.utime(path, (now - age, now - age))
    return path


def pad_to(fs: Path, ratio: float) -> None:
    """A file outside the roots that brings the filesystem to about `ratio` used."""
    u = usage(fs)
    extra = int(ratio * (u.used_bytes + u.avail_bytes)) - u.used_bytes
    if extra > 0:
        with open(fs / "pad", "ab") as fh:
            fh.write(b"\0" * extra)


# ------------------------------------------------------------------ the property

FILE = st.tuples(st.integers(0, 4), st.integers(0, 90))  # (pages, age in hours): ties, empty files, young ones


@pytest.mark.root
@pytest.mark.parametrize("tmpfs_mount", [2 * 2**20], indirect=True)
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(files=st.lists(FILE, min_size=5, max_size=40), used=st.floats(0.86, 0.98), low=st.sampled_from([0.1, 0.5, 0.8]),
       max_delete=st.one_of(st.none(), st.integers(0, 20)))
@example(files=[(1, 30)] * 30, used=0.9, low=0.1, max_delete=10)  # one age, the bound below the need
@example(files=[(0, 0)] * 3 + [(0, 24), (1, 25)], used=0.875, low=0.1, max_delete=1)  # refused whole, before

def test_a_watermark_run_frees_what_it_may_oldest_first(tmpfs_mount, files, used, low, max_delete):
    fs = tmpfs_mount
    for entry in fs.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    now = time.time()
    paths = {make(fs / "root" / f"d{i % 3}" / f"f{i}", pages, hours * 3600.0, now): (pages * PAGE, hours * 3600.0)
             for i, (pages, hours) in enumerate(files)}
    pad_to(fs, used)
    before = usage(fs)
    need = bytes_above(before, low)
    pol = policy(type="age", roots=[str(fs / "root")], older_than="1d", age_by=["mtime"], grace="0s", watermark=True,
                 high="85%", low=f"{low:.0%}", max_delete=False if max_delete is None else max_delete)

    report = runner(0.0).run(pol, trigger="watermark")

    gone = {p: v for p, v in paths.items() if not p.exists()}
    kept = {p: v for p, v in paths.items() if p.exists()}
    eligible = sorted((v for v in paths.values() if v[1] >= DAY), key=lambda v: -v[1])
    allowed = sum(b for b, _a in eligible[:max_delete])  # the oldest max_delete files (all: no bound)
    freed = sum(b for b, _a in gone.values())
    assert freed == report.bytes and len(gone) == report.files
    assert freed >= min(need, allowed)
    assert all(age >= DAY for _b, age in gone.values()), "a watermark run takes only due files"
    if gone:  # never a newer file while an older eligible one stays
        assert min(a for _b, a in gone.values()) >= max((a for _b, a in kept.values() if a >= DAY), default=0.0)
        youngest = min(gone.values(), key=lambda v: v[1])
        assert freed - youngest[0] < need or youngest[0] == 0, "nothing beyond what the need takes"
    if max_delete is not None:
        assert len(gone) <= max_delete


# ------------------------------------------------------------------ the kinds


@pytest.mark.root
@pytest.mark.parametrize("tmpfs_mount", [100 * 2**20], indirect=True)
def test_checkpoints_free_what_low_needs_and_stop_at_their_bound(tmpfs_mount):
    """2,000 checkpoints of 44 KiB at 86 %: to 80 % takes ~140 of them, oldest steps first, under the
    kind's default max_delete (1,000); to 30 % takes more than that: 1,000 go, and the run says so."""
    now = time.time()
    run = tmpfs_mount / "run"
    for step in range(1, 2001):
        make(run / f"step{step}.pt", 11, (3000 - step) * 60.0, now)
    pad_to(tmpfs_mount, 0.86)
    need = bytes_above(usage(tmpfs_mount), 0.80)
    report = runner().run(policy(type="checkpoints", roots=[str(tmpfs_mount)], watermark=True, high="85%", low="80%"),
                          trigger="watermark")
    assert report.files == math.ceil(need / (11 * PAGE)) and usage(tmpfs_mount).used_ratio <= 0.80
    assert sorted(int(p.stem[4:]) for p in run.iterdir())[0] == report.files + 1  # the oldest steps went
    assert not report.bounded and [f.kind for f in findings_for(report)] == ["cleanup.report"]

    report = runner().run(policy(type="checkpoints", roots=[str(tmpfs_mount)], watermark=True, high="80%", low="30%"),
                          trigger="watermark")
    assert report.files == 1000 and report.needed_files > 1000
    assert sorted(int(p.stem[4:]) for p in run.iterdir())[0] == 1000 + math.ceil(need / (11 * PAGE)) + 1
    assert "max_delete 1000 files reached" in report.bounded
    assert {f.kind for f in findings_for(report)} == {"cleanup.report", "cleanup.bounded"}


def test_a_size_cap_takes_the_oldest_until_the_cache_fits_bounded_by_max_delete(tmp_path):
    pip = tmp_path / "pip"
    now = time.time()
    made = [make(pip / "http" / f"{i % 7}" / f"e{i:03d}", 1, (400 - i) * 3600.0, now) for i in range(300)]
    env = {"PIP_CACHE_DIR": str(pip), "HOME": str(tmp_path)}
    r = CleanupRunner([], clock=lambda: time.time() + DAY, environ=env, homes=frozenset())

    report = r.run(policy(type="pip-cache", max_size=f"{200 * PAGE}B", all_users=False, max_delete=60))
    assert [p.exists() for p in made] == [False] * 60 + [True] * 240, "the oldest, up to the bound"
    assert report.needed_files == 100 and "max_delete 60 files reached" in report.bounded
    assert "get under max_size 800.0 KiB" in report.bounded

    report = r.run(policy(type="pip-cache", max_size=f"{200 * PAGE}B", all_users=False))
    assert [p.exists() for p in made] == [False] * 100 + [True] * 200, "only what the cap needs, oldest first"
    assert report.files == 40 and not report.bounded and not report.guard


def test_a_capped_cache_whose_expired_entries_exceed_max_delete_still_gets_under_its_cap(tmp_path):
    """The runaway guard refuses the entries older_than made due (all of them old: a misjudged older_than),
    and says so; the size cap is a need, met oldest first within the bound."""
    pip = tmp_path / "pip"
    now = time.time()
    made = [make(pip / f"e{i:03d}", 1, (400 - i) * 3600.0, now) for i in range(300)]
    r = CleanupRunner([], clock=lambda: time.time() + DAY, environ={"PIP_CACHE_DIR": str(pip), "HOME": str(tmp_path)},
                      homes=frozenset())
    report = r.run(policy(type="pip-cache", max_size=f"{250 * PAGE}B", older_than="1d", all_users=False,
                          max_delete=100))
    assert [p.exists() for p in made] == [False] * 50 + [True] * 250
    assert report.guard.startswith("300 files") and not report.bounded
    (guard,) = [f for f in findings_for(report) if f.kind == "cleanup.guard"]
    assert "kept its entries due by older_than" in guard.summary

"""The cleanup engine's behaviour: one pass for simple age policies, least-recently-used size caps,
and a summary that says why nothing goes."""

from __future__ import annotations

import contextlib
import os
import random
import time

import pytest
from trainguard.actions.cleanup.engine import agepass
from trainguard.actions.cleanup.safety.inuse import OpenFiles

from tests.support.cli import trainguard
from tests.test_cleanup import DAY, holder, make, names, policy, runner
from tests.test_cleanup_attacks import write_config

ONE_PASS = dict(type="age", age_by=["mtime"], max_delete=False, older_than="3d")


def test_one_pass_deletes_what_two_passes_would(tmp_path):
    for tree in ("one", "two"):
        for i in range(30):
            make(tmp_path / tree / f"d{i % 4}" / f"f{i}.dat", age=(i % 3) * 5 * DAY)
    one = runner(tmp_path, DAY).run(policy(roots=[str(tmp_path / "one")], **ONE_PASS))
    two = runner(tmp_path, DAY).run(policy(roots=[str(tmp_path / "two")], type="age", age_by=["mtime"], older_than="3d"))
    assert names(tmp_path / "one") == names(tmp_path / "two") and one.files == two.files == 20
    assert one.planned_files == 20


@pytest.fixture
def python_loop(monkeypatch):
    """The per-entry Python loop, whose hooks fire between judging and deleting one entry
    (tests/test_cleanup_fastpath.py runs the same attacks on the compiled loop)."""
    monkeypatch.setattr(agepass, "ENABLED", False)


def test_one_pass_a_name_swapped_for_a_symlink_just_before_the_delete_keeps_link_and_target(tmp_path, python_loop):
    root, outside = tmp_path / "root", tmp_path / "outside"
    make(root / "a" / "victim.dat")
    precious = make(outside / "precious.dat")

    def hook(event: str, relpath: str) -> None:
        if event == "before_delete" and relpath == "a/victim.dat":
            os.unlink(root / "a" / "victim.dat")
            os.symlink(precious, root / "a" / "victim.dat")

    report = runner(tmp_path, DAY, hook=hook).run(policy(roots=[str(root)], **ONE_PASS))
    assert precious.exists() and precious.read_bytes() == b"x" * 1000
    assert os.readlink(root / "a" / "victim.dat") == str(precious)  # not what was judged: put back
    assert report.files == 0 and report.skipped == {"changed": 1} and names(root) == {"a", "a/victim.dat"}


def test_one_pass_a_file_opened_between_judging_and_deleting_stays(tmp_path, python_loop):
    root = tmp_path / "root"
    target = make(root / "held.dat")
    make(root / "free.dat")
    now = [0.0]
    holders = []

    def hook(event: str, relpath: str) -> None:
        if event == "judged" and relpath == "held.dat":
            holders.append(stack.enter_context(holder(target, "open")))
            now[0] += 2.0  # the index is at most max_age (1s) old: the next check reads /proc again

    with contextlib.ExitStack() as stack:
        report = runner(tmp_path, DAY, hook=hook, open_files=OpenFiles(clock=lambda: now[0])).run(
            policy(roots=[str(root)], **ONE_PASS))
    assert target.exists() and not (root / "free.dat").exists()
    assert report.skipped["open"] == 1 and report.holders and f"PID {holders[0].pid}" in report.holders[0]


def test_a_size_cap_takes_the_least_recently_used_first(tmp_path):
    root = tmp_path / "pip"
    ages = list(range(1, 21))  # days since last use, one file each, spread over directories in random order
    random.Random(7).shuffle(ages)
    for n, age in enumerate(ages):
        path = make(root / f"http/{n % 5}/{n}" / f"age{age:02d}.bin", 4096, age=age * DAY)
        atime = time.time() - age * DAY  # used (read) as long ago as written
        os.utime(path, (atime, atime))
    report = runner(tmp_path).run(policy(type="pip-cache", roots=[str(root)], max_size="64KiB", grace="0s"))
    left = sorted(p.name for p in root.rglob("*.bin"))
    assert left == [f"age{a:02d}.bin" for a in range(1, 17)], left  # 16 x 4 KiB fit; the 4 oldest went
    assert report.files == 4


def test_a_size_cap_counts_a_recent_read_as_use(tmp_path):
    root = tmp_path / "pip"
    old_but_read = make(root / "a" / "read.bin", 4096, age=30 * DAY)
    os.utime(old_but_read, (time.time() - 60, time.time() - 30 * DAY))  # atime: read a minute ago
    make(root / "b" / "unread.bin", 4096, age=20 * DAY)
    runner(tmp_path).run(policy(type="pip-cache", roots=[str(root)], max_size="4KiB", grace="0s"))
    assert old_but_read.exists() and not (root / "b" / "unread.bin").exists()


def test_dry_run_says_why_nothing_would_go(tmp_path):
    root = tmp_path / "scratch"
    for i in range(3):
        make(root / f"new{i}.dat", age=DAY)  # newer than older_than
    held = make(root / "held.dat", age=30 * DAY)
    cfg = write_config(tmp_path, str(root), 'older_than = "7d"\n')
    with holder(held, "open") as proc:
        dry = trainguard("cleanup", "--dry-run", "--config", str(cfg), timeout=60)
        real = trainguard("cleanup", "--config", str(cfg), timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "would delete" not in dry.stdout  # per-file lines only with --verbose
    assert "3 newer than older_than" in dry.stdout, dry.stdout
    assert real.returncode == 0 and held.exists()
    assert f"1 open by PID {proc.pid} (" in real.stdout and f"1 open by PID {proc.pid} (" in dry.stdout, real.stdout


def test_the_summary_names_the_top_directories(tmp_path):
    root = tmp_path / "scratch"
    for i in range(6):
        make(root / "big" / f"f{i}.dat", 8192)
    make(root / "small" / "f.dat", 1024)
    report = runner(tmp_path, DAY).run(policy(roots=[str(root)], type="age", age_by=["mtime"]))
    assert report.top_dirs[0][0] == str(root / "big") and report.top_dirs[0][2] == 6


def test_one_pass_removes_directories_it_emptied(tmp_path):
    root = tmp_path / "root"
    make(root / "gone" / "old.dat", age=10 * DAY)
    make(root / "kept" / "new.dat", age=-4 * DAY)  # one day old at the runner's clock
    for d in ("gone", "kept"):
        os.utime(root / d, (time.time() - 10 * DAY,) * 2)
    report = runner(tmp_path, 5 * DAY).run(policy(roots=[str(root)], **ONE_PASS))  # ctimes: 5 days old
    assert names(root) == {"kept", "kept/new.dat"} and report.dirs_removed == 1


def test_a_dry_run_names_the_top_directories_too(tmp_path):
    root = tmp_path / "scratch"
    for i in range(6):
        make(root / "big" / f"f{i}.dat", 8192)
    make(root / "small" / "f.dat", 1024)
    dry = runner(tmp_path, DAY).run(policy(roots=[str(root)], type="age", age_by=["mtime"]), dry_run=True)
    assert dry.files == 7 and dry.top_dirs[0][0] == str(root / "big") and dry.top_dirs[0][2] == 6
    assert names(root) >= {"big/f0.dat", "small/f.dat"}


class _HoldingBack(OpenFiles):
    """An index that, like one missing some processes' fds, says a due entry could be open."""

    def refresh(self) -> None:
        super().refresh()
        self.hold_back = lambda st: st.st_size > 2000


@pytest.mark.parametrize("max_delete", [False, 100], ids=["one-pass", "counted"])
def test_a_due_entry_the_open_file_index_holds_back_stays(tmp_path, max_delete):
    root = tmp_path / "root"
    make(root / "big.dat", 4096)
    make(root / "small.dat", 1000)
    report = runner(tmp_path, DAY, open_files=_HoldingBack()).run(
        policy(roots=[str(root)], **dict(ONE_PASS, max_delete=max_delete)))
    assert names(root) == {"big.dat"} and report.skipped == {"unverifiable-open": 1}


@pytest.mark.parametrize("remembered", [True, False], ids=["remembered", "walked-again"])
@pytest.mark.parametrize("compiled", [False, True], ids=["python-judge", "compiled-judge"])
def test_max_delete_is_a_hard_bound_when_more_becomes_due_after_the_count(tmp_path, monkeypatch, compiled,
                                                                          remembered):
    from trainguard.actions.cleanup.engine import remembered as remembering

    if compiled and not agepass.ENABLED:
        pytest.skip("trainguard.actions.cleanup.engine._agescan is not built")
    monkeypatch.setattr(agepass, "ENABLED", compiled)
    if not remembered:  # more due than the count may remember: the deletion walks the roots again
        monkeypatch.setattr(remembering, "BUDGET", 0)
    roots = [tmp_path / "one", tmp_path / "two"]
    for root in roots:
        for sub in ("a", "b"):
            for i in range(3):
                make(root / sub / f"f{i}.dat", age=30 * DAY)
    events = []

    def hook(event: str, relpath: str) -> None:
        if event != "batch":
            return
        events.append(relpath)
        if len(events) == 7:  # both roots counted (3 batches each); the first root's deletion begins
            for i in range(5):  # due too, but not counted
                make(roots[0] / "a" / f"late{i}.dat", age=30 * DAY)

    report = runner(tmp_path, DAY, hook=hook).run(
        policy(roots=[str(r) for r in roots], type="age", age_by=["mtime"], older_than="3d", max_delete=13))
    late = {p.name for p in (roots[0] / "a").glob("late*")}
    if remembered:  # only what was counted goes: the late files were never judged
        assert report.planned_files == 12 == report.files and not report.guard
        assert late == {f"late{i}.dat" for i in range(5)}
        assert sum(1 for r in roots for p in r.rglob("*.dat")) == 5
    else:  # the second walk meets them: the bound stops it, the second root loses only what is left
        assert report.planned_files == 12 and report.files == 13 and not report.guard
        assert sum(1 for r in roots for p in r.rglob("*.dat")) == 17 - 13
        assert report.skipped.get("max-delete", 0) >= 1

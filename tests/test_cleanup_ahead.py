"""Counting ahead (actions/cleanup/engine/ahead.py): a count judges subdirectories on several threads. It
must decide exactly as the walk alone does, on real trees, and keep the walk's rules: a directory
renamed out of the root before its batch is not counted (nor deleted by the guarded run after it),
and no fd is left open."""

from __future__ import annotations

import os
import threading

import pytest
from trainguard.actions.cleanup.engine import agepass, agerules, ahead

from tests.test_cleanup import DAY, holder, make, names, policy, runner

needs_extension = pytest.mark.skipif(
    not agepass.ENABLED, reason="trainguard.actions.cleanup.engine._agescan is not built (no C compiler at install time)")

GUARDED = dict(type="age", age_by=["mtime"], older_than="3d", max_delete="100000 files")


def _tree(root) -> None:
    """Leaves (counted ahead), inner directories (back to the walk), an empty one, a large one (more
    than one read), excluded names, a symlink, a file in grace, deeper levels."""
    for p in range(3):
        for leaf in range(12):
            for i in range(leaf % 5 + 1):
                age = (p * 31 + leaf * 7 + i * 3) % 9 * DAY
                make(root / f"p{p}" / f"leaf{leaf:02d}" / (f"f{i}.lock" if i == 3 else f"f{i}.dat"), 512 * (i + 1), age)
        make(root / f"p{p}" / "inner" / "deeper" / "old.dat", age=8 * DAY)
        make(root / f"p{p}" / "inner" / "young.dat", age=DAY)
        (root / f"p{p}" / "empty").mkdir()
        os.symlink("../leaf00/f0.dat", root / f"p{p}" / "leaf01" / "link.dat")
    for i in range(400):  # with READ_BYTES at 1024: several reads
        make(root / "p0" / "large" / f"file-with-a-long-name-{i:04d}.dat", age=(i % 9) * DAY)
    make(root / "p1" / "leaf05" / "fresh.dat", age=60 - DAY)  # a minute before the runner's clock: in grace


def _count(tmp_path, monkeypatch, name: str, threads: int, hook=None, dry: bool = True):
    """The guarded age policy on tmp_path/name, counted on `threads` threads (1: the walk alone)."""
    monkeypatch.setattr(agerules, "THREADS", threads)
    calls = []
    count = ahead.Ahead.count
    monkeypatch.setattr(ahead.Ahead, "count", lambda self, lst, children: calls.append(lst.path) or
                        count(self, lst, children))
    report = runner(tmp_path, DAY, hook=hook).run(policy(name=name, roots=[str(tmp_path / name)], **GUARDED),
                                                  dry_run=dry)
    return report, calls


def _same(a, b) -> None:
    assert (a.files, a.bytes, a.planned_files, a.dirs_removed) == (b.files, b.bytes, b.planned_files, b.dirs_removed)
    assert a.skipped == b.skipped
    assert sorted((bytes_, files) for _d, bytes_, files in a.top_dirs) == \
        sorted((bytes_, files) for _d, bytes_, files in b.top_dirs)


@needs_extension
@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "guarded-delete"])
def test_a_count_ahead_decides_as_the_walk_alone(tmp_path, monkeypatch, dry):
    monkeypatch.setattr(agepass, "READ_BYTES", 1024)
    for name in ("ahead", "alone"):
        _tree(tmp_path / name)
    with holder(tmp_path / "ahead" / "p2" / "leaf04" / "f1.dat", "open"), \
            holder(tmp_path / "alone" / "p2" / "leaf04" / "f1.dat", "open"):
        fast, calls = _count(tmp_path, monkeypatch, "ahead", 3, dry=dry)
        slow, none = _count(tmp_path, monkeypatch, "alone", 1, dry=dry)
    assert calls and not none  # counted ahead below the root and each p*, only with threads
    _same(fast, slow)
    assert fast.files > 50 and fast.skipped.get("open") == 1 and fast.skipped.get("grace") == 1
    assert names(tmp_path / "ahead") == names(tmp_path / "alone")


@needs_extension
@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "guarded-delete"])
def test_a_leaf_renamed_out_of_the_root_before_its_batch_is_neither_counted_nor_deleted(tmp_path, monkeypatch, dry):
    outside = tmp_path / "outside"
    outside.mkdir()
    reports = {}
    for name, threads in (("ahead", 3), ("alone", 1)):
        _tree(tmp_path / name)
        moved = tmp_path / name / "p1" / "leaf03"
        kept = {str(p.relative_to(moved)): p.read_bytes() for p in moved.rglob("*")}

        def hook(event: str, relpath: str, name=name, moved=moved) -> None:
            if event == "batch" and relpath == "p1/leaf03":  # listed under the root, judged outside it
                os.rename(moved, outside / name)

        reports[name], _ = _count(tmp_path, monkeypatch, name, threads, hook=hook, dry=dry)
        assert {str(p.relative_to(outside / name)): p.read_bytes() for p in (outside / name).rglob("*")} == kept
        assert reports[name].skipped.get("moved") == 1
    _same(reports["ahead"], reports["alone"])


@needs_extension
def test_a_count_ahead_closes_every_directory_it_opened(tmp_path, monkeypatch):
    _tree(tmp_path / "ahead")
    before = set(os.listdir("/proc/self/fd"))
    _report, calls = _count(tmp_path, monkeypatch, "ahead", 3)
    assert calls
    assert set(os.listdir("/proc/self/fd")) <= before


@needs_extension
def test_an_error_while_counting_ahead_closes_every_directory_and_stops_the_threads(tmp_path, monkeypatch):
    _tree(tmp_path / "ahead")
    before = set(os.listdir("/proc/self/fd"))
    threads = set(threading.enumerate())

    def hook(event: str, relpath: str) -> None:
        if event == "batch" and relpath == "p1/leaf07":  # several leaves opened and in flight by now
            raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        _count(tmp_path, monkeypatch, "ahead", 3, hook=hook)
    assert set(os.listdir("/proc/self/fd")) <= before
    assert set(threading.enumerate()) <= threads

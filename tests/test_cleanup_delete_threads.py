"""A guarded run deletes what its count remembered on several threads, one directory each
(actions/cleanup/engine/remembered.py). It must leave what one thread leaves, with the same counts and
audit rows, keep max_delete a hard bound when more is deletable than was counted, and after an
error close every directory, stop its threads and still record what went."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading

import pytest
from trainguard.actions.cleanup.engine import agepass, agerules, remembered
from trainguard.actions.cleanup.record.audit import AuditLog

from tests.test_cleanup import DAY, holder, make, names, policy, runner

pytestmark = pytest.mark.skipif(
    not agepass.ENABLED, reason="trainguard.actions.cleanup.engine._agescan is not built (no C compiler at install time)")


def _tree(root, dirs: int = 12, files: int = 20) -> None:
    for d in range(dirs):
        for i in range(files):
            make(root / f"job{d % 3}" / f"d{d:02d}" / f"f{i:02d}.dat", 512 * (i % 4 + 1), 5 * DAY * (i % 2))  # odd: due
    make(root / "job0" / "d00" / "fresh.dat", age=60 - DAY)  # within grace


def _delete(tmp_path, monkeypatch, name: str, threads: int, max_delete: int = 100000, hook=None, before=None):
    """The guarded age policy on tmp_path/name, deleting on `threads` threads: (report, audit rows,
    the threads the directories were deleted on). before(): called once the count is done."""
    monkeypatch.setattr(agerules, "THREADS", threads)
    used = set()
    deleted_in, delete = remembered._deleted_in, remembered.delete_remembered
    monkeypatch.setattr(remembered, "_deleted_in", lambda *a: used.add(threading.current_thread().name) or
                        deleted_in(*a))
    monkeypatch.setattr(remembered, "delete_remembered", lambda *a: (before or (lambda: None))() or delete(*a))
    conn = sqlite3.connect(tmp_path / f"{name}.db", isolation_level=None)
    try:
        report = runner(tmp_path, DAY, hook=hook, audit=AuditLog(conn)).run(policy(
            name=name, roots=[str(tmp_path / name)], type="age", age_by=["mtime"], older_than="3d",
            max_delete=max_delete))
    finally:
        rows = sorted(os.path.relpath(p, tmp_path / name) for (p,) in conn.execute("SELECT path FROM cleanup_audit"))
        conn.close()
    return report, rows, used


def test_deleting_on_threads_leaves_what_one_thread_leaves(tmp_path, monkeypatch):
    for name in ("threads", "alone"):
        _tree(tmp_path / name)
    fast, fast_rows, used = _delete(tmp_path, monkeypatch, "threads", 3)
    slow, slow_rows, alone = _delete(tmp_path, monkeypatch, "alone", 1)
    assert any(t.startswith("cleanup-delete") for t in used) and alone == {"MainThread"}
    assert fast.files == slow.files == len(fast_rows) == 12 * 20 // 2 and not fast.guard
    assert (fast.bytes, fast.planned_files, fast.dirs_removed, fast.skipped) == \
        (slow.bytes, slow.planned_files, slow.dirs_removed, slow.skipped)
    assert fast_rows == slow_rows
    assert names(tmp_path / "threads") == names(tmp_path / "alone")


@pytest.mark.parametrize("threads", [3, 1])
def test_max_delete_stays_a_hard_bound_when_more_is_deletable_than_was_counted(tmp_path, monkeypatch, threads):
    """Files held open while the run counts are remembered, not counted; closed before the deletion,
    they are deletable too: the bound (the count exactly) stops it, and which files stay does not
    depend on the threads."""
    root = tmp_path / "root"
    _tree(root)
    held = [root / "job0" / "d00" / "f01.dat", root / "job1" / "d01" / "f03.dat", root / "job2" / "d05" / "f05.dat"]
    with contextlib.ExitStack() as stack:
        for path in held:
            stack.enter_context(holder(path, "open"))
        report, rows, _used = _delete(tmp_path, monkeypatch, "root", threads, max_delete=120 - len(held),
                                      before=stack.close)
    assert report.planned_files == 117 and not report.guard
    assert report.files == len(rows) == 117 and report.skipped.get("max-delete", 0) >= 1
    assert sum(1 for _ in root.rglob("*.dat")) == 12 * 20 + 1 - 117


def test_which_files_stay_at_the_bound_does_not_depend_on_the_threads(tmp_path, monkeypatch):
    left = {}
    for name, threads in (("threads", 3), ("alone", 1)):
        root = tmp_path / name
        _tree(root)
        with contextlib.ExitStack() as stack:
            for d in (0, 4, 8):
                stack.enter_context(holder(root / f"job{d % 3}" / f"d{d:02d}" / "f01.dat", "open"))
            _delete(tmp_path, monkeypatch, name, threads, max_delete=117, before=stack.close)
        left[name] = names(root)
    assert left["threads"] == left["alone"]


def test_an_error_while_deleting_on_threads_closes_every_directory_and_records_what_went(tmp_path, monkeypatch):
    root = tmp_path / "root"
    _tree(root)
    before = set(os.listdir("/proc/self/fd"))
    threads = set(threading.enumerate())
    deleting = []

    def hook(event: str, relpath: str) -> None:
        if event == "batch" and deleting:
            deleting.append(relpath)
            if len(deleting) == 6:  # the deletion's fifth directory: several in flight by now
                raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        _delete(tmp_path, monkeypatch, "root", 3, hook=hook, before=lambda: deleting.append("counted"))
    assert set(os.listdir("/proc/self/fd")) <= before
    assert set(threading.enumerate()) <= threads
    conn = sqlite3.connect(tmp_path / "root.db")
    rows = {os.path.relpath(p, root) for (p,) in conn.execute("SELECT path FROM cleanup_audit")}
    gone = {f"job{d % 3}/d{d:02d}/f{i:02d}.dat" for d in range(12) for i in range(20)
            if i % 2 and not (root / f"job{d % 3}" / f"d{d:02d}" / f"f{i:02d}.dat").exists()}
    assert gone and rows == gone  # every file that went has its row, and only those


def test_an_error_a_thread_raised_met_while_waiting_to_delete_at_the_bound_closes_that_directory(tmp_path,
                                                                                                 monkeypatch):
    """More is deletable than was counted (files held while counting): the last directories wait for
    the ones in flight before they are deleted with the exact remainder of max_delete. A thread's error
    raised by that wait must not leave the waiting directory open."""
    root = tmp_path / "root"
    _tree(root)
    held = [root / "job0" / "d00" / "f01.dat", root / "job1" / "d01" / "f03.dat", root / "job2" / "d05" / "f05.dat"]
    before = set(os.listdir("/proc/self/fd"))
    deleting, lock = [], threading.Lock()

    def hook(event: str, relpath: str) -> None:
        if event == "batch" and deleting:
            with lock:
                deleting.append(relpath)
                if len(deleting) == 11:  # the tenth directory: among the last in flight at the bound
                    raise RuntimeError("interrupted")

    with contextlib.ExitStack() as stack:
        for path in held:
            stack.enter_context(holder(path, "open"))
        with pytest.raises(RuntimeError, match="interrupted"):
            _delete(tmp_path, monkeypatch, "root", 3, max_delete=120 - len(held), hook=hook,
                    before=lambda: stack.close() or deleting.append("counted"))
    assert set(os.listdir("/proc/self/fd")) <= before
